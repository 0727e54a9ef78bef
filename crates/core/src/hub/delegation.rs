//! Delegation: a lead hands task T of a list to a subagent, who works it as a list of its
//! own (the sub-list, linked to T). T is the subagent's, and its status follows the
//! sub-list's ([`rolled_status`]): after every commit that changes a sub-list, the hub
//! writes T's new status into the parent list as its own change, with a `rolled_up`
//! event — through the calls' machinery, so a parent not in memory is loaded first.
//!
//! The links are the hub's, not the documents': kept in the store with the sub-list's
//! first commit, given back at start ([`HubCore::set_links`]), so a peer cannot make a
//! list roll up into a task of its choosing. A sub-list loaded again is rolled up again
//! (a crash between its commit and the parent's costs nothing).

use super::calls::{error, Answer, Call, CallId, Caller};
use super::{Commit, Effects, HubCore};
use crate::authority::Role;
use crate::model::normalize;
use crate::proto::wire::DocumentId;
use crate::proto::{
    DelegateAnswer, ErrorCode, EventBody, PatchOp, Status, TaskCounts, TaskPatch, WriteMode,
    WriteRequest, AGENT_ID_BYTES_MAX,
};

/// A sub-list's link to the task it was delegated for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The parent list's name.
    pub parent: String,
    /// The task in it.
    pub task: String,
    /// The agent it was handed to.
    pub agent: String,
    /// The sub-list's name.
    pub list: String,
}

/// The internal calls (roll-ups) are numbered from here: the runtime's are below, and an
/// answer to one of these finds no caller and is dropped.
const INTERNAL_CALLS_FROM: u64 = 1 << 63;

/// The status a sub-list with these counts gives its task: none while it has no task;
/// completed when every task is completed or cancelled; in progress while one is; else
/// blocked while one is; else pending.
pub fn rolled_status(c: &TaskCounts) -> Option<Status> {
    let total = c.pending + c.in_progress + c.completed + c.cancelled + c.blocked;
    if total == 0 {
        None
    } else if c.completed + c.cancelled == total {
        Some(Status::Completed)
    } else if c.in_progress > 0 {
        Some(Status::InProgress)
    } else if c.blocked > 0 {
        Some(Status::Blocked)
    } else {
        Some(Status::Pending)
    }
}

impl HubCore {
    /// Tells the core the links the store holds (at start).
    pub fn set_links(&mut self, links: impl IntoIterator<Item = Link>) {
        for link in links {
            if let Ok(doc) = super::list_id(&link.list) {
                self.links.insert(doc, link);
            }
        }
    }

    /// The link of sub-list `doc`, if it is one.
    pub fn link(&self, doc: &DocumentId) -> Option<&Link> {
        self.links.get(doc)
    }

    /// In a cluster: sub-list `doc` has `counts` now, as the cluster's index says: it
    /// rolls up at the end of the batch (into its parent only if the parent is in memory
    /// here, when the sub-list is not).
    pub(super) fn sub_list_counted(&mut self, doc: DocumentId, counts: TaskCounts) {
        if self.links.contains_key(&doc) {
            self.sub_counts.insert(doc, counts);
            self.rollups_due.insert(doc);
        }
    }

    /// List `parent` was loaded here: its sub-lists held elsewhere, as the cluster's
    /// index last counted them, roll up into it at the end of the batch.
    pub(super) fn parent_loaded(&mut self, parent: DocumentId) {
        for sub in self.sub_counts.keys() {
            let is_child = self
                .links
                .get(sub)
                .is_some_and(|l| super::list_id(&l.parent).is_ok_and(|p| p == parent));
            if is_child {
                self.rollups_due.insert(*sub);
            }
        }
    }

    /// A sub-list changed (or was loaded): roll it up at the end of the batch.
    pub(super) fn sub_list_touched(&mut self, doc: DocumentId) {
        if self.links.contains_key(&doc) {
            self.rollups_due.insert(doc);
        }
    }

    /// Hands task `task` of list `parent_doc` (in memory) to `agent` as list `list`.
    #[allow(clippy::too_many_arguments)] // One call's parts.
    pub(super) fn delegate(
        &mut self,
        now_ms: i64,
        id: CallId,
        caller: &Caller,
        parent_doc: DocumentId,
        (task, agent, list): (String, String, Option<String>),
        fx: &mut Effects,
    ) {
        let Some(parent) = self.docs.get(&parent_doc) else {
            return;
        };
        let parent_name = parent.name.clone().unwrap_or_default();
        if self.role_of(caller, &parent_doc) != Role::Lead {
            return fx.answers.push((
                id,
                Err(error(
                    ErrorCode::Forbidden,
                    None,
                    format!(
                        "{:?} is not a lead of this list: only a lead delegates its tasks",
                        caller.agent
                    ),
                )),
            ));
        }
        if parent.list.raw_task(&task).is_none() {
            return fx.answers.push((
                id,
                Err(error(
                    ErrorCode::UnknownTask,
                    Some("task"),
                    format!(
                        "no task {task:?} in this list: read it, and delegate one of its tasks"
                    ),
                )),
            ));
        }
        if agent.is_empty()
            || agent.len() > AGENT_ID_BYTES_MAX
            || agent.chars().any(char::is_control)
        {
            return fx.answers.push((
                id,
                Err(error(
                    ErrorCode::InvalidValue,
                    Some("agent"),
                    format!("an agent id is 1 to {AGENT_ID_BYTES_MAX} bytes of text without control characters"),
                )),
            ));
        }
        let list = list.unwrap_or_else(|| format!("{parent_name}/{task}"));
        let sub_doc = match super::list_id(&list) {
            Ok(d) => d,
            Err(e) => return fx.answers.push((id, Err(e))),
        };
        let link = Link {
            parent: parent_name.clone(),
            task: task.clone(),
            agent: agent.clone(),
            list: list.clone(),
        };
        match self.links.get(&sub_doc) {
            // Delegated so already: only the task's owner is written again if it moved.
            Some(l) if *l == link => {}
            Some(l) => {
                return fx.answers.push((
                    id,
                    Err(error(
                        ErrorCode::Conflict,
                        Some("list"),
                        format!(
                            "list {list:?} is task {:?} of list {:?} already: name another list",
                            l.task, l.parent
                        ),
                    )),
                ))
            }
            None if sub_doc == parent_doc
                || self.docs.contains_key(&sub_doc)
                || self.stored.contains(&sub_doc) =>
            {
                return fx.answers.push((
                    id,
                    Err(error(
                        ErrorCode::Conflict,
                        Some("list"),
                        format!(
                            "list {list:?} exists: a delegation makes a new list; name another"
                        ),
                    )),
                ))
            }
            None => {
                if let Err(e) = self.create_for_call(now_ms, caller, &list, fx) {
                    return fx.answers.push((id, Err(e)));
                }
                self.links.insert(sub_doc, link.clone());
                let event = EventBody::Delegated {
                    parent: parent_name.clone(),
                    task: task.clone(),
                    sub_list: list.clone(),
                    agent: agent.clone(),
                };
                self.commit(
                    sub_doc,
                    Commit {
                        events: vec![event],
                        link: Some(link.clone()),
                        ..Commit::empty(sub_doc)
                    },
                    fx,
                );
                self.keep_called(now_ms, sub_doc);
            }
        }
        let req = WriteRequest {
            mode: WriteMode::Patch {
                ops: vec![PatchOp::Upsert {
                    task: TaskPatch {
                        id: Some(task.clone()),
                        owner: Some(Some(agent.clone())),
                        ..TaskPatch::default()
                    },
                }],
            },
            expected_version: None,
            explanation: Some(format!(
                "{} delegates {task} to {agent} as list {list}",
                caller.agent
            )),
        };
        let event = EventBody::Delegated {
            parent: parent_name.clone(),
            task: task.clone(),
            sub_list: list.clone(),
            agent: agent.clone(),
        };
        self.write_as(
            now_ms,
            id,
            caller,
            parent_doc,
            &req,
            Some(event),
            false,
            fx,
            move |_, l| match l.raw_task(&task) {
                Some(raw) => Answer::Delegated(DelegateAnswer {
                    parent: parent_name,
                    task: normalize(&task, &raw),
                    list,
                    agent,
                    token: None,
                }),
                None => Answer::Snapshot(l.read()),
            },
        );
        // A task handed over with a list made before (the same delegation again) takes
        // that list's status now.
        self.rollups_due.insert(sub_doc);
    }

    /// Rolls up the sub-lists changed in this batch: each whose status differs from its
    /// task's gets a roll-up call on its parent (loaded first if it must be).
    pub(super) fn roll_up_due(&mut self, now_ms: i64, fx: &mut Effects) {
        for sub in std::mem::take(&mut self.rollups_due) {
            let Some(link) = self.links.get(&sub) else {
                continue;
            };
            // In memory here, its own counts (its parent loaded if it must be); held
            // elsewhere, the index's, into a parent held here only (whichever hub holds
            // the parent rolls it up: no other takes the parent for it).
            let counts = match self.docs.get(&sub) {
                Some(doc) => doc.list.counts(),
                None => match self.sub_counts.get(&sub) {
                    Some(c)
                        if super::list_id(&link.parent)
                            .is_ok_and(|p| self.docs.contains_key(&p)) =>
                    {
                        *c
                    }
                    _ => continue,
                },
            };
            let Some(status) = rolled_status(&counts) else {
                continue;
            };
            let (parent, task, list) = (link.parent.clone(), link.task.clone(), link.list.clone());
            self.internal_calls += 1;
            let id = CallId(INTERNAL_CALLS_FROM + self.internal_calls);
            let caller = Caller {
                agent: self.config.agent.clone(),
                identity: None,
                address: None,
            };
            self.call(
                now_ms,
                id,
                caller,
                &parent,
                Call::RollUp { task, list, status },
                fx,
            );
        }
    }

    /// A roll-up call on the parent (in memory): the task takes `status` as the hub's
    /// change, with a `rolled_up` event, unless it has it already or is gone.
    pub(super) fn roll_up(
        &mut self,
        now_ms: i64,
        id: CallId,
        parent_doc: DocumentId,
        (task, list, status): (String, String, Status),
        fx: &mut Effects,
    ) {
        let hub_actor = self.config.actor.clone();
        let hub_agent = self.config.agent.clone();
        let Some(doc) = self.docs.get_mut(&parent_doc) else {
            return;
        };
        match doc.list.raw_task(&task).map(|raw| normalize(&task, &raw)) {
            Some(t) if t.status != status => {}
            _ => return,
        }
        // The hub's own change, as its repairs are: a lead's.
        doc.authority.bind(&hub_actor, &hub_agent, Role::Lead);
        let req = WriteRequest {
            mode: WriteMode::Patch {
                ops: vec![PatchOp::Upsert {
                    task: TaskPatch {
                        id: Some(task.clone()),
                        status: Some(status),
                        ..TaskPatch::default()
                    },
                }],
            },
            expected_version: None,
            explanation: Some(format!("rolled up from list {list}")),
        };
        let caller = Caller {
            agent: hub_agent,
            identity: None,
            address: None,
        };
        let event = EventBody::RolledUp {
            task: task.clone(),
            sub_list: list.clone(),
            status,
        };
        self.write_as(
            now_ms,
            id,
            &caller,
            parent_doc,
            &req,
            Some(event),
            true,
            fx,
            |_, l| Answer::Snapshot(l.read()),
        );
        // Refused at once (a rule of the parent's, as one task in progress per owner):
        // nobody waits for this answer, so it is said here.
        if let Some((_, Err(e))) = fx.answers.iter().find(|(i, _)| *i == id) {
            tracing::warn!(parent = %parent_doc, task, list, ?status, why = %e.message, "a roll-up was refused");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(
        pending: u64,
        in_progress: u64,
        completed: u64,
        cancelled: u64,
        blocked: u64,
    ) -> TaskCounts {
        TaskCounts {
            pending,
            in_progress,
            completed,
            cancelled,
            blocked,
        }
    }

    #[test]
    fn a_sub_list_rolls_up_to_one_status() {
        assert_eq!(
            rolled_status(&counts(0, 0, 0, 0, 0)),
            None,
            "no task: nothing to say"
        );
        assert_eq!(
            rolled_status(&counts(0, 0, 2, 1, 0)),
            Some(Status::Completed)
        );
        assert_eq!(
            rolled_status(&counts(0, 0, 0, 3, 0)),
            Some(Status::Completed)
        );
        assert_eq!(
            rolled_status(&counts(1, 1, 0, 0, 1)),
            Some(Status::InProgress)
        );
        assert_eq!(rolled_status(&counts(1, 0, 1, 0, 1)), Some(Status::Blocked));
        assert_eq!(rolled_status(&counts(2, 0, 1, 0, 0)), Some(Status::Pending));
    }
}
