//! BENCHMARKS.md, the console table and the latency chart (SVG).

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{ListMemory, Results, Run};

/// The machine the run was on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Machine {
    pub(crate) cpu: String,
    pub(crate) cores: usize,
    pub(crate) memory_gib: f64,
    /// 1-minute load average before and after the run.
    pub(crate) load_before: f64,
    pub(crate) load_after: f64,
    pub(crate) kernel: String,
}

impl Machine {
    pub(crate) fn now() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map_or_else(|| "unknown".to_owned(), |s| s.trim().to_owned());
        let memory_gib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
            .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(f64::NAN);
        Machine {
            cpu,
            // The machine's, not this pinned process's.
            cores: cpuinfo
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count()
                .max(1),
            memory_gib,
            load_before: load,
            load_after: load,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
        }
    }
}

/// `YYYY-MM-DD HH:MM UTC`.
pub(crate) fn utc_now() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis()) as i64;
    format!("{} UTC", &swarmtodo::utc(ms)[..16])
}

fn f(v: f64) -> String {
    if v.is_nan() {
        "–".to_owned()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn kib(b: f64) -> String {
    if b.is_nan() {
        "–".to_owned()
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

fn find<'a>(r: &'a Results, key: &str, n: usize, history: usize) -> Option<&'a Run> {
    r.runs
        .iter()
        .find(|x| x.key == key && x.agents == n && x.history == history && x.one.writes > 0)
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_nan() || b.is_nan() || a <= 0.0 {
        "–".to_owned()
    } else {
        format!("{:.1}×", b / a)
    }
}

/// The main table, one row per server and swarm size.
pub(crate) fn table(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| server | agents | history | write → each agent p50 / p99 (ms) | write → all agents p50 / p99 (ms) | lost | server CPU per write | wire per write | memory per idle connection | acked writes lost | failures |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for x in &r.runs {
        let failure = x
            .failures
            .first()
            .map_or(String::new(), |f| f.replace('|', "/"));
        if x.one.writes == 0 {
            let _ = writeln!(
                s,
                "| {} | {} | {} | not measured |  |  |  |  |  |  | {failure} |",
                x.server, x.agents, x.history,
            );
            continue;
        }
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} / {} | {} / {} | {} | {} ms | {} | {} | {} | {failure} |",
            x.server,
            x.agents,
            x.history,
            f(x.one.each.p50),
            f(x.one.each.p99),
            f(x.one.all.p50),
            f(x.one.all.p99),
            x.one.lost,
            f(x.one.server_cpu_ms_per_write),
            kib(x.one.wire_bytes_per_write),
            kib(x.per_connection_bytes),
            x.acked_lost.map_or("–".to_owned(), |l| l.to_string()),
        );
    }
    s
}

fn sustained_table(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| server | agents | history | offered writes/s | accepted writes/s | write → ack p50 / p99 (ms) | server CPU | generator CPU | wire per write |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for x in &r.runs {
        if let Some(b) = &x.sustained {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.0} | {:.0} | {} / {} | {:.0} % | {:.0} % | {} |",
                x.server,
                x.agents,
                x.history,
                b.offered_per_s,
                b.accepted_per_s,
                f(b.ack.p50),
                f(b.ack.p99),
                b.server_cpu_share * 100.0,
                b.generator_cpu_share * 100.0,
                kib(b.wire_bytes_per_write)
            );
        }
    }
    s
}

/// Target rows: figure, target, measured, verdict.
fn targets(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| figure | target | measured | met |");
    let _ = writeln!(s, "|---|---|---|---|");
    let h = r.runs.iter().map(|x| x.history).min().unwrap_or(0);
    let hub100 = find(r, "hub", 100, h);
    let raw100 = find(r, "raw", 100, h);
    let js100 = find(r, "js", 100, h);
    let samod100 = find(r, "samod", 100, h);
    let hub1000 = find(r, "hub", 1_000, h);
    let p99 = |x: Option<&Run>| x.map_or(f64::NAN, |x| x.one.all.p99);
    let mut row = |fig: &str, target: &str, measured: String, met: Option<bool>| {
        let _ = writeln!(s, "{}", target_row(fig, target, &measured, met));
    };
    let (hub, raw) = (p99(hub100), p99(raw100));
    row(
        "one write to all 100 agents, p99",
        "≤ 10 ms and ≤ 3× raw",
        format!("{} ms; raw {} ms ({} raw)", f(hub), f(raw), ratio(raw, hub)),
        (!hub.is_nan() && !raw.is_nan()).then_some(hub <= 10.0 && hub <= 3.0 * raw),
    );
    let h1000 = p99(hub1000);
    row(
        "one write to all 1,000 agents, p99",
        "≤ 50 ms",
        format!("{} ms", f(h1000)),
        (!h1000.is_nan()).then_some(h1000 <= 50.0),
    );
    let sus: Vec<(usize, f64)> = r
        .runs
        .iter()
        .filter(|x| x.key == "hub" && x.one.writes > 0)
        .filter_map(|x| x.sustained.as_ref().map(|b| (x.history, b.accepted_per_s)))
        .collect();
    let min = sus.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
    let max = sus.iter().map(|x| x.1).fold(0.0, f64::max);
    row(
        "sustained checked writes/s, 100 agents",
        "≥ 2,000, within 20 % between 10k and 60k",
        sus.iter()
            .map(|(h, v)| format!("{v:.0}/s at {h} changes"))
            .collect::<Vec<_>>()
            .join("; "),
        (sus.len() >= 2).then_some(min >= 2_000.0 && (max - min) / max <= 0.2),
    );
    let conn = r
        .runs
        .iter()
        .filter(|x| x.key == "hub" && x.one.writes > 0)
        .max_by_key(|x| x.agents)
        .map(|x| (x.agents, x.per_connection_bytes));
    row(
        "hub memory per idle agent connection",
        "≤ 16 KiB",
        conn.map_or("–".to_owned(), |(n, b)| {
            format!("{} (at {n} agents)", kib(b))
        }),
        conn.map(|(_, b)| b <= 16.0 * 1024.0),
    );
    let (target, measured, met) = list_target(&r.lists);
    row(LIST_TARGET, target, measured, met);
    let (js, samod) = (p99(js100), p99(samod100));
    row(
        "against the JS sync server, p99 at 100 agents",
        "≥ 40× lower",
        format!("JS {} ms vs hub {} ms: {}", f(js), f(hub), ratio(hub, js)),
        (!js.is_nan() && !hub.is_nan()).then_some(js >= 40.0 * hub),
    );
    row(
        "against the samod relay, p99 at 100 agents",
        "≥ 5× lower",
        format!(
            "samod {} ms vs hub {} ms: {}",
            f(samod),
            f(hub),
            ratio(hub, samod)
        ),
        (!samod.is_nan() && !hub.is_nan()).then_some(samod >= 5.0 * hub),
    );
    s
}

/// The figure of the memory-per-list row of the targets.
const LIST_TARGET: &str = "hub memory per 1,000-task list";

/// The memory-per-list target (the hub at most the samod relay's figure of the same
/// run): the target, what was measured, whether it was met.
fn list_target(lists: &[ListMemory]) -> (&'static str, String, Option<bool>) {
    let per = |key: &str| lists.iter().find(|l| l.key == key);
    let (hub, samod) = (per("hub"), per("samod"));
    let measured = hub.map_or("–".to_owned(), |l| {
        format!(
            "{:.2} MiB per list added; samod {} ({} lists of {} changes, then as many again)",
            l.per_added_list_bytes / 1048576.0,
            samod.map_or("–".to_owned(), |s| format!(
                "{:.2} MiB",
                s.per_added_list_bytes / 1048576.0
            )),
            l.lists,
            l.history
        )
    });
    let met = hub
        .zip(samod)
        .map(|(h, s)| h.per_added_list_bytes <= s.per_added_list_bytes);
    ("≤ the samod relay's, same run", measured, met)
}

/// The memory-per-list section; `again`: when it was measured on its own
/// (`--memory`), after the rest of the file.
pub(crate) fn memory_section(lists: &[ListMemory], again: Option<&str>) -> String {
    let n = lists.first().map_or(0, |l| l.lists);
    let when = again.map_or(String::new(), |t| {
        format!(
            " Measured on its own, {t}: `cargo bench --bench side_by_side -- --memory` \
             (the other sections are from the run above)."
        )
    });
    format!(
        "{MEMORY_HEADING}\n\n\
         A fresh server is given {n} copies of the list (different document ids, same \
         content), each by a peer that stays connected while it is measured (the hub lets a \
         list no peer syncs leave memory), and left {settle} s (the hub gives back a list's \
         sync window after 10 s without a write); then {n} more, left as long. *Per list \
         from empty*: resident memory with the first {n} minus before, divided by {n}; it \
         also counts what the first lists bring once (program code paged in on first use, \
         caches filled). *Per list added*: resident memory with all {n2} minus with the \
         first {n}, divided by {n} — what one more list costs, the figure of the target.\
         {when}\n\n{}",
        memory_table(lists),
        n2 = 2 * n,
        settle = crate::LISTS_SETTLE.as_secs()
    )
}

/// The heading of the memory-per-list section.
const MEMORY_HEADING: &str = "## Memory per list";

/// Replaces the memory-per-list section of `out`, and its row of the targets, with a
/// new measure.
pub(crate) fn rewrite_memory_section(
    out: &Path,
    lists: &[ListMemory],
    section: &str,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(out)?;
    let start = text.find(MEMORY_HEADING).ok_or_else(|| {
        anyhow::anyhow!("{out:?} has no {MEMORY_HEADING:?}: make a full run first")
    })?;
    let end = text[start + MEMORY_HEADING.len()..]
        .find("\n## ")
        .map_or(text.len(), |at| start + MEMORY_HEADING.len() + at + 1);
    let (target, measured, met) = list_target(lists);
    let mut lines = Vec::new();
    for line in text[..start].lines() {
        if line.starts_with(&format!("| {LIST_TARGET} |")) {
            lines.push(target_row(LIST_TARGET, target, &measured, met));
        } else {
            lines.push(line.to_owned());
        }
    }
    std::fs::write(
        out,
        format!(
            "{}\n{}\n\n{}",
            lines.join("\n"),
            section.trim_end(),
            &text[end..]
        ),
    )?;
    Ok(())
}

/// One row of the targets table.
fn target_row(fig: &str, target: &str, measured: &str, met: Option<bool>) -> String {
    let v = match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "not measured",
    };
    format!("| {fig} | {target} | {measured} | {v} |")
}

fn memory_table(lists: &[ListMemory]) -> String {
    let mut s = String::new();
    let n = lists.first().map_or(0, |l| l.lists);
    let _ = writeln!(
        s,
        "| server | history | RSS empty | with {n} lists | with {} lists | per list from empty | per list added |",
        2 * n
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    let mib = |b: f64| b / 1048576.0;
    for l in lists {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.2} MiB | {:.2} MiB |",
            l.server,
            l.history,
            mib(l.rss_empty_bytes as f64),
            mib(l.rss_loaded_bytes as f64),
            mib(l.rss_doubled_bytes as f64),
            mib(l.per_list_bytes),
            mib(l.per_added_list_bytes)
        );
    }
    s
}

/// BENCHMARKS.md.
pub(crate) fn markdown(r: &Results, chart: &Path) -> String {
    let chart_name = chart
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let m = &r.machine;
    format!(
        "# Benchmarks: the hub side by side\n\n\
         *Written by `benches/side_by_side` — do not edit by hand; run it again.*\n\n\
         Run {started}, {wall:.0} s. Reproduce: `{cmd}`\n\n\
         Machine: {cpu}, {cores} cores, {mem:.0} GiB, Linux {kernel}; 1-minute load average \
         {lb:.2} before, {la:.2} after. Each server is a separate process pinned to core 1; \
         the load generator runs on core 0.\n\n\
         ## Targets\n\n{targets}\n\
         ## One write at a time\n\n\
         One list of 1,000 tasks. Every server first receives the whole list from a seeding \
         peer; then N agents connect, each holding the list, and sync until in step. One \
         agent at a time writes a status change to its own task (a real automerge change); \
         the generator notes when the frame carrying it reaches each of the other N−1 agents \
         (*each*) and when it reached the last of them (*all*). Agents hold incoming frames \
         (time-stamped on arrival) until every agent has one, so that the generator's own \
         work does not delay the later arrivals; then they answer as automerge would, and \
         the next write waits for the server's acknowledgement and a quiet period. The raw \
         broadcast sends the same bytes to everyone else and nothing more: the ceiling. \
         *server CPU per write* is the server process's CPU time over the phase divided by \
         the writes; *wire per write* counts the bytes of every frame in both directions at \
         the generator; memory per connection is the server's resident memory with N idle \
         agents in step minus before they connected (the seeding peer still connected then, \
         so that the list is in memory), divided by N.\n\n{table}\n\
         ![latency distribution per server]({chart_name})\n\n\
         ## Sustained writes\n\n\
         All agents write in turn at the offered total rate for the duration; a write is \
         accepted when the server's sync message says it has it (for the hub: merged, \
         checked by the authority — ownership, schema, single active, dependencies — and \
         committed to SQLite before the answer). Accepted writes/s = acknowledged writes / \
         time from the first write to the last acknowledgement. The offered rate is above \
         the 2,000/s target, so that a server that keeps up shows it: offered at the \
         target, the time its last acknowledgements take would keep the figure below.\n\n{sustained}\n\
         {memory}\n\
         ## How the generator speaks automerge-repo\n\n\
         Each agent is a thin peer (`benches/side_by_side/peer.rs`): it keeps the change \
         graph (hashes, dependencies, heads, the largest op counter) and none of the \
         content, and runs automerge's sync rules over it — the messages it sends are \
         those a full replica would send. A full replica per agent would cost the generator \
         N× the server's work (≈50 µs to apply each change) on the same two cores; and \
         the agents share the parsing of what they receive (each change is parsed once, \
         by its bytes), which took the generator's core at 2,000 writes/s. After \
         the phases, a fresh peer syncs the list from the server and every acknowledged \
         write must be on it (*acked writes lost*).\n",
        started = r.started,
        wall = r.wall_seconds,
        cmd = r.command,
        cpu = m.cpu,
        cores = m.cores,
        mem = m.memory_gib,
        kernel = m.kernel,
        lb = m.load_before,
        la = m.load_after,
        targets = targets(r),
        table = table(r),
        sustained = sustained_table(r),
        memory = memory_section(&r.lists, None),
    )
}

/// The latency distribution per server (one panel per swarm size): the share of
/// deliveries (y) that arrived within x ms, log x.
pub(crate) fn chart(r: &Results) -> String {
    let sizes: Vec<usize> = {
        let mut v: Vec<usize> = r.runs.iter().map(|x| x.agents).collect();
        v.sort();
        v.dedup();
        v
    };
    let h = r.runs.iter().map(|x| x.history).min().unwrap_or(0);
    let (pw, ph, m) = (420.0, 260.0, 50.0);
    let width = m + sizes.len() as f64 * (pw + m);
    let height = ph + 2.5 * m;
    let colors = [
        ("hub", "#1f77b4"),
        ("samod", "#ff7f0e"),
        ("js", "#2ca02c"),
        ("raw", "#7f7f7f"),
    ];
    let (lo, hi) = (0.01f64, 10_000.0f64);
    let xs = |v: f64| (v.clamp(lo, hi).log10() - lo.log10()) / (hi.log10() - lo.log10()) * pw;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (k, n) in sizes.iter().enumerate() {
        let x0 = m + k as f64 * (pw + m);
        let y0 = m;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" font-size=\"13\">write → each agent, {n} agents, {h} changes</text>",
            x0,
            y0 - 15.0
        );
        let _ = writeln!(
            s,
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>"
        );
        for t in [0.01, 0.1, 1.0, 10.0, 100.0, 1_000.0, 10_000.0] {
            let x = x0 + xs(t);
            let _ = writeln!(
                s,
                "<line x1=\"{x}\" y1=\"{y0}\" x2=\"{x}\" y2=\"{}\" stroke=\"#eee\"/><text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{t} ms</text>",
                y0 + ph,
                y0 + ph + 14.0
            );
        }
        for q in [0.0, 0.5, 0.9, 0.99, 1.0] {
            let y = y0 + ph - q * ph;
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}%</text>",
                x0 - 4.0,
                y + 4.0,
                q * 100.0
            );
        }
        let mut legend = 0.0;
        for (key, color) in colors {
            let Some(run) = find(r, key, *n, h) else {
                continue;
            };
            let mut v = run.one.samples.clone();
            if v.is_empty() {
                continue;
            }
            v.sort_by(f64::total_cmp);
            let step = (v.len() / 400).max(1);
            let pts: Vec<String> = v
                .iter()
                .enumerate()
                .step_by(step)
                .chain(std::iter::once((v.len() - 1, &v[v.len() - 1])))
                .map(|(i, t)| {
                    format!(
                        "{:.1},{:.1}",
                        x0 + xs(*t),
                        y0 + ph - (i + 1) as f64 / v.len() as f64 * ph
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                pts.join(" ")
            );
            let _ = writeln!(
                s,
                "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{} (p99 {} ms)</text>",
                x0 + 8.0,
                y0 + 8.0 + legend,
                x0 + 22.0,
                y0 + 17.0 + legend,
                run.server,
                f(run.one.each.p99)
            );
            legend += 15.0;
        }
    }
    s.push_str("</svg>\n");
    s
}
