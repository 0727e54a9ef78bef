//! The weeks-of-uptime figures kept between runs (`target/side-by-side/hardening.json`)
//! and their section of `BENCHMARKS.md`.

use std::path::Path;

use super::{Hardening, Phase, RSS_EVERY};

/// The figures so far (`work/hardening.json`), with `update` applied, kept.
pub(crate) fn record(
    work: &Path,
    update: impl FnOnce(&mut Hardening),
) -> anyhow::Result<Hardening> {
    let path = work.join("hardening.json");
    let mut h: Hardening = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    update(&mut h);
    std::fs::write(&path, serde_json::to_vec_pretty(&h)?)?;
    Ok(h)
}

/// The figures kept in `work`, if any.
pub(crate) fn kept(work: &Path) -> Option<Hardening> {
    serde_json::from_slice(&std::fs::read(work.join("hardening.json")).ok()?).ok()
}

/// The heading of the section in `BENCHMARKS.md`.
pub(crate) const HEADING: &str = "## Weeks of uptime";

/// Rewrites the section in `out` (appended when missing).
pub(crate) fn rewrite_section(out: &Path, h: &Hardening) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let before = text
        .find(HEADING)
        .map_or(text.as_str(), |at| &text[..at])
        .trim_end();
    std::fs::write(out, format!("{before}\n\n{}", section(h)))?;
    Ok(())
}

/// The section of `BENCHMARKS.md`.
pub(crate) fn section(h: &Hardening) -> String {
    let mut s = format!(
        "{HEADING}\n\n\
         The hub alone (these have no peer among the other servers, which keep every \
         document they ever saw in memory). Each part is kept in \
         `target/side-by-side/hardening.json` with when it was measured; its command is \
         given.\n\n"
    );
    if let Some(k) = &h.soak {
        s += &format!(
            "### Soak\n\n`cargo bench --bench side_by_side -- --soak {secs:.0}` ({when}): \
             {agents} agents on {lists} lists of 1,000 tasks ({history} changes each), \
             {rate:.0} writes/s offered for {secs:.0} s, each acknowledged once merged, \
             checked and committed. Resident memory read every {every} s; its slope is the \
             least-squares fit after the first minute.\n\n\
             | sent | acked | acked writes lost | connections dropped | RSS first → last | per write | RSS slope after minute 1 | hub CPU |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|\n\
             | {sent} | {acked} | {lost} | {dropped} | {f:.1} → {l:.1} MiB | {per:.0} B | {slope} | {cpu:.0} % |\n\n\
             | minute | acked | ack p50 | ack p99 | max | RSS at its end |\n|---:|---:|---:|---:|---:|---:|\n",
            secs = k.seconds,
            when = k.measured,
            agents = k.agents,
            lists = k.lists,
            history = k.history,
            rate = k.offered_per_s,
            every = RSS_EVERY.as_secs(),
            sent = k.sent,
            acked = k.acked,
            lost = k.acked_lost,
            dropped = k.dropped,
            f = k.rss_first_mib,
            l = k.rss_last_mib,
            per = k.rss_bytes_per_write,
            slope = k
                .rss_slope_mib_per_min
                .map_or_else(|| "–".to_owned(), |v| format!("{v:+.2} MiB/min")),
            cpu = k.server_cpu_share * 100.0,
        );
        for m in &k.minutes {
            s += &format!(
                "| {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} MiB |\n",
                m.minute, m.ack.count, m.ack.p50, m.ack.p99, m.ack.max, m.rss_mib
            );
        }
        s += "\n";
    }
    if let Some(k) = &h.housekeeping {
        let row = |name: &str, p: &Phase| {
            format!(
                "| {name} | {} | {:.2} ms | {:.2} ms | {:.1} ms | {:.0}/s | {:.1} ms | {:.0} % | {} |\n",
                p.history,
                p.probe.p50,
                p.probe.p99,
                p.probe.max,
                p.busy_acked_per_s,
                p.busy.p99,
                p.server_cpu_share * 100.0,
                p.acked_lost
            )
        };
        s += &format!(
            "### Housekeeping beside other lists\n\n\
             `cargo bench --bench side_by_side -- --housekeeping {secs:.0}` ({when}): a busy \
             list written by {busy} agents at {rate:.0}/s, which the hub compacts (a whole-list \
             save every 10 % of growth) and rebuilds (a load of the snapshot every 25 %, off \
             the hub's task); beside it a probe list written by one agent at a time at \
             {probe:.0}/s. The same load once with the busy list's history short, once long: \
             the probe's p99 on the long one over the short one is **{ratio:.2}×** (target \
             ≤ 2×).\n\n\
             | busy list | changes at start | probe p50 | probe p99 | probe max | busy acked | busy p99 | hub CPU | acked writes lost |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|\n{short}{long}\n",
            secs = k.seconds,
            when = k.measured,
            busy = k.busy_agents,
            rate = k.busy_rate,
            probe = k.probe_rate,
            ratio = k.p99_ratio,
            short = row("short history", &k.short),
            long = row("long history", &k.long),
        );
    }
    if let Some(k) = &h.unload {
        s += &format!(
            "### Lists out of memory\n\n\
             `cargo bench --bench side_by_side -- --unload {stored}` ({when}): a store of \
             {stored} lists of 1,000 tasks ({history} changes each; {store:.0} MiB), the hub \
             started on it; a list is in memory while a peer syncs it (or an API call \
             needs it) and leaves when the last one goes.\n\n\
             | hub | resident memory |\n|---|---:|\n\
             | {stored} stored, none in use | {idle:.1} MiB |\n\
             | {stored} stored, {n} in use | {inuse:.1} MiB |\n\
             | those released, {n} others in use | {others:.1} MiB |\n\
             | all released | {released:.1} MiB |\n\
             | {n} stored, {n} in use | {alone:.1} MiB |\n\n\
             What the {rest} lists not in use cost: {extra:.1} MiB ({per:.2} KiB each).\n\n",
            stored = k.stored,
            when = k.measured,
            history = k.history,
            store = k.store_mib,
            n = k.in_use,
            idle = k.idle_mib,
            inuse = k.in_use_mib,
            others = k.others_mib,
            released = k.released_mib,
            alone = k.alone_mib,
            rest = k.stored - k.in_use,
            extra = k.in_use_mib - k.alone_mib,
            per = (k.in_use_mib - k.alone_mib) * 1024.0 / (k.stored - k.in_use).max(1) as f64,
        );
    }
    s
}
