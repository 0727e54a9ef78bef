//! The live runner: scenarios against a real `swarmtodo serve` process started
//! with the scenario's roles and tokens, with real clients over loopback WebSockets and
//! real faults (kill -9 and restart, cut connections, a slow reader), checked by the same
//! checker as the deterministic runs — ownership included; and the checker failing on
//! planted faults.
//!
//! Budget: each test stays within about 30 s in a debug build on two cores, so the
//! storms are short (`LIVE_STORM_MS`) and hub-crash kills the hub twice. The long live
//! runs are in `simulations/README.md`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::path::{Path, PathBuf};

use swarmtodo::sim::scenario::{Mix, RoleSpec};
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
        nats_bin: None,
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
    // The rogue's injections, ownership included, were each reported once.
    let c = check(&o, "injected_reported_once");
    assert!(c.ok && !c.skipped, "{}", c.detail);
    // Live, only what cannot apply is skipped: event frames are not recorded, and one
    // hub is no cluster.
    assert!(o
        .checks
        .iter()
        .all(|c| !c.skipped
            || ["frames_faults", "events_delivered", "one_authority"].contains(&c.name)));
}

/// The nats-server `.ci/run` installs (`target/nats-venv`), unless
/// `SWARMTODO_NATS_SERVER` names one.
#[cfg(feature = "nats")]
fn nats_bin() -> PathBuf {
    std::env::var_os("SWARMTODO_NATS_SERVER").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("target/nats-venv/bin/nats-server"),
        PathBuf::from,
    )
}

/// Three hubs on one NATS: the authority of a list killed, paused past its lease and
/// cut from NATS while agents at every hub write on. Nothing acknowledged is lost, each
/// injected violation is reported once, every replica converges, and the logs the
/// checker reads hold every list whole.
#[cfg(feature = "nats")]
#[test]
fn cluster_failover_live_survives_kills_zombies_and_cuts_from_nats() {
    let mut s = brief("cluster-failover");
    // Each fault once within the brief storm, far enough apart to be seen alone.
    s.duration_ms = 9_000;
    s.faults.hub_pauses = 1;
    s.faults.nats_cuts = 1;
    s.faults.hub_crashes = 1;
    let mut cfg = config(7, None);
    cfg.nats_bin = Some(nats_bin());
    let o = run_live(&s, &cfg).unwrap();
    must_pass(&o);
    let live = o.live.as_ref().unwrap();
    assert_eq!(
        (live.kills, live.pauses, live.nats_cuts),
        (1, 1, 1),
        "{}",
        o.trace.join("\n")
    );
    assert!(live.acked > 5, "writes were acknowledged: {live:?}");
    assert_eq!(live.acked_lost, 0);
    let c = check(&o, "injected_reported_once");
    assert!(c.ok && !c.skipped, "{}", c.detail);
    assert!(!check(&o, "converged").skipped && check(&o, "converged").ok);
    // One authority at a time, as the logs show: the hubs that took the lists (one
    // fence each: the first take, and at least one for every fault that moved a list).
    let c = check(&o, "one_authority");
    assert!(c.ok && !c.skipped, "{}", c.detail);
    let cluster = live.cluster.as_ref().unwrap();
    assert!(cluster.fences >= 2, "{cluster:?}");
    assert!(cluster.records_audited > cluster.fences, "{cluster:?}");
}

/// rogue-agent with a rogue that mostly edits the lead's tasks (a worker overstepping),
/// and sometimes writes an invalid status.
fn overstepping_rogue() -> Scenario {
    let mut s = brief("rogue-agent");
    let rogue = s
        .agents
        .iter_mut()
        .find(|g| g.role == RoleSpec::Rogue)
        .unwrap();
    rogue.mix = Mix {
        foreign_task: 3,
        invalid_status: 1,
        ..Mix::default()
    };
    s
}

#[test]
fn rogue_live_ownership_violations_are_enforced_and_reported_once() {
    let o = run_live(&overstepping_rogue(), &config(4, None)).unwrap();
    must_pass(&o);
    let own = o.rules["ownership"];
    assert!(
        own.injected > 0,
        "the rogue edited the lead's tasks: {:?}",
        o.rules
    );
    assert_eq!(own.reported_once, own.injected, "{:?}", o.rules);
    let c = check(&o, "injected_reported_once");
    assert!(c.ok && !c.skipped, "{}", c.detail);
    // Ownership is checked live, not skipped: what is skipped cannot apply here.
    let skipped: Vec<&str> = o
        .checks
        .iter()
        .filter(|c| c.skipped)
        .map(|c| c.name)
        .collect();
    assert_eq!(
        skipped,
        [
            "events_delivered",
            "slow_readers_dropped",
            "one_authority",
            "frames_faults"
        ]
    );
}

#[test]
fn live_checker_catches_a_hub_that_ignores_roles() {
    let o = run_live(
        &overstepping_rogue(),
        &config(5, Some(LiveFault::HubIgnoresRoles)),
    )
    .unwrap();
    let failed: Vec<&str> = o.checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
    assert_eq!(failed, ["injected_reported_once"], "{:#?}", o.failures());
    let own = o.rules["ownership"];
    assert!(own.injected > 0 && own.reported == 0, "{:?}", o.rules);
    // The rules the hub enforces whatever the roles still held.
    let schema = o.rules["schema"];
    assert_eq!(schema.reported_once, schema.injected, "{:?}", o.rules);
    if let Some(dir) = &o.live.as_ref().unwrap().kept_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn single_active_race_live_reports_every_race_once() {
    let o = run_live(&brief("single-active-race"), &config(6, None)).unwrap();
    must_pass(&o);
    let c = o.rules["single_active"];
    assert!(
        c.injected > 0,
        "sessions raced: {:?} {:?}",
        o.rules,
        o.stats
    );
    assert_eq!(c.reported_once, c.injected, "{:?}", o.rules);
    assert_eq!(c.reported, c.injected, "{:?}", o.rules);
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
