//! Calls of the JSON API on one list (create, `todo_read`, `todo_write`, claim), decided
//! by the core one at a time, as a sync peer's change is: a write runs the model's
//! `todo_write` on the hub's replica under the caller's own actor, the authority checks
//! and repairs it, it is committed with the batch and reaches the list's peers like any
//! change, and its answer is released only once the store made it durable
//! ([`HubCore::committed`]). Claims are writes the core decides in turn, so two claimers
//! never get one task.
//!
//! A list not in memory is loaded first (the call waits, as frames do); a list nobody
//! syncs stays in memory for the next calls until it has been idle for
//! [`CALLED_LIST_IDLE_MS`].

use std::sync::Arc;

use automerge::ActorId;

use super::budget::Creator;
use super::limits::{
    CALLED_LISTS_KEPT_MAX, CALLED_LIST_IDLE_MS, CALLS_WAITING_MAX, DOCS_MAX, WAITS_MAX, WAIT_MS_MAX,
};
use super::{Commit, Conn, ConnState, Effects, HubCore, Identity};
use crate::authority::Role;
use crate::model::{normalize, normalize_priority, TodoList, WriteContext};
use crate::proto::wire::{list_document_id, DocumentId};
use crate::proto::{
    ApiError, ClaimAnswer, DelegateAnswer, ErrorCode, EventBody, PatchOp, Resolution, Rule,
    Snapshot, Status, Task, TaskPatch, Version, WaitAnswer, WriteAnswer, WriteMode, WriteRequest,
    WriteResult, LIST_NAME_BYTES_MAX,
};

/// A call of the JSON API, as the runtime numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallId(pub u64);

/// Who makes a call.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Caller {
    /// The agent the call acts as: its token's, or (a hub without tokens) the one it
    /// names.
    pub agent: String,
    /// The identity of its token, on a hub with tokens.
    pub identity: Option<Identity>,
    /// Where it comes from (its list creations are counted under it without a token).
    pub address: Option<std::net::IpAddr>,
}

/// What a call asks of a list.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Call {
    /// Create the list (the same document a Rust client creates for the name); a list
    /// that exists is only read.
    Create,
    /// The list now, or as it was at a version.
    Read(Option<Version>),
    /// `todo_write`.
    Write(#[serde(with = "crate::proto::write_request_as_json")] WriteRequest),
    /// Give the caller the task named, or the first ready one.
    Claim(Option<String>),
    /// Answer once every agent syncing the list holds this version, or after this many
    /// milliseconds (at most [`WAIT_MS_MAX`]) with who does not.
    Wait(Version, i64),
    /// Hand a task to an agent as a list of its own (see `delegation`).
    Delegate {
        /// The task.
        task: String,
        /// The agent.
        agent: String,
        /// The new list's name (default `{list}/{task}`).
        list: Option<String>,
    },
    /// The hub's own: a delegated task takes the status its list rolls up to. Made only
    /// by the core (the runtime never builds one).
    RollUp {
        /// The task.
        task: String,
        /// Its list.
        list: String,
        /// The status.
        status: Status,
    },
}

/// What a call got.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Answer {
    /// The list (create, read).
    Snapshot(Snapshot),
    /// A durable write.
    Written(WriteAnswer),
    /// A durable claim.
    Claimed(ClaimAnswer),
    /// A wait's outcome.
    Waited(WaitAnswer),
    /// A durable delegation.
    Delegated(DelegateAnswer),
}

/// A wait not answered yet.
#[derive(Debug)]
pub(super) struct PendingWait {
    id: CallId,
    doc_id: DocumentId,
    version: Version,
    heads: Vec<automerge::ChangeHash>,
    deadline_ms: i64,
}

/// A call waiting for its list to load.
#[derive(Debug)]
pub(super) struct WaitingCall {
    pub(super) id: CallId,
    caller: Caller,
    name: String,
    call: Call,
}

pub(super) fn error(code: ErrorCode, field: Option<&str>, message: String) -> ApiError {
    ApiError {
        code,
        field: field.map(str::to_owned),
        allowed: Vec::new(),
        message,
        current: None,
    }
}

/// The document of the list called `name`, if the name is one.
pub fn list_id(name: &str) -> Result<DocumentId, ApiError> {
    if name.is_empty() || name.len() > LIST_NAME_BYTES_MAX || name.chars().any(char::is_control) {
        return Err(error(
            ErrorCode::InvalidValue,
            Some("list"),
            format!("a list name is 1 to {LIST_NAME_BYTES_MAX} bytes of text without control characters"),
        ));
    }
    Ok(list_document_id(name))
}

/// The actor of the changes an agent makes through the API: the same for every call of
/// the agent on every hub (`"swarmtodo-api\0" + agent`), so that its changes form one
/// sequence, and never one a replica draws at random (those are 16 bytes).
pub fn api_actor(agent: &str) -> ActorId {
    let mut bytes = b"swarmtodo-api\0".to_vec();
    bytes.extend_from_slice(agent.as_bytes());
    ActorId::from(bytes)
}

/// The task a claim gets: the one named, if it is ready (or already the claimer's and
/// in progress: a repeated claim), else the first ready one by priority, then order.
fn pick(list: &TodoList, agent: &str, named: Option<&str>) -> Result<Task, ApiError> {
    let Some(id) = named else {
        // By the index's priorities; only the task picked is read whole.
        let index = list.index();
        return list
            .ready_tasks()
            .min_by_key(|id| {
                normalize_priority(index.tasks.get(*id).and_then(|e| e.priority()))
            })
            .and_then(|id| list.raw_task(id).map(|raw| normalize(id, &raw)))
            .ok_or_else(|| {
                error(
                    ErrorCode::NothingReady,
                    None,
                    "no task is ready (pending, unowned, every dependency completed): wait for an `unblocked` or `tasks_changed` event, then claim again".to_owned(),
                )
            });
    };
    let Some(t) = list.raw_task(id).map(|raw| normalize(id, &raw)) else {
        return Err(error(
            ErrorCode::UnknownTask,
            Some("task"),
            format!("no task {id:?} in this list: read it, or claim without a task to get the first ready one"),
        ));
    };
    if t.owner.as_deref() == Some(agent) && t.status == Status::InProgress {
        return Ok(t);
    }
    if let Some(owner) = t.owner.as_deref().filter(|o| *o != agent) {
        return Err(error(
            ErrorCode::Conflict,
            Some("task"),
            format!("task {id:?} is held by {owner:?}: claim another, or without a task to get the first ready one"),
        ));
    }
    if t.status != Status::Pending {
        return Err(error(
            ErrorCode::Conflict,
            Some("task"),
            format!(
                "task {id:?} is {}, not pending: only a pending task can be claimed",
                t.status.as_str()
            ),
        ));
    }
    if !list.is_ready(id) {
        return Err(error(
            ErrorCode::NothingReady,
            Some("task"),
            format!(
                "task {id:?} waits for tasks not completed yet ({}): claim it once they are",
                t.blocked_by.join(", ")
            ),
        ));
    }
    Ok(t)
}

impl HubCore {
    /// A call: decided now if its list is in memory, after the list loads if it is
    /// stored, else (create, write) on a new list.
    pub(super) fn call(
        &mut self,
        now_ms: i64,
        id: CallId,
        caller: Caller,
        name: &str,
        call: Call,
        fx: &mut Effects,
    ) {
        let doc_id = match list_id(name) {
            Ok(d) => d,
            Err(e) => return fx.answers.push((id, Err(e))),
        };
        let writes = !matches!(call, Call::Read(_) | Call::Wait(..) | Call::RollUp { .. });
        if writes && self.role_of(&caller, &doc_id) == Role::Observer {
            return fx.answers.push((
                id,
                Err(error(
                    ErrorCode::Forbidden,
                    None,
                    format!(
                        "{:?} is an observer of this list: it reads, and may not write or claim",
                        caller.agent
                    ),
                )),
            ));
        }
        if !self.docs.contains_key(&doc_id) {
            let loading = self.waiting.contains_key(&doc_id) || self.calls.contains_key(&doc_id);
            if loading || self.maybe_stored(&doc_id) {
                let waiting = self.calls.entry(doc_id).or_default();
                if waiting.len() >= CALLS_WAITING_MAX {
                    return fx.answers.push((
                        id,
                        Err(error(
                            ErrorCode::LimitExceeded,
                            None,
                            format!("{CALLS_WAITING_MAX} calls wait for this list to load already: retry in a moment"),
                        )),
                    ));
                }
                if !loading {
                    fx.loads.push(doc_id);
                }
                waiting.push(WaitingCall {
                    id,
                    caller,
                    name: name.to_owned(),
                    call,
                });
                return;
            }
            if !self.make_absent_list(now_ms, id, &caller, name, &call, fx) {
                return;
            }
        }
        self.called_on(now_ms, doc_id, name, &caller);
        self.decide(now_ms, id, &caller, doc_id, call, fx);
        self.keep_called(now_ms, doc_id);
    }

    /// A call on list `name`, neither in memory nor stored: a read, claim or wait finds
    /// no list (answered here); a create or write makes it first. False when answered.
    fn make_absent_list(
        &mut self,
        now_ms: i64,
        id: CallId,
        caller: &Caller,
        name: &str,
        call: &Call,
        fx: &mut Effects,
    ) -> bool {
        let made = match call {
            Call::Read(_)
            | Call::Claim(_)
            | Call::Wait(..)
            | Call::Delegate { .. }
            | Call::RollUp { .. } => Err(error(
                ErrorCode::UnknownList,
                Some("list"),
                format!(
                    "no list is called {name:?}: create it (PUT /v1/lists/{{name}}) or write to it"
                ),
            )),
            Call::Create | Call::Write(_) => self.create_for_call(now_ms, caller, name, fx),
        };
        match made {
            Ok(()) => true,
            Err(e) => {
                fx.answers.push((id, Err(e)));
                false
            }
        }
    }

    /// The calls that waited for list `doc_id` to load (or for the store to say it has
    /// nothing for it).
    pub(super) fn calls_loaded(&mut self, now_ms: i64, doc_id: DocumentId, fx: &mut Effects) {
        for w in self.calls.remove(&doc_id).unwrap_or_default() {
            if !self.docs.contains_key(&doc_id)
                && !self.make_absent_list(now_ms, w.id, &w.caller, &w.name, &w.call, fx)
            {
                continue;
            }
            self.called_on(now_ms, doc_id, &w.name, &w.caller);
            self.decide(now_ms, w.id, &w.caller, doc_id, w.call, fx);
            self.keep_called(now_ms, doc_id);
        }
    }

    /// Learns the name list `doc_id` is called by (its document id is the name's hash,
    /// so a list has at most one).
    fn name_list(&mut self, doc_id: DocumentId, name: &str) {
        if let Some(doc) = self.docs.get_mut(&doc_id) {
            if doc.name.is_none() {
                doc.name = Some(name.to_owned());
            }
        }
    }

    /// A call of `caller` on list `doc_id`, in memory: the list learns its name, the
    /// caller is present on it.
    fn called_on(&mut self, now_ms: i64, doc_id: DocumentId, name: &str, caller: &Caller) {
        self.name_list(doc_id, name);
        if let Some(doc) = self.docs.get_mut(&doc_id) {
            doc.presence.called(&caller.agent, now_ms);
            self.presence_touched(doc_id);
        }
    }

    /// The caller's role in list `doc_id`: its token's, else the hub's roles by agent.
    pub(super) fn role_of(&self, caller: &Caller, doc_id: &DocumentId) -> Role {
        match &caller.identity {
            Some(who) => who.role_in(doc_id),
            None => self.config.roles.of(Some(&caller.agent)),
        }
    }

    /// Makes list `name` (its first change, the same in every list) for a caller,
    /// within the hub's list bound and the caller's creation budget.
    pub(super) fn create_for_call(
        &mut self,
        now_ms: i64,
        caller: &Caller,
        name: &str,
        fx: &mut Effects,
    ) -> Result<(), ApiError> {
        let doc_id = list_document_id(name);
        if self.stored.len() + self.docs.len() >= DOCS_MAX {
            return Err(error(
                ErrorCode::LimitExceeded,
                Some("list"),
                format!("the hub has {DOCS_MAX} lists already: use an existing list, or ask the hub's operator for room"),
            ));
        }
        let creator = match (&caller.identity, caller.address) {
            (Some(who), _) => Creator::Agent(who.agent.clone()),
            (None, Some(a)) => Creator::Address(a),
            (None, None) => Creator::Unknown,
        };
        if !self.take_creation_by(now_ms, creator) {
            let (burst, per_minute) = self.config.list_creations;
            return Err(error(
                ErrorCode::LimitExceeded,
                Some("list"),
                format!("too many new lists: {burst} at once, then {per_minute} a minute per token (or address without one); wait, or use lists that exist"),
            ));
        }
        let list = TodoList::create(self.config.actor.clone());
        let changes = list.changes_since(&[]);
        self.insert_list(doc_id, list, Vec::new());
        self.name_list(doc_id, name);
        self.commit(
            doc_id,
            Commit {
                changes,
                ..Commit::empty(doc_id)
            },
            fx,
        );
        Ok(())
    }

    /// Decides a call on a list in memory.
    fn decide(
        &mut self,
        now_ms: i64,
        id: CallId,
        caller: &Caller,
        doc_id: DocumentId,
        call: Call,
        fx: &mut Effects,
    ) {
        let Some(doc) = self.docs.get(&doc_id) else {
            return;
        };
        match call {
            Call::Create | Call::Read(None) => {
                fx.answers.push((id, Ok(Answer::Snapshot(doc.list.read()))));
            }
            Call::Wait(version, timeout_ms) => {
                let heads = match doc.list.known_heads(&version) {
                    Ok(h) => h,
                    Err(e) => return fx.answers.push((id, Err(e))),
                };
                if self.waits.len() >= WAITS_MAX {
                    return fx.answers.push((
                        id,
                        Err(error(
                            ErrorCode::LimitExceeded,
                            None,
                            format!(
                                "{WAITS_MAX} waits are open on this hub already: retry in a moment"
                            ),
                        )),
                    ));
                }
                self.waits.push(PendingWait {
                    id,
                    doc_id,
                    version,
                    heads,
                    deadline_ms: now_ms.saturating_add(timeout_ms.clamp(0, WAIT_MS_MAX)),
                });
            }
            Call::Read(Some(v)) => {
                fx.answers
                    .push((id, doc.list.read_at(&v).map(Answer::Snapshot)));
            }
            Call::Write(req) => {
                self.write_as(
                    now_ms,
                    id,
                    caller,
                    doc_id,
                    &req,
                    None,
                    false,
                    fx,
                    |result, list| {
                        Answer::Written(WriteAnswer {
                            result,
                            snapshot: list.read(),
                        })
                    },
                );
            }
            Call::Claim(named) => {
                let task = match pick(&doc.list, &caller.agent, named.as_deref()) {
                    Ok(t) => t,
                    Err(e) => return fx.answers.push((id, Err(e))),
                };
                let req = WriteRequest {
                    mode: WriteMode::Patch {
                        ops: vec![PatchOp::Upsert {
                            task: TaskPatch {
                                id: Some(task.id.clone()),
                                owner: Some(Some(caller.agent.clone())),
                                status: Some(Status::InProgress),
                                ..TaskPatch::default()
                            },
                        }],
                    },
                    expected_version: None,
                    explanation: Some(format!("{} claims {}", caller.agent, task.id)),
                };
                let claimed = task.id;
                let event = EventBody::Claimed {
                    task: claimed.clone(),
                    agent: caller.agent.clone(),
                };
                self.write_as(
                    now_ms,
                    id,
                    caller,
                    doc_id,
                    &req,
                    Some(event),
                    false,
                    fx,
                    move |_, list| match list.raw_task(&claimed) {
                        Some(raw) => Answer::Claimed(ClaimAnswer {
                            task: normalize(&claimed, &raw),
                            version: list.version(),
                        }),
                        None => Answer::Snapshot(list.read()),
                    },
                );
            }
            Call::Delegate { task, agent, list } => {
                self.delegate(now_ms, id, caller, doc_id, (task, agent, list), fx);
            }
            Call::RollUp { task, list, status } => {
                self.roll_up(now_ms, id, doc_id, (task, list, status), fx);
            }
        }
    }

    /// `todo_write` on list `doc_id` as the caller (its own actor, its role; `as_hub`:
    /// the hub's actor), checked and repaired by the authority, committed with `event`
    /// when the authority let it stand, and answered with `answer` of the result and the
    /// list once durable (at once when the write changed nothing).
    #[allow(clippy::too_many_arguments)] // One call's parts; a struct would only rename them.
    pub(super) fn write_as(
        &mut self,
        now_ms: i64,
        id: CallId,
        caller: &Caller,
        doc_id: DocumentId,
        req: &WriteRequest,
        event: Option<EventBody>,
        as_hub: bool,
        fx: &mut Effects,
        answer: impl FnOnce(WriteResult, &TodoList) -> Answer,
    ) {
        let hub_actor = self.config.actor.clone();
        let Some(doc) = self.docs.get_mut(&doc_id) else {
            return;
        };
        let actor = if as_hub {
            hub_actor.clone()
        } else {
            api_actor(&caller.agent)
        };
        // The ids of created tasks come from this seed: no two calls share one.
        let seed = (id.0 << 20) ^ now_ms as u64;
        let ctx = WriteContext::new(caller.agent.clone(), now_ms, seed);
        doc.list.set_actor(actor.clone());
        let written = doc.list.write(req, &ctx);
        doc.list.set_actor(hub_actor);
        let (result, merge) = match written {
            Ok(w) => w,
            Err(e) => return fx.answers.push((id, Err(e))),
        };
        if !result.changed {
            return fx.answers.push((id, Ok(answer(result, &doc.list))));
        }
        if let Some(who) = &caller.identity {
            doc.authority.bind(&actor, &who.agent, who.role_in(&doc_id));
            self.actors
                .entry(actor)
                .or_insert_with(|| Arc::new(who.clone()));
        }
        let hashes: Vec<String> = merge.changes.iter().map(|c| c.hash()).collect();
        let mut commit = HubCore::check_and_repair(doc, doc_id, merge, now_ms);
        // The authority found this write against a rule the model cannot see (a
        // worker's write to another's task): the write and its repair are stored and
        // reported like a sync peer's, and the caller is refused with the reason.
        let refused = commit.events.iter().find_map(|e| match e {
            EventBody::Violation(v) if v.changes.iter().any(|c| hashes.contains(c)) => Some(v),
            _ => None,
        });
        let answered = match refused {
            Some(v) => Err(error(
                if v.rule == Rule::Ownership {
                    ErrorCode::Forbidden
                } else {
                    ErrorCode::Conflict
                },
                None,
                format!(
                    "the authority refused this write: {} ({})",
                    v.message,
                    match &v.resolution {
                        Resolution::Repaired { how } => format!("repaired: {how}"),
                        Resolution::Reported => "reported".to_owned(),
                    }
                ),
            )),
            None => {
                commit.events.extend(event);
                Ok(answer(result, &doc.list))
            }
        };
        commit.answers.push((id, answered));
        self.commit(doc_id, commit, fx);
        self.owed.entry(doc_id).or_default().moved = true;
    }

    /// A list that no peer syncs stays in memory for the next calls, at most
    /// [`CALLED_LIST_IDLE_MS`] after the last, and at most [`CALLED_LISTS_KEPT_MAX`]
    /// such lists (the oldest leaves first); [`HubCore::sweep_called`] lets them go.
    pub(super) fn keep_called(&mut self, now_ms: i64, doc_id: DocumentId) {
        if self.docs.get(&doc_id).is_some_and(|d| d.peers.is_empty()) {
            self.called.insert(doc_id, now_ms);
        }
        if self.called.len() > CALLED_LISTS_KEPT_MAX {
            if let Some((&oldest, _)) = self.called.iter().min_by_key(|(_, at)| **at) {
                self.called.insert(oldest, i64::MIN);
            }
            self.sweep_called(now_ms);
        }
    }

    /// Lets the lists kept for calls go once idle long enough (their changes are in the
    /// store, or in commits handed out and performed before any load); a list a peer
    /// syncs now stays while it does.
    pub(super) fn sweep_called(&mut self, now_ms: i64) {
        if self.called.is_empty() {
            return;
        }
        let (docs, waiting) = (&self.docs, &self.calls);
        let mut idle = Vec::new();
        self.called.retain(|doc_id, at| {
            let Some(d) = docs.get(doc_id) else {
                return false;
            };
            if !d.peers.is_empty() {
                return false;
            }
            if now_ms - *at < CALLED_LIST_IDLE_MS || waiting.contains_key(doc_id) {
                return true;
            }
            idle.push(*doc_id);
            false
        });
        for doc_id in idle {
            self.let_go(doc_id);
        }
    }

    /// When a list kept for calls is due to leave memory, a wait times out, an agent
    /// gone reaches the end of its window or a row of the index of lists is due (the
    /// runtime sends [`Input::Tick`](super::Input::Tick) then, if nothing came before).
    pub fn next_wake_ms(&self) -> Option<i64> {
        let idle = self
            .called
            .values()
            .min()
            .map(|at| at.saturating_add(CALLED_LIST_IDLE_MS));
        let wait = self.waits.iter().map(|w| w.deadline_ms).min();
        idle.into_iter()
            .chain(wait)
            .chain(self.next_presence_ms())
            .chain(self.next_summary_ms())
            .chain(self.windows_due.first().map(|(at, _)| *at))
            .min()
    }

    /// Answers the waits whose version every peer of their list now holds, and those
    /// past their deadline (with the peers that do not hold it). Its cost follows the
    /// open waits (at most [`WAITS_MAX`]) and their lists' peers.
    pub(super) fn check_waits(&mut self, now_ms: i64, fx: &mut Effects) {
        if self.waits.is_empty() {
            return;
        }
        let mut open = Vec::with_capacity(self.waits.len());
        for w in std::mem::take(&mut self.waits) {
            let pending = self.not_holding(&w.doc_id, &w.heads);
            if pending.is_empty() || now_ms >= w.deadline_ms {
                fx.answers.push((
                    w.id,
                    Ok(Answer::Waited(WaitAnswer {
                        version: w.version,
                        acknowledged: pending.is_empty(),
                        pending,
                    })),
                ));
            } else {
                open.push(w);
            }
        }
        self.waits = open;
    }

    /// The peers of list `doc_id` whose acknowledged heads do not hold `heads`, by
    /// agent (or peer id without a token), sorted.
    fn not_holding(&self, doc_id: &DocumentId, heads: &[automerge::ChangeHash]) -> Vec<String> {
        let Some(doc) = self.docs.get(doc_id) else {
            return Vec::new();
        };
        let mut pending: Vec<String> = doc
            .peers
            .iter()
            .filter(|(_, p)| {
                p.state
                    .their_heads
                    .as_deref()
                    .is_none_or(|theirs| !doc.list.covers(theirs, heads))
            })
            .map(|(c, _)| match self.conns.get(c) {
                Some(Conn {
                    identity: Some(who),
                    ..
                }) => who.agent.clone(),
                Some(Conn {
                    state: ConnState::Ready(peer),
                    ..
                }) => peer.to_string(),
                _ => format!("connection {}", c.0),
            })
            .collect();
        pending.sort();
        pending.dedup();
        pending
    }
}
