//! What the authority writes back: the root maps as they were before a change, and field
//! values committed as one change of the replica's actor.

use std::collections::BTreeMap;

use automerge::{
    transaction::CommitOptions, transaction::Transactable, AutomergeError, ChangeHash, ObjType,
    ROOT,
};

use super::{doc, field, write, Merge, RawTask, TodoList};

impl TodoList {
    /// What root key `key` should hold to undo a change whose parents are `deps`: the
    /// `tasks` or `agents` map that was the root's then, as it reads now (a change that
    /// replaced or deleted it leaves it in the document, with every write it got since;
    /// read at `deps` when it reads empty now), or the removal of a key the root did not
    /// have. `None`: nothing to undo.
    pub(crate) fn root_before(&self, key: &str, deps: &[ChangeHash]) -> Option<RootValue> {
        let then = doc::View::at(&self.doc, deps);
        let now = doc::View::now(&self.doc);
        match key {
            doc::TASKS => {
                let obj = doc::root_map_in(then, doc::TASKS)?;
                let mut tasks = doc::tasks_of(now, &obj);
                if tasks.is_empty() {
                    tasks = doc::tasks_of(then, &obj);
                }
                Some(RootValue::Tasks(tasks))
            }
            doc::AGENTS => {
                let obj = doc::root_map_in(then, doc::AGENTS)?;
                let mut agents = doc::agents_of(now, &obj);
                if agents.is_empty() {
                    agents = doc::agents_of(then, &obj);
                }
                Some(RootValue::Agents(agents))
            }
            other => {
                let had = automerge::ReadDoc::get_at(&self.doc, ROOT, other, deps)
                    .ok()
                    .flatten()
                    .is_some();
                (!had).then_some(RootValue::Delete)
            }
        }
    }

    /// Applies field values chosen by the authority as one change of this replica's
    /// actor, registered as `agent`. Returns what the change touched.
    /// `roots` (root keys to write back, see [`RootValue`]) and `agents` (entries of the
    /// `agents` map to put back, `None`: remove) go first; when the `tasks` map itself is
    /// written back, the field values for its old objects are left out.
    pub(crate) fn apply_fields(
        &mut self,
        agent: &str,
        now_ms: i64,
        message: &str,
        writes: &Writes,
    ) -> Result<Merge, AutomergeError> {
        let actor = self.doc.get_actor().clone();
        // The maps of the tasks whose fields are set, found before the transaction
        // borrows the document.
        let objs: Vec<Option<automerge::ObjId>> = writes
            .sets
            .iter()
            .map(|(id, _, _)| self.index.task_obj(&self.doc, id))
            .collect();
        let mut tx = self.doc.transaction();
        let mut tasks_obj = self.index.tasks_obj.clone();
        let mut agents = self.index.agents_obj.clone();
        let mut fresh_tasks = false;
        for (key, value) in &writes.roots {
            match value {
                RootValue::Tasks(tasks) => {
                    let obj = tx.put_object(ROOT, key.as_str(), ObjType::Map)?;
                    for (id, raw) in tasks {
                        let task = tx.put_object(&obj, id.as_str(), ObjType::Map)?;
                        write_raw(&mut tx, &task, raw)?;
                    }
                    tasks_obj = Some(obj);
                    fresh_tasks = true;
                }
                RootValue::Agents(entries) => {
                    let obj = tx.put_object(ROOT, key.as_str(), ObjType::Map)?;
                    for (actor, agent) in entries {
                        tx.put(&obj, actor.as_str(), agent.as_str())?;
                    }
                    agents = Some(obj);
                }
                RootValue::Delete => tx.delete(ROOT, key.as_str())?,
            }
        }
        if let Some(obj) = &agents {
            for (actor, agent) in &writes.agents {
                match agent {
                    Some(a) => tx.put(obj, actor.as_str(), a.as_str())?,
                    None => tx.delete(obj, actor.as_str())?,
                }
            }
        }
        let sets: &[(String, &'static str, FieldValue)] =
            if fresh_tasks { &[] } else { &writes.sets };
        for ((id, f, value), obj) in sets.iter().zip(objs) {
            let Some(tasks_obj) = &tasks_obj else { break };
            match (value, obj) {
                (FieldValue::Task(Some(raw)), _) => {
                    let raw: &RawTask = raw;
                    let obj = tx.put_object(tasks_obj, id.as_str(), ObjType::Map)?;
                    write_raw(&mut tx, &obj, raw)?;
                }
                (FieldValue::Task(None), _) => tx.delete(tasks_obj, id.as_str())?,
                (_, None) => {}
                (FieldValue::Str(Some(s)), Some(obj)) => tx.put(&obj, *f, s.as_str())?,
                (FieldValue::Str(None), Some(obj)) => tx.delete(&obj, *f)?,
                (FieldValue::List(items), Some(obj)) => {
                    let list = tx.put_object(&obj, *f, ObjType::List)?;
                    for (i, item) in items.iter().enumerate() {
                        tx.insert(&list, i, item.as_str())?;
                    }
                }
            }
        }
        write::register_agent(&mut tx, agents.as_ref(), &actor, agent)?;
        tx.commit_with(
            CommitOptions::default()
                .with_time(now_ms)
                .with_message(message),
        );
        let Some(change) = self.doc.get_last_local_change() else {
            return Ok(Merge::default());
        };
        self.window.record(&self.doc, std::iter::once(&change));
        Ok(self.index.absorb(&self.doc, &[change]))
    }
}

/// What the authority writes back in one change (see [`TodoList::apply_fields`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Writes {
    /// Root keys, in a fixed order.
    pub(crate) roots: Vec<(String, RootValue)>,
    /// Entries of the `agents` map (actor hex → agent; `None`: remove).
    pub(crate) agents: Vec<(String, Option<String>)>,
    /// Task fields: `(task, field, value)`.
    pub(crate) sets: Vec<(String, &'static str, FieldValue)>,
}

/// A root key the authority writes back (see [`TodoList::root_before`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootValue {
    /// The `tasks` map, made afresh with these tasks.
    Tasks(BTreeMap<String, RawTask>),
    /// The `agents` map, made afresh with these entries.
    Agents(BTreeMap<String, String>),
    /// A key the root did not have: removed.
    Delete,
}

/// A value the authority writes back (see [`TodoList::apply_fields`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FieldValue {
    /// A string register (None: delete it).
    Str(Option<String>),
    /// A list of strings.
    List(Vec<String>),
    /// The whole task entry (None: delete the task).
    Task(Option<RawTask>),
}

fn write_raw(
    tx: &mut automerge::transaction::Transaction<'_>,
    obj: &automerge::ObjId,
    raw: &RawTask,
) -> Result<(), AutomergeError> {
    let strs = [
        (field::CONTENT, &raw.content),
        (field::ACTIVE_FORM, &raw.active_form),
        (field::STATUS, &raw.status),
        (field::PRIORITY, &raw.priority),
        (field::OWNER, &raw.owner),
    ];
    for (f, v) in strs {
        if let Some(v) = v {
            tx.put(obj, f, v.as_str())?;
        }
    }
    let list = tx.put_object(obj, field::BLOCKED_BY, ObjType::List)?;
    for (i, d) in raw.blocked_by.iter().enumerate() {
        tx.insert(&list, i, d.as_str())?;
    }
    tx.put(obj, field::POSITION, raw.position.as_str())?;
    Ok(())
}
