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

mod apply;
pub(crate) mod deps;
mod doc;
mod history;
mod index;
mod normalize;
mod places;
mod position;
mod read;
mod repair;
pub mod sync;
mod write;

use automerge::{
    transaction::CommitOptions, transaction::Transactable, ActorId, Automerge, AutomergeError,
    Change, ChangeHash, ObjType, ROOT,
};

pub use self::apply::{chunk_changes, storage_chunk_len};
pub use self::doc::{field, RawTask, SmolStr};
pub use self::history::task_history;
pub use self::index::{ChangeInfo, Merge, TaskDelta};
pub use self::normalize::{
    clip, clip_written, normalize, normalize_priority, normalize_status, status_alias,
};
pub use self::write::WriteContext;
pub use crate::limits::PENDING_CHANGES_MAX;
pub use crate::proto::parse_write_request;
pub use crate::proto::{
    ApiError, ErrorCode, PatchOp, Priority, Snapshot, Status, Task, TaskPatch, Version, WriteMode,
    WriteRequest, WriteResult,
};

pub(crate) use self::apply::dependencies_first;
pub(crate) use self::doc::{value_json, OpKey, ROOT_ACTOR, TASK_ENTRY};
pub(crate) use self::index::Index;
pub(crate) use self::repair::{FieldValue, RootValue, Writes};

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
    /// A rebuilt document offered in place of the list's was not a save of it.
    #[error("rebuilt document refused: it {0}")]
    Rebuilt(String),
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

/// A list's document loaded from a save of it, with its index: built off the hub's
/// task, then taken in place of the list's own ([`TodoList::adopt_rebuilt`]).
#[derive(Debug)]
pub struct Rebuilt {
    doc: Automerge,
    index: Index,
}

impl Rebuilt {
    /// Loads a save of a list and indexes it (the cost of a load: a runtime does it off
    /// the hub's task).
    pub fn load(bytes: &[u8]) -> Result<Rebuilt, ModelError> {
        Ok(Automerge::load(bytes)?.into())
    }
}

impl From<Automerge> for Rebuilt {
    /// Indexes a document loaded from a save of a list.
    fn from(doc: Automerge) -> Rebuilt {
        let index = Index::build(&doc);
        Rebuilt { doc, index }
    }
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

    /// The tasks whose `blocked_by` names `id`.
    pub fn dependents_of(&self, id: &str) -> impl Iterator<Item = &str> + '_ {
        self.index
            .dependents
            .get(id)
            .into_iter()
            .flatten()
            .map(SmolStr::as_str)
    }

    /// Makes further changes as `actor` (the hub writes a caller's `todo_write` under
    /// the caller's own actor, then goes back to its own).
    pub fn set_actor(&mut self, actor: ActorId) {
        self.doc.set_actor(actor);
    }

    /// The Automerge document.
    pub fn doc(&self) -> &Automerge {
        &self.doc
    }

    /// The whole document, compressed.
    pub fn save(&self) -> Vec<u8> {
        self.doc.save()
    }

    /// The whole document, compressed — and the document in memory rebuilt from it at
    /// once, on this thread (the hub rebuilds off its task: [`TodoList::adopt_rebuilt`]).
    pub fn save_and_compact(&mut self) -> Vec<u8> {
        let bytes = self.doc.save();
        let adopted = Rebuilt::load(&bytes).and_then(|r| self.adopt_rebuilt(r, 0));
        // A document always loads from its own save; if it ever did not, the one in
        // memory stays, uncompacted.
        if let Err(e) = adopted {
            tracing::warn!(error = %e, "a saved list did not reload; kept as it was");
        }
        bytes
    }

    /// Takes `rebuilt` — this list's document loaded from a save of it, and its index,
    /// made elsewhere (a runtime loads the hub's snapshot off the hub's task) — in place
    /// of the ones in memory. Automerge's op columns grow as changes land one batch at a
    /// time and keep their spare room; a document loaded from its own save holds the
    /// same content in about two thirds of the memory (a 1,000-task list with 10,000
    /// changes: 3.3 → 2.2 MiB; `examples/list_memory.rs`). The index is new too: built in
    /// one piece, in few allocations made at one time, where the one kept up change by
    /// change is scattered over the heap that the list's first sync left full of holes
    /// (`Index::build`). The changes this list took since the save are applied to
    /// `rebuilt` first (the walk goes back only to the save's heads), so the content,
    /// the heads and the sync window stay what they are. Returns how many changes it
    /// took. Refused, with the list in memory kept, when `rebuilt` holds a change this
    /// list does not (it is not a save of this list), lacks more than `catch_up_max` of
    /// the list's changes, or does not end at this list's heads.
    pub fn adopt_rebuilt(
        &mut self,
        rebuilt: impl Into<Rebuilt>,
        catch_up_max: usize,
    ) -> Result<usize, ModelError> {
        let Rebuilt {
            doc: mut rebuilt,
            mut index,
        } = rebuilt.into();
        let theirs = rebuilt.get_heads();
        if let Some(h) = theirs
            .iter()
            .find(|h| !self.window.has_change(&self.doc, h))
        {
            return Err(ModelError::Rebuilt(format!(
                "holds change {h} that the list does not"
            )));
        }
        let mine = self.heads();
        let mut caught_up = 0;
        if theirs != mine {
            // From the window when it can tell (a save a moment old); else automerge's
            // walk back from the heads.
            let too_many = || {
                ModelError::Rebuilt(format!(
                    "lacks more than {catch_up_max} changes of the list"
                ))
            };
            let since = match self.window.change_bytes_since(&theirs) {
                Some(bytes) if bytes.len() > catch_up_max => return Err(too_many()),
                Some(bytes) => bytes
                    .into_iter()
                    .map(|b| Change::from_bytes(b.to_vec()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| ModelError::Rebuilt(e.to_string()))?,
                None => rebuilt.get_changes_added(&self.doc),
            };
            if since.len() > catch_up_max {
                return Err(too_many());
            }
            caught_up = since.len();
            rebuilt.apply_changes(since.iter().cloned())?;
            if rebuilt.get_heads() != mine {
                return Err(ModelError::Rebuilt(
                    "does not end at the list's heads with the changes since".to_owned(),
                ));
            }
            index.absorb(&rebuilt, &since);
        }
        self.doc = rebuilt.with_actor(self.doc.get_actor().clone());
        self.index = index;
        Ok(caught_up)
    }

    /// Drops the sync window's changes (≈0.5 KiB each, up to
    /// [`SYNC_WINDOW_CHANGES`](crate::limits::SYNC_WINDOW_CHANGES)), as if each had aged
    /// out: a hub does it to a list nobody wrote to for a while. Peers in step are served
    /// as before; one still behind is synced by the stock path. Returns how many it
    /// dropped.
    pub fn forget_window(&mut self) -> usize {
        self.window.forget()
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

    /// Agents that own a task whose stored status is `in_progress`.
    pub fn active_owners(&self) -> impl Iterator<Item = &str> + '_ {
        self.index.active.keys().flatten().map(SmolStr::as_str)
    }

    /// The tasks `owner` holds with stored status `in_progress`, by id.
    pub fn in_progress_of(&self, owner: &str) -> impl Iterator<Item = &str> + '_ {
        self.index
            .active
            .get(&Some(SmolStr::from(owner)))
            .into_iter()
            .flatten()
            .map(SmolStr::as_str)
    }

    /// Its tasks by status, as read (kept by the index: no pass over the tasks).
    pub fn counts(&self) -> crate::proto::TaskCounts {
        let [pending, in_progress, completed, cancelled, blocked] = self.index.counts;
        crate::proto::TaskCounts {
            pending,
            in_progress,
            completed,
            cancelled,
            blocked,
        }
    }

    /// The task as stored (possibly invalid, as a foreign peer wrote it).
    pub fn raw_task(&self, id: &str) -> Option<RawTask> {
        self.index.full(id)
    }

    /// Every task as stored, by id.
    pub fn raw_tasks(&self) -> std::collections::BTreeMap<String, RawTask> {
        self.index
            .tasks
            .iter()
            .map(|(id, e)| (id.to_string(), e.raw()))
            .collect()
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

    /// Whether this replica holds change `hash`: applied, or waiting for dependencies.
    pub fn holds(&self, hash: &ChangeHash) -> bool {
        self.doc.get_change_meta_by_hash(hash).is_some()
            || self.pending.iter().any(|c| c.hash() == *hash)
    }

    /// Changes waiting for missing dependencies.
    pub fn pending_changes(&self) -> usize {
        self.pending.len()
    }

    pub(crate) fn index(&self) -> &Index {
        &self.index
    }
}
