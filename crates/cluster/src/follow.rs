//! A list read from its log by any hub, holding it or not: its events, numbered as every
//! hub numbers them, followed as the log grows; and its document.
//!
//! In a cluster the log is the list: a hub's own store holds only what it replayed while
//! it held the list. So the JSON API's event stream and a task's history, at whatever
//! hub they are asked for, read the log.
//!
//! Events are numbered by their order in the log, from the last snapshot (which carries
//! every event before it) on: the numbering [`replay_into`](crate::replay_into) gives a
//! store. A follower ([`Follow`]) reads the log after the last record it read whenever a
//! record is stored there: it is rung by an ordered consumer of the list's subject that
//! brings only the records' headers, so it learns of a record once the log holds it
//! (never of an append the log refused) and carries no payload twice. A rollup that
//! dropped records it had not read yet brings their events in its snapshot.

use std::time::Duration;

use async_nats::jetstream::consumer;
use futures_util::{FutureExt, StreamExt};
use swarmtodo_store::{DocId, Loaded, StoredEvent};

use crate::limits::{FOLLOW_POLL, FOLLOW_RETRY};
use crate::log::{subject, Entry, Log, Logged};
use crate::{Cluster, ClusterError};

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

/// A reader of one list's events as the log takes them ([`Cluster::follow`]).
pub struct Follow {
    log: Log,
    doc: DocId,
    /// Where the next read starts after.
    through: u64,
    /// Events numbered so far.
    numbered: u64,
    /// Rings when the log stores a record of the list (none: to be made again).
    doorbell: Option<consumer::pull::Ordered>,
}

impl std::fmt::Debug for Follow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follow")
            .field("doc", &self.doc)
            .field("through", &self.through)
            .field("numbered", &self.numbered)
            .field("doorbell", &self.doorbell.is_some())
            .finish()
    }
}

impl Cluster {
    /// Follows list `doc`'s log from its start: [`Follow::next`] gives every event of the
    /// list in order, each once, numbered as every hub numbers them.
    pub async fn follow(&self, doc: DocId) -> Result<Follow, ClusterError> {
        // Rung for every record stored from now on; the first read takes what came before.
        let doorbell = ring(&self.log, doc).await?;
        Ok(Follow {
            log: self.log.clone(),
            doc,
            through: 0,
            numbered: 0,
            doorbell: Some(doorbell),
        })
    }

    /// Every event of list `doc` as its log numbers them now.
    pub async fn events(&self, doc: DocId) -> Result<Vec<StoredEvent>, ClusterError> {
        let read = self.log.read(doc, 0).await?;
        Ok(number_events(&read.records, &mut 0))
    }

    /// List `doc`'s document as its log holds it now (`None`: no change logged).
    pub async fn document(&self, doc: DocId) -> Result<Option<Loaded>, ClusterError> {
        let read = self.log.read(doc, 0).await?;
        Ok(document_of(doc, &read.records))
    }
}

impl Follow {
    /// The events numbered so far.
    pub fn numbered(&self) -> u64 {
        self.numbered
    }

    /// The events the log took since the last call (at the first, all of them), waiting
    /// up to `wait` for one when there is none yet (then: none). On `Err` (NATS failed)
    /// the follower is as it was, and may be asked again.
    pub async fn next(&mut self, wait: Duration) -> Result<Vec<StoredEvent>, ClusterError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Rings already heard are answered by this read.
            if let Some(doorbell) = &mut self.doorbell {
                while let Some(Some(rang)) = doorbell.next().now_or_never() {
                    if rang.is_err() {
                        self.doorbell = None;
                        break;
                    }
                }
            }
            let read = self.log.read(self.doc, self.through).await?;
            let mut numbered = self.numbered;
            let new = number_events(&read.records, &mut numbered);
            (self.through, self.numbered) = (read.through, numbered);
            if !new.is_empty() {
                return Ok(new);
            }
            if self.doorbell.is_none() {
                match ring(&self.log, self.doc).await {
                    Ok(doorbell) => {
                        self.doorbell = Some(doorbell);
                        // What was stored before it rings no more: read again.
                        continue;
                    }
                    Err(e) => {
                        tracing::info!(doc = %self.doc, error = %e, "no doorbell on the log: reading it every {FOLLOW_RETRY:?}")
                    }
                }
            }
            let until = deadline.min(
                tokio::time::Instant::now()
                    + if self.doorbell.is_some() {
                        FOLLOW_POLL
                    } else {
                        FOLLOW_RETRY
                    },
            );
            let rang = async {
                match &mut self.doorbell {
                    Some(doorbell) => doorbell.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                rang = rang => {
                    if !matches!(rang, Some(Ok(_))) {
                        tracing::info!(doc = %self.doc, "the log's doorbell stopped: made again");
                        self.doorbell = None;
                    }
                }
                () = tokio::time::sleep_until(until) => {
                    if until >= deadline {
                        return Ok(Vec::new());
                    }
                }
            }
        }
    }
}

/// An ordered consumer of the headers of list `doc`'s records stored from now on (a
/// free function: the follower is not shared between threads, so it is not borrowed
/// across a wait).
async fn ring(log: &Log, doc: DocId) -> Result<consumer::pull::Ordered, ClusterError> {
    let failed = |e: String| ClusterError::JetStream(format!("following the log of {doc}: {e}"));
    log.stream()
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subject(doc),
            deliver_policy: consumer::DeliverPolicy::New,
            headers_only: true,
            ..Default::default()
        })
        .await
        .map_err(|e| failed(e.to_string()))?
        .messages()
        .await
        .map_err(|e| failed(e.to_string()))
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
