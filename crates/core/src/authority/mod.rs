//! The authority: after every merge it checks the invariants of docs/DESIGN.md §4 on what the
//! merge touched, reports each violation and conflict exactly once, and chooses repairs.
//!
//! It does no I/O and reads no clock: [`Authority::check`] takes the list and the
//! [`Merge`] the list returned, and gives back events and the repair to apply;
//! [`Authority::process`] also applies the repair as an ordinary change of the
//! authority's replica (and checks that change in turn). Cost follows the merge: only
//! touched tasks, their dependents and the owners they name are looked at.
//!
//! Repairs are functions of the merged state and the offending changes only (never of
//! the order merges arrived in), so two authorities that see the same changes choose
//! the same repair.
//!
//! One module per rule (`schema`, `single_active`, `dependencies`, `ownership`, and
//! `conflicts` for concurrent writes); `findings` and `repair` hold what they share,
//! `policy` what a list asks for.
//!
//! ```
//! use automerge::ActorId;
//! use swarmtodo_core::authority::{Authority, Policy, Roles};
//! use swarmtodo_core::model::{TodoList, WriteContext};
//! use swarmtodo_proto::{PatchOp, Rule, Status, TaskPatch, WriteMode, WriteRequest};
//!
//! fn upsert(id: &str, status: Status) -> WriteRequest {
//!     WriteRequest {
//!         mode: WriteMode::Patch { ops: vec![PatchOp::Upsert { task: TaskPatch {
//!             id: Some(id.into()), content: Some(format!("Do {id}")), status: Some(status),
//!             owner: Some(Some("bob".into())), ..TaskPatch::default()
//!         }}]},
//!         expected_version: None,
//!         explanation: None,
//!     }
//! }
//! let mut hub = TodoList::create(ActorId::from([9u8; 16]));
//! let mut a = hub.fork(ActorId::from([1u8; 16]));
//! let mut b = hub.fork(ActorId::from([2u8; 16]));
//! a.write(&upsert("t1", Status::InProgress), &WriteContext::new("alice", 1, 1)).unwrap();
//! b.write(&upsert("t2", Status::InProgress), &WriteContext::new("bob", 1, 2)).unwrap();
//!
//! let mut authority = Authority::new("hub", Policy::default(), Roles::default());
//! let m = hub.merge_from(&a).unwrap();
//! assert!(authority.process(&mut hub, m, 10).unwrap().violations.is_empty());
//! let m = hub.merge_from(&b).unwrap();
//! let report = authority.process(&mut hub, m, 11).unwrap();
//! assert_eq!(report.violations.len(), 1);
//! assert_eq!(report.violations[0].rule, Rule::SingleActive);
//! let active = hub.read().tasks.iter().filter(|t| t.status == Status::InProgress).count();
//! assert_eq!(active, 1);
//! ```

mod conflicts;
mod dependencies;
mod findings;
mod ownership;
mod policy;
mod repair;
mod schema;
mod single_active;

use std::collections::{BTreeMap, BTreeSet};

pub use crate::limits::REPAIR_ROUNDS_MAX;

use crate::model::{
    clip, clip_written, field, ChangeInfo, Merge, ModelError, TaskDelta, TodoList, TASK_ENTRY,
};
use crate::proto::{
    Conflict, Resolution, Violation, AGENT_ID_BYTES_MAX, TASK_ID_BYTES_MAX, VIOLATION_TASKS_MAX,
};

use self::findings::Finding;
pub use self::policy::{Action, ActiveScope, Policy, Role, Roles};
pub use self::repair::Repair;

/// What one check found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// New violations (never reported before).
    pub violations: Vec<Violation>,
    /// New conflicts.
    pub conflicts: Vec<Conflict>,
    /// The repair to apply.
    pub repair: Repair,
}

/// What [`Authority::process`] did for one merge.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Violations, in the order found.
    pub violations: Vec<Violation>,
    /// Conflicts, in the order found.
    pub conflicts: Vec<Conflict>,
    /// The repair changes applied (what each touched).
    pub repairs: Vec<Merge>,
}

/// The authority for one list.
#[derive(Debug, Clone)]
pub struct Authority {
    /// The agent id repairs are recorded under.
    agent: String,
    policy: Policy,
    roles: Roles,
    /// Actors whose identity the hub vouches for (a token): their changes count as
    /// this agent with this role, whatever the document's `agents` map says.
    bound: BTreeMap<automerge::ActorId, (String, Role)>,
    /// Keys of every violation and conflict already reported: the idempotency set that
    /// makes each report happen once (persisted by the store across restarts).
    reported: BTreeSet<String>,
    /// Tasks the dependency checks visited so far (their cost, for tests and benches).
    dependency_visits: std::cell::Cell<usize>,
}

impl Authority {
    /// An authority that records its repairs as `agent`.
    pub fn new(agent: impl Into<String>, policy: Policy, roles: Roles) -> Self {
        Authority {
            agent: agent.into(),
            policy,
            roles,
            bound: BTreeMap::new(),
            reported: BTreeSet::new(),
            dependency_visits: std::cell::Cell::new(0),
        }
    }

    /// Binds `actor` to an identity the caller vouches for: from now on its changes are
    /// `agent`'s with `role`, whatever agent id the actor registered in the document
    /// (which any writer can set). An actor stays bound to its first identity; binding
    /// it to another is refused (false).
    pub fn bind(&mut self, actor: &automerge::ActorId, agent: &str, role: Role) -> bool {
        match self.bound.get(actor) {
            Some((a, r)) => a == agent && *r == role,
            None => {
                self.bound.insert(actor.clone(), (agent.to_owned(), role));
                true
            }
        }
    }

    /// The agent and role of a change's writer: its actor's binding (a token vouches for
    /// it), else the agent its actor registered — as it was before this change when the
    /// change rewrote that registration (or the whole `agents` map), so that a worker
    /// cannot make itself a lead by renaming itself in the change that does the lead's
    /// work.
    fn identity_of_change(&self, list: &TodoList, change: &ChangeInfo) -> (Option<String>, Role) {
        let actor = change.actor();
        if let Some((agent, role)) = self.bound.get(actor) {
            return (Some(agent.clone()), *role);
        }
        let renamed =
            change.agents.contains(&actor.to_hex_string()) || change.root.contains("agents");
        let agent = if renamed {
            list.agent_at(actor, change.change.deps())
                .or_else(|| list.agent_of(actor))
        } else {
            list.agent_of(actor)
        };
        let role = self.roles.of(agent.as_deref());
        (agent, role)
    }

    /// Restores the idempotency set (keys from [`Authority::reported`]).
    pub fn with_reported(mut self, keys: impl IntoIterator<Item = String>) -> Self {
        self.reported.extend(keys);
        self
    }

    /// Keys of everything reported so far.
    pub fn reported(&self) -> impl Iterator<Item = &str> + '_ {
        self.reported.iter().map(String::as_str)
    }

    /// Tasks the dependency checks visited so far: their cost follows the tasks
    /// reachable from changed dependencies, each visited once per check.
    pub fn dependency_visits(&self) -> usize {
        self.dependency_visits.get()
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Checks, repairs and re-checks one merge, applying repairs to `list` as changes
    /// stamped `now_ms`.
    pub fn process(
        &mut self,
        list: &mut TodoList,
        merge: Merge,
        now_ms: i64,
    ) -> Result<Report, ModelError> {
        let mut report = Report::default();
        let mut merge = merge;
        for _ in 0..REPAIR_ROUNDS_MAX {
            if merge.is_empty() {
                break;
            }
            let out = self.check(list, &merge);
            report.violations.extend(out.violations);
            report.conflicts.extend(out.conflicts);
            if out.repair.is_empty() {
                break;
            }
            // The change's message (and the `repaired` event that quotes it) names the
            // first VIOLATION_TASKS_MAX notes and counts the rest: a merge that broke a
            // rule on thousands of tasks makes a message of a few KB, not a megabyte.
            let notes = &out.repair.notes;
            let mut message = format!(
                "swarmtodo repair: {}",
                notes
                    .iter()
                    .take(VIOLATION_TASKS_MAX)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            );
            if notes.len() > VIOLATION_TASKS_MAX {
                message.push_str(&format!(
                    "; … and {} more",
                    notes.len() - VIOLATION_TASKS_MAX
                ));
            }
            merge = list.apply_fields(&self.agent, now_ms, &message, &out.repair.writes())?;
            report.repairs.push(merge.clone());
        }
        Ok(report)
    }

    /// Checks every task of the list (load time, or a checker's final pass).
    pub fn check_all(&mut self, list: &TodoList) -> Outcome {
        let all_fields: BTreeSet<String> = field::ALL
            .iter()
            .map(|f| (*f).to_owned())
            .chain([TASK_ENTRY.to_owned()])
            .collect();
        let merge = Merge {
            changes: Vec::new(),
            tasks: list
                .raw_tasks()
                .into_iter()
                .map(|(id, raw)| {
                    let delta = TaskDelta {
                        before: Some(raw.clone()),
                        after: Some(raw),
                        fields: all_fields.clone(),
                    };
                    (id, delta)
                })
                .collect(),
            rebuilt: false,
            rejected: Vec::new(),
        };
        self.check(list, &merge)
    }

    /// Checks what `merge` touched. Returns only what was not reported before, and the
    /// repair the policy asks for.
    pub fn check(&mut self, list: &TodoList, merge: &Merge) -> Outcome {
        // Rendered only when something is reported: rendering is base58 per head, and a
        // busy list's merges have many heads (5.6 % of an overloaded hub's time when it
        // was rendered for every merge).
        let version = std::cell::OnceCell::new();
        let version_now = || version.get_or_init(|| list.version()).clone();
        let mut findings: Vec<Finding> = Vec::new();
        let mut repair = Repair::default();

        self.check_schema(list, merge, &mut findings, &mut repair);
        self.check_single_active(list, merge, &mut findings, &mut repair);
        self.check_dependencies(list, merge, &mut findings, &mut repair);
        self.check_ownership(list, merge, &mut findings, &mut repair);
        self.check_root(list, merge, &mut findings, &mut repair);
        let conflicts = self.check_conflicts(list, merge, &version_now, &mut repair);

        let mut violations = Vec::new();
        for f in findings {
            if !self.reported.insert(f.key.clone()) {
                continue;
            }
            // Everything a violation lists is bounded (VIOLATION_TASKS_MAX): one over a
            // whole list names its first tasks and counts them all.
            let involved: Vec<&ChangeInfo> = merge
                .changes
                .iter()
                .filter(|c| c.touched.keys().any(|t| f.tasks.contains(t)))
                .collect();
            let mut agents: BTreeSet<String> =
                f.values.iter().filter_map(|v| v.agent.clone()).collect();
            for c in &involved {
                if agents.len() >= VIOLATION_TASKS_MAX {
                    break;
                }
                if let Some(a) = list.agent_of(c.actor()) {
                    agents.insert(a);
                }
            }
            let changes: BTreeSet<String> = f
                .changes
                .iter()
                .cloned()
                .chain(involved.iter().rev().map(|c| c.hash()))
                .take(VIOLATION_TASKS_MAX)
                .collect();
            let resolution = match &f.repair {
                Some(how) => {
                    repair.notes.push(how.clone());
                    Resolution::Repaired { how: how.clone() }
                }
                None => Resolution::Reported,
            };
            let tasks_total = f.tasks.len() as u64;
            let tasks: Vec<String> = f
                .tasks
                .into_iter()
                .take(VIOLATION_TASKS_MAX)
                .map(|t| clip(&t, TASK_ID_BYTES_MAX).to_owned())
                .collect();
            violations.push(Violation {
                key: f.key,
                rule: f.rule,
                message: f.message,
                tasks_total,
                agents: agents
                    .into_iter()
                    .take(VIOLATION_TASKS_MAX)
                    .map(|a| clip(&a, AGENT_ID_BYTES_MAX).to_owned())
                    .collect(),
                changes: changes.into_iter().collect(),
                values: f
                    .values
                    .into_iter()
                    .take(VIOLATION_TASKS_MAX)
                    .map(clip_written)
                    .collect(),
                tasks,
                version: version_now(),
                resolution,
            });
        }
        Outcome {
            violations,
            conflicts,
            repair,
        }
    }
}
