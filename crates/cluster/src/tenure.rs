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
use crate::log::Label;
use crate::{record, Cluster, ClusterError};

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
