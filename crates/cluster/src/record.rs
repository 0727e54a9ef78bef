//! What one commit of a list puts in its log, as bytes: its changes, the events it
//! produced and the keys they reported, together, so that a reader gets all of a commit
//! or none of it (the SQLite store keeps the same promise with one transaction).
//!
//! The encoding is plain: a magic, then three counted sections of length-prefixed
//! items (big-endian `u32` counts and lengths). Records come from other hubs over NATS,
//! so decoding checks every length against what is left and against the store's limits
//! before it allocates.

use automerge::ChangeHash;
use swarmtodo_store::{
    Batch, ChangeRecord, NewEvent, BATCH_ITEMS_MAX, CHANGE_BYTES_MAX, EVENT_BYTES_MAX,
    EVENT_KIND_BYTES_MAX, REPORTED_KEY_BYTES_MAX, SNAPSHOT_BYTES_MAX, SNAPSHOT_HEADS_MAX,
};

use crate::limits::LOG_RECORD_BYTES_MAX;
use crate::ClusterError;

/// The first bytes of every encoded commit (and its format's version).
const MAGIC: &[u8; 4] = b"STC1";

/// The first bytes of every encoded snapshot (and its format's version).
const SNAPSHOT_MAGIC: &[u8; 4] = b"STS1";

/// A list as its log holds it through one record: what a rollup puts in place of the
/// records before it (`log.rs`). The document is the list's last compaction
/// (`Automerge::save()`, with its heads) and the changes since; the events are all of
/// the list's events, in order; the keys all that were reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// `Automerge::save()` of the list at its last compaction (empty: none yet).
    pub document: Vec<u8>,
    /// The heads `document` covers.
    pub heads: Vec<ChangeHash>,
    /// The changes since `document`, in the order they were applied; with the
    /// document, every event and every key, the list as the log had it.
    pub batch: Batch,
}

/// Encodes a snapshot: its document and heads, then its batch as [`encode`] does.
/// Fails with `cluster_too_large` past [`LOG_RECORD_BYTES_MAX`].
pub fn encode_snapshot(snapshot: &Snapshot) -> Result<Vec<u8>, ClusterError> {
    let batch = encode(&snapshot.batch)?;
    let size = SNAPSHOT_MAGIC.len() + 8 + snapshot.document.len() + 32 * snapshot.heads.len();
    if size + batch.len() > LOG_RECORD_BYTES_MAX {
        return Err(ClusterError::TooLarge {
            what: "a snapshot record",
            bytes: size + batch.len(),
            max: LOG_RECORD_BYTES_MAX,
        });
    }
    let mut out = Vec::with_capacity(size + batch.len());
    out.extend_from_slice(SNAPSHOT_MAGIC);
    put_bytes(&mut out, &snapshot.document);
    put_count(&mut out, snapshot.heads.len());
    for h in &snapshot.heads {
        out.extend_from_slice(&h.0);
    }
    out.extend_from_slice(&batch);
    Ok(out)
}

/// Decodes a snapshot written by [`encode_snapshot`], with every check of [`decode`]
/// for its batch. `seq` names the record in the error.
pub fn decode_snapshot(bytes: &[u8], seq: u64) -> Result<Snapshot, ClusterError> {
    let bad = |reason: String| ClusterError::CorruptRecord { seq, reason };
    let mut r = Reader { bytes, at: 0 };
    if r.take(SNAPSHOT_MAGIC.len()).map_err(&bad)? != SNAPSHOT_MAGIC {
        return Err(bad("not a swarmtodo snapshot (bad magic)".to_owned()));
    }
    let document = r
        .item("a snapshot's document", SNAPSHOT_BYTES_MAX)
        .map_err(&bad)?
        .to_vec();
    let n = r.count("heads").map_err(&bad)?;
    if n > SNAPSHOT_HEADS_MAX {
        return Err(bad(format!(
            "{n} heads, more than the {SNAPSHOT_HEADS_MAX} allowed"
        )));
    }
    let mut heads = Vec::with_capacity(n);
    for _ in 0..n {
        let h = r.take(32).map_err(&bad)?;
        let mut hash = [0u8; 32];
        hash.copy_from_slice(h);
        heads.push(ChangeHash(hash));
    }
    let batch = decode(&bytes[r.at..], seq)?;
    Ok(Snapshot {
        document,
        heads,
        batch,
    })
}

/// Encodes the changes, events and reported keys of `batch` (its summary is the lists
/// index's, not the log's). Fails with `cluster_too_large` past [`LOG_RECORD_BYTES_MAX`].
pub fn encode(batch: &Batch) -> Result<Vec<u8>, ClusterError> {
    let mut size = MAGIC.len() + 12;
    size += batch
        .changes
        .iter()
        .map(|c| 4 + c.bytes().len())
        .sum::<usize>();
    size += batch
        .events
        .iter()
        .map(|e| 8 + e.kind().len() + e.json().len())
        .sum::<usize>();
    size += batch.reported.iter().map(|k| 4 + k.len()).sum::<usize>();
    if size > LOG_RECORD_BYTES_MAX {
        return Err(ClusterError::TooLarge {
            what: "a commit record",
            bytes: size,
            max: LOG_RECORD_BYTES_MAX,
        });
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(MAGIC);
    put_count(&mut out, batch.changes.len());
    for c in &batch.changes {
        put_bytes(&mut out, c.bytes());
    }
    put_count(&mut out, batch.events.len());
    for e in &batch.events {
        put_bytes(&mut out, e.kind().as_bytes());
        put_bytes(&mut out, e.json().as_bytes());
    }
    put_count(&mut out, batch.reported.len());
    for k in &batch.reported {
        put_bytes(&mut out, k.as_bytes());
    }
    debug_assert_eq!(out.len(), size);
    Ok(out)
}

/// Decodes a commit written by [`encode`]. Every change is parsed (its hash and
/// dependencies come from its bytes) and every event's JSON checked, so a record that
/// decodes is one the store would take. `seq` names the record in the error.
pub fn decode(bytes: &[u8], seq: u64) -> Result<Batch, ClusterError> {
    let bad = |reason: String| ClusterError::CorruptRecord { seq, reason };
    let mut r = Reader { bytes, at: 0 };
    if r.take(MAGIC.len()).map_err(&bad)? != MAGIC {
        return Err(bad("not a swarmtodo commit (bad magic)".to_owned()));
    }
    let mut batch = Batch::default();
    for _ in 0..r.count("changes").map_err(&bad)? {
        let change = r.item("a change", CHANGE_BYTES_MAX).map_err(&bad)?;
        let record = ChangeRecord::from_bytes(change.to_vec()).map_err(|e| bad(e.to_string()))?;
        batch.changes.push(record);
    }
    for _ in 0..r.count("events").map_err(&bad)? {
        let kind = r
            .text("an event kind", EVENT_KIND_BYTES_MAX)
            .map_err(&bad)?;
        let json = r.text("an event", EVENT_BYTES_MAX).map_err(&bad)?;
        let event = NewEvent::from_json(kind, json).map_err(|e| bad(e.to_string()))?;
        batch.events.push(event);
    }
    for _ in 0..r.count("reported keys").map_err(&bad)? {
        let key = r
            .text("a reported key", REPORTED_KEY_BYTES_MAX)
            .map_err(&bad)?;
        batch.reported.push(key.to_owned());
    }
    if r.at != bytes.len() {
        return Err(bad(format!(
            "{} bytes after the last section",
            bytes.len() - r.at
        )));
    }
    Ok(batch)
}

fn put_count(out: &mut Vec<u8>, n: usize) {
    // Counts and lengths are bounded far below 4 GiB (LOG_RECORD_BYTES_MAX).
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_count(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// A cursor over a record that never reads past its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "cut short: {n} bytes wanted at offset {}, {} left",
                self.at,
                self.bytes.len() - self.at
            ));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u32(&mut self) -> Result<usize, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    /// A section's count, at most [`BATCH_ITEMS_MAX`] (and at most one item per four
    /// bytes left: no count makes the reader loop past the record's end).
    fn count(&mut self, what: &str) -> Result<usize, String> {
        let n = self.u32()?;
        let left = self.bytes.len() - self.at;
        if n > BATCH_ITEMS_MAX || n > left / 4 {
            return Err(format!("{n} {what}: more than the record can hold"));
        }
        Ok(n)
    }

    fn item(&mut self, what: &str, max: usize) -> Result<&'a [u8], String> {
        let n = self.u32()?;
        if n > max {
            return Err(format!("{what} of {n} bytes, more than the {max} allowed"));
        }
        self.take(n)
    }

    fn text(&mut self, what: &str, max: usize) -> Result<&'a str, String> {
        let bytes = self.item(what, max)?;
        std::str::from_utf8(bytes).map_err(|e| format!("{what} is not UTF-8: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use automerge::{transaction::Transactable, Automerge, ROOT};

    fn batch() -> Batch {
        let mut doc = Automerge::new();
        let mut tx = doc.transaction();
        tx.put(ROOT, "k", "v").ok();
        tx.commit();
        let change = doc.get_last_local_change();
        Batch {
            changes: change.iter().map(ChangeRecord::from_change).collect(),
            events: vec![
                NewEvent::new("violation", &serde_json::json!({"rule": "schema"})).unwrap(),
            ],
            reported: vec!["schema:t1".to_owned()],
            summary: None,
        }
    }

    #[test]
    fn a_commit_comes_back_as_it_went_in() {
        let b = batch();
        let bytes = encode(&b).unwrap();
        assert_eq!(decode(&bytes, 1).unwrap(), b);
    }

    #[test]
    fn every_cut_of_a_record_is_refused_not_misread() {
        let bytes = encode(&batch()).unwrap();
        for n in 0..bytes.len() {
            let e = decode(&bytes[..n], 7).unwrap_err();
            assert_eq!(e.code(), "cluster_corrupt_record", "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer, 7)
            .unwrap_err()
            .to_string()
            .contains("1 bytes after"));
    }

    #[test]
    fn a_snapshot_comes_back_as_it_went_in_and_every_cut_is_refused() {
        let mut doc = Automerge::new();
        let mut tx = doc.transaction();
        tx.put(ROOT, "k", "v").ok();
        tx.commit();
        let s = Snapshot {
            document: doc.save(),
            heads: doc.get_heads(),
            batch: batch(),
        };
        let bytes = encode_snapshot(&s).unwrap();
        assert_eq!(decode_snapshot(&bytes, 1).unwrap(), s);
        for n in 0..bytes.len() {
            let e = decode_snapshot(&bytes[..n], 7).unwrap_err();
            assert_eq!(e.code(), "cluster_corrupt_record", "cut at {n}");
        }
        let commit = encode(&batch()).unwrap();
        assert!(decode_snapshot(&commit, 2)
            .unwrap_err()
            .to_string()
            .contains("not a swarmtodo snapshot"));
    }

    #[test]
    fn a_huge_count_is_refused_before_anything_is_allocated() {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        let e = decode(&bytes, 3).unwrap_err();
        assert!(
            e.to_string().contains("more than the record can hold"),
            "{e}"
        );
    }

    #[test]
    fn a_change_that_is_not_one_is_refused() {
        let mut b = batch();
        let mut bytes = MAGIC.to_vec();
        put_count(&mut bytes, 1);
        put_bytes(&mut bytes, b"not a change");
        put_count(&mut bytes, 0);
        put_count(&mut bytes, 0);
        assert_eq!(
            decode(&bytes, 3).unwrap_err().code(),
            "cluster_corrupt_record"
        );
        b.events.clear();
        assert!(decode(&encode(&b).unwrap(), 3).is_ok());
    }
}
