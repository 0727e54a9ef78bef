//! Committing a planned write: the fields that differ written as one Automerge change,
//! and the writer's actor registered as its agent.

use automerge::{
    transaction::CommitOptions, transaction::Transactable, ActorId, AutomergeError, ObjType, ROOT,
};

use super::{Desired, Plan, WriteContext};
use crate::model::doc::{self, field, RawTask};
use crate::model::index::Index;
use crate::model::{write, Merge, TodoList};

fn put_str(
    tx: &mut automerge::transaction::Transaction<'_>,
    obj: &automerge::ObjId,
    key: &str,
    value: Option<&str>,
    current: Option<&str>,
) -> Result<bool, automerge::AutomergeError> {
    if value == current {
        return Ok(false);
    }
    match value {
        Some(v) => tx.put(obj, key, v)?,
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
        Some(t.content.as_str()),
        cur.content.as_deref(),
    )?;
    wrote |= put_str(
        tx,
        &obj,
        field::ACTIVE_FORM,
        t.active_form.as_deref(),
        cur.active_form.as_deref(),
    )?;
    wrote |= put_str(
        tx,
        &obj,
        field::STATUS,
        Some(t.status.as_str()),
        cur.status.as_deref(),
    )?;
    wrote |= put_str(
        tx,
        &obj,
        field::PRIORITY,
        Some(t.priority.as_str()),
        cur.priority.as_deref(),
    )?;
    wrote |= put_str(
        tx,
        &obj,
        field::OWNER,
        t.owner.as_deref(),
        cur.owner.as_deref(),
    )?;
    if existing.is_none() || !t.blocked_by.iter().eq(cur.blocked_by.iter()) {
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
        Some(d.position.as_str()),
        Some(cur.position.as_str()),
    )?;
    Ok(wrote)
}

/// Whether committing `plan` would change anything at all.
pub(crate) fn plan_is_noop(index: &Index, plan: &Plan) -> bool {
    plan.changed
        .iter()
        .all(|(id, d)| match (d, index.full(id)) {
            (None, None) => true,
            (None, Some(_)) | (Some(_), None) => false,
            (Some(d), Some(raw)) => raw_matches(&raw, d),
        })
}

fn raw_matches(raw: &RawTask, d: &Desired) -> bool {
    let t = &d.task;
    raw.content.as_deref() == Some(t.content.as_str())
        && raw.active_form.as_deref() == t.active_form.as_deref()
        && raw.status.as_deref() == Some(t.status.as_str())
        && raw.priority.as_deref() == Some(t.priority.as_str())
        && raw.owner.as_deref() == t.owner.as_deref()
        && raw.blocked_by.iter().eq(t.blocked_by.iter())
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
    pub(super) fn commit(
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
        // The tasks the plan changes, as stored, with their maps: read before the
        // transaction borrows the document.
        let existing: Vec<Option<(automerge::ObjId, RawTask)>> = plan
            .changed
            .keys()
            .map(|id| Some((index.task_obj(&self.doc, id)?, index.full(id)?)))
            .collect();
        let mut tx = self.doc.transaction();
        let mut wrote = false;
        for ((id, d), existing) in plan.changed.iter().zip(&existing) {
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
                        existing.as_ref().map(|(obj, raw)| (obj, raw)),
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
