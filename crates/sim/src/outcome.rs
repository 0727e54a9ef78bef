//! The types of a run, shared by the deterministic runner ([`super::runner`]), the live
//! one ([`super::live`]), the checker ([`super::check`]) and the report
//! ([`super::report`]): how to run a seed ([`RunConfig`], [`LiveConfig`]), the bugs
//! planted on purpose ([`Fault`], [`LiveFault`]), and what a run produced
//! ([`RunOutcome`], with its [`Stats`], [`Injection`]s, [`Check`]s and, for a live run,
//! [`LiveStats`]), or why it could not be carried out ([`SimError`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use super::scenario::{Action, ScenarioError};
use swarmtodo_proto::Rule;
use swarmtodo_store::StoreError;

/// Why a run could not be carried out (a failed check is not an error: it is in the
/// [`RunOutcome`]).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The store failed (the run's own SQLite file).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A file or folder of the run.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The scenario cannot be set up as given.
    #[error("setup: {0}")]
    Setup(String),
    /// The event queue hit its bound.
    #[error("more than {0} events waiting: the scenario is too large for the simulator")]
    QueueFull(usize),
    /// The scenario file.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
}

/// Interval of the divergence samples (and of the quiescence test after the storm).
pub const SAMPLE_MS: u64 = 100;

/// A bug planted on purpose, to prove that the checker catches it. Hooks in the
/// simulation only; the product code is untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// One replica silently drops the first change of another agent that it receives,
    /// and keeps dropping it.
    ReplicaDropsChange,
    /// The store gets the first violation event twice (an authority that reports twice).
    DoubleReport,
    /// The store acknowledges a commit before it is durable and loses the last one.
    StoreLosesLastWrite,
    /// One event frame between the store and a peer is lost (the first one).
    DropEvent,
    /// One event frame reaches its peer twice (the first one).
    DuplicateEvent,
}

/// How to run one seed.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The seed: every choice of the run follows from it.
    pub seed: u64,
    /// Where the run's SQLite file goes (a folder per run, removed afterwards).
    pub work_dir: PathBuf,
    /// A planted bug, for the checker's own tests.
    pub fault: Option<Fault>,
    /// Keep the trace lines (the digest is always computed).
    pub trace: bool,
}

/// A violation the scenario caused on purpose, and must see reported exactly once.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Injection {
    /// The rule it breaks.
    pub rule: Rule,
    /// The list (index).
    pub list: usize,
    /// The agent that did it.
    pub agent: String,
    /// The change that did it (hex): the reported violation names it.
    pub change: String,
    /// The other changes of a race (hex): the violation arises when the hub has merged
    /// them all, and names the one it merged last (or all, merged together), so a
    /// report naming any of `change` and these counts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<String>,
    /// What it did.
    pub action: Action,
    /// When, simulated milliseconds.
    pub at_ms: u64,
}

/// Counters of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Actions agents attempted.
    pub ops: u64,
    /// Writes that made a change.
    pub writes: u64,
    /// Writes the model refused, by error code.
    pub refused: BTreeMap<String, u64>,
    /// Actions with nothing to do (no task fits, or the rogue waiting for its ack).
    pub idle: u64,
    /// Frames sent.
    pub frames: u64,
    /// Frames lost by the network.
    pub dropped: u64,
    /// Frames delivered twice.
    pub duplicated: u64,
    /// Frames held back for reordering.
    pub reordered: u64,
    /// Frames the hub took in one batch with others.
    pub batched: u64,
    /// Hub kills.
    pub hub_crashes: u64,
    /// Partitions.
    pub partitions: u64,
    /// Agent connections opened.
    pub connects: u64,
    /// Reconnects after a stalled sync.
    pub stall_resets: u64,
    /// Keepalive sync messages sent by idle agents.
    pub keepalives: u64,
    /// Commits made durable.
    pub commits: u64,
    /// Compactions.
    pub compactions: u64,
    /// Closes of agents' own connections by the hub, by code and reason.
    pub closes: BTreeMap<String, u64>,
    /// Frames an agent could not decode or sync messages its replica refused.
    pub agent_errors: u64,
    /// Side connections the rogue opened for bad frames.
    pub bad_frames: u64,
}

impl Stats {
    /// Counts a write the model refused, by its error code.
    pub(crate) fn refused_write(&mut self, e: &swarmtodo_proto::ApiError) {
        *self.refused.entry(format!("{:?}", e.code)).or_default() += 1;
    }
}

/// Everything one seed produced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunOutcome {
    /// The scenario.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// The planted fault, if any.
    pub fault: Option<Fault>,
    /// Simulated milliseconds from the end of the storm to quiescence (None: never).
    pub convergence_ms: Option<u64>,
    /// Simulated end of the run.
    pub end_ms: u64,
    /// Write-to-acknowledgement latencies, simulated milliseconds, in write order.
    pub latencies_ms: Vec<u64>,
    /// `(simulated ms, replicas whose heads differ from the hub's)`.
    pub divergence: Vec<(u64, u64)>,
    /// Counters.
    pub stats: Stats,
    /// Injected violations.
    pub injected: Vec<Injection>,
    /// Per rule: injected, reported for an injection, reported in all.
    pub rules: BTreeMap<String, RuleCount>,
    /// The checker's verdicts.
    pub checks: Vec<Check>,
    /// The final version of each list.
    pub versions: Vec<String>,
    /// Digest of the whole trace.
    pub trace_digest: u64,
    /// Trace lines (when asked for).
    #[serde(skip)]
    pub trace: Vec<String>,
    /// Wall-clock milliseconds the run took (not part of the trace).
    pub wall_ms: u64,
    /// What only a live run measures (None: a deterministic run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveStats>,
}

impl RunOutcome {
    /// True when every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    /// The failed checks, one line each.
    pub fn failures(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect()
    }
}

/// One verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// It holds.
    pub ok: bool,
    /// What was found (the first problems, or a summary).
    pub detail: String,
    /// Not checked in this kind of run (the detail says why): neither passed nor failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
}

impl Check {
    /// A check that cannot apply here, and why.
    pub fn skipped(name: &'static str, why: String) -> Check {
        Check {
            name,
            ok: true,
            detail: format!("skipped: {why}"),
            skipped: true,
        }
    }
}

/// Violations of one rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RuleCount {
    /// Caused on purpose.
    pub injected: u64,
    /// Injected ones reported exactly once.
    pub reported_once: u64,
    /// Violation events of this rule in the store (injected or arising).
    pub reported: u64,
}

/// How to run one live seed.
#[derive(Debug, Clone)]
pub struct LiveConfig {
    /// The seed: agents, their choices and the fault schedule follow from it (timing is
    /// the machine's).
    pub seed: u64,
    /// Where the run's folder goes (the hub's SQLite file and its log). Removed after a
    /// passing run, kept after a failing one.
    pub work_dir: PathBuf,
    /// The `swarmtodo` binary to run as the hub.
    pub hub_bin: PathBuf,
    /// A bug planted on purpose, for the checker's own tests.
    pub fault: Option<LiveFault>,
    /// Keep the controller's log (kills, restarts, cuts, slow readers) in the outcome.
    pub trace: bool,
    /// The nats-server of a scenario with a `[cluster]` (`None`:
    /// `SWARMTODO_NATS_SERVER`, else `nats-server` on the `PATH`).
    pub nats_bin: Option<PathBuf>,
}

/// A bug planted on purpose in a live run, to show that the checker catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LiveFault {
    /// After the hub has stopped, the most recent acknowledged change still in the
    /// store's change table is deleted from the SQLite file (a store that lost an
    /// acknowledged write).
    StoreLosesAckedWrite,
    /// The hub's configuration file gives every agent's token a lead's role (a hub that
    /// does not enforce the scenario's roles): a worker's edits of other agents' tasks
    /// go unreported, and the checker, which keeps the scenario's roles, must say so.
    HubIgnoresRoles,
}

/// What only a live run measures.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LiveStats {
    /// Peak resident memory of the hub process (largest `VmHWM` of its incarnations),
    /// KiB.
    pub hub_peak_rss_kib: u64,
    /// Write → the writer's sync saw the hub's heads equal its own, milliseconds.
    pub ack_latencies_ms: Vec<u64>,
    /// Storm length, milliseconds.
    pub storm_ms: u64,
    /// `kill -9` of the hub.
    pub kills: u64,
    /// A cluster's hubs paused past their lease, then woken (zombies).
    pub pauses: u64,
    /// A cluster's hubs cut from NATS, then reconnected.
    pub nats_cuts: u64,
    /// Restarts that could not have the old port and moved the agents to a new one.
    pub restarts_on_new_port: u64,
    /// Connection cuts that hit a live connection.
    pub cuts: u64,
    /// Slow readers, judged or not.
    pub slow_readers: Vec<SlowReaderOutcome>,
    /// Changes acknowledged to their writers.
    pub acked: u64,
    /// Acknowledged changes missing from the hub or the store at the end.
    pub acked_lost: u64,
    /// Writes that never reached every other agent of their list.
    pub unpropagated: u64,
    /// Times the hub process ended without being killed or stopped.
    pub hub_exits: Vec<String>,
    /// The hub's exit after SIGTERM.
    pub hub_stop: String,
    /// The planted fault, if any.
    pub fault: Option<LiveFault>,
    /// The run's folder, when it was kept (a failing run).
    pub kept_dir: Option<String>,
    /// What only a run of a cluster measures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStats>,
}

/// What only a live run of a cluster measures: who wrote the lists' logs, and the terms
/// as a list's authority that ended.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ClusterStats {
    /// Fences in the lists' logs: each a hub taking a list.
    pub fences: u64,
    /// Records of the lists' logs read as they grew.
    pub records_audited: u64,
    /// Commits written by another hub than the one whose fence opens their stretch of
    /// the log (the first few): two authorities at once.
    pub authority_problems: Vec<String>,
    /// Terms as a list's authority that ended while a hub held them, by the code of the
    /// refusal that ended them, from the hubs' logs: `cluster_fenced` (an append refused
    /// by the log), `cluster_lease_expired` (the hub's own clock), `cluster_lease_lost`
    /// (a renewal refused).
    pub terms_ended: std::collections::BTreeMap<String, u64>,
}

/// What became of one slow reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SlowReaderOutcome {
    /// Writes of the well-behaved client on its list while it was stuck (each relayed
    /// to the slow reader by the hub).
    pub writes: u64,
    /// The hub dropped it (its pings started failing).
    pub closed: bool,
    /// Milliseconds from its request to being dropped.
    pub closed_after_ms: Option<u64>,
    /// Writes of the well-behaved client that the hub did not acknowledge (the slow
    /// reader must not hold anyone else up).
    pub writer_failures: u64,
    /// It could not even join (the hub was down).
    pub no_hub: bool,
}
