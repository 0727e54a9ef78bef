//! The history of one task (blame): every change that touched it, from the Automerge
//! history, with who made it, when, why, and each field it changed from what to what.
//!
//! One pass over the list's changes in causal order follows the objects the task is
//! made of — every map written under its id in a `tasks` map (a conflicting one too)
//! and every object made inside them (the texts of `content`, the list of `blocked_by`)
//! — so that an edit to a text replaced long ago is still found. A change found is read
//! twice, at its dependencies and at itself: the task as its writer saw it just before
//! and just after. Its cost follows the list's changes (decoded once each) plus the
//! task's.

use std::collections::{BTreeSet, HashMap};

use automerge::{legacy, Automerge, ChangeHash, ObjType, ReadDoc};

use super::doc::{self, field, OpKey, RawTask, SmolStr, TASK_ENTRY};
use super::{clip, ErrorCode, TodoList};
use crate::proto::{
    ApiError, FieldChange, HistoryEntry, TaskHistory, EVENT_VALUE_BYTES_MAX, HISTORY_ENTRIES_MAX,
};

/// What an object is to the task followed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// A `tasks` map (the root's, or one that lost a conflict).
    Tasks,
    /// A map of the task.
    Task,
    /// An object inside the task map, holding this field.
    Field(String),
}

impl TodoList {
    /// The last `limit` (at most [`HISTORY_ENTRIES_MAX`]) changes that touched task
    /// `id`, oldest first, and how many did in all. `unknown_task` when none ever did.
    pub fn history(&self, id: &str, limit: usize) -> Result<TaskHistory, ApiError> {
        task_history(&self.doc, id, limit)
    }
}

/// [`TodoList::history`] of a list's document (a hub reads it from its store, off its
/// task, without building the list's index).
pub fn task_history(doc: &Automerge, id: &str, limit: usize) -> Result<TaskHistory, ApiError> {
    let limit = limit.clamp(1, HISTORY_ENTRIES_MAX);
    let mut parts: HashMap<OpKey, Part> = HashMap::new();
    let mut found: Vec<(ChangeHash, BTreeSet<String>)> = Vec::new();
    for change in doc.get_changes(&[]) {
        let decoded = change.decode();
        let mut touched = BTreeSet::new();
        for (i, op) in decoded.operations.iter().enumerate() {
            let parent = match &op.obj {
                legacy::ObjectId::Root => None,
                legacy::ObjectId::Id(o) => parts
                    .get(&OpKey {
                        counter: o.counter(),
                        actor: o.actor().clone(),
                    })
                    .cloned(),
            };
            let key = match &op.key {
                legacy::Key::Map(k) => Some(k.as_str()),
                legacy::Key::Seq(_) => None,
            };
            let (is_root, made) = (
                matches!(op.obj, legacy::ObjectId::Root),
                match op.action {
                    legacy::OpType::Make(t) => Some(t),
                    _ => None,
                },
            );
            let part = match (is_root, &parent, key) {
                (true, _, Some(doc::TASKS)) => {
                    made.filter(|t| *t == ObjType::Map).map(|_| Part::Tasks)
                }
                (false, Some(Part::Tasks), Some(k)) if k == id => {
                    touched.insert(TASK_ENTRY.to_owned());
                    made.filter(|t| *t == ObjType::Map).map(|_| Part::Task)
                }
                (false, Some(Part::Task), Some(f)) => {
                    touched.insert(f.to_owned());
                    made.map(|_| Part::Field(f.to_owned()))
                }
                (false, Some(Part::Field(f)), _) => {
                    touched.insert(f.clone());
                    made.map(|_| Part::Field(f.clone()))
                }
                _ => None,
            };
            if let Some(part) = part {
                parts.insert(
                    OpKey {
                        counter: u64::from(decoded.start_op) + i as u64,
                        actor: decoded.actor_id.clone(),
                    },
                    part,
                );
            }
        }
        if !touched.is_empty() {
            found.push((change.hash(), touched));
        }
    }
    if found.is_empty() {
        return Err(ApiError {
            code: ErrorCode::UnknownTask,
            field: Some("task".to_owned()),
            allowed: Vec::new(),
            message: format!(
                "no change of this list ever touched a task {id:?}: read the list for its task ids"
            ),
            current: None,
        });
    }
    let total = found.len() as u64;
    let entries = found[found.len().saturating_sub(limit)..]
        .iter()
        .filter_map(|(hash, touched)| entry(doc, id, *hash, touched))
        .collect();
    Ok(TaskHistory {
        task: id.to_owned(),
        entries,
        total,
    })
}

/// One change to task `id`: the task at the change's dependencies and at the change.
fn entry(
    doc: &Automerge,
    id: &str,
    hash: ChangeHash,
    touched: &BTreeSet<String>,
) -> Option<HistoryEntry> {
    let change = doc.get_change_by_hash(&hash)?;
    let deps = change.deps().to_vec();
    let before = doc::read_task_by_id(doc::View::at(doc, &deps), id);
    let after = doc::read_task_by_id(doc::View::at(doc, &[hash]), id);
    let mut fields = Vec::new();
    if before.is_none() != after.is_none() {
        let present = |t: &Option<RawTask>| serde_json::Value::Bool(t.is_some());
        fields.push(FieldChange {
            field: "task".to_owned(),
            before: present(&before),
            after: present(&after),
        });
    }
    for f in field::ALL {
        let (b, a) = (value(before.as_ref(), f), value(after.as_ref(), f));
        if b != a || touched.contains(f) {
            fields.push(FieldChange {
                field: (*f).to_owned(),
                before: b,
                after: a,
            });
        }
    }
    let agents = doc::root_map_in(doc::View::at(doc, &[hash]), doc::AGENTS);
    Some(HistoryEntry {
        change: hash.to_string(),
        agent: doc::agent_of(doc, agents.as_ref(), change.actor_id()),
        at_ms: change.timestamp(),
        explanation: change
            .message()
            .map(|m| clip(m, EVENT_VALUE_BYTES_MAX).to_owned()),
        fields,
    })
}

/// Field `f` of a task as JSON (`null` when the task or the field is absent); texts cut
/// at [`EVENT_VALUE_BYTES_MAX`].
fn value(task: Option<&RawTask>, f: &str) -> serde_json::Value {
    let Some(t) = task else {
        return serde_json::Value::Null;
    };
    let text = |s: &Option<SmolStr>| match s {
        Some(s) => serde_json::Value::String(clip(s, EVENT_VALUE_BYTES_MAX).to_owned()),
        None => serde_json::Value::Null,
    };
    match f {
        field::CONTENT => text(&t.content),
        field::ACTIVE_FORM => text(&t.active_form),
        field::STATUS => text(&t.status),
        field::PRIORITY => text(&t.priority),
        field::OWNER => text(&t.owner),
        field::POSITION => serde_json::Value::String(t.position.to_string()),
        field::BLOCKED_BY => serde_json::json!(t.blocked_by),
        _ => serde_json::Value::Null,
    }
}
