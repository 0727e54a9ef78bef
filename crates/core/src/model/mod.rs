//! The typed todo model on Automerge: one document per list, tasks in a map keyed by
//! stable id, order by fractional position keys (docs/DESIGN.md §3).
//!
//! [`TodoList`] is a replica: it holds the document, a materialised index kept up to
//! date change by change, and the `todo_write` / `todo_read` operations of docs/DESIGN.md §5.
//! It does no I/O and reads no clock: time and the seed for generated ids come in a
//! [`WriteContext`].
//!
//! ```
//! use automerge::ActorId;
//! use swarmtodo_core::model::{TodoList, WriteContext};
//! use swarmtodo_proto::{PatchOp, Status, TaskPatch, WriteMode, WriteRequest};
//!
//! let mut lead = TodoList::create(ActorId::from([1u8; 16]));
//! let mut worker = lead.fork(ActorId::from([2u8; 16]));
//!
//! let plan = WriteRequest {
//!     mode: WriteMode::Patch { ops: vec![PatchOp::Upsert { task: TaskPatch {
//!         id: Some("t1".into()), content: Some("Run the tests".into()), ..TaskPatch::default()
//!     }}]},
//!     expected_version: None,
//!     explanation: Some("plan".into()),
//! };
//! lead.write(&plan, &WriteContext::new("lead", 1_000, 1)).unwrap();
//! worker.merge_from(&lead).unwrap();
//!
//! let start = WriteRequest {
//!     mode: WriteMode::Patch { ops: vec![PatchOp::Upsert { task: TaskPatch {
//!         id: Some("t1".into()), status: Some(Status::InProgress), ..TaskPatch::default()
//!     }}]},
//!     expected_version: None,
//!     explanation: None,
//! };
//! worker.write(&start, &WriteContext::new("worker", 2_000, 2)).unwrap();
//! lead.merge_from(&worker).unwrap();
//! assert_eq!(lead.read().tasks[0].status, Status::InProgress);
//! assert_eq!(lead.version(), worker.version());
//! ```

pub(crate) mod deps;
mod doc;
mod index;
mod position;
pub mod sync;
mod write;

use std::collections::BTreeMap;

use automerge::{
    transaction::CommitOptions, transaction::Transactable, ActorId, Automerge, AutomergeError,
    Change, ChangeHash, ObjType, ROOT,
};

pub use self::doc::RawTask;
pub use self::index::{ChangeInfo, Merge, TaskDelta};
pub use self::write::WriteContext;
pub use crate::proto::parse_write_request;
pub use crate::proto::{
    ApiError, ErrorCode, PatchOp, Priority, Snapshot, Status, Task, TaskPatch, Version, WriteMode,
    WriteRequest, WriteResult,
};

pub use self::doc::field;
pub(crate) use self::doc::{value_json, OpKey, ROOT_ACTOR, TASK_ENTRY};
pub(crate) use self::index::Index;
pub use crate::limits::PENDING_CHANGES_MAX;
use crate::proto::{
    AGENT_ID_BYTES_MAX, BLOCKED_BY_COUNT_MAX, EVENT_VALUE_BYTES_MAX, TASK_ID_BYTES_MAX,
    TASK_TEXT_BYTES_MAX,
};

/// Errors of the replica that are not a refused write: broken documents and transport
/// mistakes. A refused write is an [`ApiError`].
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Automerge refused the bytes or the change.
    #[error("automerge: {0}")]
    Automerge(#[from] AutomergeError),
    /// A chunk of a sync message is neither a change nor a bundle of changes.
    #[error("sync message chunk {index} is not a change or bundle: {reason}")]
    BadChunk {
        /// Position of the chunk in the message.
        index: usize,
        /// What the decoder said.
        reason: String,
    },
}

/// Reads a status as a snapshot shows it: a valid value as is; a common misspelling
/// (`done`, `in-progress`, `canceled`, …) as what it clearly means; anything else as
/// `pending`. The authority's schema repair makes the same choice, so a replica's read
/// already shows what the repair will write.
pub fn normalize_status(raw: Option<&str>) -> Status {
    let Some(raw) = raw else {
        return Status::Pending;
    };
    if let Ok(s) = raw.parse() {
        return s;
    }
    status_alias(raw).unwrap_or(Status::Pending)
}

/// The status a known misspelling means, if it is one.
pub fn status_alias(raw: &str) -> Option<Status> {
    let s = raw.trim().to_ascii_lowercase().replace(['-', ' '], "_");
    match s.as_str() {
        "pending" | "todo" | "to_do" | "open" | "not_started" | "new" => Some(Status::Pending),
        "in_progress" | "inprogress" | "active" | "doing" | "started" | "running" => {
            Some(Status::InProgress)
        }
        "completed" | "complete" | "done" | "finished" | "closed" => Some(Status::Completed),
        "cancelled" | "canceled" | "dropped" | "abandoned" => Some(Status::Cancelled),
        "blocked" | "waiting" | "on_hold" => Some(Status::Blocked),
        _ => None,
    }
}

/// Reads a priority as a snapshot shows it: valid as is, anything else `medium`.
pub fn normalize_priority(raw: Option<&str>) -> Priority {
    let Some(raw) = raw else {
        return Priority::default();
    };
    raw.parse()
        .or_else(|()| raw.trim().to_ascii_lowercase().parse())
        .unwrap_or_default()
}

/// The typed task a stored one reads as.
///
/// What a sync peer stored past the model's limits (the authority repairs it, but
/// reads and events can come first) is cut to them: ids to [`TASK_ID_BYTES_MAX`], texts
/// to [`TASK_TEXT_BYTES_MAX`], owners to [`AGENT_ID_BYTES_MAX`], dependencies to
/// [`BLOCKED_BY_COUNT_MAX`], so that a task always reads and renders at a bounded size.
pub fn normalize(id: &str, raw: &RawTask) -> Task {
    let text = |s: &Option<String>| {
        s.as_deref()
            .map(|s| clip(s, TASK_TEXT_BYTES_MAX).to_owned())
    };
    Task {
        id: clip(id, TASK_ID_BYTES_MAX).to_owned(),
        content: text(&raw.content).unwrap_or_default(),
        active_form: text(&raw.active_form),
        status: normalize_status(raw.status.as_deref()),
        priority: normalize_priority(raw.priority.as_deref()),
        owner: raw
            .owner
            .as_deref()
            .map(|o| clip(o, AGENT_ID_BYTES_MAX).to_owned()),
        blocked_by: raw
            .blocked_by
            .iter()
            .take(BLOCKED_BY_COUNT_MAX)
            .map(|d| clip(d, TASK_ID_BYTES_MAX).to_owned())
            .collect(),
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A written value as an event quotes it: strings cut to [`EVENT_VALUE_BYTES_MAX`],
/// lists to [`BLOCKED_BY_COUNT_MAX`] entries of at most [`TASK_ID_BYTES_MAX`], the
/// task id and agent to their limits.
pub fn clip_written(mut w: crate::proto::WrittenValue) -> crate::proto::WrittenValue {
    use serde_json::Value;
    let text = |s: &str, max: usize| {
        let cut = clip(s, max);
        if cut.len() < s.len() {
            format!("{cut}…")
        } else {
            cut.to_owned()
        }
    };
    w.value = match w.value {
        Value::String(s) => Value::String(text(&s, EVENT_VALUE_BYTES_MAX)),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .take(BLOCKED_BY_COUNT_MAX)
                .map(|i| match i {
                    Value::String(s) => Value::String(text(&s, TASK_ID_BYTES_MAX)),
                    other => other,
                })
                .collect(),
        ),
        Value::Object(mut task) => {
            if let Some(Value::String(c)) = task.get_mut(field::CONTENT) {
                *c = text(c, EVENT_VALUE_BYTES_MAX);
            }
            Value::Object(task)
        }
        other => other,
    };
    w.task = text(&w.task, TASK_ID_BYTES_MAX);
    w.agent = w.agent.map(|a| text(&a, AGENT_ID_BYTES_MAX));
    w
}

/// One replica of one todo list.
#[derive(Debug, Clone)]
pub struct TodoList {
    doc: Automerge,
    index: Index,
    /// Changes received before their dependencies; applied when those arrive.
    pending: Vec<Change>,
    /// The last changes applied, for sync without walking the history.
    window: sync::SyncWindow,
    /// Sync steps answered from `window` and by the stock functions.
    sync_counters: sync::Counters,
}

impl TodoList {
    /// A new, empty list whose first change is the same for every creator (see
    /// `doc::ROOT_ACTOR`), so concurrent creators end with one root. Later changes are
    /// made by `actor`, which must be unique to this replica.
    pub fn create(actor: ActorId) -> TodoList {
        let mut doc = Automerge::new().with_actor(ActorId::from(doc::ROOT_ACTOR));
        // The two root maps cannot fail to be created in a fresh document.
        let made: Result<_, automerge::transaction::Failure<AutomergeError>> = doc.transact_with(
            |_| CommitOptions::default().with_time(0),
            |tx| {
                tx.put_object(ROOT, doc::TASKS, ObjType::Map)?;
                tx.put_object(ROOT, doc::AGENTS, ObjType::Map)?;
                Ok(())
            },
        );
        debug_assert!(made.is_ok(), "creating the root maps of an empty document");
        doc.set_actor(actor);
        TodoList::from_doc(doc)
    }

    /// Wraps an existing document (loaded, or received from a peer).
    pub fn from_doc(doc: Automerge) -> TodoList {
        let index = Index::build(&doc);
        let window = sync::SyncWindow::of(&doc);
        TodoList {
            doc,
            index,
            pending: Vec::new(),
            window,
            sync_counters: Default::default(),
        }
    }

    /// Loads a saved document and makes further changes as `actor`.
    pub fn load(bytes: &[u8], actor: ActorId) -> Result<TodoList, ModelError> {
        let doc = Automerge::load(bytes)?.with_actor(actor);
        Ok(TodoList::from_doc(doc))
    }

    /// A second replica of this list at the same state, writing as `actor`.
    pub fn fork(&self, actor: ActorId) -> TodoList {
        TodoList {
            doc: self.doc.fork().with_actor(actor),
            index: self.index.clone(),
            pending: self.pending.clone(),
            window: self.window.clone(),
            sync_counters: Default::default(),
        }
    }

    /// The Automerge document.
    pub fn doc(&self) -> &Automerge {
        &self.doc
    }

    /// The whole document, compressed.
    pub fn save(&self) -> Vec<u8> {
        self.doc.save()
    }

    /// The whole document, compressed — and the document in memory rebuilt from it.
    /// Automerge's op columns grow as changes land one batch at a time and keep their
    /// spare room; a document loaded from its own save holds the same content in about
    /// two thirds of the memory (a 1,000-task list with 10,000 changes: 3.3 → 2.2 MiB;
    /// `examples/list_memory.rs`). The hub does this when it stores a snapshot anyway.
    /// Heads, index and sync window are unchanged: the content is the same.
    pub fn save_and_compact(&mut self) -> Vec<u8> {
        let bytes = self.doc.save();
        match Automerge::load(&bytes) {
            Ok(doc) if doc.get_heads() == self.doc.get_heads() => {
                self.doc = doc.with_actor(self.doc.get_actor().clone());
            }
            // A document always loads from its own save; if it ever did not, the
            // one in memory stays, uncompacted.
            Ok(_) => tracing::warn!("a saved list reloaded with other heads; kept as it was"),
            Err(e) => tracing::warn!(error = %e, "a saved list did not reload; kept as it was"),
        }
        bytes
    }

    /// The current heads (the sync window's when it is in step: automerge collects and
    /// sorts them on every call).
    pub fn heads(&self) -> Vec<ChangeHash> {
        if self.window.in_step(&self.doc) {
            self.window.heads().to_vec()
        } else {
            self.doc.get_heads()
        }
    }

    /// The current version.
    pub fn version(&self) -> Version {
        Version(doc::render_heads(&self.doc.get_heads()))
    }

    /// Renders heads as a version string.
    pub fn version_of(heads: &[ChangeHash]) -> Version {
        Version(doc::render_heads(heads))
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.index.tasks.len()
    }

    /// True when the list has no task.
    pub fn is_empty(&self) -> bool {
        self.index.tasks.is_empty()
    }

    /// The task as stored (possibly invalid, as a foreign peer wrote it).
    pub fn raw_task(&self, id: &str) -> Option<&RawTask> {
        self.index.tasks.get(id).map(|e| &e.raw)
    }

    /// The task as stored at `heads` (read at those heads: no copy of the document).
    pub fn raw_task_at(&self, id: &str, heads: &[ChangeHash]) -> Option<RawTask> {
        doc::read_task_by_id(doc::View::at(&self.doc, heads), id)
    }

    /// The agent a change's actor registered as.
    pub fn agent_of(&self, actor: &ActorId) -> Option<String> {
        doc::agent_of(&self.doc, self.index.agents_obj.as_ref(), actor)
    }

    /// True for the list's first change: the same bytes in every list (a fixed actor, no
    /// parents), which makes the two root maps.
    pub(crate) fn is_first_change(change: &Change) -> bool {
        change.actor_id().to_bytes() == doc::ROOT_ACTOR && change.deps().is_empty()
    }

    /// The agent `actor` had registered as at `heads` (read at those heads).
    pub fn agent_at(&self, actor: &ActorId, heads: &[ChangeHash]) -> Option<String> {
        self.agent_hex_at(&actor.to_hex_string(), heads)
    }

    /// The `agents` entry under key `hex` (an actor id, or anything a writer put there).
    pub(crate) fn agent_of_hex(&self, hex: &str) -> Option<String> {
        doc::agent_in(doc::View::now(&self.doc), hex)
    }

    /// The `agents` entry under key `hex` at `heads`.
    pub(crate) fn agent_hex_at(&self, hex: &str, heads: &[ChangeHash]) -> Option<String> {
        doc::agent_in(doc::View::at(&self.doc, heads), hex)
    }

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

    /// Changes waiting for missing dependencies.
    pub fn pending_changes(&self) -> usize {
        self.pending.len()
    }

    pub(crate) fn index(&self) -> &Index {
        &self.index
    }

    /// `todo_read`: the tasks in order at the current version.
    pub fn read(&self) -> Snapshot {
        Snapshot {
            version: self.version(),
            tasks: self
                .index
                .order
                .iter()
                .filter_map(|(_, id)| self.index.tasks.get(id).map(|e| normalize(id, &e.raw)))
                .collect(),
        }
    }

    /// `todo_read` as of an earlier version, read at its heads with automerge's `*_at`
    /// reads. A copy of the document at those heads (`fork_at`) and its index cost
    /// 98 ms for a 1,000-task list of 10,000 changes and 526 ms at 60,000; these reads
    /// 12 and 16 ms. Stale replaces read their base the same way.
    pub fn read_at(&self, version: &Version) -> Result<Snapshot, ApiError> {
        if *version == self.version() {
            return Ok(self.read());
        }
        let heads = self.known_heads(version)?;
        let tasks = doc::read_tasks(doc::View::at(&self.doc, &heads));
        let mut order: Vec<(&String, &RawTask)> = tasks.iter().collect();
        order.sort_by(|(a_id, a), (b_id, b)| (&a.position, a_id).cmp(&(&b.position, b_id)));
        Ok(Snapshot {
            version: TodoList::version_of(&heads),
            tasks: order
                .into_iter()
                .map(|(id, raw)| normalize(id, raw))
                .collect(),
        })
    }

    fn known_heads(&self, version: &Version) -> Result<Vec<ChangeHash>, ApiError> {
        let heads = doc::parse_heads(&version.0).ok_or_else(|| ApiError {
            code: ErrorCode::InvalidValue,
            field: Some("version".into()),
            allowed: Vec::new(),
            message: format!(
                "{version:?} is not a version: use one returned by todo_read or todo_write"
            ),
            current: None,
        })?;
        if let Some(h) = heads
            .iter()
            .find(|h| self.doc.get_change_meta_by_hash(h).is_none())
        {
            return Err(unknown_version(version, h));
        }
        Ok(heads)
    }

    /// Applies changes from a peer (in any order, with duplicates) and says what they
    /// touched.
    ///
    /// Automerge is only ever handed changes whose dependencies it has, one at a time in
    /// causal order, so its own queue stays empty and this replica's index sees every
    /// change that lands. Changes whose dependencies are missing wait here, at most
    /// [`PENDING_CHANGES_MAX`] of them; a change Automerge refuses (say, a forged
    /// sequence number) is dropped and listed in [`Merge::rejected`], and the rest of
    /// the batch still lands.
    pub fn apply_changes(&mut self, changes: Vec<Change>) -> Result<Merge, ModelError> {
        let mut fresh: Vec<Change> = Vec::with_capacity(changes.len());
        let mut seen = std::collections::HashSet::new();
        for c in self.pending.drain(..).chain(changes) {
            let h = c.hash();
            if self.doc.get_change_meta_by_hash(&h).is_none() && seen.insert(h) {
                fresh.push(c);
            }
        }
        if fresh.is_empty() {
            return Ok(Merge::default());
        }
        let (ready, waiting) = causal_order(&self.doc, fresh);
        let mut applied = Vec::with_capacity(ready.len());
        let mut rejected = Vec::new();
        let mut failed: std::collections::HashSet<ChangeHash> = std::collections::HashSet::new();
        // The common case: the whole ready batch lands in one call. When Automerge
        // refuses it, whatever did land stays, and the rest is retried one by one so that
        // only the bad change (and what depends on it) is dropped.
        let batch_ok = self.doc.apply_changes(ready.iter().cloned()).is_ok();
        for c in ready {
            if self.doc.get_change_meta_by_hash(&c.hash()).is_some() {
                applied.push(c);
                continue;
            }
            if batch_ok {
                failed.insert(c.hash());
                rejected.push((c.hash().to_string(), "not applied".to_owned()));
                continue;
            }
            // A change whose parent was refused cannot land either.
            if c.deps().iter().any(|d| failed.contains(d)) {
                failed.insert(c.hash());
                rejected.push((
                    c.hash().to_string(),
                    "depends on a refused change".to_owned(),
                ));
                continue;
            }
            match self.doc.apply_changes(std::iter::once(c.clone())) {
                Ok(()) if self.doc.get_change_meta_by_hash(&c.hash()).is_some() => applied.push(c),
                Ok(()) => {
                    failed.insert(c.hash());
                    rejected.push((c.hash().to_string(), "not applied".to_owned()));
                }
                Err(e) => {
                    failed.insert(c.hash());
                    rejected.push((c.hash().to_string(), e.to_string()));
                }
            }
        }
        let mut waiting = waiting;
        if waiting.len() > PENDING_CHANGES_MAX {
            for c in waiting.drain(PENDING_CHANGES_MAX..) {
                rejected.push((
                    c.hash().to_string(),
                    format!(
                        "more than {PENDING_CHANGES_MAX} changes wait for missing dependencies"
                    ),
                ));
            }
        }
        self.pending = waiting;
        self.window.record(&self.doc, applied.iter());
        let mut merge = self.index.absorb(&self.doc, &applied);
        merge.rejected = rejected;
        Ok(merge)
    }

    /// Receives an Automerge sync message from a peer: its changes go through
    /// [`TodoList::apply_changes`] (causal order, index kept in step), then the peer's
    /// sync state is updated from the rest of the message — from the recent-changes
    /// window when it can answer (cost independent of the history; see [`sync`]),
    /// else by automerge's stock function. The message must have been validated (the
    /// hub's `syncmsg` module) before it gets here.
    pub fn receive_sync_message(
        &mut self,
        state: &mut automerge::sync::State,
        message: automerge::sync::Message,
    ) -> Result<Merge, ModelError> {
        self.receive_sync_message_indexed(state, &mut sync::SentIndex::default(), message)
    }

    /// [`TodoList::receive_sync_message`] for a peer whose changes in flight are kept
    /// indexed beside its state (`sent`, see [`sync::SentIndex`]): what the peer acknowledges
    /// costs a walk from its heads, not a lookup per change in flight. A hub keeps one
    /// per peer.
    pub fn receive_sync_message_indexed(
        &mut self,
        state: &mut automerge::sync::State,
        sent: &mut sync::SentIndex,
        message: automerge::sync::Message,
    ) -> Result<Merge, ModelError> {
        let admitted = self.receive_sync_message_admitting(state, sent, message, |_| {
            Ok::<(), std::convert::Infallible>(())
        })?;
        match admitted {
            Ok(merge) => Ok(merge),
            Err(never) => match never {},
        }
    }

    /// [`TodoList::receive_sync_message_indexed`] that first shows `admit` the message's
    /// changes this replica does not hold yet (neither applied nor waiting), before
    /// Automerge sees any of them. When `admit` refuses, nothing of the message is
    /// applied, the sync state is untouched, and its error comes back (`Ok(Err(..))`):
    /// the hub refuses a change whose actor belongs to another agent this way, as once
    /// Automerge holds a change nothing can take it out (and the actor's own next change
    /// with the same sequence number would be refused instead).
    pub fn receive_sync_message_admitting<E>(
        &mut self,
        state: &mut automerge::sync::State,
        sent: &mut sync::SentIndex,
        message: automerge::sync::Message,
        admit: impl FnOnce(&[Change]) -> Result<(), E>,
    ) -> Result<Result<Merge, E>, ModelError> {
        let changes = Self::message_changes(&message)?;
        let fresh: Vec<Change> = changes
            .iter()
            .filter(|c| !self.holds(&c.hash()))
            .cloned()
            .collect();
        if let Err(e) = admit(&fresh) {
            return Ok(Err(e));
        }
        let before = self.heads();
        let merge = self.apply_changes(changes)?;
        match sync::receive_state(&self.doc, &self.window, state, sent, message, &before) {
            Ok(()) => {
                self.sync_counters.count(true);
                Ok(Ok(merge))
            }
            Err(message) => {
                self.sync_counters.count(false);
                tracing::debug!(
                    heads = message.heads.len(),
                    sent = state.sent_hashes.len(),
                    "receive: stock sync step"
                );
                sent.forget();
                self.receive_state_stock(state, message, &before)?;
                Ok(Ok(merge))
            }
        }
    }

    /// Whether this replica holds change `hash`: applied, or waiting for dependencies.
    pub fn holds(&self, hash: &ChangeHash) -> bool {
        self.doc.get_change_meta_by_hash(hash).is_some()
            || self.pending.iter().any(|c| c.hash() == *hash)
    }

    /// [`TodoList::receive_sync_message`] by automerge's stock function only (whose
    /// cost follows the history): the reference of the differential test and the
    /// benches.
    pub fn receive_sync_message_stock(
        &mut self,
        state: &mut automerge::sync::State,
        message: automerge::sync::Message,
    ) -> Result<Merge, ModelError> {
        let (merge, before, message) = self.receive_changes(message)?;
        self.receive_state_stock(state, message, &before)?;
        Ok(merge)
    }

    /// Applies a sync message's changes; returns what they touched and the heads before.
    fn receive_changes(
        &mut self,
        message: automerge::sync::Message,
    ) -> Result<(Merge, Vec<ChangeHash>, automerge::sync::Message), ModelError> {
        let changes = Self::message_changes(&message)?;
        let before = self.heads();
        let merge = self.apply_changes(changes)?;
        Ok((merge, before, message))
    }

    /// The changes a sync message carries, decoded from its chunks.
    fn message_changes(message: &automerge::sync::Message) -> Result<Vec<Change>, ModelError> {
        let mut changes = Vec::new();
        for (index, chunk) in message.changes.iter().enumerate() {
            changes.extend(
                chunk_changes(chunk).map_err(|reason| ModelError::BadChunk { index, reason })?,
            );
        }
        Ok(changes)
    }

    /// The state part of the stock `receive_sync_message`, its changes already applied
    /// (heads `before` them): the message goes to automerge without its changes, and
    /// what automerge would have done differently with them is done here.
    fn receive_state_stock(
        &mut self,
        state: &mut automerge::sync::State,
        mut message: automerge::sync::Message,
        before: &[ChangeHash],
    ) -> Result<(), AutomergeError> {
        let had_changes = !message.changes.is_empty();
        let after = self.doc.get_heads();
        let last_sent = state.last_sent_heads.clone();
        if had_changes && !state.read_only {
            state.shared_heads = sync::advance_heads(before, &after, &state.shared_heads);
        }
        // Without its changes and with heads equal to ours, automerge takes the message
        // as "the peer already knows our heads" and records them as sent, which it
        // does not do for a message that carried changes.
        let took_as_known = had_changes && message.heads == after && !message.heads.is_empty();
        message.changes = automerge::sync::ChunkList::from(Vec::<Vec<u8>>::new());
        automerge::sync::SyncDoc::receive_sync_message(&mut self.doc, state, message)?;
        if took_as_known {
            state.last_sent_heads = last_sent;
        }
        Ok(())
    }

    /// The next sync message for a peer, if there is anything to say: from the
    /// recent-changes window when it can answer (see [`sync`]), else by automerge's
    /// stock function.
    pub fn generate_sync_message(
        &self,
        state: &mut automerge::sync::State,
    ) -> Option<automerge::sync::Message> {
        self.generate_with(state, &mut sync::SentIndex::default(), None)
    }

    /// [`TodoList::generate_sync_message`] with the peer's changes in flight indexed
    /// (see [`TodoList::receive_sync_message_indexed`]).
    pub fn generate_sync_message_indexed(
        &self,
        state: &mut automerge::sync::State,
        sent: &mut sync::SentIndex,
    ) -> Option<automerge::sync::Message> {
        self.generate_with(state, sent, None)
    }

    /// Replaces what a peer's last message said it has (`their_have`: a Bloom filter of
    /// its changes since some heads, 12 KiB for a peer that joined with a 10,000-change
    /// history) by the same fact in a few bytes, when this replica has every change of
    /// the peer's heads: the peer has exactly the ancestors of its heads, so "last sync:
    /// its heads, nothing since" says what the filter says, minus the filter's false
    /// positives (changes it would have withheld by mistake). A hub keeps one such state
    /// per idle peer; the filter was most of it. Returns true when it replaced one.
    pub fn settle_their_have(&self, state: &mut automerge::sync::State) -> bool {
        let (Some(heads), Some(have)) = (&state.their_heads, &state.their_have) else {
            return false;
        };
        let settled =
            have.len() == 1 && have[0].last_sync == *heads && have[0].bloom.to_bytes().is_empty();
        if settled || heads.iter().any(|h| !self.window.has_change(&self.doc, h)) {
            return false;
        }
        state.their_have = Some(vec![automerge::sync::Have {
            last_sync: heads.clone(),
            bloom: automerge::sync::BloomFilter::default(),
        }]);
        true
    }

    /// Keeps in the recent-changes window what the peers in `states` may still need
    /// (see `sync::SYNC_WINDOW_CHANGES_MAX`): a hub calls it for a list's peers after
    /// answering them, so that peers whose acknowledgements lag stay on the window's
    /// path instead of making every message walk the history.
    pub fn keep_window_for<'a>(
        &mut self,
        states: impl Iterator<Item = &'a automerge::sync::State>,
    ) {
        self.window.keep_for(states);
    }

    /// Changes in the recent-changes window.
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    /// A window position before which every change is an ancestor of `heads` (`None`:
    /// the window cannot tell): a peer whose heads these are has every change this
    /// replica had when its window ended there ([`TodoList::window_end`]).
    pub fn window_covered_by(&self, heads: &[automerge::ChangeHash]) -> Option<u64> {
        self.window.low_of_deps(heads)
    }

    /// Where the next change applied will stand in the recent-changes window: taken
    /// when a peer's message has been received, it tells the changes applied since.
    pub fn window_end(&self) -> u64 {
        self.window.end()
    }

    /// [`TodoList::generate_sync_message`] for a peer whose last message was received
    /// at window position `heard_at` ([`TodoList::window_end`] then): the changes
    /// applied since are sent even when the peer's Bloom filter claims them. That
    /// filter was made before they existed here, so a hit is a false positive (about
    /// one check in a hundred), and stock sync would withhold the change until the peer
    /// asks for it by hash — a round trip more for that peer. Sending a change the peer
    /// already has (from another connection) costs only its bytes. The hub answers
    /// this way; replicas keep stock behaviour.
    pub fn generate_sync_message_after(
        &self,
        state: &mut automerge::sync::State,
        sent: &mut sync::SentIndex,
        heard_at: u64,
    ) -> Option<automerge::sync::Message> {
        self.generate_with(state, sent, Some(heard_at))
    }

    fn generate_with(
        &self,
        state: &mut automerge::sync::State,
        sent: &mut sync::SentIndex,
        fresh_from: Option<u64>,
    ) -> Option<automerge::sync::Message> {
        let budget = sync::SYNC_CHANGES_BYTES_MAX;
        let mut cut = None;
        let window = sync::generate(
            &self.doc,
            &self.window,
            &self.pending,
            state,
            sent,
            fresh_from,
            budget,
            &mut cut,
        );
        let m = match window {
            Some(m) => {
                self.sync_counters.count(true);
                m
            }
            None => {
                self.sync_counters.count(false);
                tracing::debug!(
                    their_heads = ?state.their_heads.as_ref().map(Vec::len),
                    last_sync = ?state.their_have.as_ref().and_then(|h| h.first()).map(|h| h.last_sync.len()),
                    shared = state.shared_heads.len(),
                    "generate: stock sync step"
                );
                sent.forget();
                let mut m = self.generate_sync_message_stock(state);
                if let Some(m) = &mut m {
                    cut = self.cut_message(m, state, budget);
                }
                m
            }
        }?;
        if let Some((sent, left)) = cut {
            self.sync_counters.count_cut();
            tracing::debug!(
                sent,
                left,
                "generate: message cut to the changes bytes bound"
            );
        }
        Some(m)
    }

    /// Cuts a message whose changes add up to more than `budget` bytes to the first of
    /// them in causal order (every change after its dependencies) that fit, at least
    /// one; the others leave the peer's `sent_hashes`, so that the next message to it
    /// carries them. The peer applies what it got and answers, and the answer brings
    /// the next part: a peer back after many changes catches up over several round
    /// trips instead of one message larger than either side reads (a hub refuses
    /// frames over `FRAME_BYTES_MAX`; tungstenite refuses to queue more than its write
    /// buffer). The message keeps our heads: the peer asks for the ones it lacks.
    /// Returns how many changes went and how many were left out, if it cut.
    fn cut_message(
        &self,
        m: &mut automerge::sync::Message,
        state: &mut automerge::sync::State,
        budget: usize,
    ) -> Option<(usize, usize)> {
        let bytes: usize = m.changes.iter().map(<[u8]>::len).sum();
        if bytes <= budget {
            return None;
        }
        let mut changes = Vec::new();
        'chunks: for chunk in m.changes.iter() {
            let mut rest = chunk;
            while !rest.is_empty() {
                let Ok(len) = storage_chunk_len(rest) else {
                    return None;
                };
                let (one, tail) = rest.split_at(len);
                rest = tail;
                if one.get(8) == Some(&CHUNK_TYPE_DOCUMENT) {
                    // The whole document (stock sync sends it for a peer that lacks
                    // more than a third of it): the changes the peer lacks instead,
                    // those that are not ancestors of the heads it has of ours.
                    let theirs: Vec<ChangeHash> = state
                        .their_heads
                        .iter()
                        .flatten()
                        .filter(|h| self.doc.get_change_meta_by_hash(h).is_some())
                        .copied()
                        .collect();
                    changes = self.doc.get_changes(&theirs);
                    break 'chunks;
                }
                let Ok(c) = Change::from_bytes(one.to_vec()) else {
                    return None;
                };
                changes.push(c);
            }
        }
        let ordered = dependencies_first(changes);
        let mut taken = 0usize;
        let mut used = 0usize;
        for c in &ordered {
            let len = c.raw_bytes().len();
            if taken > 0 && used + len > budget {
                break;
            }
            taken += 1;
            used += len;
        }
        let left = &ordered[taken..];
        for c in left {
            state.sent_hashes.remove(&c.hash());
        }
        let v2 = m.version == automerge::sync::MessageVersion::V2;
        let (chunks, _) = sync::change_chunks(ordered[..taken].iter().map(Change::raw_bytes), v2);
        m.changes = automerge::sync::ChunkList::from(chunks);
        (!left.is_empty()).then_some((taken, left.len()))
    }

    /// [`TodoList::generate_sync_message`] by automerge's stock function only (the
    /// `need` it asks for walks the changes waiting here, as automerge walks its queue).
    pub fn generate_sync_message_stock(
        &self,
        state: &mut automerge::sync::State,
    ) -> Option<automerge::sync::Message> {
        // Automerge's own queue is always empty here (see `apply_changes`).
        let waiting = (!self.pending.is_empty())
            .then(|| sync::need_and_have(&self.doc, &self.window, &self.pending, state));
        let mut m = automerge::sync::SyncDoc::generate_sync_message(&self.doc, state)?;
        if let Some((need, have)) = waiting {
            m.need = need;
            if !have {
                m.have.clear();
            }
        }
        Some(m)
    }

    /// How many sync steps were answered from the window and by the stock functions.
    pub fn sync_counters(&self) -> sync::SyncCounters {
        self.sync_counters.get()
    }

    /// Pulls every change `other` has and this replica lacks.
    pub fn merge_from(&mut self, other: &TodoList) -> Result<Merge, ModelError> {
        let changes = self.doc.get_changes_added(&other.doc);
        self.apply_changes(changes)
    }

    /// The changes since `heads` (for sending to a peer).
    pub fn changes_since(&self, heads: &[ChangeHash]) -> Vec<Change> {
        self.doc.get_changes(heads)
    }

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

    /// The tasks at `version` (the base of a stale replace), read at its heads.
    fn base_tasks(&self, version: &Version) -> Result<BTreeMap<String, RawTask>, ApiError> {
        let heads = self.known_heads(version)?;
        Ok(doc::read_tasks(doc::View::at(&self.doc, &heads)))
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
        let objs: Vec<Option<automerge::ObjId>> = sets
            .iter()
            .map(|(id, _, _)| self.index.tasks.get(id).map(|e| e.obj.clone()))
            .collect();
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

use crate::format::{CHUNK_MAGIC, CHUNK_TYPE_DOCUMENT};

/// The changes in one entry of a sync message's change list. Depending on the sender's
/// version that is one change, several changes one after the other, a bundle, or a
/// whole saved document (V2 messages); each storage chunk is decoded by its type.
/// The message was validated before (sizes and inflation bounded).
pub fn chunk_changes(bytes: &[u8]) -> Result<Vec<Change>, String> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let len = storage_chunk_len(rest)?;
        let (chunk, tail) = rest.split_at(len);
        rest = tail;
        if chunk.get(8) == Some(&CHUNK_TYPE_DOCUMENT) {
            let doc = Automerge::load(chunk).map_err(|e| format!("document chunk: {e}"))?;
            out.extend(doc.get_changes(&[]));
            continue;
        }
        match Change::from_bytes(chunk.to_vec()) {
            // `from_bytes` does not verify the chunk's checksum (the first four bytes
            // of the change's hash): a flipped byte would land as a different change.
            Ok(c) if c.hash().as_ref()[..4] != chunk[4..8] => {
                return Err(format!(
                    "change {} does not match its checksum: corrupt",
                    c.hash()
                ));
            }
            Ok(c) => out.push(c),
            Err(change_err) => {
                let bundle = automerge::Bundle::try_from(chunk)
                    .map_err(|e| format!("{change_err}; as a bundle: {e}"))?;
                out.extend(bundle.to_changes().map_err(|e| e.to_string())?);
            }
        }
    }
    Ok(out)
}

/// Length of the storage chunk at the start of `bytes`: magic (4), checksum (4), type
/// (1), LEB128 length, then that many bytes. A sync message's change chunk is one or
/// more of these, one after the other.
pub fn storage_chunk_len(bytes: &[u8]) -> Result<usize, String> {
    if bytes.len() < 9 || bytes[..4] != CHUNK_MAGIC {
        return Err("not an Automerge storage chunk".to_owned());
    }
    let mut len: u64 = 0;
    let mut shift = 0u32;
    let mut i = 9;
    loop {
        let b = *bytes.get(i).ok_or("truncated chunk length")?;
        i += 1;
        len |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return Err("chunk length overflows".to_owned());
        }
    }
    let total = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(i))
        .ok_or("chunk length overflows")?;
    if total > bytes.len() {
        return Err(format!(
            "chunk claims {total} bytes, {} present",
            bytes.len()
        ));
    }
    Ok(total)
}

/// `changes` in an order where every change follows those of its dependencies that are
/// among them (the others are the peer's already: a sync message's changes).
fn dependencies_first(changes: Vec<Change>) -> Vec<Change> {
    let (ready, waiting) = split_in_causal_order(changes, |_| false);
    debug_assert!(waiting.is_empty());
    ready
}

/// Splits `changes` (none of them in `doc`) into those that can be applied now, in an
/// order where every change follows its dependencies (Kahn's algorithm), and those that
/// wait for a dependency nobody has sent yet.
fn causal_order(doc: &Automerge, changes: Vec<Change>) -> (Vec<Change>, Vec<Change>) {
    split_in_causal_order(changes, |d| doc.get_change_meta_by_hash(d).is_none())
}

/// Kahn's algorithm over `changes`: those whose dependencies among them come first, in
/// order (ties in the order given), then those that depend, directly or not, on a
/// change `missing` says is nowhere (asked only for dependencies not among them).
fn split_in_causal_order(
    changes: Vec<Change>,
    missing: impl Fn(&ChangeHash) -> bool,
) -> (Vec<Change>, Vec<Change>) {
    let index: std::collections::HashMap<ChangeHash, usize> = changes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.hash(), i))
        .collect();
    let mut waiting_on = vec![0usize; changes.len()];
    let mut blocked = vec![false; changes.len()];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); changes.len()];
    for (i, c) in changes.iter().enumerate() {
        for d in c.deps() {
            if let Some(&j) = index.get(d) {
                waiting_on[i] += 1;
                children[j].push(i);
            } else if missing(d) {
                blocked[i] = true;
            }
        }
    }
    let mut queue: std::collections::VecDeque<usize> = (0..changes.len())
        .filter(|&i| waiting_on[i] == 0 && !blocked[i])
        .collect();
    let mut order = Vec::with_capacity(changes.len());
    while let Some(i) = queue.pop_front() {
        order.push(i);
        for &k in &children[i] {
            waiting_on[k] -= 1;
            if waiting_on[k] == 0 && !blocked[k] {
                queue.push_back(k);
            }
        }
    }
    let mut slots: Vec<Option<Change>> = changes.into_iter().map(Some).collect();
    let ready: Vec<Change> = order.iter().filter_map(|&i| slots[i].take()).collect();
    let waiting: Vec<Change> = slots.into_iter().flatten().collect();
    (ready, waiting)
}

fn unknown_version(version: &Version, cause: impl std::fmt::Display) -> ApiError {
    ApiError {
        code: ErrorCode::UnknownVersion,
        field: Some("version".into()),
        allowed: Vec::new(),
        message: format!(
            "version {version} is not known here ({cause}): sync first, or use a version from todo_read"
        ),
        current: None,
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
