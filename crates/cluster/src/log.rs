//! A list's log as any hub reads it: its records, the events they carry numbered as
//! every hub numbers them, and the list's document they add up to. Reading it from NATS
//! is `nats/log.rs`'s; what a read holds and what it makes is here, with or without
//! NATS (the replay of `replay.rs` reads the same records).
//!
//! Events are numbered by their order in the log, from the last snapshot (which carries
//! every event before it) on: the numbering [`replay_into`](crate::replay_into) gives a
//! store.

use swarmtodo_store::{Batch, DocId, Loaded, StoredEvent};

use crate::record::Snapshot;

/// One record of a list's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// Its sequence in the stream (of its last part, for a commit in parts).
    pub seq: u64,
    /// The hub that wrote it.
    pub hub: String,
    /// The revision of that hub's lease when it wrote it.
    pub lease: u64,
    /// What it holds.
    pub entry: Entry,
    /// The subject that keeps it in parts (a snapshot larger than one message).
    pub parts: Option<String>,
}

/// What a record holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A commit: a merge's changes, its events and the keys they reported.
    Commit(Batch),
    /// A new authority took the list here.
    Fence,
    /// The list as the log held it here: every record before it is gone (a rollup).
    Snapshot(Box<Snapshot>),
}

/// A read of a list's log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Read {
    /// The whole records after the sequence asked from, in order.
    pub records: Vec<Logged>,
    /// Where the next read starts after: the last whole record's sequence, or before
    /// the parts of a commit still being written.
    pub through: u64,
    /// Parts of commits cut by a fence (their writer lost the list half-way): dropped.
    pub abandoned_parts: usize,
}

/// Numbers the events of `records` — a read of a list's log that starts where the last
/// one stopped, or at the log's start — given `numbered`, the events numbered so far:
/// the events new to the reader, in order. A snapshot brings those of its events past
/// `numbered` (the records that carried them were rolled up before they were read).
pub fn number_events(records: &[Logged], numbered: &mut u64) -> Vec<StoredEvent> {
    let mut out = Vec::new();
    for r in records {
        let (events, from) = match &r.entry {
            Entry::Commit(b) => (&b.events, 0),
            Entry::Snapshot(s) => {
                let all = s.batch.events.len() as u64;
                if all < *numbered {
                    tracing::warn!(
                        seq = r.seq,
                        all,
                        numbered = *numbered,
                        "a snapshot carries fewer events than its log had before it: they are kept"
                    );
                }
                let from = usize::try_from(*numbered)
                    .unwrap_or(usize::MAX)
                    .min(s.batch.events.len());
                (&s.batch.events, from)
            }
            Entry::Fence => continue,
        };
        for e in &events[from..] {
            *numbered += 1;
            out.push(StoredEvent {
                seq: *numbered,
                kind: e.kind().to_owned(),
                json: e.json().to_owned(),
            });
        }
    }
    out
}

/// List `doc`'s document as `records` — its log from the start — hold it: the last
/// snapshot's document and every change after it. `None` when the log holds no change.
pub fn document_of(doc: DocId, records: &[Logged]) -> Option<Loaded> {
    let from = records
        .iter()
        .rposition(|r| matches!(r.entry, Entry::Snapshot(_)))
        .unwrap_or(0);
    let mut loaded = Loaded {
        doc,
        snapshot: None,
        snapshot_heads: Vec::new(),
        changes: Vec::new(),
    };
    for r in &records[from..] {
        let batch = match &r.entry {
            Entry::Commit(b) => b,
            Entry::Snapshot(s) => {
                if !s.document.is_empty() {
                    loaded.snapshot = Some(s.document.clone());
                    loaded.snapshot_heads = s.heads.clone();
                }
                &s.batch
            }
            Entry::Fence => continue,
        };
        loaded
            .changes
            .extend(batch.changes.iter().map(|c| c.bytes().to_vec()));
    }
    (loaded.snapshot.is_some() || !loaded.changes.is_empty()).then_some(loaded)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // In tests a panic is the failure report.

    use super::*;
    use crate::record::Snapshot;
    use swarmtodo_store::{Batch, NewEvent};

    fn events(kinds: &[&str]) -> Vec<NewEvent> {
        kinds
            .iter()
            .map(|k| NewEvent::from_json(*k, format!("{{\"k\":\"{k}\"}}")).unwrap())
            .collect()
    }

    fn record(seq: u64, entry: Entry) -> Logged {
        Logged {
            seq,
            hub: "hub-1".to_owned(),
            lease: 1,
            entry,
            parts: None,
        }
    }

    fn commit(seq: u64, kinds: &[&str]) -> Logged {
        record(
            seq,
            Entry::Commit(Batch {
                events: events(kinds),
                ..Batch::default()
            }),
        )
    }

    fn snapshot(seq: u64, kinds: &[&str]) -> Logged {
        record(
            seq,
            Entry::Snapshot(Box::new(Snapshot {
                batch: Batch {
                    events: events(kinds),
                    ..Batch::default()
                },
                ..Snapshot::default()
            })),
        )
    }

    fn seqs_and_kinds(events: &[StoredEvent]) -> Vec<(u64, String)> {
        events.iter().map(|e| (e.seq, e.kind.clone())).collect()
    }

    #[test]
    fn events_are_numbered_across_reads_fences_and_snapshots_each_once() {
        let mut n = 0;
        let first = number_events(
            &[
                commit(1, &["a", "b"]),
                record(2, Entry::Fence),
                commit(3, &["c"]),
            ],
            &mut n,
        );
        assert_eq!(
            seqs_and_kinds(&first),
            vec![(1, "a".into()), (2, "b".into()), (3, "c".into())]
        );
        // The log was rolled up before the next read: the snapshot has every event, and
        // brings the two the reader did not see.
        let next = number_events(
            &[snapshot(9, &["a", "b", "c", "d", "e"]), commit(10, &["f"])],
            &mut n,
        );
        assert_eq!(
            seqs_and_kinds(&next),
            vec![(4, "d".into()), (5, "e".into()), (6, "f".into())]
        );
        // A snapshot of what the reader has seen brings nothing.
        let same = number_events(&[snapshot(11, &["a", "b", "c", "d", "e", "f"])], &mut n);
        assert!(same.is_empty());
        assert_eq!(n, 6);
        // A snapshot with fewer events than were numbered brings none and renumbers none.
        assert!(
            number_events(&[snapshot(12, &["a"]), commit(13, &["g"])], &mut n)
                .iter()
                .map(|e| e.seq)
                .eq([7])
        );
    }

    #[test]
    fn a_document_is_the_last_snapshot_s_and_the_changes_after_it() {
        let mut am = automerge::AutoCommit::new();
        use automerge::transaction::Transactable;
        am.put(automerge::ROOT, "a", 1).unwrap();
        let saved = am.save();
        let heads = am.get_heads();
        am.put(automerge::ROOT, "b", 2).unwrap();
        let later = am.get_last_local_change().unwrap();
        let doc = DocId([7; 16]);
        let records = vec![
            commit(1, &["x"]),
            record(
                2,
                Entry::Snapshot(Box::new(Snapshot {
                    document: saved.clone(),
                    heads: heads.clone(),
                    batch: Batch::default(),
                })),
            ),
            record(
                3,
                Entry::Commit(Batch {
                    changes: vec![swarmtodo_store::ChangeRecord::from_change(&later)],
                    ..Batch::default()
                }),
            ),
        ];
        let loaded = document_of(doc, &records).unwrap();
        assert_eq!(loaded.snapshot.as_deref(), Some(saved.as_slice()));
        assert_eq!(loaded.snapshot_heads, heads);
        let rebuilt = loaded.rebuild().unwrap();
        assert_eq!(rebuilt.get_heads(), am.get_heads());
        assert!(document_of(doc, &[record(1, Entry::Fence)]).is_none());
    }
}
