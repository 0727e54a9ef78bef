//! Deterministic simulation of swarms against the real hub core.
//!
//! A [`Scenario`] (TOML in `simulations/`) says who the agents are, what they do, and
//! which faults hit them. [`run`] plays one seed of it in one thread: the real
//! [`HubCore`](swarmtodo_core::hub::HubCore) with its authority, real [`TodoList`]
//! replicas for the agents, and a real SQLite [`Db`](swarmtodo_store::Db) that the hub
//! restarts from after a crash — over a simulated network that drops, duplicates,
//! delays and reorders frames. Everything follows from the seed, so a failing seed
//! replays identically. Once the run is quiet, the [`check`] module says whether the
//! lists converged, every injected violation was reported exactly once, nothing
//! acknowledged was lost, the event streams have no gap and the store reloads to the
//! same state. [`report`] turns many runs into a table, JSON and an SVG picture.
//!
//! [`live`] plays a scenario for real instead ([`run_live`]): a `swarmtodo serve`
//! process, the real client over loopback WebSockets, kill -9 and restart, cut
//! connections and slow readers — then the same checker on the clients' replicas, the
//! hub's state and its SQLite file. Its agents make their choices with the same code
//! (`behave`) as the deterministic ones.
//!
//! ```no_run
//! use swarmtodo_sim::{run, RunConfig, Scenario};
//!
//! let scenario = Scenario::load("simulations/contention.toml".as_ref()).unwrap();
//! let config = RunConfig { seed: 7, work_dir: std::env::temp_dir(), fault: None, trace: false };
//! let outcome = run(&scenario, &config).unwrap();
//! assert!(outcome.passed(), "seed 7: {:?}", outcome.failures());
//! ```
//!
//! [`TodoList`]: swarmtodo_core::model::TodoList

pub(crate) mod behave;
pub mod check;
pub mod live;
pub mod net;
mod outcome;
pub mod report;
pub mod rng;
pub mod runner;
pub mod scenario;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub use self::live::{run_live, LiveConfig, LiveFault};
pub use self::outcome::{Fault, Injection, RunConfig, RunOutcome, SimError};
pub use self::runner::run;
pub use self::scenario::{Scenario, ScenarioError};

/// Runs the seeds `seeds` of `scenario` on `jobs` threads (each seed on one thread, so
/// parallelism does not touch determinism), calling `done` after each. Outcomes come
/// back in seed order.
pub fn run_seeds(
    scenario: &Scenario,
    seeds: Range<u64>,
    base: &RunConfig,
    jobs: usize,
    done: &(dyn Fn(&RunOutcome) + Sync),
) -> Result<Vec<RunOutcome>, SimError> {
    let next = AtomicU64::new(seeds.start);
    let results: Mutex<Vec<Result<RunOutcome, (u64, SimError)>>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds.end {
                    break;
                }
                let cfg = RunConfig {
                    seed,
                    ..base.clone()
                };
                let r = run(scenario, &cfg).map_err(|e| (seed, e));
                if let Ok(o) = &r {
                    done(o);
                }
                if let Ok(mut all) = results.lock() {
                    all.push(r);
                }
            });
        }
    });
    let mut out = Vec::new();
    for r in results.into_inner().unwrap_or_else(|p| p.into_inner()) {
        match r {
            Ok(o) => out.push(o),
            Err((seed, e)) => {
                return Err(SimError::Setup(format!("seed {seed}: {e}")));
            }
        }
    }
    out.sort_by_key(|o| o.seed);
    Ok(out)
}
