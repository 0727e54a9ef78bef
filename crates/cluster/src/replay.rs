//! A hub's own SQLite store as a copy of the cluster's log: before a hub acts for a
//! list it takes, it replays into its store what the log holds that the store does
//! not — the commits other hubs wrote while they held the list — and then loads the
//! list from its store as a single hub does.
//!
//! Changes and reported keys the store has already are skipped by the store itself (by
//! hash, by key). Events carry no identity but their place: a list's events are
//! numbered by their order in the log, so the store's last `seq` says how many of the
//! log's events it holds, and only those after it are added.
//!
//! A log rolled up starts with a snapshot, which carries every event and key of the
//! list and its document: the document's changes are added only when the store lacks
//! one of its heads (a store that took part in the list's history has them), and the
//! document then replaces the store's snapshot, as a compaction does: the list loads
//! from it, not from every change the store lacked.

use std::borrow::Cow;

use swarmtodo_store::{Batch, ChangeRecord, Db, DocId};

use crate::log::{Entry, Logged};
use crate::record::Snapshot;
use crate::ClusterError;

/// What a replay added to the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Commits of the log that brought the store something.
    pub commits: usize,
    /// Changes new to the store.
    pub changes: usize,
    /// Events new to the store.
    pub events: usize,
    /// The store's snapshot of the list was replaced by the log's (the store lacked its
    /// heads): a load of the list rebuilds from it, not from every change it lacked.
    pub compacted: bool,
}

/// Replays `records` — list `doc`'s log from its start or a snapshot, in order; what
/// comes before its last snapshot is passed over — into `db`, where
/// the list is named `name` if the store does not know it yet. Refused with
/// `cluster_store_ahead` (and nothing written) when the store holds more of the list's
/// events than the log: it was written outside the cluster.
pub fn replay_into(
    db: &mut Db,
    doc: DocId,
    name: &str,
    records: &[Logged],
) -> Result<Replayed, ClusterError> {
    let from = records
        .iter()
        .rposition(|r| matches!(r.entry, Entry::Snapshot(_)))
        .unwrap_or(0);
    let records = &records[from..];
    let in_log: u64 = records
        .iter()
        .map(|r| match &r.entry {
            Entry::Commit(b) => b.events.len() as u64,
            Entry::Snapshot(s) => s.batch.events.len() as u64,
            Entry::Fence => 0,
        })
        .sum();
    let known = db.list_by_doc(doc)?.is_some();
    let stored_events = if known { db.last_event_seq(doc)? } else { 0 };
    if stored_events > in_log {
        return Err(ClusterError::StoreAhead {
            doc,
            stored: stored_events,
            logged: in_log,
        });
    }
    let mut seen: u64 = 0;
    let mut rests = Vec::new();
    // The log's snapshot whose document the store lacks becomes the store's snapshot.
    let mut compact_to = None;
    for r in records {
        let batch = match &r.entry {
            Entry::Commit(b) => Cow::Borrowed(b),
            Entry::Snapshot(s) => {
                let batch = as_batch(db, doc, known, s, r.seq)?;
                if batch.changes.len() > s.batch.changes.len() {
                    compact_to = Some(s);
                }
                Cow::Owned(batch)
            }
            Entry::Fence => continue,
        };
        let held = stored_events
            .saturating_sub(seen)
            .min(batch.events.len() as u64) as usize;
        seen += batch.events.len() as u64;
        let rest = Batch {
            changes: batch.changes.clone(),
            events: batch.events[held..].to_vec(),
            reported: batch.reported.clone(),
            summary: None,
        };
        if !rest.is_empty() {
            rests.push((doc, rest));
        }
    }
    let mut out = Replayed::default();
    if rests.is_empty() {
        return Ok(out);
    }
    if !known {
        db.create_or_get_list(name, doc)?;
    }
    // One transaction (one write to disk) for the whole replay: a hub taking a list
    // with a long log does not pay a sync of the disk per record.
    for commit in db.commit_merges(&rests)? {
        if commit.changes_added > 0 || !commit.seqs.is_empty() {
            out.commits += 1;
        }
        out.changes += commit.changes_added;
        out.events += commit.seqs.len();
    }
    // Every change of the log's document is stored now: its save replaces them, as a
    // compaction does, so that loading the list does not apply them one by one. (When
    // it cannot — past a store limit — the changes stay, and the list loads all the
    // same.)
    if let Some(s) = compact_to {
        match db.compact(doc, &s.document, &s.heads) {
            Ok(_) => out.compacted = true,
            Err(e) => {
                tracing::info!(%doc, error = %e, "the log's snapshot did not replace the store's")
            }
        }
    }
    Ok(out)
}

/// Snapshot `s` (record `seq`) as one batch for `db`: its changes, events and keys,
/// and its document's changes unless the store holds its heads.
fn as_batch(
    db: &Db,
    doc: DocId,
    known: bool,
    s: &Snapshot,
    seq: u64,
) -> Result<Batch, ClusterError> {
    let mut batch = s.batch.clone();
    if s.document.is_empty() || (known && db.holds_heads(doc, &s.heads)?) {
        return Ok(batch);
    }
    let bad = |reason: String| ClusterError::CorruptRecord { seq, reason };
    let document = automerge::Automerge::load(&s.document)
        .map_err(|e| bad(format!("a snapshot's document does not load: {e}")))?;
    let (mut got, mut want) = (document.get_heads(), s.heads.clone());
    got.sort();
    want.sort();
    if got != want {
        return Err(bad("a snapshot's document is not at its heads".to_owned()));
    }
    let mut changes: Vec<ChangeRecord> = document
        .get_changes(&[])
        .into_iter()
        .map(|c| ChangeRecord::from_change(&c))
        .collect();
    changes.append(&mut batch.changes);
    batch.changes = changes;
    Ok(batch)
}
