//! The values that go in and out of the store.

use automerge::{Automerge, Change, ChangeHash};
use serde::Serialize;
pub use swarmtodo_core::hub::Summary;

use super::{
    DocId, StoreError, BATCH_BYTES_MAX, BATCH_ITEMS_MAX, CHANGE_BYTES_MAX, EVENT_BYTES_MAX,
    EVENT_KIND_BYTES_MAX, REPORTED_KEY_BYTES_MAX,
};

/// One Automerge change as stored: its hash, the hashes it depends on (what compaction
/// walks to find the changes a snapshot covers) and its bytes.
///
/// Built only from an Automerge [`Change`], so the hash and dependencies always agree
/// with the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeRecord {
    hash: ChangeHash,
    deps: Vec<ChangeHash>,
    bytes: Vec<u8>,
}

impl ChangeRecord {
    /// The record of a change (its bytes compressed as Automerge compresses them).
    pub fn from_change(change: &Change) -> ChangeRecord {
        let mut c = change.clone();
        ChangeRecord {
            hash: change.hash(),
            deps: change.deps().to_vec(),
            bytes: c.bytes().into_owned(),
        }
    }

    /// The record of a change given as bytes (as a sync message carries it).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<ChangeRecord, StoreError> {
        if bytes.len() > CHANGE_BYTES_MAX {
            return Err(StoreError::TooLarge {
                what: "a change",
                bytes: bytes.len(),
                max: CHANGE_BYTES_MAX,
            });
        }
        let change =
            Change::from_bytes(bytes.clone()).map_err(|e| StoreError::BadChange(e.to_string()))?;
        Ok(ChangeRecord {
            hash: change.hash(),
            deps: change.deps().to_vec(),
            bytes,
        })
    }

    /// The change's hash.
    pub fn hash(&self) -> ChangeHash {
        self.hash
    }

    /// The hashes of the changes it depends on.
    pub fn deps(&self) -> &[ChangeHash] {
        &self.deps
    }

    /// The encoded change.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// An event to append: its kind (`tasks_changed`, `violation`, …, docs/DESIGN.md §6) and its
/// JSON. The store gives it its `seq`; the JSON is stored as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    kind: String,
    json: String,
}

impl NewEvent {
    /// Serializes `event` as an event of `kind`.
    pub fn new<T: Serialize + ?Sized>(
        kind: impl Into<String>,
        event: &T,
    ) -> Result<NewEvent, StoreError> {
        NewEvent::checked(kind.into(), serde_json::to_string(event)?)
    }

    /// An event whose JSON is already written (read back from another hub's log):
    /// checked as [`NewEvent::new`] checks, and the JSON must parse.
    pub fn from_json(
        kind: impl Into<String>,
        json: impl Into<String>,
    ) -> Result<NewEvent, StoreError> {
        let json = json.into();
        check_len("an event", json.len(), EVENT_BYTES_MAX)?;
        serde_json::from_str::<serde::de::IgnoredAny>(&json)?;
        NewEvent::checked(kind.into(), json)
    }

    fn checked(kind: String, json: String) -> Result<NewEvent, StoreError> {
        if kind.is_empty() {
            return Err(StoreError::EmptyEventKind);
        }
        check_len("an event kind", kind.len(), EVENT_KIND_BYTES_MAX)?;
        check_len("an event", json.len(), EVENT_BYTES_MAX)?;
        Ok(NewEvent { kind, json })
    }

    /// The kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The JSON text.
    pub fn json(&self) -> &str {
        &self.json
    }
}

/// What one transaction stores for a list: a merge's changes (the repair change
/// included), the events it produced and the keys those events reported. Empty parts
/// are allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Changes, in the order the document applied them. Changes already stored are
    /// skipped.
    pub changes: Vec<ChangeRecord>,
    /// Events, in order; they get consecutive `seq`s.
    pub events: Vec<NewEvent>,
    /// Reported keys ([`swarmtodo_core::authority::Authority::reported`]); keys already stored are
    /// skipped.
    pub reported: Vec<String>,
    /// The list as the batch leaves it (its name, once known, version and counts), for
    /// [`Db::lists`](crate::Db::lists); `None` keeps what is stored (the hub writes it
    /// at most once a second per list).
    pub summary: Option<Summary>,
}

impl Batch {
    /// True when there is nothing to store.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
            && self.events.is_empty()
            && self.reported.is_empty()
            && self.summary.is_none()
    }

    /// Checks every limit before anything is written, so a refused batch leaves no trace.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        check_count("changes in a batch", self.changes.len())?;
        check_count("events in a batch", self.events.len())?;
        check_count("reported keys in a batch", self.reported.len())?;
        let mut total: usize = 0;
        for c in &self.changes {
            check_len("a change", c.bytes.len(), CHANGE_BYTES_MAX)?;
            total = total.saturating_add(c.bytes.len());
        }
        for e in &self.events {
            // Fields are private and checked by `NewEvent::new`; checked again because a
            // batch is the boundary of the transaction.
            if e.kind.is_empty() {
                return Err(StoreError::EmptyEventKind);
            }
            check_len("an event kind", e.kind.len(), EVENT_KIND_BYTES_MAX)?;
            check_len("an event", e.json.len(), EVENT_BYTES_MAX)?;
            total = total.saturating_add(e.json.len());
        }
        for k in &self.reported {
            check_len("a reported key", k.len(), REPORTED_KEY_BYTES_MAX)?;
            total = total.saturating_add(k.len());
        }
        check_len("a batch", total, BATCH_BYTES_MAX)
    }
}

pub(crate) fn check_len(what: &'static str, bytes: usize, max: usize) -> Result<(), StoreError> {
    if bytes > max {
        return Err(StoreError::TooLarge { what, bytes, max });
    }
    Ok(())
}

fn check_count(what: &'static str, count: usize) -> Result<(), StoreError> {
    if count > BATCH_ITEMS_MAX {
        return Err(StoreError::TooMany {
            what,
            count,
            max: BATCH_ITEMS_MAX,
        });
    }
    Ok(())
}

/// What a committed batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// The `seq` of each event of the batch, in order.
    pub seqs: Vec<u64>,
    /// How many changes were new (the others were stored already).
    pub changes_added: usize,
    /// The list after the commit (for deciding when to compact).
    pub list: ListInfo,
}

/// A list and the size of what is stored for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListInfo {
    /// The unique name.
    pub name: String,
    /// The automerge-repo document id.
    pub doc: DocId,
    /// The `seq` of the last event (0 before the first).
    pub last_seq: u64,
    /// Incremental changes stored since the snapshot.
    pub changes: u64,
    /// Their bytes.
    pub change_bytes: u64,
    /// Bytes of the snapshot (0 when there is none).
    pub snapshot_bytes: u64,
}

/// One stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Position in the list's stream: 1, 2, 3, … without gaps.
    pub seq: u64,
    /// The kind.
    pub kind: String,
    /// The JSON text, as appended.
    pub json: String,
}

/// A list's document as stored: the snapshot, if any, and the changes since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// The list.
    pub doc: DocId,
    /// The last compaction's `Automerge::save()`.
    pub snapshot: Option<Vec<u8>>,
    /// The heads that snapshot covers.
    pub snapshot_heads: Vec<ChangeHash>,
    /// The changes stored since, in the order they were appended.
    pub changes: Vec<Vec<u8>>,
}

impl Loaded {
    /// Rebuilds the document: loads the snapshot and applies the changes. Fails when a
    /// change does not parse or cannot land because a change it depends on is missing
    /// (the store lost part of the history).
    ///
    /// The cost follows the document's size; async callers run it off the runtime.
    pub fn rebuild(&self) -> Result<Automerge, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt {
            doc: self.doc,
            reason,
        };
        let mut doc = match &self.snapshot {
            Some(bytes) => Automerge::load(bytes).map_err(|e| corrupt(format!("snapshot: {e}")))?,
            None => Automerge::new(),
        };
        let mut changes = Vec::with_capacity(self.changes.len());
        for (i, bytes) in self.changes.iter().enumerate() {
            let c = Change::from_bytes(bytes.clone())
                .map_err(|e| corrupt(format!("change {i}: {e}")))?;
            changes.push(c);
        }
        let hashes: Vec<ChangeHash> = changes.iter().map(Change::hash).collect();
        doc.apply_changes(changes)
            .map_err(|e| corrupt(format!("applying the changes: {e}")))?;
        // Automerge queues a change whose dependencies are missing instead of failing.
        if let Some(h) = hashes
            .iter()
            .find(|h| doc.get_change_meta_by_hash(h).is_none())
        {
            return Err(corrupt(format!(
                "change {h} waits for a dependency the store does not have"
            )));
        }
        Ok(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, json_bytes: usize) -> NewEvent {
        NewEvent {
            kind: kind.to_owned(),
            json: "x".repeat(json_bytes),
        }
    }

    /// `(batch, expected error code or None)`.
    fn check(batch: Batch, expected: Option<&str>) {
        let got = batch.check().err().map(|e| e.code());
        assert_eq!(got, expected, "{batch:?}");
    }

    #[test]
    fn batch_limits() {
        check(Batch::default(), None);
        check(
            Batch {
                events: vec![event("violation", EVENT_BYTES_MAX)],
                ..Batch::default()
            },
            None,
        );
        check(
            Batch {
                events: vec![event("violation", EVENT_BYTES_MAX + 1)],
                ..Batch::default()
            },
            Some("store_too_large"),
        );
        check(
            Batch {
                events: vec![event("", 2)],
                ..Batch::default()
            },
            Some("store_empty_event_kind"),
        );
        check(
            Batch {
                events: vec![event(&"k".repeat(EVENT_KIND_BYTES_MAX + 1), 2)],
                ..Batch::default()
            },
            Some("store_too_large"),
        );
        check(
            Batch {
                reported: vec!["k".repeat(REPORTED_KEY_BYTES_MAX + 1)],
                ..Batch::default()
            },
            Some("store_too_large"),
        );
        check(
            Batch {
                changes: vec![ChangeRecord {
                    hash: ChangeHash([0; 32]),
                    deps: Vec::new(),
                    bytes: vec![0; CHANGE_BYTES_MAX + 1],
                }],
                ..Batch::default()
            },
            Some("store_too_large"),
        );
    }

    #[test]
    fn new_event_refuses_what_a_batch_refuses() {
        assert_eq!(
            NewEvent::new("", &1).err().map(|e| e.code()),
            Some("store_empty_event_kind")
        );
        let big = "x".repeat(EVENT_BYTES_MAX);
        assert_eq!(
            NewEvent::new("tasks_changed", &big).err().map(|e| e.code()),
            Some("store_too_large")
        );
        let e = NewEvent::new("snapshot", &serde_json::json!({"a": 1})).ok();
        assert_eq!(e.as_ref().map(NewEvent::json), Some(r#"{"a":1}"#));
    }

    #[test]
    fn change_record_from_bytes_agrees_with_from_change() {
        use automerge::transaction::Transactable;
        let mut doc = Automerge::new();
        let mut tx = doc.transaction();
        let put = tx.put(automerge::ROOT, "k", "v".repeat(1000));
        assert!(put.is_ok());
        tx.commit();
        let Some(change) = doc.get_last_local_change() else {
            panic!("a committed transaction makes a change");
        };
        let a = ChangeRecord::from_change(&change);
        let b = ChangeRecord::from_bytes(a.bytes().to_vec()).ok();
        assert_eq!(Some(&a), b.as_ref());
        assert_eq!(a.hash(), change.hash());
        assert_eq!(
            ChangeRecord::from_bytes(vec![1, 2, 3])
                .err()
                .map(|e| e.code()),
            Some("store_bad_change")
        );
    }
}
