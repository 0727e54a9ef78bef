//! `todo_write` on a replica (docs/DESIGN.md §5): validate the whole request against the
//! list, build the resulting tasks as a draft, and only then commit the fields that
//! differ as one Automerge change. An invalid write changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use automerge::{transaction::Transactable, ActorId, ObjType, ROOT};

use super::doc::{self, field, RawTask};
use super::index::Index;
use super::{normalize, position, write, Merge, TodoList};
use crate::proto::{
    ApiError, ErrorCode, PatchOp, Priority, Status, Task, TaskPatch, WriteMode, WriteRequest,
    WriteResult, AGENT_ID_BYTES_MAX, BLOCKED_BY_COUNT_MAX, EXPLANATION_BYTES_MAX, LIST_TASKS_MAX,
    TASK_ID_BYTES_MAX, TASK_TEXT_BYTES_MAX, WRITE_OPS_MAX,
};
use automerge::{transaction::CommitOptions, AutomergeError};

/// Who writes, when, and the seed for generated task ids. The model reads no clock and
/// no OS randomness: the caller passes both.
#[derive(Debug, Clone)]
pub struct WriteContext {
    /// The writing agent's id (recorded against the replica's actor in the list).
    pub agent: String,
    /// Milliseconds since the Unix epoch, stamped on the change.
    pub now_ms: i64,
    /// Seed for ids of tasks created without one.
    pub id_seed: u64,
}

impl WriteContext {
    /// A context for `agent` at `now_ms`, with `id_seed` for generated ids.
    pub fn new(agent: impl Into<String>, now_ms: i64, id_seed: u64) -> Self {
        WriteContext {
            agent: agent.into(),
            now_ms,
            id_seed,
        }
    }
}

/// A task as the write wants it, including its position key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Desired {
    pub(crate) task: Task,
    pub(crate) position: String,
}

/// The outcome of planning: every task whose stored form must change.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// id → desired task (None: remove).
    pub(crate) changed: BTreeMap<String, Option<Desired>>,
    pub(crate) created: Vec<String>,
    pub(crate) removed: Vec<String>,
}

fn err(code: ErrorCode, field: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError {
        code,
        field: Some(field.into()),
        allowed: Vec::new(),
        message: message.into(),
        current: None,
    }
}

fn check_id(id: &str, at: &str) -> Result<(), ApiError> {
    if id.trim().is_empty() {
        return Err(err(
            ErrorCode::MissingField,
            at,
            "task id is empty: give a non-empty id, or omit it to have one generated",
        ));
    }
    if id.len() > TASK_ID_BYTES_MAX {
        return Err(err(
            ErrorCode::LimitExceeded,
            at,
            format!(
                "task id is {} bytes; the limit is {TASK_ID_BYTES_MAX}",
                id.len()
            ),
        ));
    }
    if id.chars().any(char::is_control) {
        return Err(err(
            ErrorCode::InvalidValue,
            at,
            "task id contains control characters",
        ));
    }
    Ok(())
}

fn check_text(text: &str, at: &str, required: bool) -> Result<(), ApiError> {
    if required && text.trim().is_empty() {
        return Err(err(
            ErrorCode::MissingField,
            at,
            "content is empty: say what the task is, imperatively (\"Run the tests\")",
        ));
    }
    if text.len() > TASK_TEXT_BYTES_MAX {
        return Err(err(
            ErrorCode::LimitExceeded,
            at,
            format!(
                "text is {} bytes; the limit is {TASK_TEXT_BYTES_MAX}",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// Field-level checks of one patch, independent of the list.
fn check_patch(p: &TaskPatch, at: &str) -> Result<(), ApiError> {
    if let Some(id) = &p.id {
        check_id(id, &format!("{at}.id"))?;
    }
    if let Some(c) = &p.content {
        check_text(c, &format!("{at}.content"), true)?;
    }
    if let Some(Some(a)) = &p.active_form {
        check_text(a, &format!("{at}.active_form"), false)?;
    }
    if let Some(Some(o)) = &p.owner {
        let f = format!("{at}.owner");
        if o.trim().is_empty() {
            return Err(err(
                ErrorCode::MissingField,
                f,
                "owner is empty: give an agent id, or null to release the task",
            ));
        }
        if o.len() > AGENT_ID_BYTES_MAX {
            return Err(err(
                ErrorCode::LimitExceeded,
                f,
                format!(
                    "owner is {} bytes; the limit is {AGENT_ID_BYTES_MAX}",
                    o.len()
                ),
            ));
        }
    }
    if let Some(deps) = &p.blocked_by {
        let f = format!("{at}.blocked_by");
        if deps.len() > BLOCKED_BY_COUNT_MAX {
            return Err(err(
                ErrorCode::LimitExceeded,
                f,
                format!(
                    "{} dependencies; the limit is {BLOCKED_BY_COUNT_MAX}",
                    deps.len()
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for (i, d) in deps.iter().enumerate() {
            check_id(d, &format!("{f}[{i}]"))?;
            if !seen.insert(d) {
                return Err(err(
                    ErrorCode::DuplicateId,
                    format!("{f}[{i}]"),
                    format!("dependency {d:?} is named twice"),
                ));
            }
        }
    }
    Ok(())
}

/// Generates the `n`-th task id of a write from the caller's seed (UUID v4 layout).
fn generated_id(seed: u64, n: u64) -> String {
    // SplitMix64: a well-mixed stream from a seed, enough for unique ids per write.
    let mut state = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&next().to_le_bytes());
    bytes[8..].copy_from_slice(&next().to_le_bytes());
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// Applies a patch's fields to a task.
fn apply_fields(task: &mut Task, p: &TaskPatch) {
    if let Some(c) = &p.content {
        task.content = c.clone();
    }
    if let Some(a) = &p.active_form {
        task.active_form = a.clone();
    }
    if let Some(s) = p.status {
        task.status = s;
    }
    if let Some(pr) = p.priority {
        task.priority = pr;
    }
    if let Some(o) = &p.owner {
        task.owner = o.clone();
    }
    if let Some(b) = &p.blocked_by {
        task.blocked_by = b.clone();
    }
}

/// The draft: the list's index plus the tasks this write changes.
struct Draft<'a> {
    index: &'a Index,
    plan: Plan,
    generated: u64,
    seed: u64,
    /// The greatest `(position, id)` ever planned in this write: an upper bound of the
    /// planned positions, so appending stays O(log n) per task (a key after it is after
    /// everything).
    planned_max: Option<(String, String)>,
}

impl<'a> Draft<'a> {
    fn new(index: &'a Index, seed: u64) -> Self {
        Draft {
            index,
            plan: Plan::default(),
            generated: 0,
            seed,
            planned_max: None,
        }
    }

    fn get(&self, id: &str) -> Option<Desired> {
        match self.plan.changed.get(id) {
            Some(d) => d.clone(),
            None => self.index.tasks.get(id).map(|e| Desired {
                task: normalize(id, &e.raw),
                position: e.raw.position.clone(),
            }),
        }
    }

    fn exists(&self, id: &str) -> bool {
        match self.plan.changed.get(id) {
            Some(d) => d.is_some(),
            None => self.index.tasks.contains_key(id),
        }
    }

    fn new_id(&mut self) -> String {
        loop {
            let id = generated_id(self.seed, self.generated);
            self.generated += 1;
            if !self.exists(&id) {
                return id;
            }
        }
    }

    fn set(&mut self, id: &str, d: Option<Desired>) {
        if let Some(d) = &d {
            let key = (d.position.clone(), id.to_owned());
            if self.planned_max.as_ref().is_none_or(|m| key > *m) {
                self.planned_max = Some(key);
            }
        }
        self.plan.changed.insert(id.to_owned(), d);
    }

    /// The order key of the task right after `key` in the draft, skipping `skip`.
    fn next_position(&self, key: &(String, String), skip: &str) -> Option<String> {
        use std::ops::Bound::{Excluded, Unbounded};
        let from_index = self
            .index
            .order
            .range((Excluded(key.clone()), Unbounded))
            .find(|(_, id)| id != skip && !self.plan.changed.contains_key(id))
            .cloned();
        let from_plan = self
            .plan
            .changed
            .iter()
            .filter(|(id, _)| id.as_str() != skip)
            .filter_map(|(id, d)| d.as_ref().map(|d| (d.position.clone(), id.clone())))
            .filter(|k| k > key)
            .min();
        match (from_index, from_plan) {
            (Some(a), Some(b)) => Some(a.min(b).0),
            (a, b) => a.or(b).map(|k| k.0),
        }
    }

    /// A position at or after the greatest in the draft.
    fn last_position(&self) -> Option<String> {
        // The index's last key is an upper bound even if the write moves or removes
        // that task: a key after it is after every remaining one.
        let from_index = self.index.order.iter().next_back().cloned();
        from_index.max(self.planned_max.clone()).map(|k| k.0)
    }

    fn first_position(&self) -> Option<String> {
        let from_index = self
            .index
            .order
            .iter()
            .find(|(_, id)| !self.plan.changed.contains_key(id))
            .cloned();
        let from_plan = self
            .plan
            .changed
            .iter()
            .filter_map(|(id, d)| d.as_ref().map(|d| (d.position.clone(), id.clone())))
            .min();
        match (from_index, from_plan) {
            (Some(a), Some(b)) => Some(a.min(b).0),
            (a, b) => a.or(b).map(|k| k.0),
        }
    }

    /// Creates or updates one task from a patch; a new task goes to the end.
    fn upsert(&mut self, p: &TaskPatch, at: &str) -> Result<String, ApiError> {
        let id = match &p.id {
            Some(id) => id.clone(),
            None => self.new_id(),
        };
        match self.get(&id) {
            Some(mut d) => {
                apply_fields(&mut d.task, p);
                self.set(&id, Some(d));
            }
            None => {
                let Some(content) = &p.content else {
                    return Err(err(
                        ErrorCode::MissingField,
                        format!("{at}.content"),
                        format!("task {id:?} is new, so it needs content"),
                    ));
                };
                let mut task = Task {
                    id: id.clone(),
                    content: content.clone(),
                    active_form: None,
                    status: Status::Pending,
                    priority: Priority::Medium,
                    owner: None,
                    blocked_by: Vec::new(),
                };
                apply_fields(&mut task, p);
                let position = position::between(self.last_position().as_deref(), None);
                self.plan.created.push(id.clone());
                self.set(&id, Some(Desired { task, position }));
            }
        }
        Ok(id)
    }

    fn unknown(&self, id: &str, at: String) -> ApiError {
        err(
            ErrorCode::UnknownTask,
            at,
            format!("no task {id:?} in the list: read the list and use an id from it"),
        )
    }

    fn remove(&mut self, id: &str, at: String) -> Result<(), ApiError> {
        if !self.exists(id) {
            return Err(self.unknown(id, at));
        }
        if self.index.tasks.contains_key(id) {
            self.plan.removed.push(id.to_owned());
        } else {
            self.plan.created.retain(|c| c != id);
        }
        self.set(id, None);
        Ok(())
    }

    fn move_after(&mut self, id: &str, after: Option<&str>, at: &str) -> Result<(), ApiError> {
        let Some(mut d) = self.get(id) else {
            return Err(self.unknown(id, format!("{at}.id")));
        };
        let (lo, hi) = match after {
            None => (None, self.first_position_excluding(id)),
            Some(a) if a == id => {
                return Err(err(
                    ErrorCode::InvalidValue,
                    format!("{at}.after"),
                    "a task cannot move after itself",
                ))
            }
            Some(a) => {
                let Some(ad) = self.get(a) else {
                    return Err(self.unknown(a, format!("{at}.after")));
                };
                let key = (ad.position.clone(), a.to_owned());
                (Some(ad.position), self.next_position(&key, id))
            }
        };
        d.position = position::between(lo.as_deref(), hi.as_deref());
        self.set(id, Some(d));
        Ok(())
    }

    fn first_position_excluding(&self, id: &str) -> Option<String> {
        let first = self.first_position();
        match first {
            Some(p) if self.get(id).map(|d| d.position) == Some(p.clone()) => {
                self.next_position(&(p, id.to_owned()), id)
            }
            other => other,
        }
    }
}

/// Longest increasing subsequence of `keys` (indices into it), O(n log n).
fn longest_increasing<T: Ord>(keys: &[T]) -> BTreeSet<usize> {
    let mut tails: Vec<usize> = Vec::new();
    let mut prev: Vec<Option<usize>> = vec![None; keys.len()];
    for i in 0..keys.len() {
        let pos = tails.partition_point(|&t| keys[t] < keys[i]);
        if pos > 0 {
            prev[i] = Some(tails[pos - 1]);
        }
        if pos == tails.len() {
            tails.push(i);
        } else {
            tails[pos] = i;
        }
    }
    let mut out = BTreeSet::new();
    let mut cur = tails.last().copied();
    while let Some(i) = cur {
        out.insert(i);
        cur = prev[i];
    }
    out
}

/// Plans a write against the index. `base` is the list as the writer last saw it
/// (replace only): ids and contents.
pub(crate) fn plan(
    index: &Index,
    req: &WriteRequest,
    ctx: &WriteContext,
    base: Option<&BTreeMap<String, RawTask>>,
) -> Result<Plan, ApiError> {
    if let Some(e) = &req.explanation {
        if e.len() > EXPLANATION_BYTES_MAX {
            return Err(err(
                ErrorCode::LimitExceeded,
                "explanation",
                format!(
                    "explanation is {} bytes; the limit is {EXPLANATION_BYTES_MAX}",
                    e.len()
                ),
            ));
        }
    }
    let mut draft = Draft::new(index, ctx.id_seed);
    match &req.mode {
        WriteMode::Patch { ops } => {
            if ops.len() > WRITE_OPS_MAX {
                return Err(err(
                    ErrorCode::LimitExceeded,
                    "ops",
                    format!("{} ops; the limit is {WRITE_OPS_MAX}", ops.len()),
                ));
            }
            let mut upserted = BTreeSet::new();
            for (i, op) in ops.iter().enumerate() {
                let at = format!("ops[{i}]");
                match op {
                    PatchOp::Upsert { task } => {
                        let at = format!("{at}.task");
                        check_patch(task, &at)?;
                        if let Some(id) = &task.id {
                            if !upserted.insert(id.clone()) {
                                return Err(err(
                                    ErrorCode::DuplicateId,
                                    format!("{at}.id"),
                                    format!(
                                        "task {id:?} is upserted twice in one write: merge the two"
                                    ),
                                ));
                            }
                        }
                        draft.upsert(task, &at)?;
                    }
                    PatchOp::Remove { id } => draft.remove(id, format!("{at}.id"))?,
                    PatchOp::Move { id, after } => draft.move_after(id, after.as_deref(), &at)?,
                }
            }
        }
        WriteMode::Replace { tasks, .. } => {
            if tasks.len() > WRITE_OPS_MAX {
                return Err(err(
                    ErrorCode::LimitExceeded,
                    "tasks",
                    format!("{} tasks; the limit is {WRITE_OPS_MAX}", tasks.len()),
                ));
            }
            let base_all: BTreeMap<String, RawTask>;
            let base = match base {
                Some(b) => b,
                None => {
                    base_all = index
                        .tasks
                        .iter()
                        .map(|(id, e)| (id.clone(), e.raw.clone()))
                        .collect();
                    &base_all
                }
            };
            // Resolve ids: explicit, else the first unclaimed base task with the same
            // content (id-less writers), else generated.
            let mut ids: Vec<Option<String>> = Vec::with_capacity(tasks.len());
            let mut seen = BTreeSet::new();
            for (i, t) in tasks.iter().enumerate() {
                let at = format!("tasks[{i}]");
                check_patch(t, &at)?;
                if let Some(id) = &t.id {
                    if !seen.insert(id.clone()) {
                        return Err(err(
                            ErrorCode::DuplicateId,
                            format!("{at}.id"),
                            format!("task {id:?} appears twice in the list"),
                        ));
                    }
                }
                ids.push(t.id.clone());
            }
            for (i, t) in tasks.iter().enumerate() {
                if ids[i].is_some() {
                    continue;
                }
                if let Some(content) = &t.content {
                    let hit = base
                        .iter()
                        .find(|(id, b)| b.content.as_ref() == Some(content) && !seen.contains(*id))
                        .map(|(id, _)| id.clone());
                    if let Some(id) = hit {
                        seen.insert(id.clone());
                        ids[i] = Some(id);
                    }
                }
            }
            // Tasks the writer saw and left out go; tasks others added since stay.
            for id in base.keys() {
                if !seen.contains(id) && index.tasks.contains_key(id) {
                    draft.remove(id, "tasks".to_owned())?;
                }
            }
            // Field updates and creations; new tasks get positions below.
            let mut resolved = Vec::with_capacity(tasks.len());
            for (i, t) in tasks.iter().enumerate() {
                let at = format!("tasks[{i}]");
                let mut p = t.clone();
                p.id = ids[i].clone();
                // A diff against the base: only what the writer changed since it read
                // the list is written, so concurrent edits of other fields survive.
                if let Some((id, b)) = p.id.clone().and_then(|id| base.get(&id).map(|b| (id, b))) {
                    let mut reduced = p.clone();
                    drop_unchanged(&mut reduced, &normalize(&id, b));
                    let gone = !draft.exists(&id);
                    if gone
                        && reduced
                            == (TaskPatch {
                                id: Some(id.clone()),
                                ..TaskPatch::default()
                            })
                    {
                        // Removed by someone else since, and not edited by this writer:
                        // it stays removed.
                        continue;
                    }
                    if !gone {
                        p = reduced;
                    }
                }
                let id = draft.upsert(&p, &at)?;
                resolved.push(id);
            }
            order_replace(&mut draft, &resolved);
        }
    }
    validate(&draft)?;
    // Report what the write does as a whole: a task removed then upserted again in one
    // patch is updated, one created then removed never existed.
    let mut plan = draft.plan;
    let mut created_seen = BTreeSet::new();
    plan.created.retain(|id| {
        matches!(plan.changed.get(id), Some(Some(_)))
            && !index.tasks.contains_key(id)
            && created_seen.insert(id.clone())
    });
    let mut removed_seen = BTreeSet::new();
    plan.removed.retain(|id| {
        matches!(plan.changed.get(id), Some(None))
            && index.tasks.contains_key(id)
            && removed_seen.insert(id.clone())
    });
    Ok(plan)
}

/// Clears the fields of `p` that equal the base task's.
fn drop_unchanged(p: &mut TaskPatch, base: &Task) {
    if p.content.as_ref() == Some(&base.content) {
        p.content = None;
    }
    if p.active_form.as_ref() == Some(&base.active_form) {
        p.active_form = None;
    }
    if p.status == Some(base.status) {
        p.status = None;
    }
    if p.priority == Some(base.priority) {
        p.priority = None;
    }
    if p.owner.as_ref() == Some(&base.owner) {
        p.owner = None;
    }
    if p.blocked_by.as_ref() == Some(&base.blocked_by) {
        p.blocked_by = None;
    }
}

/// Gives the tasks of a replace the order they were sent in, moving as few as possible:
/// the longest run already in order keeps its keys, the rest get keys between neighbours.
fn order_replace(draft: &mut Draft<'_>, resolved: &[String]) {
    let existing: Vec<(usize, (String, String))> = resolved
        .iter()
        .enumerate()
        .filter(|(_, id)| draft.index.tasks.contains_key(*id))
        .filter_map(|(i, id)| {
            draft
                .index
                .tasks
                .get(id)
                .map(|e| (i, (e.raw.position.clone(), id.clone())))
        })
        .collect();
    let keys: Vec<(String, String)> = existing.iter().map(|(_, k)| k.clone()).collect();
    let keep: BTreeSet<usize> = longest_increasing(&keys)
        .into_iter()
        .map(|j| existing[j].0)
        .collect();
    let anchor = |i: usize| -> Option<String> {
        keep.contains(&i)
            .then(|| {
                draft
                    .index
                    .tasks
                    .get(&resolved[i])
                    .map(|e| e.raw.position.clone())
            })
            .flatten()
    };
    let mut lo: Option<String> = None;
    let mut i = 0;
    while i < resolved.len() {
        if let Some(p) = anchor(i) {
            lo = Some(p);
            i += 1;
            continue;
        }
        let hi = (i + 1..resolved.len()).find_map(anchor);
        let mut j = i;
        while j < resolved.len() && anchor(j).is_none() {
            let key = position::between(lo.as_deref(), hi.as_deref());
            if let Some(Some(d)) = draft.plan.changed.get_mut(&resolved[j]) {
                d.position = key.clone();
            } else if let Some(mut d) = draft.get(&resolved[j]) {
                d.position = key.clone();
                draft.set(&resolved[j], Some(d));
            }
            lo = Some(key);
            j += 1;
        }
        i = j;
    }
}

/// Whole-draft checks: list size, dependencies, one in-progress task per owner.
fn validate(draft: &Draft<'_>) -> Result<(), ApiError> {
    let index = draft.index;
    let created = draft
        .plan
        .changed
        .iter()
        .filter(|(id, d)| d.is_some() && !index.tasks.contains_key(*id))
        .count();
    let total = index.tasks.len() + created;
    if total > LIST_TASKS_MAX {
        return Err(err(
            ErrorCode::LimitExceeded,
            "tasks",
            format!("the list would hold {total} tasks; the limit is {LIST_TASKS_MAX}"),
        ));
    }
    // A cycle can only close through a task this write changes: one walk from all of
    // them, each task visited once.
    let deps = |id: &str| -> Vec<&str> {
        let named: &[String] = match draft.plan.changed.get(id) {
            Some(Some(d)) => &d.task.blocked_by,
            Some(None) => &[],
            None => draft
                .index
                .tasks
                .get(id)
                .map_or(&[][..], |e| &e.raw.blocked_by),
        };
        named
            .iter()
            .filter(|dep| dep.as_str() != id && draft.exists(dep))
            .map(String::as_str)
            .collect()
    };
    let changed = draft
        .plan
        .changed
        .iter()
        .filter(|(_, d)| d.is_some())
        .map(|(id, _)| id.as_str());
    if let Some(cycle) = super::deps::cycles(changed, deps).0.first() {
        let at = cycle
            .iter()
            .find(|t| draft.plan.changed.contains_key(*t))
            .unwrap_or(&cycle[0]);
        return Err(err(
            ErrorCode::InvalidDependency,
            format!("task {at}.blocked_by"),
            format!(
                "dependencies would form a cycle of {} tasks: {}",
                cycle.len() - 1,
                cycle
                    .iter()
                    .take(crate::proto::VIOLATION_TASKS_MAX)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(" → ")
            ),
        ));
    }
    for (id, d) in &draft.plan.changed {
        let Some(d) = d else { continue };
        for dep in &d.task.blocked_by {
            if dep == id || !draft.exists(dep) {
                return Err(err(
                    ErrorCode::InvalidDependency,
                    format!("task {id}.blocked_by"),
                    if dep == id {
                        format!("task {id:?} cannot depend on itself")
                    } else {
                        format!("task {id:?} depends on {dep:?}, which is not in the list")
                    },
                ));
            }
        }
        // Only a write that starts a task (or hands a started task to another owner)
        // is refused; a list that is already over the limit after a merge stays
        // editable, and the authority reports it.
        let already_active = index.tasks.get(id).is_some_and(|e| {
            e.raw.status.as_deref() == Some(Status::InProgress.as_str())
                && e.raw.owner == d.task.owner
        });
        if d.task.status == Status::InProgress && !already_active {
            let owner = &d.task.owner;
            let others: Vec<String> = index
                .active
                .get(owner)
                .into_iter()
                .flatten()
                .filter(|t| *t != id && !draft.plan.changed.contains_key(*t))
                .cloned()
                .chain(
                    draft
                        .plan
                        .changed
                        .iter()
                        .filter(|(t, o)| {
                            *t != id
                                && o.as_ref().is_some_and(|o| {
                                    o.task.status == Status::InProgress && o.task.owner == *owner
                                })
                        })
                        .map(|(t, _)| t.clone()),
                )
                .collect();
            if let Some(other) = others.first() {
                let who = owner.as_deref().unwrap_or("(no owner)");
                return Err(err(
                    ErrorCode::SecondInProgress,
                    format!("task {id}.status"),
                    format!(
                        "{who} already has task {other:?} in_progress: complete or pause it first (one in_progress task per owner)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn put_str(
    tx: &mut automerge::transaction::Transaction<'_>,
    obj: &automerge::ObjId,
    key: &str,
    value: &Option<String>,
    current: &Option<String>,
) -> Result<bool, automerge::AutomergeError> {
    if value == current {
        return Ok(false);
    }
    match value {
        Some(v) => tx.put(obj, key, v.as_str())?,
        None => tx.delete(obj, key)?,
    }
    Ok(true)
}

/// Writes the fields of `d` that differ from `current` (all of them for a new task).
/// Returns whether anything was written.
pub(crate) fn write_task(
    tx: &mut automerge::transaction::Transaction<'_>,
    tasks: &automerge::ObjId,
    existing: Option<(&automerge::ObjId, &RawTask)>,
    d: &Desired,
) -> Result<bool, automerge::AutomergeError> {
    let empty = RawTask::default();
    let (obj, cur) = match existing {
        Some((obj, raw)) => (obj.clone(), raw),
        None => (
            tx.put_object(tasks, d.task.id.as_str(), ObjType::Map)?,
            &empty,
        ),
    };
    let mut wrote = existing.is_none();
    let t = &d.task;
    wrote |= put_str(
        tx,
        &obj,
        field::CONTENT,
        &Some(t.content.clone()),
        &cur.content,
    )?;
    wrote |= put_str(
        tx,
        &obj,
        field::ACTIVE_FORM,
        &t.active_form,
        &cur.active_form,
    )?;
    wrote |= put_str(
        tx,
        &obj,
        field::STATUS,
        &Some(t.status.as_str().to_owned()),
        &cur.status,
    )?;
    wrote |= put_str(
        tx,
        &obj,
        field::PRIORITY,
        &Some(t.priority.as_str().to_owned()),
        &cur.priority,
    )?;
    wrote |= put_str(tx, &obj, field::OWNER, &t.owner, &cur.owner)?;
    if existing.is_none() || t.blocked_by != cur.blocked_by {
        let list = tx.put_object(&obj, field::BLOCKED_BY, ObjType::List)?;
        for (i, dep) in t.blocked_by.iter().enumerate() {
            tx.insert(&list, i, dep.as_str())?;
        }
        wrote = true;
    }
    wrote |= put_str(
        tx,
        &obj,
        field::POSITION,
        &Some(d.position.clone()),
        &Some(cur.position.clone()),
    )?;
    Ok(wrote)
}

/// Whether committing `plan` would change anything at all.
pub(crate) fn plan_is_noop(index: &Index, plan: &Plan) -> bool {
    plan.changed
        .iter()
        .all(|(id, d)| match (d, index.tasks.get(id)) {
            (None, None) => true,
            (None, Some(_)) | (Some(_), None) => false,
            (Some(d), Some(e)) => raw_matches(&e.raw, d),
        })
}

fn raw_matches(raw: &RawTask, d: &Desired) -> bool {
    let t = &d.task;
    raw.content.as_deref() == Some(t.content.as_str())
        && raw.active_form == t.active_form
        && raw.status.as_deref() == Some(t.status.as_str())
        && raw.priority.as_deref() == Some(t.priority.as_str())
        && raw.owner == t.owner
        && raw.blocked_by == t.blocked_by
        && raw.position == d.position
}

/// Records `actor → agent` in the list's agent map if it is not there yet.
pub(crate) fn register_agent(
    tx: &mut automerge::transaction::Transaction<'_>,
    agents: Option<&automerge::ObjId>,
    actor: &ActorId,
    agent: &str,
) -> Result<(), automerge::AutomergeError> {
    let key = actor.to_hex_string();
    match agents {
        Some(agents) => {
            if doc::read_string(&*tx, agents, &key).as_deref() != Some(agent) {
                tx.put(agents, key, agent)?;
            }
        }
        None => {
            let agents = tx.put_object(ROOT, doc::AGENTS, ObjType::Map)?;
            tx.put(&agents, key, agent)?;
        }
    }
    Ok(())
}

impl TodoList {
    /// `todo_write`: validates the whole request, then commits what differs as one
    /// change. An invalid request changes nothing. Returns the result and what the
    /// change touched (empty when the write asked for what was already there).
    pub fn write(
        &mut self,
        req: &WriteRequest,
        ctx: &WriteContext,
    ) -> Result<(WriteResult, Merge), ApiError> {
        if let Some(expected) = &req.expected_version {
            let current = self.version();
            if *expected != current {
                return Err(ApiError {
                    code: ErrorCode::StaleVersion,
                    field: Some("expected_version".into()),
                    allowed: Vec::new(),
                    message: format!(
                        "the list moved on from {expected} to {current}: re-read it (the current list is attached) and send the write again"
                    ),
                    current: Some(Box::new(self.read())),
                });
            }
        }
        let base = match &req.mode {
            WriteMode::Replace {
                base_version: Some(v),
                ..
            } if *v != self.version() => Some(self.base_tasks(v)?),
            _ => None,
        };
        let plan = write::plan(&self.index, req, ctx, base.as_ref())?;
        let version = self.version();
        if write::plan_is_noop(&self.index, &plan) {
            return Ok((
                WriteResult {
                    version,
                    changed: false,
                    created: Vec::new(),
                    updated: Vec::new(),
                    removed: Vec::new(),
                },
                Merge::default(),
            ));
        }
        let merge = self
            .commit(&plan, ctx, req.explanation.as_deref())
            .map_err(internal)?;
        let created: Vec<String> = plan.created.clone();
        let updated: Vec<String> = merge
            .tasks
            .iter()
            .filter(|(id, d)| d.before.is_some() && d.after.is_some() && !created.contains(id))
            .map(|(id, _)| id.clone())
            .collect();
        Ok((
            WriteResult {
                version: self.version(),
                changed: true,
                created,
                updated,
                removed: plan.removed.clone(),
            },
            merge,
        ))
    }

    fn commit(
        &mut self,
        plan: &write::Plan,
        ctx: &WriteContext,
        explanation: Option<&str>,
    ) -> Result<Merge, AutomergeError> {
        let tasks_obj = match self.index.tasks_obj.clone() {
            Some(t) => t,
            None => {
                // A document made elsewhere without our root: add the map once.
                let mut tx = self.doc.transaction();
                let t = tx.put_object(ROOT, doc::TASKS, ObjType::Map)?;
                tx.commit_with(CommitOptions::default().with_time(ctx.now_ms));
                self.index = Index::build(&self.doc);
                t
            }
        };
        let actor = self.doc.get_actor().clone();
        let index = &self.index;
        let mut opts = CommitOptions::default().with_time(ctx.now_ms);
        if let Some(e) = explanation {
            opts = opts.with_message(e);
        }
        let mut tx = self.doc.transaction();
        let mut wrote = false;
        for (id, d) in &plan.changed {
            let existing = index.tasks.get(id);
            match d {
                None => {
                    if existing.is_some() {
                        tx.delete(&tasks_obj, id.as_str())?;
                        wrote = true;
                    }
                }
                Some(d) => {
                    wrote |= write::write_task(
                        &mut tx,
                        &tasks_obj,
                        existing.map(|e| (&e.obj, &e.raw)),
                        d,
                    )?;
                }
            }
        }
        if wrote {
            write::register_agent(&mut tx, index.agents_obj.as_ref(), &actor, &ctx.agent)?;
        }
        tx.commit_with(opts);
        let Some(change) = self.doc.get_last_local_change() else {
            return Ok(Merge::default());
        };
        self.window.record(&self.doc, std::iter::once(&change));
        Ok(self.index.absorb(&self.doc, &[change]))
    }
}

fn internal(e: AutomergeError) -> ApiError {
    ApiError {
        code: ErrorCode::Internal,
        field: None,
        allowed: Vec::new(),
        message: format!("the write could not be committed ({e}); nothing changed, try again"),
        current: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lis_keeps_the_longest_ordered_run() {
        let keys = [5, 1, 2, 9, 3, 4];
        let lis = longest_increasing(&keys);
        let picked: Vec<i32> = lis.iter().map(|&i| keys[i]).collect();
        assert_eq!(picked, vec![1, 2, 3, 4]);
        assert!(longest_increasing::<i32>(&[]).is_empty());
    }

    #[test]
    fn generated_ids_are_uuids_and_differ() {
        let a = generated_id(7, 0);
        let b = generated_id(7, 1);
        assert_ne!(a, b);
        assert_eq!(generated_id(7, 0), a);
        assert!(uuid::Uuid::parse_str(&a).is_ok());
    }
}
