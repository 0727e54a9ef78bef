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

use std::collections::{BTreeMap, BTreeSet};

use automerge::{ObjId as ExId, ReadDoc};

pub use crate::limits::REPAIR_ROUNDS_MAX;

use crate::model::{
    clip, clip_written, field, normalize_priority, normalize_status, status_alias, ChangeInfo,
    FieldValue, Merge, ModelError, OpKey, RawTask, RootValue, TaskDelta, TodoList, Writes,
    TASK_ENTRY,
};
use crate::proto::{
    Conflict, Priority, Resolution, Rule, Status, Version, Violation, WrittenValue,
    AGENT_ID_BYTES_MAX, BLOCKED_BY_COUNT_MAX, LIST_TASKS_MAX, TASK_ID_BYTES_MAX,
    TASK_TEXT_BYTES_MAX, VIOLATION_TASKS_MAX,
};

/// What to do about a rule's violations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Emit the event; leave the state.
    Report,
    /// Emit the event and repair.
    Repair,
}

/// Whether "one task in progress" counts per owner or for the whole list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveScope {
    /// At most one `in_progress` per owner (unowned tasks share one bucket).
    PerOwner,
    /// At most one `in_progress` in the list.
    PerList,
}

/// A list's policy: per rule, report or repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Invalid status or priority: repair to what it means (`done` → `completed`) or
    /// the default; empty content can only be reported.
    pub schema: Action,
    /// A second `in_progress`: repair keeps the one set last (Automerge's order of the
    /// status writes) and sets the others back to `pending`.
    pub single_active: Action,
    /// Per owner or per list.
    pub single_active_scope: ActiveScope,
    /// Missing dependency, cycle, completed before its dependency: repair drops missing
    /// ids and breaks a cycle at its greatest task id; completed-before-open is reported.
    pub dependencies: Action,
    /// A worker changed a task it does not own: repair restores the fields it wrote to
    /// their values before that change.
    pub ownership: Action,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            schema: Action::Repair,
            single_active: Action::Repair,
            single_active_scope: ActiveScope::PerOwner,
            dependencies: Action::Report,
            ownership: Action::Repair,
        }
    }
}

/// An agent's role on a list (docs/DESIGN.md §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Reads and writes everything.
    Lead,
    /// Changes only tasks it owns or claims.
    Worker,
    /// Reads only.
    Observer,
}

/// Roles by agent id, with a default for agents not named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roles {
    /// Named agents.
    pub by_agent: BTreeMap<String, Role>,
    /// Everyone else (and changes whose actor never said which agent it is).
    pub default: Role,
}

impl Default for Roles {
    fn default() -> Self {
        Roles {
            by_agent: BTreeMap::new(),
            default: Role::Lead,
        }
    }
}

impl Roles {
    /// The role of `agent`.
    pub fn of(&self, agent: Option<&str>) -> Role {
        agent
            .and_then(|a| self.by_agent.get(a))
            .copied()
            .unwrap_or(self.default)
    }
}

/// Field writes chosen by the authority, keyed so that two rules never write one field
/// twice and the order is deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Repair {
    sets: BTreeMap<(String, &'static str), FieldValue>,
    /// Root keys written back (a `tasks` or `agents` map another role replaced).
    roots: BTreeMap<String, RootValue>,
    /// Entries of the `agents` map written back (`None`: removed).
    agents: BTreeMap<String, Option<String>>,
    /// What the repair does, for people (one line per violation).
    pub notes: Vec<String>,
}

impl Repair {
    /// True when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.roots.is_empty() && self.agents.is_empty()
    }

    fn set(&mut self, task: &str, field: &'static str, value: FieldValue) {
        self.sets.entry((task.to_owned(), field)).or_insert(value);
    }

    /// The writes, in a fixed order.
    fn writes(&self) -> Writes {
        Writes {
            roots: self
                .roots
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            agents: self
                .agents
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            sets: self
                .sets
                .iter()
                .map(|((t, f), v)| (t.clone(), *f, v.clone()))
                .collect(),
        }
    }

    /// `(task, field, rendered value)` for tests and logs.
    pub fn describe(&self) -> Vec<(String, String, String)> {
        self.sets
            .iter()
            .map(|((t, f), v)| (t.clone(), (*f).to_owned(), format!("{v:?}")))
            .collect()
    }
}

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

/// Tasks and values gathered for one violation.
struct Finding {
    key: String,
    rule: Rule,
    message: String,
    tasks: BTreeSet<String>,
    values: Vec<WrittenValue>,
    repair: Option<String>,
    /// Changes involved beyond those that touched `tasks` (a change to the root).
    changes: Vec<String>,
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
                .index()
                .tasks
                .iter()
                .map(|(id, e)| {
                    let delta = TaskDelta {
                        before: Some(e.raw.clone()),
                        after: Some(e.raw.clone()),
                        fields: all_fields.clone(),
                    };
                    (id.clone(), delta)
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

    fn check_schema(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let fixing = self.policy.schema == Action::Repair;
        for (id, delta) in &merge.tasks {
            let shown = clip(id, TASK_ID_BYTES_MAX);
            let Some(raw) = &delta.after else {
                self.check_entry_shape(list, id, delta, findings, repair);
                continue;
            };
            // A finding about field `f` (TASK_ENTRY: the task itself), keyed by the
            // operation that wrote its value; `fix` is what the repair writes.
            let mut bad = |f: &'static str, msg: String, fix: Option<(FieldValue, String)>| {
                let w = (f != TASK_ENTRY).then(|| written(list, id, f)).flatten();
                let op = match &w {
                    Some(w) => w.op.clone(),
                    None if f == TASK_ENTRY => list
                        .index()
                        .tasks
                        .get(id)
                        .and_then(|e| OpKey::of(&e.obj))
                        .map(|k| k.render())
                        .unwrap_or_default(),
                    None => String::new(),
                };
                let key = digest_key("schema", &format!("{id}:{f}:{op}"));
                let fix = fix.filter(|_| fixing);
                if let Some((value, _)) = &fix {
                    if !self.reported.contains(&key) {
                        repair.set(id, f, value.clone());
                    }
                }
                findings.push(Finding {
                    key,
                    rule: Rule::Schema,
                    message: msg,
                    tasks: [id.clone()].into(),
                    values: w.into_iter().collect(),
                    repair: fix.map(|(_, how)| how),
                    changes: Vec::new(),
                });
            };
            let str_fix = |f: &str, v: &str| {
                (
                    FieldValue::Str(Some(v.to_owned())),
                    format!("set {shown}.{f} to {v:?}"),
                )
            };
            if id.len() > TASK_ID_BYTES_MAX {
                // No request can name such a task: it goes (its content is in the event).
                bad(
                    TASK_ENTRY,
                    format!(
                        "task id {shown:?}… is {} bytes, more than the {TASK_ID_BYTES_MAX} allowed",
                        id.len()
                    ),
                    Some((
                        FieldValue::Task(None),
                        format!("removed the task with the {}-byte id", id.len()),
                    )),
                );
                continue;
            }
            match raw.status.as_deref() {
                Some(s) if s.parse::<Status>().is_ok() => {}
                other => {
                    let to = other
                        .and_then(status_alias)
                        .unwrap_or(normalize_status(None));
                    bad(
                        field::STATUS,
                        format!(
                            "task {shown:?} has status {:?}; allowed: {}",
                            other.map(|o| clip(o, TASK_ID_BYTES_MAX)),
                            Status::allowed().join(", ")
                        ),
                        Some(str_fix(field::STATUS, to.as_str())),
                    );
                }
            }
            match raw.priority.as_deref() {
                Some(p) if p.parse::<Priority>().is_ok() => {}
                other => bad(
                    field::PRIORITY,
                    format!(
                        "task {shown:?} has priority {:?}; allowed: {}",
                        other.map(|o| clip(o, TASK_ID_BYTES_MAX)),
                        Priority::allowed().join(", ")
                    ),
                    Some(str_fix(field::PRIORITY, normalize_priority(other).as_str())),
                ),
            }
            if raw.content.as_deref().is_none_or(|c| c.trim().is_empty()) {
                bad(
                    field::CONTENT,
                    format!(
                        "task {shown:?} has no content; the writer should say what the task is"
                    ),
                    None,
                );
            }
            // Limits `todo_write` enforces hold for sync peers too: texts are cut to
            // the limit, an owner over it names no agent and is removed, dependencies
            // past the most a task may name are dropped.
            for (f, text) in [
                (field::CONTENT, &raw.content),
                (field::ACTIVE_FORM, &raw.active_form),
            ] {
                let Some(text) = text.as_deref().filter(|t| t.len() > TASK_TEXT_BYTES_MAX) else {
                    continue;
                };
                bad(
                    f,
                    format!(
                        "task {shown:?} has a {f} of {} bytes, more than the {TASK_TEXT_BYTES_MAX} allowed",
                        text.len()
                    ),
                    Some((
                        FieldValue::Str(Some(clip(text, TASK_TEXT_BYTES_MAX).to_owned())),
                        format!("cut {shown}.{f} to {TASK_TEXT_BYTES_MAX} bytes"),
                    )),
                );
            }
            if let Some(owner) = raw
                .owner
                .as_deref()
                .filter(|o| o.len() > AGENT_ID_BYTES_MAX)
            {
                bad(
                    field::OWNER,
                    format!(
                        "task {shown:?} has an owner of {} bytes, more than the {AGENT_ID_BYTES_MAX} an agent id may have",
                        owner.len()
                    ),
                    Some((FieldValue::Str(None), format!("removed {shown}.owner"))),
                );
            }
            let misshapen = |f: &str| raw.misshapen.contains(&f);
            if raw.blocked_by.len() > BLOCKED_BY_COUNT_MAX || misshapen(field::BLOCKED_BY) {
                let kept: Vec<String> = raw
                    .blocked_by
                    .iter()
                    .take(BLOCKED_BY_COUNT_MAX)
                    .cloned()
                    .collect();
                bad(
                    field::BLOCKED_BY,
                    format!(
                        "task {shown:?} has a blocked_by that is not a list of at most {BLOCKED_BY_COUNT_MAX} task ids"
                    ),
                    Some((
                        FieldValue::List(kept),
                        format!("rewrote {shown}.blocked_by as a list of its first {BLOCKED_BY_COUNT_MAX} ids"),
                    )),
                );
            }
            for f in [field::ACTIVE_FORM, field::OWNER] {
                if misshapen(f) {
                    bad(
                        f,
                        format!("task {shown:?} has a {f} that is not a string"),
                        Some((FieldValue::Str(None), format!("removed {shown}.{f}"))),
                    );
                }
            }
        }
        self.check_list_size(list, merge, findings, repair);
    }

    /// A task entry that is not a map (a string, a list, a number): no task reads it,
    /// and it hides the task it replaced. The task as it was is put back, or the entry
    /// removed.
    fn check_entry_shape(
        &self,
        list: &TodoList,
        id: &str,
        delta: &TaskDelta,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let index = list.index();
        let Some(tasks) = &index.tasks_obj else {
            return;
        };
        let Ok(Some((value, exid))) = list.doc().get(tasks, id) else {
            return;
        };
        let op = OpKey::of(&exid).map(|k| k.render()).unwrap_or_default();
        let key = digest_key("schema", &format!("{id}:entry:{op}"));
        let shown = clip(id, TASK_ID_BYTES_MAX);
        let fixing = self.policy.schema == Action::Repair;
        if fixing && !self.reported.contains(&key) {
            repair.set(
                id,
                TASK_ENTRY_STATIC,
                FieldValue::Task(delta.before.clone()),
            );
        }
        findings.push(Finding {
            key,
            rule: Rule::Schema,
            message: format!("task {shown:?} is not a task map but {value}"),
            tasks: [id.to_owned()].into(),
            values: vec![clip_written(WrittenValue {
                task: id.to_owned(),
                field: "task".to_owned(),
                value: crate::model::value_json(list.doc(), &value, &exid),
                agent: OpKey::of(&exid).and_then(|k| list.agent_of(&k.actor)),
                op,
            })],
            repair: fixing.then(|| match delta.before {
                Some(_) => format!("put back task {shown:?} as it was"),
                None => format!("removed the entry {shown:?}"),
            }),
            changes: Vec::new(),
        });
    }

    /// More tasks than `LIST_TASKS_MAX` after a merge that made tasks: the newest (in
    /// Automerge's order of the operations that made them, the same on every replica)
    /// past the limit are removed.
    fn check_list_size(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let index = list.index();
        let made = merge
            .tasks
            .values()
            .any(|d| d.before.is_none() && d.after.is_some());
        if !made || index.tasks.len() <= LIST_TASKS_MAX {
            return;
        }
        let mut by_age: Vec<(OpKey, &String)> = index
            .tasks
            .iter()
            .filter_map(|(id, e)| Some((OpKey::of(&e.obj)?, id)))
            .collect();
        by_age.sort();
        let over = &by_age[LIST_TASKS_MAX.min(by_age.len())..];
        let names: Vec<String> = over
            .iter()
            .map(|(k, id)| format!("{id}={}", k.render()))
            .collect();
        let key = digest_key("schema", &format!("list_size:{}", names.join(",")));
        let fixing = self.policy.schema == Action::Repair;
        if fixing && !self.reported.contains(&key) {
            for (_, id) in over {
                repair.set(id, TASK_ENTRY_STATIC, FieldValue::Task(None));
            }
        }
        findings.push(Finding {
            key,
            rule: Rule::Schema,
            message: format!(
                "the list holds {} tasks, more than the {LIST_TASKS_MAX} allowed",
                index.tasks.len()
            ),
            tasks: over.iter().map(|(_, id)| (*id).clone()).collect(),
            values: Vec::new(),
            repair: fixing.then(|| {
                format!(
                    "removed the {} newest tasks: {}",
                    over.len(),
                    some_of(over.iter().map(|(_, id)| *id), over.len())
                )
            }),
            changes: Vec::new(),
        });
    }

    fn check_single_active(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let index = list.index();
        // Buckets the merge could have overfilled: owners of touched in-progress tasks.
        let mut buckets: BTreeSet<Option<String>> = BTreeSet::new();
        for delta in merge.tasks.values() {
            if let Some(raw) = &delta.after {
                if raw.status.as_deref() == Some(Status::InProgress.as_str()) {
                    buckets.insert(raw.owner.clone());
                }
            }
        }
        let groups: Vec<(String, BTreeSet<String>)> = match self.policy.single_active_scope {
            ActiveScope::PerOwner => buckets
                .into_iter()
                .filter_map(|b| {
                    let set = index.active.get(&b)?.clone();
                    Some((b.unwrap_or_else(|| "(no owner)".to_owned()), set))
                })
                .collect(),
            ActiveScope::PerList if !buckets.is_empty() => {
                vec![(
                    "(list)".to_owned(),
                    index.active.values().flatten().cloned().collect(),
                )]
            }
            ActiveScope::PerList => Vec::new(),
        };
        for (who, set) in groups {
            if set.len() < 2 {
                continue;
            }
            let values: Vec<(OpKey, WrittenValue)> = set
                .iter()
                .filter_map(|t| {
                    let (w, k) = written_with_key(list, t, field::STATUS)?;
                    Some((k, w))
                })
                .collect();
            // Keep the in-progress status written last in Automerge's order of
            // operations (counter, then actor): the same choice on every replica.
            let keep = values
                .iter()
                .max_by(|a, b| a.0.cmp(&b.0))
                .map(|(_, w)| w.task.clone());
            let ops: Vec<String> = values
                .iter()
                .map(|(_, w)| format!("{}={}", w.task, w.op))
                .collect();
            let key = digest_key("single_active", &format!("{who}:{}", ops.join(",")));
            let fixing = self.policy.single_active == Action::Repair && keep.is_some();
            let how = keep.as_ref().filter(|_| fixing).map(|k| {
                let others = set.iter().filter(|t| *t != k);
                format!(
                    "kept {:?} in_progress, set {} back to pending",
                    clip(k, TASK_ID_BYTES_MAX),
                    some_of(others, set.len() - 1)
                )
            });
            if fixing && !self.reported.contains(&key) {
                for t in set.iter().filter(|t| Some(*t) != keep.as_ref()) {
                    repair.set(
                        t,
                        field::STATUS,
                        FieldValue::Str(Some(Status::Pending.as_str().to_owned())),
                    );
                }
            }
            findings.push(Finding {
                key,
                rule: Rule::SingleActive,
                message: format!(
                    "{} has {} tasks in_progress ({}); at most one is allowed",
                    clip(&who, AGENT_ID_BYTES_MAX),
                    set.len(),
                    some_of(&set, set.len())
                ),
                tasks: set,
                values: values.into_iter().map(|(_, w)| w).collect(),
                repair: how,
                changes: Vec::new(),
            });
        }
    }

    fn check_dependencies(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let index = list.index();
        let fixing = self.policy.dependencies == Action::Repair;
        // Touched tasks and every task that names one of them.
        let mut subjects: BTreeSet<&String> = merge.tasks.keys().collect();
        for id in merge.tasks.keys() {
            if let Some(ds) = index.dependents.get(id) {
                subjects.extend(ds);
            }
        }
        for id in subjects {
            let Some(entry) = index.tasks.get(id) else {
                continue;
            };
            let raw = &entry.raw;
            let missing: Vec<&String> = raw
                .blocked_by
                .iter()
                .filter(|d| !index.tasks.contains_key(*d) || *d == id)
                .collect();
            if !missing.is_empty() {
                let deps_value = written(list, id, field::BLOCKED_BY);
                let deps_op = deps_value
                    .as_ref()
                    .map(|w| w.op.clone())
                    .unwrap_or_default();
                let key = digest_key(
                    "dependencies",
                    &format!("missing:{id}:{missing:?}:{deps_op}"),
                );
                let kept: Vec<String> = raw
                    .blocked_by
                    .iter()
                    .filter(|d| !missing.contains(d))
                    .cloned()
                    .collect();
                if fixing && !self.reported.contains(&key) {
                    repair.set(id, field::BLOCKED_BY, FieldValue::List(kept));
                }
                findings.push(Finding {
                    key,
                    rule: Rule::Dependencies,
                    message: format!(
                        "task {:?} is blocked by {}, which are not tasks of this list (or itself)",
                        clip(id, TASK_ID_BYTES_MAX),
                        some_of(missing.iter().copied(), missing.len())
                    ),
                    tasks: [id.clone()].into(),
                    values: deps_value.into_iter().collect(),
                    repair: fixing.then(|| {
                        format!(
                            "dropped {} from {}.blocked_by",
                            some_of(missing.iter().copied(), missing.len()),
                            clip(id, TASK_ID_BYTES_MAX)
                        )
                    }),
                    changes: Vec::new(),
                });
            }
            if normalize_status(raw.status.as_deref()) == Status::Completed {
                for dep in &raw.blocked_by {
                    let Some(d) = index.tasks.get(dep) else {
                        continue;
                    };
                    if !normalize_status(d.raw.status.as_deref()).is_open() {
                        continue;
                    }
                    let status = written(list, id, field::STATUS);
                    let op = status.as_ref().map(|w| w.op.clone()).unwrap_or_default();
                    let dep_status = written(list, dep, field::STATUS);
                    let dep_op = dep_status
                        .as_ref()
                        .map(|w| w.op.clone())
                        .unwrap_or_default();
                    findings.push(Finding {
                        key: digest_key("dependencies", &format!("open:{id}:{op}:{dep}:{dep_op}")),
                        rule: Rule::Dependencies,
                        message: format!(
                            "task {id:?} is completed while {dep:?}, which it depends on, is still open"
                        ),
                        tasks: [id.clone(), dep.clone()].into(),
                        values: status.into_iter().chain(dep_status).collect(),
                        repair: None,
                        changes: Vec::new(),
                    });
                }
            }
        }
        // Cycles: only a change to a task's dependencies (or a new task) can close one,
        // and any cycle it closes runs through that task. One walk from all of them,
        // each task visited once (Tarjan's strongly connected components): linear in the
        // tasks reachable from what changed, never once per task of a chain.
        let starts: Vec<&String> = merge
            .tasks
            .iter()
            .filter(|(_, d)| {
                merge.rebuilt
                    || d.fields.contains(field::BLOCKED_BY)
                    || d.fields.contains(TASK_ENTRY)
            })
            .map(|(id, _)| id)
            .collect();
        let (cycles, visited) = find_cycles(list, &starts);
        self.dependency_visits
            .set(self.dependency_visits.get() + visited);
        for cycle in cycles {
            let mut members: Vec<String> = cycle[..cycle.len() - 1].to_vec();
            members.sort();
            let ops: Vec<String> = members
                .iter()
                .filter_map(|t| written(list, t, field::BLOCKED_BY))
                .map(|w| w.op)
                .collect();
            let key = digest_key(
                "dependencies",
                &format!("cycle:{}:{}", members.join(","), ops.join(",")),
            );
            // Break at the greatest id: drop its edge to its successor in the cycle.
            let breaker = members.last().cloned().unwrap_or_default();
            let next = cycle
                .windows(2)
                .find(|w| w[0] == breaker)
                .map(|w| w[1].clone());
            let how = next.as_ref().filter(|_| fixing).map(|n| {
                format!(
                    "removed {:?} from {}.blocked_by to break the cycle",
                    clip(n, TASK_ID_BYTES_MAX),
                    clip(&breaker, TASK_ID_BYTES_MAX)
                )
            });
            if let (true, Some(n), Some(b)) = (fixing, &next, index.tasks.get(&breaker)) {
                if !self.reported.contains(&key) {
                    let kept = b
                        .raw
                        .blocked_by
                        .iter()
                        .filter(|d| *d != n)
                        .cloned()
                        .collect();
                    repair.set(&breaker, field::BLOCKED_BY, FieldValue::List(kept));
                }
            }
            findings.push(Finding {
                key,
                rule: Rule::Dependencies,
                message: format!(
                    "dependency cycle of {} tasks: {}",
                    cycle.len() - 1,
                    cycle
                        .iter()
                        .take(VIOLATION_TASKS_MAX)
                        .map(|t| clip(t, TASK_ID_BYTES_MAX))
                        .collect::<Vec<_>>()
                        .join(" → ")
                ),
                values: members
                    .iter()
                    .take(VIOLATION_TASKS_MAX)
                    .filter_map(|t| written(list, t, field::BLOCKED_BY))
                    .collect(),
                tasks: members.into_iter().collect(),
                repair: how,
                changes: Vec::new(),
            });
        }
    }

    fn check_ownership(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        for change in &merge.changes {
            let (agent, role) = self.identity_of_change(list, change);
            if role == Role::Lead {
                continue;
            }
            let who = agent
                .as_deref()
                .map(|a| clip(a, AGENT_ID_BYTES_MAX).to_owned())
                .unwrap_or_else(|| change.actor().to_hex_string());
            for (id, fields) in &change.touched {
                let shown = clip(id, TASK_ID_BYTES_MAX);
                let delta = merge.tasks.get(id);
                let before_owner = delta
                    .and_then(|d| d.before.as_ref())
                    .and_then(|r| r.owner.clone());
                let after_owner = delta
                    .and_then(|d| d.after.as_ref())
                    .and_then(|r| r.owner.clone());
                let mine = |o: &Option<String>| o.is_none() || o.as_deref() == agent.as_deref();
                let allowed = role == Role::Worker
                    && mine(&before_owner)
                    && (!fields.contains(field::OWNER) || mine(&after_owner));
                if allowed {
                    continue;
                }
                let key = digest_key("ownership", &format!("{}:{id}", change.hash()));
                let fixing = self.policy.ownership == Action::Repair;
                if fixing && !self.reported.contains(&key) {
                    restore_before(list, change, id, fields, repair);
                }
                findings.push(Finding {
                    key,
                    rule: Rule::Ownership,
                    message: format!(
                        "{who} ({role:?}) changed task {shown:?} owned by {}",
                        before_owner
                            .as_deref()
                            .map_or("nobody", |o| clip(o, AGENT_ID_BYTES_MAX))
                    ),
                    tasks: [id.clone()].into(),
                    values: fields
                        .iter()
                        .filter_map(|f| field_name(f).and_then(|f| written(list, id, f)))
                        .collect(),
                    repair: fixing.then(|| {
                        format!(
                            "restored {shown}'s {} as they were before {who}'s change",
                            some_of(fields, fields.len())
                        )
                    }),
                    changes: Vec::new(),
                });
            }
        }
    }

    /// Rule 4 for the document's root: the root's keys and the `agents` map are the
    /// lead's. Another role's change that deletes or replaces `tasks` or `agents`, or
    /// adds a root key, is reverted: the map is written back as it was, with every
    /// write it got since (a replaced map stays in the document). An `agents` entry may
    /// be written only by its own actor and only with the agent that actor is (its
    /// token's, or the one it registered first); any other is put back.
    fn check_root(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let own = list.doc().get_actor();
        let fixing = self.policy.ownership == Action::Repair;
        for change in &merge.changes {
            if change.root.is_empty() && change.agents.is_empty() {
                continue;
            }
            if change.actor() == own || TodoList::is_first_change(&change.change) {
                continue;
            }
            let (agent, role) = self.identity_of_change(list, change);
            if role == Role::Lead {
                continue;
            }
            let who = clip(
                &agent
                    .clone()
                    .unwrap_or_else(|| change.actor().to_hex_string()),
                AGENT_ID_BYTES_MAX,
            )
            .to_owned();
            let deps = change.change.deps();
            if !change.root.is_empty() {
                let keys = some_of(&change.root, change.root.len());
                let key = digest_key("ownership", &format!("root:{}", change.hash()));
                if fixing && !self.reported.contains(&key) {
                    for k in &change.root {
                        if let Some(v) = list.root_before(k, deps) {
                            repair.roots.entry(k.clone()).or_insert(v);
                        }
                    }
                }
                // The tasks the change made disappear (or appear), bounded by the event.
                let tasks = merge
                    .tasks
                    .iter()
                    .filter(|(_, d)| d.before != d.after)
                    .map(|(id, _)| id.clone())
                    .collect();
                findings.push(Finding {
                    key,
                    rule: Rule::Ownership,
                    message: format!(
                        "{who} ({role:?}) wrote the list's root ({keys}): only a lead may"
                    ),
                    tasks,
                    values: Vec::new(),
                    repair: fixing
                        .then(|| format!("put back {keys} as they were before {who}'s change")),
                    changes: vec![change.hash()],
                });
            }
            let mine = change.actor().to_hex_string();
            let expected = self
                .bound
                .get(change.actor())
                .map(|(a, _)| a.clone())
                .or_else(|| list.agent_at(change.actor(), deps));
            for k in &change.agents {
                let now = list.agent_of_hex(k);
                let allowed = *k == mine
                    && expected
                        .as_ref()
                        .is_none_or(|e| now.as_deref() == Some(e.as_str()));
                if allowed {
                    continue;
                }
                let key = digest_key("ownership", &format!("agents:{}:{k}", change.hash()));
                let before = list.agent_hex_at(k, deps);
                if fixing && !self.reported.contains(&key) {
                    repair.agents.entry(k.clone()).or_insert(before.clone());
                }
                findings.push(Finding {
                    key,
                    rule: Rule::Ownership,
                    message: format!(
                        "{who} ({role:?}) registered actor {} as {:?}: an agent registers only itself, as itself",
                        clip(k, 64),
                        now.as_deref().map(|a| clip(a, AGENT_ID_BYTES_MAX))
                    ),
                    tasks: BTreeSet::new(),
                    values: Vec::new(),
                    repair: fixing.then(|| {
                        format!(
                            "put back actor {}'s registration ({:?})",
                            clip(k, 64),
                            before.as_deref().map(|a| clip(a, AGENT_ID_BYTES_MAX))
                        )
                    }),
                    changes: vec![change.hash()],
                });
            }
        }
    }

    /// Rule 5. Also: when the winning value is one of this authority's own repairs and
    /// an agent wrote another value concurrently (a write the authority had not seen when
    /// it repaired), the agent's value is written back. A repair only fixes a violation;
    /// it must not overrule an agent that moved on, and this makes the end state the same
    /// whether or not the authority saw the violation in between.
    fn check_conflicts(
        &mut self,
        list: &TodoList,
        merge: &Merge,
        version: &dyn Fn() -> Version,
        repair: &mut Repair,
    ) -> Vec<Conflict> {
        let mut out = Vec::new();
        let index = list.index();
        let doc = list.doc();
        for (id, delta) in &merge.tasks {
            for f in &delta.fields {
                let (obj, key): (Option<ExId>, &str) = if f == TASK_ENTRY {
                    (index.tasks_obj.clone(), id.as_str())
                } else {
                    match (index.tasks.get(id), field_name(f)) {
                        (Some(e), Some(name)) => (Some(e.obj.clone()), name),
                        _ => continue,
                    }
                };
                let Some(obj) = obj else { continue };
                let Ok(all) = doc.get_all(&obj, key) else {
                    continue;
                };
                if all.len() < 2 {
                    continue;
                }
                let Ok(Some((_, winner_id))) = doc.get(&obj, key) else {
                    continue;
                };
                let field_label = if f == TASK_ENTRY { "task" } else { key };
                let values: Vec<WrittenValue> = all
                    .iter()
                    .map(|(v, exid)| WrittenValue {
                        task: id.clone(),
                        field: field_label.to_owned(),
                        value: crate::model::value_json(doc, v, exid),
                        agent: OpKey::of(exid).and_then(|k| list.agent_of(&k.actor)),
                        op: OpKey::of(exid).map(|k| k.render()).unwrap_or_default(),
                    })
                    .collect();
                let winner_op = OpKey::of(&winner_id)
                    .map(|k| k.render())
                    .unwrap_or_default();
                let Some(winner) = values.iter().find(|v| v.op == winner_op).cloned() else {
                    continue;
                };
                let mut ops: Vec<&str> = values.iter().map(|v| v.op.as_str()).collect();
                ops.sort();
                let key = digest_key("conflict", &format!("{id}:{field_label}:{}", ops.join(",")));
                if !self.reported.insert(key.clone()) {
                    continue;
                }
                if f != TASK_ENTRY && winner.agent.as_deref() == Some(self.agent.as_str()) {
                    let yield_to = all
                        .iter()
                        .zip(&values)
                        .filter(|(_, w)| w.agent.as_deref() != Some(self.agent.as_str()))
                        .filter_map(|((_, exid), w)| OpKey::of(exid).map(|k| (k, w)))
                        .max_by(|a, b| a.0.cmp(&b.0))
                        .map(|(_, w)| w.clone());
                    if let (Some(w), Some(name)) = (yield_to, field_name(f)) {
                        let value = match &w.value {
                            serde_json::Value::String(s) => Some(FieldValue::Str(Some(s.clone()))),
                            serde_json::Value::Array(items) => Some(FieldValue::List(
                                items
                                    .iter()
                                    .filter_map(|i| i.as_str().map(str::to_owned))
                                    .collect(),
                            )),
                            _ => None,
                        };
                        if let Some(value) = value {
                            repair.set(id, name, value);
                            let shown = clip_written(w.clone());
                            repair.notes.push(format!(
                                "{}.{name}: kept {}'s concurrent {} over the authority's repair",
                                shown.task,
                                shown.agent.as_deref().unwrap_or("an agent"),
                                shown.value
                            ));
                        }
                    }
                }
                let agents: BTreeSet<String> =
                    values.iter().filter_map(|v| v.agent.clone()).collect();
                // The winner last, then as many of the others as an event lists.
                let others = values.len().saturating_sub(1).min(VIOLATION_TASKS_MAX - 1);
                let values: Vec<WrittenValue> = values
                    .into_iter()
                    .filter(|v| v.op != winner.op)
                    .take(others)
                    .chain([winner.clone()])
                    .map(clip_written)
                    .collect();
                out.push(Conflict {
                    key,
                    task: clip(id, TASK_ID_BYTES_MAX).to_owned(),
                    field: field_label.to_owned(),
                    values,
                    winner: clip_written(winner),
                    agents: agents.into_iter().take(VIOLATION_TASKS_MAX).collect(),
                    version: version(),
                });
            }
        }
        out
    }
}

/// A violation's or conflict's key: its kind and a digest of everything that names it
/// (task ids, Automerge op ids). What a key names can be as large as the list (a
/// single-active violation over a thousand tasks); the digest keeps every key the same
/// short size, which the store and each event can hold.
fn digest_key(kind: &str, names: &str) -> String {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(names.as_bytes());
    let hex: String = hash[..KEY_DIGEST_BYTES]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{kind}:{hex}")
}

/// Bytes of the SHA-256 digest a key keeps (128 bits: no two violations collide).
const KEY_DIGEST_BYTES: usize = 16;

/// `items` for a message: the first [`VIOLATION_TASKS_MAX`], then how many more.
fn some_of<'a>(items: impl IntoIterator<Item = &'a String>, total: usize) -> String {
    let shown: Vec<&str> = items
        .into_iter()
        .take(VIOLATION_TASKS_MAX)
        .map(|s| clip(s, TASK_ID_BYTES_MAX))
        .collect();
    let more = total.saturating_sub(shown.len());
    let mut out = shown.join(", ");
    if more > 0 {
        out.push_str(&format!(" … and {more} more"));
    }
    out
}

/// The static name of a known field.
fn field_name(f: &str) -> Option<&'static str> {
    field::ALL.iter().copied().find(|x| *x == f)
}

/// The current (winning) value of a field, with its writer.
fn written(list: &TodoList, id: &str, f: &'static str) -> Option<WrittenValue> {
    written_with_key(list, id, f).map(|(w, _)| w)
}

fn written_with_key(list: &TodoList, id: &str, f: &'static str) -> Option<(WrittenValue, OpKey)> {
    let entry = list.index().tasks.get(id)?;
    let (value, exid) = list.doc().get(&entry.obj, f).ok()??;
    let key = OpKey::of(&exid)?;
    Some((
        WrittenValue {
            task: id.to_owned(),
            field: f.to_owned(),
            value: crate::model::value_json(list.doc(), &value, &exid),
            agent: list.agent_of(&key.actor),
            op: key.render(),
        },
        key,
    ))
}

/// The dependency cycles among the tasks reachable from `starts` (see
/// [`crate::model::deps::cycles`]), and how many tasks the walk visited. A task naming
/// itself is a missing dependency, not a cycle.
fn find_cycles(list: &TodoList, starts: &[&String]) -> (Vec<Vec<String>>, usize) {
    let index = list.index();
    let deps = |id: &str| -> Vec<&str> {
        index
            .tasks
            .get(id)
            .map(|e| {
                e.raw
                    .blocked_by
                    .iter()
                    .filter(|d| d.as_str() != id && index.tasks.contains_key(*d))
                    .map(String::as_str)
                    .collect()
            })
            .unwrap_or_default()
    };
    crate::model::deps::cycles(starts.iter().map(|s| s.as_str()), deps)
}

/// Chooses writes that put the fields `change` wrote on task `id` back to their values
/// in the change's parent state (a function of the change alone: deterministic).
fn restore_before(
    list: &TodoList,
    change: &crate::model::ChangeInfo,
    id: &str,
    fields: &BTreeSet<String>,
    repair: &mut Repair,
) {
    let before: Option<RawTask> = list.raw_task_at(id, change.change.deps());
    let now = list.raw_task(id);
    match (&before, now) {
        (None, Some(_)) => repair.set(id, TASK_ENTRY_STATIC, FieldValue::Task(None)),
        (Some(b), None) => repair.set(id, TASK_ENTRY_STATIC, FieldValue::Task(Some(b.clone()))),
        (Some(b), Some(_)) => {
            for f in fields {
                let value = match f.as_str() {
                    field::CONTENT => FieldValue::Str(b.content.clone()),
                    field::ACTIVE_FORM => FieldValue::Str(b.active_form.clone()),
                    field::STATUS => FieldValue::Str(b.status.clone()),
                    field::PRIORITY => FieldValue::Str(b.priority.clone()),
                    field::OWNER => FieldValue::Str(b.owner.clone()),
                    field::POSITION => FieldValue::Str(Some(b.position.clone())),
                    field::BLOCKED_BY => FieldValue::List(b.blocked_by.clone()),
                    _ => continue,
                };
                if let Some(name) = field_name(f) {
                    repair.set(id, name, value);
                }
            }
        }
        (None, None) => {}
    }
}

const TASK_ENTRY_STATIC: &str = TASK_ENTRY;
