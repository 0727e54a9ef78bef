//! The live runner (issue 4): scenarios against a real `swarmtodo serve` process, with
//! real clients over loopback WebSockets and real faults (kill -9 and restart, cut
//! connections, a slow reader), checked by the same checker as the deterministic runs;
//! and the checker failing on a planted fault.
//!
//! Budget: each test stays within about 30 s in a debug build on two cores, so the
//! storms are short (`LIVE_STORM_MS`) and hub-crash kills the hub twice. The long live
//! runs are in `simulations/README.md`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::path::{Path, PathBuf};

use swarmtodo::sim::{run_live, LiveConfig, LiveFault, RunOutcome, Scenario};

/// Storm length of a live test, milliseconds.
const LIVE_STORM_MS: u64 = 5_000;
/// Longest wait for quiescence after it, milliseconds.
const LIVE_SETTLE_MS: u64 = 20_000;
/// Hub kills in the hub-crash test.
const LIVE_KILLS: u32 = 2;

fn scenario_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("simulations")
        .join(format!("{name}.toml"))
}

/// The scenario file, with a short storm.
fn brief(name: &str) -> Scenario {
    let mut s = Scenario::load(&scenario_path(name)).unwrap();
    s.duration_ms = s.duration_ms.min(LIVE_STORM_MS);
    s.settle_ms_max = s.settle_ms_max.min(LIVE_SETTLE_MS);
    s.faults.hub_crashes = s.faults.hub_crashes.min(LIVE_KILLS);
    s
}

fn config(seed: u64, fault: Option<LiveFault>) -> LiveConfig {
    LiveConfig {
        seed,
        work_dir: std::env::temp_dir(),
        hub_bin: PathBuf::from(env!("CARGO_BIN_EXE_swarmtodo")),
        fault,
        trace: true,
    }
}

fn must_pass(o: &RunOutcome) {
    assert!(
        o.passed(),
        "live {} seed {} failed (rerun: cargo run -- sim simulations/{}.toml --live --seed {}): {:#?}\nlog:\n{}",
        o.scenario,
        o.seed,
        o.scenario,
        o.seed,
        o.failures(),
        o.trace.join("\n")
    );
}

fn check<'a>(o: &'a RunOutcome, name: &str) -> &'a swarmtodo::sim::check::Check {
    o.checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}"))
}

#[test]
fn lead_and_subagents_live_passes() {
    let o = run_live(&brief("lead-and-subagents"), &config(1, None)).unwrap();
    must_pass(&o);
    let live = o.live.as_ref().unwrap();
    assert!(o.stats.writes > 5, "the agents wrote: {:?}", o.stats);
    assert!(live.acked > 5, "writes were acknowledged: {live:?}");
    assert_eq!(live.acked_lost, 0);
    assert!(!o.latencies_ms.is_empty(), "write → everyone measured");
    assert!(live.hub_peak_rss_kib > 0, "the hub's memory was read");
    assert!(!check(&o, "converged").skipped && check(&o, "converged").ok);
}

#[test]
fn hub_crash_live_survives_kills_cuts_and_a_slow_reader() {
    let s = brief("hub-crash");
    assert!(s.faults.connection_cuts > 0 && s.faults.slow_readers > 0);
    let o = run_live(&s, &config(2, None)).unwrap();
    must_pass(&o);
    let live = o.live.as_ref().unwrap();
    assert_eq!(live.kills, u64::from(LIVE_KILLS), "{}", o.trace.join("\n"));
    assert!(live.cuts > 0, "connections were cut: {live:?}");
    assert_eq!(live.acked_lost, 0);
    let slow = check(&o, "slow_readers_dropped");
    assert!(!slow.skipped, "the slow reader was judged: {}", slow.detail);
    assert!(
        live.slow_readers
            .iter()
            .all(|r| r.closed && r.writes > 0 && r.writer_failures == 0),
        "{:?}",
        live.slow_readers
    );
    // The rogue's injections of rules the served hub enforces were each reported once.
    let c = check(&o, "injected_reported_once");
    assert!(c.ok && !c.skipped, "{}", c.detail);
}

#[test]
fn live_checker_catches_a_store_that_lost_an_acknowledged_write() {
    let o = run_live(
        &brief("lead-and-subagents"),
        &config(3, Some(LiveFault::StoreLosesAckedWrite)),
    )
    .unwrap();
    let failed: Vec<&str> = o.checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
    assert!(failed.contains(&"acknowledged_durable"), "{failed:?}");
    assert!(
        o.live.as_ref().unwrap().acked_lost > 0,
        "{:?}",
        o.live.as_ref().unwrap()
    );
    // Everything that ran live was fine: only the store file was tampered with.
    assert!(check(&o, "converged").ok && check(&o, "replicas_identical").ok);
    if let Some(dir) = &o.live.as_ref().unwrap().kept_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
}
