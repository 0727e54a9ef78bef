//! The live runner (`swarmtodo sim FILE --live`): the scenario against a real
//! `swarmtodo serve` process, with real clients over loopback WebSockets and faults made
//! for real.
//!
//! - The hub is a child process on `127.0.0.1` with its SQLite file in the run's
//!   folder ([`hub`]). A hub crash is `kill -9`, then a restart on the same data file
//!   and, when the port is still free, the same port (else the agents are pointed at the
//!   new one).
//! - The hub runs with a configuration file written for the run ([`Access`]): a token
//!   per agent (its sessions share it) with the agent's role — workers and the rogue
//!   are workers, so ownership is enforced as in the deterministic runs — and tokens of
//!   their own for the checker's read-back and the slow readers. Every connection,
//!   raw ones included, carries its token (`?token=`).
//! - Each agent syncs each of its lists with the real client ([`Connection`]), acts at
//!   the scenario's rate with the behaviours the deterministic runner uses
//!   ([`super::behave`]), and reconnects with the client's backoff ([`session`]). An
//!   agent of several sessions has a session (replica and connection) per list per
//!   session; sessions race each other with `race_start`.
//! - Connection cuts drop an agent's connection without a close; partitions keep agents
//!   off the hub (they write on); slow readers are raw peers that never read ([`raw`]).
//! - "Acknowledged" is what the client sees: its sync ended with the hub's heads equal
//!   to its own, and the hub answers only after its commit is durable.
//!
//! After the storm the runner waits for quiescence (every agent connected and in sync,
//! every list's replicas at one version), reads the hub's state with a fresh client,
//! stops the hub with SIGTERM, opens its SQLite file and runs the checker of
//! [`super::check`]. What cannot be checked live is reported as skipped, with the reason.
//! Timing is wall-clock, so a live run is not reproducible from its seed; the seed fixes
//! the agents, their choices and the fault schedule.
//!
//! Here: [`run_live`]. The run's storm, quiescence and read-back are the controller's
//! (`controller`), the verdict the judge's (`judge`); the tokens are in `access`, and
//! what the sessions and the controller share in `shared`.
//!
//! [`Connection`]: swarmtodo_client::Connection

mod access;
mod cluster;
mod controller;
mod hub;
mod judge;
mod nats;
mod raw;
mod session;
mod shared;

use std::time::{Duration, Instant};

pub use self::access::{Access, CHECKER_AGENT, SLOW_READER_AGENT, SLOW_WRITER_AGENT};
use self::controller::drive;
pub use self::controller::{
    LOG_LINES_MAX, QUIET_SAMPLES, READ_BACK_RETRY, READ_BACK_TIMEOUT, SETUP_TIMEOUT,
    SLOW_READER_WINDOW_MS,
};
use self::hub::HubCommand;
pub use self::hub::{HUB_START_TIMEOUT, HUB_STOP_TIMEOUT};
use self::judge::judge;
pub(crate) use self::judge::terms_text;
pub use self::nats::{nats_server_bin, NatsProcess, Relay, NATS_START_TIMEOUT};
pub use self::raw::{
    BAD_FRAME_TIMEOUT, SLOW_READER_CLOSE_WAIT, SLOW_READER_RCVBUF_BYTES, SLOW_READER_WRITES_MAX,
    SLOW_READER_WRITE_TASKS,
};
pub use self::session::{RACE_ANSWER_TIMEOUT, SYNC_STALL};
pub use super::outcome::{ClusterStats, LiveConfig, LiveFault, LiveStats, SlowReaderOutcome};
use super::outcome::{RunOutcome, SimError};
use super::scenario::Scenario;

/// Runs one live seed of `scenario`.
pub fn run_live(scenario: &Scenario, cfg: &LiveConfig) -> Result<RunOutcome, SimError> {
    let started = Instant::now();
    let dir = cfg.work_dir.join(format!(
        "swarmtodo-live-{}-{}-{}",
        std::process::id(),
        scenario.name,
        cfg.seed
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| SimError::Io(dir.display().to_string(), e))?;
    let access = Access::new(scenario, cfg.seed, cfg.fault)?;
    // One hub, or a cluster's: each with its configuration, store and log.
    let cmds = match &scenario.cluster {
        None => vec![hub_command(cfg, &dir, "hub", access.toml())?],
        Some(c) => (0..c.hubs)
            .map(|i| {
                let toml = format!(
                    "{}\n[cluster]\nlease_ms = {}\nrollup_after_commits = {}\n",
                    access.toml(),
                    c.lease_ms,
                    c.rollup_after_commits
                );
                hub_command(cfg, &dir, &format!("hub-{i}"), &toml)
            })
            .collect::<Result<_, _>>()?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| SimError::Io("the async runtime".into(), e))?;
    let ended = runtime.block_on(drive(scenario, cfg, cmds, &access, &dir));
    runtime.shutdown_timeout(Duration::from_secs(1));
    let mut outcome = judge(scenario, cfg, &access, ended?, started)?;
    if outcome.passed() {
        // Best effort: a leftover folder only costs disk.
        let _ = std::fs::remove_dir_all(&dir);
    } else if let Some(live) = outcome.live.as_mut() {
        live.kept_dir = Some(dir.display().to_string());
    }
    Ok(outcome)
}

/// Hub `name` of a run in `dir`: its configuration file (`toml`), store and log there.
fn hub_command(
    cfg: &LiveConfig,
    dir: &std::path::Path,
    name: &str,
    toml: &str,
) -> Result<HubCommand, SimError> {
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, toml).map_err(|e| SimError::Io(config.display().to_string(), e))?;
    Ok(HubCommand {
        bin: cfg.hub_bin.clone(),
        data: dir.join(format!("{name}.db")),
        config,
        log: dir.join(format!("{name}.log")),
        extra: Vec::new(),
    })
}
