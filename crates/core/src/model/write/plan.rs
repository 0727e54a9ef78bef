//! Planning a write: the request's ops or tasks applied to a draft of the list (the index
//! plus the tasks this write changes), generated ids, and the positions that keep the
//! order asked for.

use std::collections::{BTreeMap, BTreeSet};

use super::check::{check_patch, exists, validate};
use super::{err, Desired, Plan, WriteContext};
use crate::model::doc::RawTask;
use crate::model::index::Index;
use crate::model::{normalize, position};
use crate::proto::{
    ApiError, ErrorCode, PatchOp, Priority, Status, Task, TaskPatch, WriteMode, WriteRequest,
    EXPLANATION_BYTES_MAX, WRITE_OPS_MAX,
};

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
pub(super) struct Draft<'a> {
    pub(super) index: &'a Index,
    pub(super) plan: Plan,
    generated: u64,
    seed: u64,
    /// The greatest `(position, id)` ever planned in this write: an upper bound of the
    /// planned positions, so appending stays O(log n) per task (a key after it is after
    /// everything).
    planned_max: Option<(String, String)>,
    /// The index's greatest `(position, id)`, found on first use.
    index_last: std::cell::OnceCell<Option<(String, String)>>,
}

impl<'a> Draft<'a> {
    fn new(index: &'a Index, seed: u64) -> Self {
        Draft {
            index,
            plan: Plan::default(),
            generated: 0,
            seed,
            planned_max: None,
            index_last: std::cell::OnceCell::new(),
        }
    }

    fn get(&self, id: &str) -> Option<Desired> {
        match self.plan.changed.get(id) {
            Some(d) => d.clone(),
            None => self.index.full(id).map(|raw| Desired {
                task: normalize(id, &raw),
                position: raw.position.to_string(),
            }),
        }
    }

    pub(super) fn exists(&self, id: &str) -> bool {
        exists(self.index, &self.plan, id)
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
        let key = (key.0.as_str(), key.1.as_str());
        let from_index = self
            .index
            .order_keys()
            .filter(|k| *k > key && k.1 != skip && !self.plan.changed.contains_key(k.1))
            .min()
            .map(owned_key);
        let from_plan = self
            .plan
            .changed
            .iter()
            .filter(|(id, _)| id.as_str() != skip)
            .filter_map(|(id, d)| d.as_ref().map(|d| (d.position.clone(), id.clone())))
            .filter(|(p, id)| (p.as_str(), id.as_str()) > key)
            .min();
        match (from_index, from_plan) {
            (Some(a), Some(b)) => Some(a.min(b).0),
            (a, b) => a.or(b).map(|k| k.0),
        }
    }

    /// A position at or after the greatest in the draft.
    fn last_position(&self) -> Option<String> {
        // The index's last key is an upper bound even if the write moves or removes
        // that task: a key after it is after every remaining one. Found once a draft
        // (the index does not change under it), so appending n tasks costs one pass.
        let from_index = self
            .index_last
            .get_or_init(|| self.index.order_keys().max().map(owned_key))
            .clone();
        from_index.max(self.planned_max.clone()).map(|k| k.0)
    }

    fn first_position(&self) -> Option<String> {
        let from_index = self
            .index
            .order_keys()
            .filter(|k| !self.plan.changed.contains_key(k.1))
            .min()
            .map(owned_key);
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
                        .map(|(id, e)| (id.to_string(), e.raw()))
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
                        .find(|(id, b)| {
                            b.content.as_deref() == Some(content.as_str()) && !seen.contains(*id)
                        })
                        .map(|(id, _)| id.clone());
                    if let Some(id) = hit {
                        seen.insert(id.clone());
                        ids[i] = Some(id);
                    }
                }
            }
            // Tasks the writer saw and left out go; tasks others added since stay.
            for id in base.keys() {
                if !seen.contains(id) && index.tasks.contains_key(id.as_str()) {
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
    validate(draft.index, &draft.plan)?;
    // Report what the write does as a whole: a task removed then upserted again in one
    // patch is updated, one created then removed never existed.
    let mut plan = draft.plan;
    let mut created_seen = BTreeSet::new();
    plan.created.retain(|id| {
        matches!(plan.changed.get(id), Some(Some(_)))
            && !index.tasks.contains_key(id.as_str())
            && created_seen.insert(id.clone())
    });
    let mut removed_seen = BTreeSet::new();
    plan.removed.retain(|id| {
        matches!(plan.changed.get(id), Some(None))
            && index.tasks.contains_key(id.as_str())
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

/// An order key of the index as the plan holds it.
fn owned_key((position, id): (&str, &str)) -> (String, String) {
    (position.to_string(), id.to_string())
}

/// Gives the tasks of a replace the order they were sent in, moving as few as possible:
/// the longest run already in order keeps its keys, the rest get keys between neighbours.
fn order_replace(draft: &mut Draft<'_>, resolved: &[String]) {
    let existing: Vec<(usize, (String, String))> = resolved
        .iter()
        .enumerate()
        .filter(|(_, id)| draft.index.tasks.contains_key(id.as_str()))
        .filter_map(|(i, id)| {
            draft
                .index
                .tasks
                .get(id.as_str())
                .map(|e| (i, (e.position.to_string(), id.clone())))
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
                    .get(resolved[i].as_str())
                    .map(|e| e.position.to_string())
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
