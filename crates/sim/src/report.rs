//! Many runs into one report: a summary table for the terminal, JSON, and an SVG
//! picture (latency distribution, convergence over time).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::check::RuleCount;
use super::outcome::RunOutcome;

/// Bars of the latency histogram.
pub const HISTOGRAM_BINS: usize = 40;
/// Points of the convergence curve.
pub const CURVE_POINTS_MAX: usize = 400;
/// Failing seeds listed in the summary (all are in the runs file).
pub const FAILED_SEEDS_LISTED_MAX: usize = 50;

/// What a set of runs amounts to.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The scenario.
    pub scenario: String,
    /// Runs.
    pub runs: usize,
    /// Runs whose every check passed.
    pub passed: usize,
    /// Seeds that failed (first [`FAILED_SEEDS_LISTED_MAX`]).
    pub failed_seeds: Vec<u64>,
    /// Failed checks by name: how many runs failed each.
    pub failed_checks: BTreeMap<String, usize>,
    /// Actions attempted.
    pub ops: u64,
    /// Writes that made a change.
    pub writes: u64,
    /// Violations by rule (injected, reported once, reported in all).
    pub rules: BTreeMap<String, RuleCount>,
    /// Hub crashes.
    pub hub_crashes: u64,
    /// Frames sent / lost / duplicated / reordered.
    pub frames: [u64; 4],
    /// Convergence time after the storm, simulated ms: p50, p99, max.
    pub convergence_ms: [u64; 3],
    /// Write-to-acknowledgement latency, simulated ms: p50, p99, max.
    pub latency_ms: [u64; 3],
    /// Actions per wall-clock second over all runs.
    pub ops_per_s: f64,
    /// Seeds per wall-clock minute.
    pub seeds_per_min: f64,
    /// Wall-clock milliseconds of the whole batch.
    pub wall_ms: u64,
    /// Peak resident memory of the process, KiB (Linux; 0 elsewhere).
    pub peak_rss_kib: u64,
    /// Live runs only: what they measure besides (None: deterministic runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveSummary>,
}

/// What live runs measure, summed over the runs. Their `latency_ms` is write → every
/// other agent of the list has it, and `convergence_ms` wall-clock milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LiveSummary {
    /// Peak resident memory of the hub process (largest over runs and restarts), KiB.
    pub hub_peak_rss_kib: u64,
    /// Write → the writer saw the hub's acknowledgement, ms: p50, p99, max.
    pub ack_latency_ms: [u64; 3],
    /// Actions per second of storm.
    pub ops_per_storm_s: f64,
    /// Writes per second of storm.
    pub writes_per_storm_s: f64,
    /// `kill -9` of the hub survived.
    pub kills: u64,
    /// Restarts that had to take a new port.
    pub restarts_on_new_port: u64,
    /// A cluster's hubs paused past their lease, then woken.
    pub pauses: u64,
    /// A cluster's hubs cut from NATS, then reconnected.
    pub nats_cuts: u64,
    /// Connection cuts.
    pub cuts: u64,
    /// Reconnects after a sync that made no progress.
    pub stall_resets: u64,
    /// Slow readers run / dropped by the hub.
    pub slow_readers: [u64; 2],
    /// Changes acknowledged to their writers.
    pub acked: u64,
    /// Acknowledged changes missing from the hub or the store at the end.
    pub acked_lost: u64,
    /// Writes that never reached every other agent.
    pub unpropagated: u64,
    /// A cluster's fences in the lists' logs (hubs taking a list).
    pub fences: u64,
    /// A cluster's terms as a list's authority that ended, by the refusal's code.
    pub terms_ended: BTreeMap<String, u64>,
    /// Checks skipped, with the reason (the first run's).
    pub skipped: BTreeMap<String, String>,
}

fn live_summary(runs: &[RunOutcome]) -> Option<LiveSummary> {
    let mut out = LiveSummary::default();
    let mut ack = Vec::new();
    let mut storm_ms = 0u64;
    let mut any = false;
    for r in runs {
        let Some(l) = &r.live else { continue };
        any = true;
        out.hub_peak_rss_kib = out.hub_peak_rss_kib.max(l.hub_peak_rss_kib);
        ack.extend(l.ack_latencies_ms.iter().copied());
        storm_ms += l.storm_ms;
        out.kills += l.kills;
        out.restarts_on_new_port += l.restarts_on_new_port;
        out.pauses += l.pauses;
        out.nats_cuts += l.nats_cuts;
        out.cuts += l.cuts;
        out.stall_resets += r.stats.stall_resets;
        out.slow_readers[0] += l.slow_readers.len() as u64;
        out.slow_readers[1] += l.slow_readers.iter().filter(|s| s.closed).count() as u64;
        out.acked += l.acked;
        out.acked_lost += l.acked_lost;
        out.unpropagated += l.unpropagated;
        if let Some(c) = &l.cluster {
            out.fences += c.fences;
            for (code, n) in &c.terms_ended {
                *out.terms_ended.entry(code.clone()).or_default() += n;
            }
        }
        for c in r.checks.iter().filter(|c| c.skipped) {
            out.skipped
                .entry(c.name.to_owned())
                .or_insert_with(|| c.detail.clone());
        }
    }
    if !any {
        return None;
    }
    let secs = storm_ms.max(1) as f64 / 1_000.0;
    out.ack_latency_ms = three(ack);
    out.ops_per_storm_s = runs.iter().map(|r| r.stats.ops).sum::<u64>() as f64 / secs;
    out.writes_per_storm_s = runs.iter().map(|r| r.stats.writes).sum::<u64>() as f64 / secs;
    Some(out)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn three(mut v: Vec<u64>) -> [u64; 3] {
    v.sort_unstable();
    [
        percentile(&v, 0.5),
        percentile(&v, 0.99),
        v.last().copied().unwrap_or(0),
    ]
}

/// Peak resident set size of this process (`VmHWM`), KiB.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Sums up `runs` that took `wall_ms` together.
pub fn summarize(scenario: &str, runs: &[RunOutcome], wall_ms: u64) -> Summary {
    let mut rules: BTreeMap<String, RuleCount> = BTreeMap::new();
    let mut failed_checks: BTreeMap<String, usize> = BTreeMap::new();
    let mut frames = [0u64; 4];
    for r in runs {
        for (k, c) in &r.rules {
            let t = rules.entry(k.clone()).or_default();
            t.injected += c.injected;
            t.reported_once += c.reported_once;
            t.reported += c.reported;
        }
        for c in r.checks.iter().filter(|c| !c.ok) {
            *failed_checks.entry(c.name.to_owned()).or_default() += 1;
        }
        frames[0] += r.stats.frames;
        frames[1] += r.stats.dropped;
        frames[2] += r.stats.duplicated;
        frames[3] += r.stats.reordered;
    }
    let ops: u64 = runs.iter().map(|r| r.stats.ops).sum();
    let secs = (wall_ms.max(1)) as f64 / 1_000.0;
    Summary {
        scenario: scenario.to_owned(),
        runs: runs.len(),
        passed: runs.iter().filter(|r| r.passed()).count(),
        failed_seeds: runs
            .iter()
            .filter(|r| !r.passed())
            .map(|r| r.seed)
            .take(FAILED_SEEDS_LISTED_MAX)
            .collect(),
        failed_checks,
        ops,
        writes: runs.iter().map(|r| r.stats.writes).sum(),
        rules,
        hub_crashes: runs.iter().map(|r| r.stats.hub_crashes).sum(),
        frames,
        convergence_ms: three(runs.iter().filter_map(|r| r.convergence_ms).collect()),
        latency_ms: three(
            runs.iter()
                .flat_map(|r| r.latencies_ms.iter().copied())
                .collect(),
        ),
        ops_per_s: ops as f64 / secs,
        seeds_per_min: runs.len() as f64 * 60.0 / secs,
        wall_ms,
        peak_rss_kib: peak_rss_kib(),
        live: live_summary(runs),
    }
}

/// The summary as a table for the terminal.
pub fn table(s: &Summary) -> String {
    let mut t = String::new();
    let mut row = |k: &str, v: String| {
        let _ = writeln!(t, "  {k:<28} {v}");
    };
    row("scenario", s.scenario.clone());
    row("runs (passed / all)", format!("{} / {}", s.passed, s.runs));
    if !s.failed_seeds.is_empty() {
        row("failed seeds", format!("{:?}", s.failed_seeds));
        row("failed checks", format!("{:?}", s.failed_checks));
    }
    row("ops (writes)", format!("{} ({})", s.ops, s.writes));
    for (rule, c) in &s.rules {
        row(
            &format!("violations {rule}"),
            format!(
                "injected {}, reported once {}, reported in all {}",
                c.injected, c.reported_once, c.reported
            ),
        );
    }
    if let Some(l) = &s.live {
        live_rows(&mut row, s, l);
        return t;
    }
    row("hub crashes", s.hub_crashes.to_string());
    row(
        "frames (lost/dup/reordered)",
        format!(
            "{} ({}/{}/{})",
            s.frames[0], s.frames[1], s.frames[2], s.frames[3]
        ),
    );
    row(
        "convergence p50/p99/max",
        format!(
            "{} / {} / {} ms (simulated)",
            s.convergence_ms[0], s.convergence_ms[1], s.convergence_ms[2]
        ),
    );
    row(
        "ack latency p50/p99/max",
        format!(
            "{} / {} / {} ms (simulated)",
            s.latency_ms[0], s.latency_ms[1], s.latency_ms[2]
        ),
    );
    row("throughput", format!("{:.0} ops/s (wall)", s.ops_per_s));
    row(
        "seeds per minute",
        format!("{:.0} ({} ms wall)", s.seeds_per_min, s.wall_ms),
    );
    row("peak memory", format!("{} MiB", s.peak_rss_kib / 1024));
    t
}

/// The rows of a live summary (wall-clock figures).
fn live_rows(row: &mut impl FnMut(&str, String), s: &Summary, l: &LiveSummary) {
    row(
        "hub kills survived",
        format!(
            "{} (restarts on a new port: {})",
            l.kills, l.restarts_on_new_port
        ),
    );
    if l.pauses + l.nats_cuts > 0 {
        row(
            "hubs paused / cut from NATS",
            format!("{} / {}", l.pauses, l.nats_cuts),
        );
    }
    if l.fences > 0 {
        row("lists taken (fences)", l.fences.to_string());
        row("terms ended by", crate::live::terms_text(&l.terms_ended));
    }
    row(
        "cuts / stall resets",
        format!("{} / {}", l.cuts, l.stall_resets),
    );
    row(
        "slow readers dropped",
        format!("{} of {}", l.slow_readers[1], l.slow_readers[0]),
    );
    row(
        "acked writes (lost)",
        format!("{} ({})", l.acked, l.acked_lost),
    );
    row(
        "convergence p50/p99/max",
        format!(
            "{} / {} / {} ms after the storm",
            s.convergence_ms[0], s.convergence_ms[1], s.convergence_ms[2]
        ),
    );
    row(
        "write → all others p50/p99",
        format!(
            "{} / {} ms (max {}; {} never arrived)",
            s.latency_ms[0], s.latency_ms[1], s.latency_ms[2], l.unpropagated
        ),
    );
    row(
        "write → acked p50/p99",
        format!(
            "{} / {} ms (max {})",
            l.ack_latency_ms[0], l.ack_latency_ms[1], l.ack_latency_ms[2]
        ),
    );
    row(
        "throughput",
        format!(
            "{:.1} ops/s, {:.1} writes/s (storm)",
            l.ops_per_storm_s, l.writes_per_storm_s
        ),
    );
    row(
        "hub peak memory",
        format!("{} MiB", l.hub_peak_rss_kib / 1024),
    );
    row("wall", format!("{} ms", s.wall_ms));
    for (name, why) in &l.skipped {
        row(
            &format!("skipped {name}"),
            why.trim_start_matches("skipped: ").to_owned(),
        );
    }
}

/// Writes `summary.json`, `runs.json` and `report.svg` into `dir`.
pub fn write(dir: &Path, summary: &Summary, runs: &[RunOutcome]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let summary_json = serde_json::to_string_pretty(summary).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("summary.json"), summary_json + "\n")?;
    let runs_json = serde_json::to_string_pretty(runs).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("runs.json"), runs_json + "\n")?;
    std::fs::write(dir.join("report.svg"), svg(summary, runs))?;
    Ok(())
}

/// The picture: the latency histogram on the left, on the right the share of replicas
/// not yet at the hub's version over simulated time (mean over the runs).
pub fn svg(summary: &Summary, runs: &[RunOutcome]) -> String {
    const W: f64 = 420.0;
    const H: f64 = 260.0;
    const PAD: f64 = 40.0;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">"#,
        W * 2.0 + PAD,
        H + PAD * 2.0
    );
    let _ = write!(
        out,
        r#"<text x="{PAD}" y="16" font-size="13">{} — {} runs, {} passed</text>"#,
        escape(&summary.scenario),
        summary.runs,
        summary.passed
    );

    // Latency histogram.
    let mut lat: Vec<u64> = runs
        .iter()
        .flat_map(|r| r.latencies_ms.iter().copied())
        .collect();
    lat.sort_unstable();
    let max = percentile(&lat, 0.999).max(1);
    let mut bins = [0u64; HISTOGRAM_BINS];
    for l in &lat {
        let i = ((*l).min(max) as f64 / max as f64 * (HISTOGRAM_BINS - 1) as f64) as usize;
        bins[i.min(HISTOGRAM_BINS - 1)] += 1;
    }
    let top = bins.iter().copied().max().unwrap_or(1).max(1);
    let (x0, y0) = (PAD, PAD + H - PAD);
    let bw = (W - PAD) / HISTOGRAM_BINS as f64;
    let (lat_title, curve_title) = if summary.live.is_some() {
        (
            "write → every other agent has it (ms)",
            "agents not in sync with the hub, share (mean over runs)",
        )
    } else {
        (
            "write → acknowledgement latency (simulated ms)",
            "replicas behind the hub, share (mean over runs)",
        )
    };
    let _ = write!(
        out,
        r#"<text x="{x0}" y="{}">{lat_title}</text>"#,
        PAD - 6.0
    );
    for (i, b) in bins.iter().enumerate() {
        let h = *b as f64 / top as f64 * (H - PAD * 1.5);
        let _ = write!(
            out,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="#4a7ab5"/>"##,
            x0 + i as f64 * bw,
            y0 - h,
            (bw - 1.0).max(1.0)
        );
    }
    axis(&mut out, x0, y0, W - PAD, &format!("0 … {max} ms"), top);

    // Convergence: mean divergence per time slot.
    let end = runs.iter().map(|r| r.end_ms).max().unwrap_or(1).max(1);
    let slots = CURVE_POINTS_MAX;
    let mut sum = vec![0f64; slots];
    let mut n = vec![0u64; slots];
    let replicas = |r: &RunOutcome| {
        r.divergence
            .iter()
            .map(|(_, d)| *d)
            .max()
            .unwrap_or(1)
            .max(1)
    };
    for r in runs {
        let total = replicas(r) as f64;
        for (t, d) in &r.divergence {
            let i = ((*t as f64 / end as f64) * (slots - 1) as f64) as usize;
            sum[i.min(slots - 1)] += *d as f64 / total;
            n[i.min(slots - 1)] += 1;
        }
    }
    let (cx0, cy0) = (W + PAD, PAD + H - PAD);
    let _ = write!(
        out,
        r#"<text x="{cx0}" y="{}">{curve_title}</text>"#,
        PAD - 6.0
    );
    let points: Vec<String> = (0..slots)
        .filter(|i| n[*i] > 0)
        .map(|i| {
            let x = cx0 + i as f64 / (slots - 1) as f64 * (W - PAD);
            let y = cy0 - sum[i] / n[i] as f64 * (H - PAD * 1.5);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let _ = write!(
        out,
        r##"<polyline fill="none" stroke="#c0504d" stroke-width="1.5" points="{}"/>"##,
        points.join(" ")
    );
    axis(&mut out, cx0, cy0, W - PAD, &format!("0 … {end} ms"), 1);
    out.push_str("</svg>\n");
    out
}

fn axis(out: &mut String, x0: f64, y0: f64, w: f64, label: &str, top: u64) {
    let _ = write!(
        out,
        r#"<line x1="{x0}" y1="{y0}" x2="{}" y2="{y0}" stroke="black"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{}" stroke="black"/><text x="{x0}" y="{}">{}</text><text x="{}" y="{}" text-anchor="end">{top}</text>"#,
        x0 + w,
        y0 - 200.0,
        y0 + 14.0,
        escape(label),
        x0 - 3.0,
        y0 - 190.0
    );
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
