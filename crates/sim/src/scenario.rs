//! Scenarios: what a simulation runs, read from a TOML file.
//!
//! A scenario names its lists, its agents (in groups with a role, a rate, a mix of
//! behaviours and how many sessions each agent runs under its one id), the network
//! (latency, drops, duplicates, reordering) and the faults (partitions, hub crashes). Unknown keys are refused, and every error names the
//! field it is about (`agents[1].rate_per_s: …`).
//!
//! The types are plain data: the deterministic runner reads them, and so can a live
//! runner against a real hub process.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Most agents in one scenario.
pub const AGENTS_MAX: usize = 10_000;
/// Most lists in one scenario.
pub const LISTS_MAX: usize = 1_000;
/// Longest storm, in simulated milliseconds (one simulated day).
pub const DURATION_MS_MAX: u64 = 24 * 60 * 60 * 1_000;
/// Most tasks in a list's first plan.
pub const INITIAL_TASKS_MAX: usize = 1_000;
/// Most hub crashes in one run.
pub const HUB_CRASHES_MAX: u32 = 10_000;
/// Most partitions in one run.
pub const PARTITIONS_MAX: u32 = 10_000;
/// Most connection cuts in one live run.
pub const CONNECTION_CUTS_MAX: u32 = 10_000;
/// Most slow readers in one live run.
pub const SLOW_READERS_MAX: u32 = 100;
/// Most hubs of a live cluster run.
pub const CLUSTER_HUBS_MAX: usize = 9;
/// Most pauses, or cuts from NATS, of hubs in one live cluster run.
pub const CLUSTER_FAULTS_MAX: u32 = 1_000;
/// Most sessions of one agent (replicas and connections under one agent id).
pub const SESSIONS_MAX: usize = 16;
/// Highest rate of one agent, in actions per simulated second.
pub const RATE_PER_S_MAX: f64 = 1_000.0;
/// Longest one-way network latency, in simulated milliseconds.
pub const LATENCY_MS_MAX: u64 = 60_000;

/// A scenario file, parsed and checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name (the file's stem by convention), used in reports.
    pub name: String,
    /// What the scenario stresses, for people.
    #[serde(default)]
    pub description: String,
    /// How long agents act, in simulated milliseconds. Then faults stop and the run
    /// waits for quiescence.
    pub duration_ms: u64,
    /// Longest wait for quiescence after the storm, in simulated milliseconds; a run
    /// that has not converged by then fails its convergence check.
    #[serde(default = "default_settle_ms_max")]
    pub settle_ms_max: u64,
    /// The lists.
    #[serde(default)]
    pub lists: ListsSpec,
    /// The agents, in groups.
    pub agents: Vec<AgentGroup>,
    /// The simulated network.
    #[serde(default)]
    pub network: NetworkSpec,
    /// Faults injected during the storm.
    #[serde(default)]
    pub faults: FaultSpec,
    /// Live runner only: the hub is several hubs on one NATS JetStream.
    #[serde(default)]
    pub cluster: Option<ClusterSpec>,
}

/// Live runner only: several hubs on one nats-server, each list with one authority
/// among them (docs/DESIGN.md §10). Agents are spread over the hubs; a hub crash kills
/// the hub that holds a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// How many hubs (2 to [`CLUSTER_HUBS_MAX`]).
    pub hubs: usize,
    /// Their leases' time to live, in milliseconds (at least 1,000).
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// Commits after which a list's log is rolled up into a snapshot.
    #[serde(default = "default_rollup_after_commits")]
    pub rollup_after_commits: u64,
}

fn default_lease_ms() -> u64 {
    1_000
}

fn default_rollup_after_commits() -> u64 {
    1_000
}

fn default_settle_ms_max() -> u64 {
    120_000
}

/// The lists of a scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListsSpec {
    /// How many lists (named `list-0`, `list-1`, …).
    pub count: usize,
    /// Tasks in each list's first plan (written by the list's first lead).
    pub initial_tasks: usize,
}

impl Default for ListsSpec {
    fn default() -> Self {
        ListsSpec {
            count: 1,
            initial_tasks: 6,
        }
    }
}

/// A group of agents that behave alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentGroup {
    /// The agent id, or with `count > 1` the prefix (`sub` → `sub-0`, `sub-1`, …).
    pub name: String,
    /// How many agents.
    #[serde(default = "one")]
    pub count: usize,
    /// Sessions of each agent: replicas with a connection of their own that act under
    /// the one agent id (parallel subagents sharing an identity). Each acts at
    /// `rate_per_s` with the group's mix.
    #[serde(default = "one")]
    pub sessions: usize,
    /// Their role on every list.
    pub role: RoleSpec,
    /// Which lists each agent syncs.
    #[serde(default)]
    pub lists: ListChoice,
    /// Actions per simulated second, per agent.
    pub rate_per_s: f64,
    /// The behaviour mix (relative weights).
    #[serde(default)]
    pub mix: Mix,
}

fn one() -> usize {
    1
}

/// An agent's role (docs/DESIGN.md §7), plus the rogue: a worker that misbehaves on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoleSpec {
    /// Writes everything.
    Lead,
    /// Changes only its own or unowned tasks.
    Worker,
    /// Reads only.
    Observer,
    /// A worker role at the hub that sends invalid values, other agents' tasks,
    /// garbage frames and oversize messages (the injected violations).
    Rogue,
}

/// Which lists an agent syncs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListChoice {
    /// Every list.
    #[default]
    All,
    /// One list: agent `i` of the group syncs list `i % count`.
    Spread,
}

/// Relative weights of an agent's behaviours. Absent: 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mix {
    /// Add a few tasks to the plan.
    pub plan: u32,
    /// Take an unowned open task.
    pub claim: u32,
    /// Take an unowned open task and start it at once (the race for `in_progress`).
    pub claim_start: u32,
    /// Start one of one's own pending tasks.
    pub start: u32,
    /// Complete one's task in progress.
    pub complete: u32,
    /// Cancel an open task.
    pub cancel: u32,
    /// Replace the whole list from a version seen a while ago (`base_version`).
    pub replace_stale: u32,
    /// Move a task.
    pub reorder: u32,
    /// Add a dependency between two tasks.
    pub depend: u32,
    /// With a sibling session of the same agent (`sessions` ≥ 2): both start a
    /// different one of the agent's pending tasks at once, each from a replica that
    /// agrees nothing of the agent's is in progress. Valid writes, but the merge holds
    /// two tasks in progress for one owner: an injected single-active violation. The
    /// race is decided by the hub only if no one else changes those tasks' status
    /// meanwhile (a lead's `cancel` would decide some races for it).
    pub race_start: u32,
    /// Rogue: write an invalid status (a schema violation).
    pub invalid_status: u32,
    /// Rogue: set two of its tasks `in_progress` in one change (single active).
    pub double_active: u32,
    /// Rogue: make a task depend on one that does not exist (dependencies).
    pub bad_dependency: u32,
    /// Rogue: change a task another agent owns (ownership).
    pub foreign_task: u32,
    /// Rogue: send bytes that are no automerge-repo message, on a side connection.
    pub garbage_frame: u32,
    /// Rogue: send a `sync` message whose payload is not a sync message.
    pub invalid_sync: u32,
    /// Rogue: send a frame larger than the hub accepts.
    pub oversize: u32,
    /// Rogue: make dozens to hundreds of tasks in progress for itself in one change
    /// (one single-active violation over all of them: keys and events stay bounded).
    pub wide_active: u32,
    /// Rogue: make a long dependency cycle in one change (one dependencies violation;
    /// the check's cost stays linear in the cycle).
    pub dependency_cycle: u32,
    /// Rogue: delete the root's `tasks` map (ownership: reverted).
    pub wipe_root: u32,
    /// Rogue: a `blocked_by` that is a string, or a task entry that is a string (schema).
    pub misshapen: u32,
    /// Rogue: content over `TASK_TEXT_BYTES_MAX` or an id over `TASK_ID_BYTES_MAX`
    /// (schema).
    pub over_limit: u32,
}

/// One behaviour of [`Mix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// See [`Mix::plan`].
    Plan,
    /// See [`Mix::claim`].
    Claim,
    /// See [`Mix::claim_start`].
    ClaimStart,
    /// See [`Mix::start`].
    Start,
    /// See [`Mix::complete`].
    Complete,
    /// See [`Mix::cancel`].
    Cancel,
    /// See [`Mix::replace_stale`].
    ReplaceStale,
    /// See [`Mix::reorder`].
    Reorder,
    /// See [`Mix::depend`].
    Depend,
    /// See [`Mix::race_start`].
    RaceStart,
    /// See [`Mix::invalid_status`].
    InvalidStatus,
    /// See [`Mix::double_active`].
    DoubleActive,
    /// See [`Mix::bad_dependency`].
    BadDependency,
    /// See [`Mix::foreign_task`].
    ForeignTask,
    /// See [`Mix::garbage_frame`].
    GarbageFrame,
    /// See [`Mix::invalid_sync`].
    InvalidSync,
    /// See [`Mix::oversize`].
    Oversize,
    /// See [`Mix::wide_active`].
    WideActive,
    /// See [`Mix::dependency_cycle`].
    DependencyCycle,
    /// See [`Mix::wipe_root`].
    WipeRoot,
    /// See [`Mix::misshapen`].
    Misshapen,
    /// See [`Mix::over_limit`].
    OverLimit,
}

impl Action {
    /// True for the rogue's actions.
    pub fn is_rogue(self) -> bool {
        matches!(
            self,
            Action::InvalidStatus
                | Action::DoubleActive
                | Action::BadDependency
                | Action::ForeignTask
                | Action::GarbageFrame
                | Action::InvalidSync
                | Action::Oversize
                | Action::WideActive
                | Action::DependencyCycle
                | Action::WipeRoot
                | Action::Misshapen
                | Action::OverLimit
        )
    }
}

impl Mix {
    /// `(action, weight)` for every action, in a fixed order.
    pub fn weights(&self) -> [(Action, u32); 22] {
        [
            (Action::Plan, self.plan),
            (Action::Claim, self.claim),
            (Action::ClaimStart, self.claim_start),
            (Action::Start, self.start),
            (Action::Complete, self.complete),
            (Action::Cancel, self.cancel),
            (Action::ReplaceStale, self.replace_stale),
            (Action::Reorder, self.reorder),
            (Action::Depend, self.depend),
            (Action::RaceStart, self.race_start),
            (Action::InvalidStatus, self.invalid_status),
            (Action::DoubleActive, self.double_active),
            (Action::BadDependency, self.bad_dependency),
            (Action::ForeignTask, self.foreign_task),
            (Action::GarbageFrame, self.garbage_frame),
            (Action::InvalidSync, self.invalid_sync),
            (Action::Oversize, self.oversize),
            (Action::WideActive, self.wide_active),
            (Action::DependencyCycle, self.dependency_cycle),
            (Action::WipeRoot, self.wipe_root),
            (Action::Misshapen, self.misshapen),
            (Action::OverLimit, self.over_limit),
        ]
    }

    /// Sum of the weights.
    pub fn total(&self) -> u64 {
        self.weights().iter().map(|(_, w)| u64::from(*w)).sum()
    }
}

/// The simulated network between agents and the hub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkSpec {
    /// One-way latency range `[min, max]`, simulated milliseconds.
    pub latency_ms: [u64; 2],
    /// Probability that a frame is lost during the storm.
    pub drop: f64,
    /// Probability that a frame arrives twice.
    pub duplicate: f64,
    /// Probability that a frame is held back so that later frames overtake it.
    pub reorder: f64,
}

impl Default for NetworkSpec {
    fn default() -> Self {
        NetworkSpec {
            latency_ms: [1, 20],
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
        }
    }
}

/// Faults injected during the storm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultSpec {
    /// How many times some agents go offline (and keep writing).
    pub partitions: u32,
    /// How long one partition lasts, `[min, max]` simulated milliseconds.
    pub partition_ms: [u64; 2],
    /// Fraction of the agents cut off by one partition.
    pub partition_agents: f64,
    /// How many times the hub is killed (no shutdown: what it had not committed is
    /// gone, frames in flight are lost) and restarted from its store.
    pub hub_crashes: u32,
    /// How long the hub stays down after a crash, `[min, max]` simulated milliseconds.
    pub hub_down_ms: [u64; 2],
    /// Live runner only: how many times one agent's connection is cut (dropped without
    /// a close; the client reconnects with its backoff). The deterministic runner's
    /// partitions and stall resets cover the same ground there.
    pub connection_cuts: u32,
    /// Live runner only: raw peers that join, ask for a list again and again, and never
    /// read; the hub must drop each, and no one else may notice.
    pub slow_readers: u32,
    /// Live cluster only: how many times a list's authority is paused (SIGSTOP) past
    /// its lease, then woken (SIGCONT): a zombie that acts on what it held.
    pub hub_pauses: u32,
    /// How long one pause lasts, `[min, max]` milliseconds.
    pub hub_pause_ms: [u64; 2],
    /// Live cluster only: how many times a list's authority is cut from NATS (both keep
    /// running), then reconnected.
    pub nats_cuts: u32,
    /// How long one cut from NATS lasts, `[min, max]` milliseconds.
    pub nats_cut_ms: [u64; 2],
}

impl Default for FaultSpec {
    fn default() -> Self {
        FaultSpec {
            partitions: 0,
            partition_ms: [1_000, 5_000],
            partition_agents: 0.3,
            hub_crashes: 0,
            hub_down_ms: [10, 500],
            connection_cuts: 0,
            slow_readers: 0,
            hub_pauses: 0,
            hub_pause_ms: [2_500, 4_000],
            nats_cuts: 0,
            nats_cut_ms: [2_500, 4_000],
        }
    }
}

/// A scenario file that does not load.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not TOML, or a key or value that does not fit (the message names the key).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message (with line, column and key).
        message: String,
    },
    /// A value out of range.
    #[error("{path}: {field}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// The field, as a path (`agents[1].rate_per_s`).
        field: String,
        /// What is wrong and what is allowed.
        message: String,
    },
}

impl Scenario {
    /// Reads and checks a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Scenario::parse(&text, &path.display().to_string())
    }

    /// Parses and checks scenario text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            path: origin.to_owned(),
            message: e.to_string(),
        })?;
        scenario
            .check()
            .map_err(|(field, message)| ScenarioError::Invalid {
                path: origin.to_owned(),
                field,
                message,
            })?;
        Ok(scenario)
    }

    /// Every session of every agent, in a fixed order: `(group index, agent id, list
    /// indexes)`. An agent of `sessions = n` appears `n` times in a row, under one id.
    pub fn agents(&self) -> Vec<(usize, String, Vec<usize>)> {
        let mut out = Vec::new();
        for (g, group) in self.agents.iter().enumerate() {
            for i in 0..group.count {
                let name = if group.count == 1 {
                    group.name.clone()
                } else {
                    format!("{}-{i}", group.name)
                };
                let lists: Vec<usize> = match group.lists {
                    ListChoice::All => (0..self.lists.count).collect(),
                    ListChoice::Spread => vec![i % self.lists.count],
                };
                for _ in 0..group.sessions {
                    out.push((g, name.clone(), lists.clone()));
                }
            }
        }
        out
    }

    /// Checks ranges; the error is `(field path, message)`.
    fn check(&self) -> Result<(), (String, String)> {
        let bad = |field: &str, message: String| Err((field.to_owned(), message));
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty".into());
        }
        if self.duration_ms == 0 || self.duration_ms > DURATION_MS_MAX {
            return bad(
                "duration_ms",
                format!("must be in 1..={DURATION_MS_MAX}, is {}", self.duration_ms),
            );
        }
        if self.settle_ms_max == 0 || self.settle_ms_max > DURATION_MS_MAX {
            return bad(
                "settle_ms_max",
                format!(
                    "must be in 1..={DURATION_MS_MAX}, is {}",
                    self.settle_ms_max
                ),
            );
        }
        if self.lists.count == 0 || self.lists.count > LISTS_MAX {
            return bad(
                "lists.count",
                format!("must be in 1..={LISTS_MAX}, is {}", self.lists.count),
            );
        }
        if self.lists.initial_tasks > INITIAL_TASKS_MAX {
            return bad(
                "lists.initial_tasks",
                format!(
                    "must be at most {INITIAL_TASKS_MAX}, is {}",
                    self.lists.initial_tasks
                ),
            );
        }
        if self.agents.is_empty() {
            return bad("agents", "a scenario needs at least one agent group".into());
        }
        let mut total = 0usize;
        let mut names = std::collections::BTreeSet::new();
        for (i, g) in self.agents.iter().enumerate() {
            let at = |f: &str| format!("agents[{i}].{f}");
            if g.name.trim().is_empty() || g.name.len() > 64 {
                return bad(&at("name"), "must be 1 to 64 bytes".into());
            }
            if !names.insert(g.name.clone()) {
                return bad(&at("name"), format!("{:?} names two groups", g.name));
            }
            if g.count == 0 {
                return bad(&at("count"), "must be at least 1".into());
            }
            if g.sessions == 0 || g.sessions > SESSIONS_MAX {
                return bad(
                    &at("sessions"),
                    format!("must be in 1..={SESSIONS_MAX}, is {}", g.sessions),
                );
            }
            total = total.saturating_add(g.count.saturating_mul(g.sessions));
            let writes = g.mix.total() > 0;
            if writes && !(g.rate_per_s > 0.0 && g.rate_per_s <= RATE_PER_S_MAX) {
                return bad(
                    &at("rate_per_s"),
                    format!("must be in (0, {RATE_PER_S_MAX}], is {}", g.rate_per_s),
                );
            }
            if g.role == RoleSpec::Observer && writes {
                return bad(
                    &at("mix"),
                    "an observer does not write: leave the mix empty".into(),
                );
            }
            if g.role == RoleSpec::Rogue && g.sessions > 1 {
                // Its injections are counted one merge at a time: sibling sessions
                // injecting at once would blur which report answers which.
                return bad(&at("sessions"), "a rogue has one session".into());
            }
            if g.mix.race_start > 0 && g.sessions < 2 {
                return bad(
                    &at("mix"),
                    "race_start races a sibling session of the same agent: it needs \
                     sessions >= 2"
                        .into(),
                );
            }
            let rogue_actions = g.mix.weights().iter().any(|(a, w)| *w > 0 && a.is_rogue());
            if rogue_actions && g.role != RoleSpec::Rogue {
                return bad(
                    &at("mix"),
                    "invalid_status, double_active, bad_dependency, foreign_task, \
                     garbage_frame, invalid_sync, oversize, wide_active, \
                     dependency_cycle, wipe_root, misshapen and over_limit need \
                     role = \"rogue\""
                        .into(),
                );
            }
        }
        if total > AGENTS_MAX {
            return bad("agents", format!("{total} agents, at most {AGENTS_MAX}"));
        }
        let n = &self.network;
        if n.latency_ms[0] > n.latency_ms[1] || n.latency_ms[1] > LATENCY_MS_MAX {
            return bad(
                "network.latency_ms",
                format!("must be [min, max] with min <= max <= {LATENCY_MS_MAX}"),
            );
        }
        for (f, p) in [
            ("network.drop", n.drop),
            ("network.duplicate", n.duplicate),
            ("network.reorder", n.reorder),
            ("faults.partition_agents", self.faults.partition_agents),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return bad(f, format!("a probability in [0, 1], is {p}"));
            }
        }
        let f = &self.faults;
        if f.partitions > PARTITIONS_MAX {
            return bad("faults.partitions", format!("at most {PARTITIONS_MAX}"));
        }
        if f.hub_crashes > HUB_CRASHES_MAX {
            return bad("faults.hub_crashes", format!("at most {HUB_CRASHES_MAX}"));
        }
        if f.connection_cuts > CONNECTION_CUTS_MAX {
            return bad(
                "faults.connection_cuts",
                format!("at most {CONNECTION_CUTS_MAX}"),
            );
        }
        if f.slow_readers > SLOW_READERS_MAX {
            return bad("faults.slow_readers", format!("at most {SLOW_READERS_MAX}"));
        }
        for (name, n) in [
            ("faults.hub_pauses", f.hub_pauses),
            ("faults.nats_cuts", f.nats_cuts),
        ] {
            if n > CLUSTER_FAULTS_MAX {
                return bad(name, format!("at most {CLUSTER_FAULTS_MAX}"));
            }
            if n > 0 && self.cluster.is_none() {
                return bad(name, "needs a [cluster] of hubs".into());
            }
        }
        if let Some(c) = &self.cluster {
            if !(2..=CLUSTER_HUBS_MAX).contains(&c.hubs) {
                return bad(
                    "cluster.hubs",
                    format!("from 2 to {CLUSTER_HUBS_MAX}, is {}", c.hubs),
                );
            }
            if c.lease_ms < 1_000 {
                return bad("cluster.lease_ms", "at least 1000".into());
            }
            if c.rollup_after_commits == 0 {
                return bad("cluster.rollup_after_commits", "at least 1".into());
            }
        }
        for (name, r) in [
            ("faults.partition_ms", f.partition_ms),
            ("faults.hub_down_ms", f.hub_down_ms),
            ("faults.hub_pause_ms", f.hub_pause_ms),
            ("faults.nats_cut_ms", f.nats_cut_ms),
        ] {
            if r[0] > r[1] || r[1] > DURATION_MS_MAX {
                return bad(name, "must be [min, max] with min <= max".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        name = "t"
        duration_ms = 1000
        [[agents]]
        name = "lead"
        role = "lead"
        rate_per_s = 1.0
        mix = { plan = 1 }
    "#;

    fn error(text: &str) -> String {
        match Scenario::parse(text, "x.toml") {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn minimal_loads_with_defaults() {
        let s = Scenario::parse(MINIMAL, "x.toml").unwrap();
        assert_eq!(s.lists.count, 1);
        assert_eq!(s.agents()[0].1, "lead");
    }

    #[test]
    fn errors_name_the_field() {
        let e = error(&MINIMAL.replace("rate_per_s = 1.0", "rate_per_s = 0.0"));
        assert!(e.contains("agents[0].rate_per_s"), "{e}");
        let e = error(&MINIMAL.replace("mix = { plan = 1 }", "mix = { plann = 1 }"));
        assert!(e.contains("plann"), "{e}");
        let e = error(&format!("{MINIMAL}\n[network]\ndrop = 1.5\n"));
        assert!(e.contains("network.drop"), "{e}");
        let e = error(&MINIMAL.replace("role = \"lead\"", "role = \"boss\""));
        assert!(e.contains("boss"), "{e}");
        let e = error(&MINIMAL.replace("mix = { plan = 1 }", "mix = { oversize = 1 }"));
        assert!(e.contains("agents[0].mix"), "{e}");
        let e = error(&MINIMAL.replace("mix = { plan = 1 }", "mix = { race_start = 1 }"));
        assert!(e.contains("agents[0].mix") && e.contains("sessions"), "{e}");
        let e = error(&MINIMAL.replace("rate_per_s = 1.0", "rate_per_s = 1.0\nsessions = 0"));
        assert!(e.contains("agents[0].sessions"), "{e}");
        let e = error(&MINIMAL.replace("role = \"lead\"", "role = \"rogue\"\nsessions = 2"));
        assert!(e.contains("agents[0].sessions"), "{e}");
    }

    #[test]
    fn sessions_share_their_agent_id() {
        let s = Scenario::parse(
            &MINIMAL.replace(
                "mix = { plan = 1 }",
                "count = 2\nsessions = 3\nmix = { race_start = 1 }",
            ),
            "x.toml",
        )
        .unwrap();
        let names: Vec<String> = s.agents().into_iter().map(|(_, n, _)| n).collect();
        assert_eq!(
            names,
            ["lead-0", "lead-0", "lead-0", "lead-1", "lead-1", "lead-1"]
        );
    }
}
