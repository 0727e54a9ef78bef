//! What agents do: a scenario's behaviours as write requests, shared by the
//! deterministic runner ([`super::runner`]) and the live one ([`super::live`]).
//!
//! Every choice draws from the caller's [`Rng`] in a fixed order, and nothing here reads
//! a clock: a seed of the deterministic runner replays unchanged, and a live agent makes
//! the same kind of choices from its own generator.

use std::collections::VecDeque;

use automerge::transaction::{CommitOptions, Transactable};
use automerge::{ActorId, ObjType, ReadDoc, ROOT};

use super::rng::Rng;
use super::scenario::{Action, FaultSpec, Mix};
use swarmtodo_core::model::{field, TodoList};
use swarmtodo_proto::{
    PatchOp, Priority, Rule, Status, Task, TaskPatch, Version, WriteMode, WriteRequest,
};

/// Most tasks an agent's plan lets a list grow to; past it the plan removes finished
/// tasks instead.
pub const LIST_TASKS_SIM_MAX: usize = 120;
/// Versions an agent remembers for its stale replaces.
pub const SEEN_VERSIONS_MAX: usize = 8;
/// Tasks the rogue keeps for its injections, per list.
pub const ROGUE_TASKS: usize = 4;
/// Tasks no one but their owner (the lead) may touch: the rogue's ownership targets.
pub const GUARD_TASKS: usize = 2;

const _: () = assert!(ROGUE_TASKS >= 2, "double_active needs two tasks");

/// Statuses no agent may write (what a buggy or foreign peer sends).
pub(crate) const BAD_STATUSES: [&str; 5] =
    ["done!", "bogus", "In Progress?", "finished-ish", "wip"];

/// A task of the ordinary workflow (not the rogue's, not a guarded one).
pub(crate) fn is_ordinary(id: &str) -> bool {
    !id.starts_with("rogue-") && !id.starts_with("guard-")
}

fn status(id: &str, s: Status) -> TaskPatch {
    TaskPatch {
        id: Some(id.to_owned()),
        status: Some(s),
        ..TaskPatch::default()
    }
}

/// The time to an agent's next action, milliseconds: uniform in [0.5, 1.5] × the mean
/// interval of `rate_per_s`, at least 1 ms.
pub(crate) fn interval_ms(rng: &mut Rng, rate_per_s: f64) -> u64 {
    let mean = 1_000.0 / rate_per_s;
    let jitter = 0.5 + (rng.below(1_001) as f64) / 1_000.0;
    ((mean * jitter) as u64).max(1)
}

/// The hub kills of a storm of `storm_ms`: `(at, down for)` in milliseconds, in time
/// order, spread over the storm and never overlapping; many kills share the storm, so
/// the hub is down for at most half of it.
pub(crate) fn hub_crashes(rng: &mut Rng, storm_ms: u64, f: &FaultSpec) -> Vec<(u64, u64)> {
    let mut crashes: Vec<u64> = (0..f.hub_crashes)
        .map(|_| rng.range(1, storm_ms.saturating_sub(1).max(1)))
        .collect();
    crashes.sort_unstable();
    let mut free_at = 0;
    let down_cap = (storm_ms / (2 * u64::from(f.hub_crashes.max(1)))).max(1);
    let (lo, hi) = (
        f.hub_down_ms[0].min(down_cap),
        f.hub_down_ms[1].min(down_cap),
    );
    let mut out = Vec::new();
    for t in crashes {
        let t = t.max(free_at);
        let down = rng.range(lo, hi);
        out.push((t, down));
        free_at = t + down + 1;
    }
    out
}

/// The partitions of a storm of `storm_ms` among `agents` agents: `(at, lasting,
/// agents cut off)`, milliseconds; each cuts off at least one agent.
pub(crate) fn partitions(
    rng: &mut Rng,
    storm_ms: u64,
    f: &FaultSpec,
    agents: usize,
) -> Vec<(u64, u64, Vec<usize>)> {
    let mut out = Vec::new();
    for _ in 0..f.partitions {
        let at = rng.range(1, storm_ms.max(2) - 1);
        let len = rng.range(f.partition_ms[0], f.partition_ms[1]);
        let mut cut: Vec<usize> = (0..agents)
            .filter(|_| rng.chance(f.partition_agents))
            .collect();
        if cut.is_empty() && agents > 0 {
            cut.push(rng.index(agents));
        }
        out.push((at, len, cut));
    }
    out
}

/// One action drawn from `mix` by weight (`mix.total()` must not be 0).
pub(crate) fn pick_action(rng: &mut Rng, mix: &Mix) -> Action {
    let mut pick = rng.below(mix.total());
    for (act, w) in mix.weights() {
        if pick < u64::from(w) {
            return act;
        }
        pick -= u64::from(w);
    }
    Action::Plan
}

/// A list's first plan, written by its first lead: `initial_tasks` steps, about half
/// of them given to one of `workers`, and with `guards` the tasks only the lead may
/// touch (the rogue's ownership targets).
pub(crate) fn initial_plan(
    rng: &mut Rng,
    initial_tasks: usize,
    lead: &str,
    workers: &[String],
    guards: usize,
) -> WriteRequest {
    let mut tasks = Vec::new();
    for i in 0..initial_tasks {
        let owner = if workers.is_empty() || rng.chance(0.5) {
            None
        } else {
            Some(workers[rng.index(workers.len())].clone())
        };
        tasks.push(TaskPatch {
            id: Some(format!("plan-{i}")),
            content: Some(format!("Plan step {i}")),
            owner: Some(owner),
            ..TaskPatch::default()
        });
    }
    for i in 0..guards {
        tasks.push(TaskPatch {
            id: Some(format!("guard-{i}")),
            content: Some(format!("Guarded step {i}")),
            owner: Some(Some(lead.to_owned())),
            ..TaskPatch::default()
        });
    }
    WriteRequest {
        mode: WriteMode::Patch {
            ops: tasks
                .into_iter()
                .map(|t| PatchOp::Upsert { task: t })
                .collect(),
        },
        expected_version: None,
        explanation: Some("initial plan".into()),
    }
}

/// One agent on one list, as its behaviours see it.
#[derive(Debug)]
pub(crate) struct Writer<'a> {
    /// The agent id.
    pub(crate) name: &'a str,
    /// A lead (writes everything) rather than a worker.
    pub(crate) lead: bool,
    /// Its replica of the list.
    pub(crate) replica: &'a TodoList,
    /// Versions it saw lately, oldest first (for stale replaces).
    pub(crate) seen: &'a VecDeque<Version>,
    /// The workers of the list (owners a lead's new tasks may get).
    pub(crate) workers: &'a [String],
    /// The counter of the agent's new task ids.
    pub(crate) next_task: &'a mut u64,
    /// Which of the agent's sessions this is (0 for an agent of one session): its new
    /// task ids must not collide with its siblings'.
    pub(crate) session: usize,
    /// Tasks of a race the hub has not seen both starts of yet: left alone, so that
    /// the race is decided by the hub and no one else (see [`race_tasks`]).
    pub(crate) held: &'a [String],
}

impl Writer<'_> {
    fn new_task_id(&mut self) -> String {
        *self.next_task += 1;
        if self.session == 0 {
            format!("{}-t{}", self.name, self.next_task)
        } else {
            format!("{}-s{}-t{}", self.name, self.session, self.next_task)
        }
    }
}

/// The write that starts task `id` (a validated write: the model refuses it when the
/// writer's replica already has a task of the owner in progress).
pub(crate) fn start_request(id: &str) -> WriteRequest {
    WriteRequest {
        mode: WriteMode::Patch {
            ops: vec![PatchOp::Upsert {
                task: status(id, Status::InProgress),
            }],
        },
        expected_version: None,
        explanation: None,
    }
}

/// The two tasks of a `race_start` by agent `me` on `replica`: two different pending
/// tasks it owns, when none of its tasks is in progress (else None: nothing to race
/// for, or the model would refuse the starts).
///
/// The race is the hub's to decide only if both starts reach it before anything else
/// changes either task (a sibling that has seen one start could complete it before the
/// other arrives, and there would be nothing to report). So the runners hold both
/// tasks — no agent's behaviour touches them (`held`) — until the hub has acknowledged
/// both starts.
pub(crate) fn race_tasks(
    rng: &mut Rng,
    me: &str,
    replica: &TodoList,
    held: &[String],
) -> Option<(String, String)> {
    let snap = replica.read();
    let mine = snap
        .tasks
        .iter()
        .filter(|t| is_ordinary(&t.id) && t.owner.as_deref() == Some(me));
    if mine.clone().any(|t| t.status == Status::InProgress) {
        return None;
    }
    let pending: Vec<&Task> = mine
        .filter(|t| t.status == Status::Pending && !held.contains(&t.id))
        .collect();
    if pending.len() < 2 {
        return None;
    }
    let i = rng.index(pending.len());
    let j = (i + 1 + rng.index(pending.len() - 1)) % pending.len();
    Some((pending[i].id.clone(), pending[j].id.clone()))
}

/// The write request for an ordinary action, if one applies.
pub(crate) fn request(rng: &mut Rng, mut w: Writer<'_>, action: Action) -> Option<WriteRequest> {
    let me = w.name;
    let lead = w.lead;
    let snap = w.replica.read();
    let held = w.held;
    let ordinary: Vec<&Task> = snap
        .tasks
        .iter()
        .filter(|t| is_ordinary(&t.id) && !held.contains(&t.id))
        .collect();
    let mine = |t: &&Task| t.owner.as_deref() == Some(me);
    let open = |t: &&Task| matches!(t.status, Status::Pending | Status::Blocked);
    let patch = |ops: Vec<PatchOp>| WriteRequest {
        mode: WriteMode::Patch { ops },
        expected_version: None,
        explanation: None,
    };
    let upsert = |task: TaskPatch| PatchOp::Upsert { task };
    match action {
        Action::Plan => {
            if snap.tasks.len() >= LIST_TASKS_SIM_MAX {
                let done: Vec<PatchOp> = ordinary
                    .iter()
                    .filter(|t| !t.status.is_open())
                    .take(3)
                    .map(|t| PatchOp::Remove { id: t.id.clone() })
                    .collect();
                return (!done.is_empty()).then(|| patch(done));
            }
            let workers = w.workers;
            let n = rng.range(1, 3);
            let mut ops = Vec::new();
            for _ in 0..n {
                let id = w.new_task_id();
                let owner = if !lead || workers.is_empty() || rng.chance(0.5) {
                    None
                } else {
                    Some(workers[rng.index(workers.len())].clone())
                };
                let priority = [Priority::High, Priority::Medium, Priority::Low][rng.index(3)];
                ops.push(upsert(TaskPatch {
                    id: Some(id.clone()),
                    content: Some(format!("Do {id}")),
                    active_form: Some(Some(format!("Doing {id}"))),
                    priority: Some(priority),
                    owner: Some(owner),
                    ..TaskPatch::default()
                }));
            }
            Some(patch(ops))
        }
        Action::Claim | Action::ClaimStart => {
            let free: Vec<&&Task> = ordinary
                .iter()
                .filter(|t| t.owner.is_none() && t.status == Status::Pending)
                .collect();
            if free.is_empty() {
                return None;
            }
            // The race: everyone goes for the first free tasks.
            let t = free[rng.index(free.len().min(3))];
            let busy = ordinary
                .iter()
                .any(|t| mine(t) && t.status == Status::InProgress);
            let start = action == Action::ClaimStart;
            if start && busy {
                // Finish what is in progress first.
                let cur = ordinary
                    .iter()
                    .find(|t| mine(t) && t.status == Status::InProgress)?;
                return Some(patch(vec![upsert(status(&cur.id, Status::Completed))]));
            }
            Some(patch(vec![upsert(TaskPatch {
                id: Some(t.id.clone()),
                owner: Some(Some(me.to_owned())),
                status: start.then_some(Status::InProgress),
                ..TaskPatch::default()
            })]))
        }
        Action::Start => {
            let c: Vec<&&Task> = ordinary
                .iter()
                .filter(|t| mine(t) && t.status == Status::Pending)
                .collect();
            let t = c.get(rng.index(c.len()))?;
            Some(patch(vec![upsert(status(&t.id, Status::InProgress))]))
        }
        Action::Complete => {
            let t = ordinary
                .iter()
                .find(|t| mine(t) && t.status == Status::InProgress)?;
            Some(patch(vec![upsert(status(&t.id, Status::Completed))]))
        }
        Action::Cancel => {
            let c: Vec<&&Task> = ordinary
                .iter()
                .filter(|t| (lead || mine(t) || t.owner.is_none()) && open(t))
                .collect();
            let t = c.get(rng.index(c.len()))?;
            Some(patch(vec![upsert(status(&t.id, Status::Cancelled))]))
        }
        Action::Reorder => {
            let c: Vec<&&Task> = ordinary
                .iter()
                .filter(|t| lead || mine(t) || t.owner.is_none())
                .collect();
            let t = c.get(rng.index(c.len()))?;
            let after = if rng.chance(0.2) {
                None
            } else {
                let o = ordinary[rng.index(ordinary.len())];
                (o.id != t.id).then(|| o.id.clone())
            };
            Some(patch(vec![PatchOp::Move {
                id: t.id.clone(),
                after,
            }]))
        }
        Action::Depend => {
            if ordinary.len() < 2 {
                return None;
            }
            let x = ordinary[rng.index(ordinary.len())];
            let y = ordinary[rng.index(ordinary.len())];
            if x.id == y.id || x.blocked_by.contains(&y.id) || !(lead || mine(&x)) {
                return None;
            }
            let mut deps = x.blocked_by.clone();
            deps.push(y.id.clone());
            Some(patch(vec![upsert(TaskPatch {
                id: Some(x.id.clone()),
                blocked_by: Some(deps),
                ..TaskPatch::default()
            })]))
        }
        Action::ReplaceStale => {
            let base = w.seen.front().cloned()?;
            let old = w.replica.read_at(&base).ok()?;
            let droppable: Vec<usize> = old
                .tasks
                .iter()
                .enumerate()
                .filter(|(_, t)| is_ordinary(&t.id) && !held.contains(&t.id))
                .map(|(i, _)| i)
                .collect();
            let skip = droppable.get(rng.index(droppable.len())).copied();
            let mut tasks: Vec<TaskPatch> = old
                .tasks
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != skip)
                .map(|(_, t)| TaskPatch {
                    id: Some(t.id.clone()),
                    content: Some(t.content.clone()),
                    active_form: Some(t.active_form.clone()),
                    status: Some(t.status),
                    priority: Some(t.priority),
                    owner: Some(t.owner.clone()),
                    blocked_by: Some(t.blocked_by.clone()),
                })
                .collect();
            let id = w.new_task_id();
            tasks.push(TaskPatch {
                id: Some(id.clone()),
                content: Some(format!("Do {id}")),
                ..TaskPatch::default()
            });
            Some(WriteRequest {
                mode: WriteMode::Replace {
                    tasks,
                    base_version: Some(base),
                },
                expected_version: None,
                explanation: Some("replan from an old read".into()),
            })
        }
        _ => None,
    }
}

/// What the rogue writes around the model's validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawEdit {
    /// Put this status on every task.
    Status(&'static str),
    /// Make every task depend on this (missing) task.
    BlockedBy(String),
    /// Make `count` tasks `{prefix}{i}`, all in progress for the rogue.
    Wide {
        /// Ids start with this.
        prefix: String,
        /// How many.
        count: usize,
    },
    /// Make `count` tasks `{prefix}{i}`, each blocked by the one before, the first by
    /// the last: one cycle.
    Cycle {
        /// Ids start with this.
        prefix: String,
        /// How many.
        count: usize,
    },
    /// Delete the root's `tasks` map.
    WipeTasks,
    /// Write every task's `blocked_by` as this string (not a list).
    StringBlockedBy(String),
    /// Put a plain string under this task id.
    StringEntry(String),
    /// Write every task's content this many bytes long.
    LongContent(usize),
    /// Make a task with this id (longer than the model allows).
    LongId(String),
}

/// The rogue's next move for one of its injecting actions.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RogueMove {
    /// Its own tasks first, by the book (a validated write, no injection).
    Setup(WriteRequest),
    /// A change that bypasses validation, on the tasks `ids`, breaking `rule`.
    Raw {
        /// The rule the change breaks.
        rule: Rule,
        /// The tasks it edits, in order.
        ids: Vec<String>,
        /// The edit.
        edit: RawEdit,
    },
    /// A validated write on a task another agent owns (ownership).
    Foreign(WriteRequest),
    /// Nothing fits now.
    Idle,
}

/// The rogue `me`'s move for `action` (one of invalid_status, double_active,
/// bad_dependency, foreign_task) on its `replica`.
pub(crate) fn rogue_move(rng: &mut Rng, me: &str, replica: &TodoList, action: Action) -> RogueMove {
    let snap = replica.read();
    let prefix = format!("rogue-{me}-");
    let own: Vec<&Task> = snap
        .tasks
        .iter()
        .filter(|t| t.id.starts_with(&prefix))
        .collect();
    if own.len() < ROGUE_TASKS && action != Action::ForeignTask {
        let ops = (own.len()..ROGUE_TASKS)
            .map(|i| PatchOp::Upsert {
                task: TaskPatch {
                    id: Some(format!("{prefix}{i}")),
                    content: Some(format!("Rogue task {i}")),
                    owner: Some(Some(me.to_owned())),
                    ..TaskPatch::default()
                },
            })
            .collect();
        return RogueMove::Setup(WriteRequest {
            mode: WriteMode::Patch { ops },
            expected_version: None,
            explanation: None,
        });
    }
    match action {
        Action::InvalidStatus => {
            let t = own[rng.index(own.len())].id.clone();
            let bad = BAD_STATUSES[rng.index(BAD_STATUSES.len())];
            RogueMove::Raw {
                rule: Rule::Schema,
                ids: vec![t],
                edit: RawEdit::Status(bad),
            }
        }
        Action::DoubleActive => {
            let idle: Vec<String> = own
                .iter()
                .filter(|t| t.status != Status::InProgress)
                .map(|t| t.id.clone())
                .collect();
            if idle.len() < 2 {
                return RogueMove::Idle;
            }
            let i = rng.index(idle.len());
            let j = (i + 1 + rng.index(idle.len() - 1)) % idle.len();
            RogueMove::Raw {
                rule: Rule::SingleActive,
                ids: vec![idle[i].clone(), idle[j].clone()],
                edit: RawEdit::Status(Status::InProgress.as_str()),
            }
        }
        Action::BadDependency => {
            let t = own[rng.index(own.len())].id.clone();
            let ghost = format!("ghost-{}", rng.below(1_000_000));
            RogueMove::Raw {
                rule: Rule::Dependencies,
                ids: vec![t],
                edit: RawEdit::BlockedBy(ghost),
            }
        }
        Action::ForeignTask => {
            let guards: Vec<&Task> = snap
                .tasks
                .iter()
                .filter(|t| t.id.starts_with("guard-"))
                .collect();
            let Some(t) = guards.get(rng.index(guards.len())) else {
                return RogueMove::Idle;
            };
            let n = rng.below(1_000_000);
            RogueMove::Foreign(WriteRequest {
                mode: WriteMode::Patch {
                    ops: vec![PatchOp::Upsert {
                        task: TaskPatch {
                            id: Some(t.id.clone()),
                            content: Some(format!("Rogue edit {n}")),
                            ..TaskPatch::default()
                        },
                    }],
                },
                expected_version: None,
                explanation: None,
            })
        }
        Action::WideActive => RogueMove::Raw {
            rule: Rule::SingleActive,
            ids: Vec::new(),
            edit: RawEdit::Wide {
                prefix: format!("{prefix}w{}-", rng.below(1_000_000)),
                count: rng.range(ROGUE_BULK_MIN as u64, ROGUE_BULK_MAX as u64) as usize,
            },
        },
        Action::DependencyCycle => RogueMove::Raw {
            rule: Rule::Dependencies,
            ids: Vec::new(),
            edit: RawEdit::Cycle {
                prefix: format!("{prefix}c{}-", rng.below(1_000_000)),
                count: rng.range(ROGUE_BULK_MIN as u64, ROGUE_BULK_MAX as u64) as usize,
            },
        },
        Action::WipeRoot => RogueMove::Raw {
            rule: Rule::Ownership,
            ids: Vec::new(),
            edit: RawEdit::WipeTasks,
        },
        Action::Misshapen if rng.below(2) == 0 => RogueMove::Raw {
            rule: Rule::Schema,
            ids: vec![own[rng.index(own.len())].id.clone()],
            edit: RawEdit::StringBlockedBy(own[rng.index(own.len())].id.clone()),
        },
        Action::Misshapen => RogueMove::Raw {
            rule: Rule::Schema,
            ids: Vec::new(),
            edit: RawEdit::StringEntry(format!("{prefix}s{}", rng.below(1_000_000))),
        },
        Action::OverLimit if rng.below(2) == 0 => RogueMove::Raw {
            rule: Rule::Schema,
            ids: vec![own[rng.index(own.len())].id.clone()],
            edit: RawEdit::LongContent(
                swarmtodo_proto::TASK_TEXT_BYTES_MAX + 1 + rng.below(4_096) as usize,
            ),
        },
        Action::OverLimit => {
            let mut id = format!("{prefix}long{}-", rng.below(1_000_000));
            while id.len() <= swarmtodo_proto::TASK_ID_BYTES_MAX {
                id.push('x');
            }
            RogueMove::Raw {
                rule: Rule::Schema,
                ids: Vec::new(),
                edit: RawEdit::LongId(id),
            }
        }
        _ => RogueMove::Idle,
    }
}

/// Fewest tasks a bulk rogue move (`wide_active`, `dependency_cycle`) makes …
const ROGUE_BULK_MIN: usize = 20;
/// … and most: over a hundred in one change, enough that a key naming each would be
/// kilobytes, yet the list stays small enough for 200 seeds in minutes (the limits
/// themselves are reached by `tests/hub/hostile_peers.rs`).
const ROGUE_BULK_MAX: usize = 120;

/// A change that bypasses the model's validation (a foreign or buggy peer): made on a
/// fork of `replica` under `raw_actor` (registered as agent `name`), stamped `now_ms`.
/// None when a task of `ids` is missing. The caller applies it to the replica.
pub(crate) fn raw_change(
    replica: &TodoList,
    raw_actor: &ActorId,
    name: &str,
    now_ms: i64,
    ids: &[String],
    edit: &RawEdit,
) -> Option<automerge::Change> {
    let mut doc = replica.doc().fork().with_actor(raw_actor.clone());
    let get = |obj: &automerge::ObjId, key: &str| -> Option<automerge::ObjId> {
        doc.get(obj, key).ok().flatten().map(|(_, id)| id)
    };
    let (Some(tasks), Some(agents)) = (get(&ROOT, "tasks"), get(&ROOT, "agents")) else {
        return None;
    };
    let objs = ids
        .iter()
        .map(|id| get(&tasks, id))
        .collect::<Option<Vec<_>>>()?;
    let mut tx = doc.transaction();
    let wrote = tx
        .put(&agents, raw_actor.to_hex_string(), name)
        .and_then(|()| {
            for o in &objs {
                match edit {
                    RawEdit::Status(s) => tx.put(o, field::STATUS, *s)?,
                    RawEdit::BlockedBy(ghost) => {
                        let deps = tx.put_object(o, field::BLOCKED_BY, ObjType::List)?;
                        tx.insert(&deps, 0, ghost.as_str())?;
                    }
                    RawEdit::StringBlockedBy(dep) => tx.put(o, field::BLOCKED_BY, dep.as_str())?,
                    RawEdit::LongContent(n) => tx.put(o, field::CONTENT, "x".repeat(*n))?,
                    _ => {}
                }
            }
            let task = |tx: &mut automerge::transaction::Transaction<'_>,
                        id: &str,
                        status: &str,
                        deps: &[String]|
             -> Result<(), automerge::AutomergeError> {
                let t = tx.put_object(&tasks, id, ObjType::Map)?;
                tx.put(&t, field::CONTENT, format!("Rogue {id}"))?;
                tx.put(&t, field::STATUS, status)?;
                tx.put(&t, field::PRIORITY, "medium")?;
                tx.put(&t, field::OWNER, name)?;
                tx.put(&t, field::POSITION, "f0")?;
                let list = tx.put_object(&t, field::BLOCKED_BY, ObjType::List)?;
                for (i, d) in deps.iter().enumerate() {
                    tx.insert(&list, i, d.as_str())?;
                }
                Ok(())
            };
            match edit {
                RawEdit::Wide { prefix, count } => {
                    for i in 0..*count {
                        task(&mut tx, &format!("{prefix}{i}"), "in_progress", &[])?;
                    }
                }
                RawEdit::Cycle { prefix, count } => {
                    for i in 0..*count {
                        let before = (i + count - 1) % count;
                        task(
                            &mut tx,
                            &format!("{prefix}{i}"),
                            "pending",
                            &[format!("{prefix}{before}")],
                        )?;
                    }
                }
                RawEdit::WipeTasks => tx.delete(&ROOT, "tasks")?,
                RawEdit::StringEntry(id) => tx.put(&tasks, id.as_str(), "just a string")?,
                RawEdit::LongId(id) => task(&mut tx, id, "pending", &[])?,
                _ => {}
            }
            Ok(())
        });
    if wrote.is_err() {
        tx.rollback();
        return None;
    }
    tx.commit_with(CommitOptions::default().with_time(now_ms));
    doc.get_last_local_change()
}
