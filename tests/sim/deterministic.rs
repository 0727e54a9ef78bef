//! The deterministic simulation: every scenario of `simulations/` passes its
//! checks on a few seeds, a seed replays to the same trace, and the checker catches the
//! bugs planted on purpose.
//!
//! Budget: the whole file stays within about a minute in a debug build on two cores,
//! so the scenarios run here are shortened (see `quick`): at most `QUICK_STORM_MS` of
//! storm, two crashes, two partitions, and swarm-1000 thinned to 100 agents. The full
//! scenarios and long seed ranges run in release (`simulations/README.md`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::path::{Path, PathBuf};

use swarmtodo::sim::{run, Fault, RunConfig, RunOutcome, Scenario};

/// Longest storm of a scenario in these tests, simulated milliseconds.
const QUICK_STORM_MS: u64 = 3_000;
/// Seeds per scenario in these tests.
const QUICK_SEEDS: u64 = 2;

fn scenario_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("simulations")
        .join(format!("{name}.toml"))
}

/// The scenario file, shortened for a debug build.
fn quick(name: &str) -> Scenario {
    let mut s = Scenario::load(&scenario_path(name)).unwrap();
    s.duration_ms = s.duration_ms.min(QUICK_STORM_MS);
    s.settle_ms_max = s.settle_ms_max.min(30_000);
    s.faults.hub_crashes = s.faults.hub_crashes.min(2);
    s.faults.partitions = s.faults.partitions.min(2);
    for g in &mut s.agents {
        // 1,000 agents are for release runs; a tenth keeps the shape.
        if g.count > 100 {
            g.count /= 10;
        }
    }
    s
}

fn config(seed: u64, fault: Option<Fault>, trace: bool) -> RunConfig {
    RunConfig {
        seed,
        work_dir: std::env::temp_dir(),
        fault,
        trace,
    }
}

fn must_pass(o: &RunOutcome) {
    assert!(
        o.passed(),
        "scenario {} seed {} failed (replay: cargo run -- sim simulations/{}.toml --seed {}): {:#?}",
        o.scenario,
        o.seed,
        o.scenario,
        o.seed,
        o.failures()
    );
}

fn passes(name: &str) {
    let s = quick(name);
    for seed in 0..QUICK_SEEDS {
        must_pass(&run(&s, &config(seed, None, false)).unwrap());
    }
}

#[test]
fn every_scenario_file_loads() {
    for name in [
        "lead-and-subagents",
        "contention",
        "partition-heal",
        "hub-crash",
        "rogue-agent",
        "swarm-1000",
        "single-active-race",
    ] {
        let s = Scenario::load(&scenario_path(name)).unwrap();
        assert_eq!(s.name, name);
    }
    let swarm = Scenario::load(&scenario_path("swarm-1000")).unwrap();
    assert_eq!(swarm.agents().len(), 1_000);
    assert_eq!(swarm.lists.count, 10);
}

#[test]
fn lead_and_subagents_passes() {
    passes("lead-and-subagents");
}

#[test]
fn contention_passes() {
    passes("contention");
}

#[test]
fn partition_heal_passes() {
    passes("partition-heal");
}

#[test]
fn hub_crash_passes() {
    let s = quick("hub-crash");
    for seed in 0..QUICK_SEEDS {
        let o = run(&s, &config(seed, None, false)).unwrap();
        must_pass(&o);
        assert_eq!(
            o.stats.hub_crashes, 2,
            "seed {seed}: the hub was killed twice"
        );
    }
}

#[test]
fn rogue_agent_passes_and_its_violations_are_counted() {
    let s = quick("rogue-agent");
    for seed in 0..QUICK_SEEDS {
        let o = run(&s, &config(seed, None, false)).unwrap();
        must_pass(&o);
        let injected: u64 = o.rules.values().map(|c| c.injected).sum();
        let once: u64 = o.rules.values().map(|c| c.reported_once).sum();
        assert!(injected > 0, "seed {seed}: the rogue injected nothing");
        assert_eq!(once, injected, "seed {seed}: {:?}", o.rules);
        assert!(o.stats.bad_frames > 0, "seed {seed}: no bad frame sent");
    }
}

/// Seeds of the single-active race in these tests.
const RACE_SEEDS: u64 = 3;

#[test]
fn single_active_races_are_each_reported_once() {
    let s = quick("single-active-race");
    assert!(s
        .agents
        .iter()
        .any(|g| g.sessions > 1 && g.mix.race_start > 0));
    for seed in 0..RACE_SEEDS {
        let o = run(&s, &config(seed, None, false)).unwrap();
        must_pass(&o);
        let c = o.rules["single_active"];
        assert!(
            c.injected > 0,
            "seed {seed}: no race was run: {:?}",
            o.stats
        );
        // Every race reported exactly once, and every single-active report is a race's.
        assert_eq!(c.reported_once, c.injected, "seed {seed}: {:?}", o.rules);
        assert_eq!(c.reported, c.injected, "seed {seed}: {:?}", o.rules);
        assert!(o.injected.iter().all(|i| i.also.len() == 1));
    }
}

#[test]
fn swarm_passes_thinned() {
    let s = quick("swarm-1000");
    let o = run(&s, &config(0, None, false)).unwrap();
    must_pass(&o);
}

#[test]
fn a_seed_replays_to_the_same_trace() {
    let s = quick("partition-heal");
    let a = run(&s, &config(11, None, true)).unwrap();
    let b = run(&s, &config(11, None, true)).unwrap();
    assert!(a.trace.len() > 100, "a trace worth comparing");
    assert_eq!(a.trace, b.trace);
    assert_eq!(a.trace_digest, b.trace_digest);
    assert_eq!(a.versions, b.versions);
    assert_eq!(a.latencies_ms, b.latencies_ms);
    let c = run(&s, &config(12, None, true)).unwrap();
    assert_ne!(a.trace_digest, c.trace_digest, "another seed, another run");
}

/// The checks that fail for `seed` of `s` with `fault` planted; the same seed without
/// the fault must pass (so what fails is the fault's doing).
fn failed_checks(s: &Scenario, seed: u64, fault: Fault) -> Vec<&'static str> {
    must_pass(&run(s, &config(seed, None, false)).unwrap());
    let o = run(s, &config(seed, Some(fault), false)).unwrap();
    o.checks.iter().filter(|c| !c.ok).map(|c| c.name).collect()
}

#[test]
fn checker_catches_a_replica_that_drops_a_change() {
    let mut s = quick("lead-and-subagents");
    s.settle_ms_max = 5_000;
    let failed = failed_checks(&s, 3, Fault::ReplicaDropsChange);
    assert!(failed.contains(&"replicas_identical"), "{failed:?}");
    assert!(failed.contains(&"converged"), "{failed:?}");
}

#[test]
fn checker_catches_an_authority_that_reports_twice() {
    let s = quick("rogue-agent");
    let failed = failed_checks(&s, 3, Fault::DoubleReport);
    assert!(failed.contains(&"reported_once"), "{failed:?}");
}

#[test]
fn checker_catches_a_store_that_loses_the_last_write() {
    let s = quick("lead-and-subagents");
    let failed = failed_checks(&s, 3, Fault::StoreLosesLastWrite);
    assert!(failed.contains(&"acknowledged_durable"), "{failed:?}");
    assert!(failed.contains(&"store_reloads"), "{failed:?}");
}

#[test]
fn checker_catches_an_event_lost_between_store_and_peer() {
    let s = quick("lead-and-subagents");
    let failed = failed_checks(&s, 3, Fault::DropEvent);
    assert_eq!(failed, ["events_delivered"]);
}

#[test]
fn checker_catches_an_event_sent_twice() {
    let s = quick("lead-and-subagents");
    let failed = failed_checks(&s, 3, Fault::DuplicateEvent);
    assert_eq!(failed, ["events_delivered"]);
}
