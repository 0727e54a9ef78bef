//! Durable storage of lists, their changes, events and reported keys in one SQLite file
//! (docs/DESIGN.md §4, §6, §8).
//!
//! - [`Db`]: the synchronous core, one connection, plain methods. Tests and simulations
//!   use it directly, without a runtime.
//! - [`Store`]: the handle async code uses. The [`Db`] lives on a dedicated thread;
//!   requests travel over a bounded queue of [`STORE_QUEUE_MAX`] and answers come back
//!   on oneshot channels, so no `async fn` ever blocks the runtime on SQLite.
//!
//! What is stored per list (a list is a name plus an automerge-repo document id):
//!
//! - the document, as at most one snapshot (`Automerge::save()`) plus the incremental
//!   changes made since; [`Db::compact`] folds changes into a new snapshot atomically, so
//!   a load is always *snapshot + remaining changes*;
//! - the events, with a per-list `seq` of 1, 2, 3, … without gaps, assigned inside the
//!   transaction that stores them, so a subscriber resumes with [`Db::events_since`] and
//!   sees no gap and no duplicate;
//! - the authority's reported keys (the idempotency set that makes every violation be
//!   reported once, also across restarts).
//!
//! [`Db::commit_merge`] stores a merge's changes, the repair change, the events and the
//! keys in one transaction: after a crash either all of them are there or none is.
//!
//! Architecture invariant: a call that writes returns only after SQLite has made the
//! transaction durable (`journal_mode=WAL`, `synchronous=FULL`), so whatever the hub has
//! acknowledged survives a crash of the process, the OS or the power.
//!
//! ```
//! use automerge::{transaction::Transactable, Automerge, ROOT};
//! use swarmtodo_store::{Batch, ChangeRecord, Db, DocId, NewEvent};
//!
//! # let dir = std::env::temp_dir().join(format!("swarmtodo-store-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! let mut db = Db::open(dir.join("hub.sqlite3")).unwrap();
//! let (doc_id, created) = db.create_or_get_list("swarm-42", DocId([7; 16])).unwrap();
//! assert!(created);
//!
//! let mut doc = Automerge::new();
//! let mut tx = doc.transaction();
//! tx.put(ROOT, "hello", "world").unwrap();
//! tx.commit();
//! let change = doc.get_last_local_change().unwrap();
//!
//! let batch = Batch {
//!     changes: vec![ChangeRecord::from_change(&change)],
//!     events: vec![NewEvent::new("tasks_changed", &serde_json::json!({"tasks": []})).unwrap()],
//!     reported: vec!["schema:t1".to_owned()],
//!     summary: None,
//! };
//! let commit = db.commit_merge(doc_id, &batch).unwrap();
//! assert_eq!(commit.seqs, vec![1]);
//!
//! let loaded = db.load(doc_id).unwrap().unwrap();
//! assert_eq!(loaded.rebuild().unwrap().get_heads(), doc.get_heads());
//! assert_eq!(db.events_since(doc_id, 0, 10).unwrap()[0].seq, 1);
//! # drop(db);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

mod db;
mod handle;
mod record;
mod schema;

use std::fmt;

pub mod drive;
pub mod limits;
pub mod persist;

pub use self::db::{Db, MadeToken};
pub use self::handle::Store;
pub use self::limits::{
    BATCH_BYTES_MAX, BATCH_ITEMS_MAX, CHANGE_BYTES_MAX, EVENTS_PAGE_MAX, EVENT_BYTES_MAX,
    EVENT_KIND_BYTES_MAX, LISTS_PAGE_MAX, LIST_NAME_BYTES_MAX, REPORTED_KEY_BYTES_MAX,
    SNAPSHOT_BYTES_MAX, SNAPSHOT_HEADS_MAX, STORE_BUSY_TIMEOUT_MS, STORE_QUEUE_MAX,
};
pub use self::record::{
    Batch, ChangeRecord, Commit, ListInfo, Loaded, NewEvent, StoredEvent, Summary,
};
pub use self::schema::{APPLICATION_ID, SCHEMA_VERSION};

/// The automerge-repo document id of a list: 16 bytes. Shown as automerge-repo shows it
/// (base58check), so logs match the clients' `automerge:` URLs.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DocId(pub [u8; 16]);

impl DocId {
    /// The 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for DocId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&bs58::encode(self.0).with_check().into_string())
    }
}

impl fmt::Debug for DocId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DocId({self})")
    }
}

/// What the store refused or failed to do. [`StoreError::code`] is stable.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed (I/O error, full disk, a lock held too long, a corrupt file).
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The file was written by a newer swarmtodo.
    #[error(
        "the store has schema version {found}, newer than {supported} that this build \
         knows: upgrade swarmtodo or point it at another file"
    )]
    SchemaTooNew {
        /// `user_version` of the file.
        found: i64,
        /// The newest version this build writes.
        supported: i64,
    },
    /// The file is a SQLite database of something else.
    #[error("{path} is not a swarmtodo store: {reason}")]
    NotAStore {
        /// The file.
        path: String,
        /// What gave it away.
        reason: String,
    },
    /// No list has this document id.
    #[error("no list has document id {0}")]
    UnknownList(DocId),
    /// The proposed document id of a new list belongs to another list.
    #[error("document id {doc} already belongs to list {owner:?}")]
    DocIdTaken {
        /// The proposed id.
        doc: DocId,
        /// The list that has it.
        owner: String,
    },
    /// A list name is empty, too long or holds control characters.
    #[error("invalid list name: {0}")]
    InvalidName(String),
    /// A value is larger than its limit.
    #[error("{what} is {bytes} bytes, more than the {max} allowed")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A batch holds more items than its limit.
    #[error("{what}: {count} items, more than the {max} allowed")]
    TooMany {
        /// What there were too many of.
        what: &'static str,
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An event kind is empty.
    #[error("an event kind must not be empty")]
    EmptyEventKind,
    /// An event did not serialize to JSON.
    #[error("event does not serialize to JSON: {0}")]
    EventJson(#[from] serde_json::Error),
    /// Bytes are not an Automerge change.
    #[error("not an automerge change: {0}")]
    BadChange(String),
    /// A compaction's snapshot does not cover the snapshot it would replace.
    #[error(
        "the new snapshot of {doc} does not cover the stored one (head {missing} is not an \
         ancestor of the heads given): it is older, or changes were not appended"
    )]
    SnapshotBehind {
        /// The list.
        doc: DocId,
        /// A head of the stored snapshot the new heads do not reach (hex).
        missing: String,
    },
    /// The stored document does not load.
    #[error("the stored document of {doc} does not load: {reason}")]
    Corrupt {
        /// The list.
        doc: DocId,
        /// What failed.
        reason: String,
    },
    /// A commit of a list follows one of the same batch the store refused: it builds
    /// on it (its changes may depend on the refused ones), so it is refused too.
    #[error(
        "a commit of {doc} follows one of its batch that was refused ({why}): refused too; \
         its writers send both again"
    )]
    AfterRefused {
        /// The list.
        doc: DocId,
        /// Why the earlier one was refused.
        why: String,
    },
    /// The store thread is gone (closed, or it failed).
    #[error("the store is closed")]
    Closed,
    /// The store thread could not be started.
    #[error("cannot start the store thread: {0}")]
    Thread(std::io::Error),
}

impl StoreError {
    /// A stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Sqlite(_) => "store_sqlite",
            StoreError::SchemaTooNew { .. } => "store_schema_too_new",
            StoreError::NotAStore { .. } => "store_not_a_store",
            StoreError::UnknownList(_) => "store_unknown_list",
            StoreError::DocIdTaken { .. } => "store_doc_id_taken",
            StoreError::InvalidName(_) => "store_invalid_name",
            StoreError::TooLarge { .. } => "store_too_large",
            StoreError::TooMany { .. } => "store_too_many",
            StoreError::EmptyEventKind => "store_empty_event_kind",
            StoreError::EventJson(_) => "store_event_json",
            StoreError::BadChange(_) => "store_bad_change",
            StoreError::SnapshotBehind { .. } => "store_snapshot_behind",
            StoreError::Corrupt { .. } => "store_corrupt",
            StoreError::AfterRefused { .. } => "store_after_refused",
            StoreError::Closed => "store_closed",
            StoreError::Thread(_) => "store_thread",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_id_renders_as_automerge_repo_does() {
        let id = DocId([0; 16]);
        let text = id.to_string();
        let back = bs58::decode(&text).with_check(None).into_vec();
        assert_eq!(back.ok().as_deref(), Some(&id.0[..]));
        assert_eq!(format!("{id:?}"), format!("DocId({text})"));
    }

    #[test]
    fn codes_are_distinct() {
        let errors = [
            StoreError::SchemaTooNew {
                found: 2,
                supported: 1,
            },
            StoreError::UnknownList(DocId([1; 16])),
            StoreError::EmptyEventKind,
            StoreError::Closed,
            StoreError::BadChange(String::new()),
            StoreError::AfterRefused {
                doc: DocId([1; 16]),
                why: String::new(),
            },
        ];
        let codes: std::collections::BTreeSet<_> = errors.iter().map(|e| e.code()).collect();
        assert_eq!(codes.len(), errors.len());
    }
}
