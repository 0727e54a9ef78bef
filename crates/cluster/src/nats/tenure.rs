//! A term on NATS: taking a list (its lease, then a fence after the end of its log),
//! appending to its log, rolling the log up into a snapshot, renewing and releasing the
//! lease (`tenure.rs` says what a term is).

use swarmtodo_store::{Batch, DocId};

use crate::limits::FENCE_ATTEMPTS_MAX;
use crate::nats::log::Label;
use crate::record::Snapshot;
use crate::tenure::{KeptSnapshot, LogPoint, Tenure};
use crate::{record, Cluster, ClusterError};

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
