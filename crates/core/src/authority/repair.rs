//! The repair the authority chooses: field writes keyed so that two rules never write one
//! field twice, and the writes that undo a change on a task.

use std::collections::{BTreeMap, BTreeSet};

use super::findings::{field_name, TASK_ENTRY_STATIC};
use crate::model::{field, FieldValue, RawTask, RootValue, SmolStr, TodoList, Writes};

/// Field writes chosen by the authority, keyed so that two rules never write one field
/// twice and the order is deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Repair {
    pub(super) sets: BTreeMap<(String, &'static str), FieldValue>,
    /// Root keys written back (a `tasks` or `agents` map another role replaced).
    pub(super) roots: BTreeMap<String, RootValue>,
    /// Entries of the `agents` map written back (`None`: removed).
    pub(super) agents: BTreeMap<String, Option<String>>,
    /// What the repair does, for people (one line per violation).
    pub notes: Vec<String>,
}

impl Repair {
    /// True when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.roots.is_empty() && self.agents.is_empty()
    }

    pub(super) fn set(&mut self, task: &str, field: &'static str, value: FieldValue) {
        self.sets.entry((task.to_owned(), field)).or_insert(value);
    }

    /// The writes, in a fixed order.
    pub(super) fn writes(&self) -> Writes {
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

/// Chooses writes that put the fields `change` wrote on task `id` back to their values
/// in the change's parent state (a function of the change alone: deterministic).
pub(super) fn restore_before(
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
                    field::CONTENT => FieldValue::Str(owned(&b.content)),
                    field::ACTIVE_FORM => FieldValue::Str(owned(&b.active_form)),
                    field::STATUS => FieldValue::Str(owned(&b.status)),
                    field::PRIORITY => FieldValue::Str(owned(&b.priority)),
                    field::OWNER => FieldValue::Str(owned(&b.owner)),
                    field::POSITION => FieldValue::Str(Some(b.position.to_string())),
                    field::BLOCKED_BY => {
                        FieldValue::List(b.blocked_by.iter().map(SmolStr::to_string).collect())
                    }
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

/// A stored string as a repair writes it.
fn owned(s: &Option<SmolStr>) -> Option<String> {
    s.as_deref().map(str::to_owned)
}
