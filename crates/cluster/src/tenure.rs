//! A hub's term as one list's authority: its lease and where the log ends for it.
//!
//! Taking a list is three steps: create the lease, find the log's end, append a fence
//! after it. From the fence on, the log refuses every append that does not follow what
//! this holder wrote — a former holder that wakes up and appends after the sequence it
//! last saw is refused by the log, whatever its clock says. The holder appends only
//! while its lease is live by its own count and renews it every third of its time to
//! live; an append refused, or a renewal refused, ends the term: the hub stops acting
//! for the list and takes it again (reading what the log holds) if it can.

use swarmtodo_store::{Batch, DocId};

use crate::lease::Lease;
use crate::limits::FENCE_ATTEMPTS_MAX;
use crate::log::{Entry, Label, Logged};
use crate::record::Snapshot;
use crate::{record, Cluster, ClusterError};

/// Where a holder's log stands: the list, the holder's lease, the last record, and
/// how many events the log holds up to it (once the holder read it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPoint {
    /// The list.
    pub doc: DocId,
    /// The revision of the holder's lease then (it grows with each renewal).
    pub lease: u64,
    /// The sequence of the last record.
    pub last: u64,
    /// The events the log holds up to it, if known.
    pub events: Option<u64>,
}

/// A snapshot encoded for its rollup ([`Cluster::keep_snapshot`]).
#[derive(Debug)]
pub struct KeptSnapshot {
    at: LogPoint,
    events: u64,
    /// The message's payload, and the subject keeping the snapshot in parts past one
    /// message.
    kept: (bytes::Bytes, Option<String>),
}

/// One hub's term as authority of one list.
#[derive(Debug)]
pub struct Tenure {
    lease: Lease,
    /// The sequence of the last record this holder wrote (its fence, at first).
    last: u64,
    /// An append failed half-way or was refused: nothing more may be appended.
    ended: bool,
    /// [`Tenure::ignore_clock`].
    clock_ignored: bool,
    /// How many events the log holds up to [`Tenure::last`], once the holder read it
    /// ([`Tenure::caught_up`]): a snapshot must carry exactly these.
    events: Option<u64>,
    /// The subject keeping the list's last snapshot in parts, if it is kept so: purged
    /// when a newer snapshot takes its place.
    parts: Option<String>,
    /// Commits in the log after its last snapshot (or its start), once known.
    since_snapshot: u64,
}

impl Tenure {
    /// The list.
    pub fn doc(&self) -> DocId {
        self.lease.doc
    }

    /// The lease (its revision is the fencing token every record carries).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The sequence of the last record this holder wrote: the log is known up to here.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// True while this holder may append: the term did not end and the lease is live.
    pub fn is_live(&self) -> bool {
        !self.ended && self.lease.is_live()
    }

    /// Tells the term what the log held when this holder read it up to its fence
    /// (`records`, from the log's start or its last snapshot): how many events, and
    /// which subject keeps its snapshot in parts. Until then the holder writes no snapshot.
    pub fn caught_up(&mut self, records: &[Logged]) {
        let from = records
            .iter()
            .rposition(|r| matches!(r.entry, Entry::Snapshot(_)))
            .unwrap_or(0);
        let (mut events, mut commits) = (0u64, 0u64);
        for r in &records[from..] {
            match &r.entry {
                Entry::Commit(b) => {
                    events += b.events.len() as u64;
                    commits += 1;
                }
                Entry::Snapshot(s) => events += s.batch.events.len() as u64,
                Entry::Fence => {}
            }
        }
        self.events = Some(events);
        self.since_snapshot = commits;
        self.parts = records.get(from).and_then(|r| r.parts.clone());
    }

    /// The subject keeping the list's last snapshot in parts, if it is kept so (known
    /// once the log was read, [`Tenure::caught_up`]).
    pub fn snapshot_parts(&self) -> Option<&str> {
        self.parts.as_deref()
    }

    /// How many events the log holds up to [`Tenure::last`], if known
    /// ([`Tenure::caught_up`]).
    pub fn events(&self) -> Option<u64> {
        self.events
    }

    /// How many commits the log holds after its last snapshot (or its start), as far
    /// as this holder knows.
    pub fn since_snapshot(&self) -> u64 {
        self.since_snapshot
    }

    /// Where the log stands now: what a snapshot made from the holder's store is for.
    pub fn point(&self) -> LogPoint {
        LogPoint {
            doc: self.doc(),
            lease: self.lease.revision,
            last: self.last,
            events: self.events,
        }
    }

    /// [`Tenure::point`], for a snapshot about to be made: the log is not due for
    /// another before as many commits more, whether this one lands or not.
    pub fn begin_snapshot(&mut self) -> LogPoint {
        self.since_snapshot = 0;
        self.point()
    }

    /// Plays a holder whose clock stopped — a process paused after it checked its
    /// lease, that appends when it wakes up: [`Cluster::append`] no longer checks the
    /// lease by this hub's count, so only the log's fencing stands in its way. For
    /// fault tests and simulations.
    #[doc(hidden)]
    pub fn ignore_clock(&mut self) {
        self.clock_ignored = true;
    }
}

impl Cluster {
    /// Takes list `doc`: its lease, then a fence after the end of its log. Refused with
    /// `cluster_lease_held` while another hub holds it. The caller reads the log up to
    /// [`Tenure::last`] before it acts: that is the list as the cluster knows it.
    pub async fn take(&self, doc: DocId) -> Result<Tenure, ClusterError> {
        let lease = self.leases.acquire(doc).await?;
        let label = Label {
            hub: &self.hub,
            lease: lease.revision,
        };
        for attempt in 1..=FENCE_ATTEMPTS_MAX {
            if !lease.is_live() {
                break;
            }
            let end = self.log.last_seq(doc).await?;
            match self.log.fence(doc, end, &label).await {
                Ok(last) => {
                    tracing::info!(%doc, lease = lease.revision, fence = last, "list taken");
                    return Ok(Tenure {
                        lease,
                        last,
                        ended: false,
                        clock_ignored: false,
                        events: None,
                        parts: None,
                        since_snapshot: 0,
                    });
                }
                // The former holder's last appends landed in between: fence after them.
                Err(ClusterError::Fenced { .. }) => {
                    tracing::debug!(%doc, attempt, "the log moved while fencing it");
                }
                Err(e) => return Err(e),
            }
        }
        let _ = self.leases.release(&lease).await;
        Err(ClusterError::LeaseLost { doc })
    }

    /// Deletes the snapshot parts of list `doc` that no rollup names: all but `keep`,
    /// its last snapshot's ([`Tenure::snapshot_parts`]; a writer that died between the
    /// parts and the rollup left the others). For a holder of the list: after its fence
    /// no former holder's rollup can name others. How many subjects of parts went.
    pub async fn sweep_snapshot_parts(
        &self,
        doc: DocId,
        keep: Option<&str>,
    ) -> Result<usize, ClusterError> {
        self.log.sweep_parts(doc, keep).await
    }

    /// Appends a commit as the list's authority; the sequence of its last record.
    /// Refused without writing past [`LOG_RECORD_BYTES_MAX`](crate::limits::LOG_RECORD_BYTES_MAX)
    /// (`cluster_too_large`), once the lease is not live by this hub's count
    /// (`cluster_lease_expired`), and by the log when another holder fenced it
    /// (`cluster_fenced`). Either way, and after any other failure, the term is over.
    pub async fn append(&self, tenure: &mut Tenure, batch: &Batch) -> Result<u64, ClusterError> {
        // Too large is refused whatever the term's state: nothing is written.
        let record = record::encode(batch)?;
        if tenure.ended {
            return Err(ClusterError::LeaseLost { doc: tenure.doc() });
        }
        if !tenure.clock_ignored && !tenure.lease.is_live() {
            tenure.ended = true;
            return Err(ClusterError::LeaseExpired { doc: tenure.doc() });
        }
        let label = Label {
            hub: &self.hub,
            lease: tenure.lease.revision,
        };
        match self
            .log
            .commit(tenure.doc(), tenure.last, &label, record)
            .await
        {
            Ok(last) => {
                tenure.last = last;
                if let Some(n) = &mut tenure.events {
                    *n += batch.events.len() as u64;
                }
                tenure.since_snapshot += 1;
                Ok(last)
            }
            Err(e) => {
                tenure.ended = true;
                if let ClusterError::Fenced { .. } = e {
                    tracing::warn!(doc = %tenure.doc(), lease = tenure.lease.revision, "append refused by the log: another hub holds the list");
                }
                Err(e)
            }
        }
    }

    /// Encodes `snapshot` — the list as the log holds it at `at` (from
    /// [`Tenure::begin_snapshot`]) — for [`Cluster::roll_up`], keeping it in parts on
    /// a subject of its own when it is larger than one message. The term is not needed meanwhile:
    /// its lease goes on being renewed. Refused when the snapshot does not carry
    /// exactly the log's events (`cluster_snapshot_mismatch`: it is not the list as the
    /// log holds it) or the holder has not read the log ([`Tenure::caught_up`]), and
    /// past [`LOG_RECORD_BYTES_MAX`](crate::limits::LOG_RECORD_BYTES_MAX)
    /// (`cluster_too_large`).
    pub async fn keep_snapshot(
        &self,
        at: LogPoint,
        snapshot: &Snapshot,
    ) -> Result<KeptSnapshot, ClusterError> {
        let carried = snapshot.batch.events.len() as u64;
        if at.events != Some(carried) {
            return Err(ClusterError::SnapshotMismatch {
                doc: at.doc,
                logged: at.events,
                carried,
            });
        }
        let label = Label {
            hub: &self.hub,
            lease: at.lease,
        };
        let kept = self.log.keep(at.doc, at.last, &label, snapshot).await?;
        Ok(KeptSnapshot {
            at,
            events: carried,
            kept,
        })
    }

    /// Appends a kept snapshot as a rollup: the log's earlier records go. Its
    /// sequence. Refused without writing when the log moved since the snapshot's point
    /// (`cluster_snapshot_stale`) or the lease is not live by this hub's count, and
    /// by the log when another hub fenced it; either way but the first, the term is
    /// over, as after an append.
    pub async fn roll_up(
        &self,
        tenure: &mut Tenure,
        snapshot: KeptSnapshot,
    ) -> Result<u64, ClusterError> {
        let doc = tenure.doc();
        let parts = snapshot.kept.1.clone();
        let refused = |e: ClusterError| async {
            if let Some(name) = &parts {
                self.log.forget_parts(name).await;
            }
            Err(e)
        };
        if tenure.ended {
            return refused(ClusterError::LeaseLost { doc }).await;
        }
        // The lease's revision grows with each renewal: where the log ends says it all.
        if (tenure.last, tenure.events) != (snapshot.at.last, snapshot.at.events) {
            return refused(ClusterError::SnapshotStale {
                doc,
                made_at: snapshot.at.last,
                log_at: tenure.last,
            })
            .await;
        }
        if !tenure.clock_ignored && !tenure.lease.is_live() {
            tenure.ended = true;
            return refused(ClusterError::LeaseExpired { doc }).await;
        }
        let label = Label {
            hub: &self.hub,
            lease: tenure.lease.revision,
        };
        match self
            .log
            .roll_up(doc, tenure.last, &label, snapshot.kept)
            .await
        {
            Ok(seq) => {
                tenure.last = seq;
                let old = std::mem::replace(&mut tenure.parts, parts);
                if let Some(old) = old {
                    self.log.forget_parts(&old).await;
                }
                tracing::debug!(%doc, seq, events = snapshot.events, "log rolled up into a snapshot");
                Ok(seq)
            }
            Err(e) => {
                tenure.ended = true;
                Err(e)
            }
        }
    }

    /// True when `tenure`'s log is due to be rolled up: it took
    /// [`ClusterConfig::rollup_after_commits`](crate::ClusterConfig) commits since its
    /// last snapshot, and the holder knows what it holds ([`Tenure::caught_up`]).
    pub fn rollup_due(&self, tenure: &Tenure) -> bool {
        tenure.events.is_some() && tenure.since_snapshot >= self.rollup_after
    }

    /// Renews the lease of `tenure`; refused (and the term over) once another hub
    /// took the list.
    pub async fn renew(&self, tenure: &mut Tenure) -> Result<(), ClusterError> {
        if tenure.ended {
            return Err(ClusterError::LeaseLost { doc: tenure.doc() });
        }
        let renewed = self.leases.renew(&mut tenure.lease).await;
        if renewed.is_err() {
            tenure.ended = true;
        }
        renewed
    }

    /// Ends the term and gives the lease back, so that another hub takes the list at
    /// once (on shutdown, or when the list leaves memory).
    pub async fn release(&self, tenure: &mut Tenure) -> Result<(), ClusterError> {
        tenure.ended = true;
        self.leases.release(&tenure.lease).await
    }
}
