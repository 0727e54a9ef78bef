//! One authority per list: a lease in a JetStream key-value bucket.
//!
//! The bucket's entries expire after the lease's time to live (the bucket's `max_age`).
//! A hub takes a list by *creating* its key (refused while another hub's entry lives),
//! renews by *updating* it at the revision it holds (refused once another hub took it),
//! and releases it by purging it at that revision. The revision is the fencing token:
//! it only grows, and every record the holder appends carries it.
//!
//! The holder counts its lease from the moment it sent the request that granted it,
//! which is before the server stamped the entry, and stops acting [`LEASE_MARGIN`]
//! before that count runs out: by its own clock it lets go before the bucket does, so
//! no other hub can take the list while it still thinks it holds it. A holder that was
//! paused past that point and wakes up mid-append is stopped by the log instead
//! (`log.rs`): the new holder's fence is there first.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use swarmtodo_store::DocId;

use crate::lease::Lease;
use crate::ClusterError;

/// The bucket of the authority leases (one key per list: its document id).
pub const LEASE_BUCKET: &str = "swarmtodo-authority";

/// The lease bucket, as one hub uses it.
#[derive(Debug, Clone)]
pub(crate) struct Leases {
    kv: kv::Store,
    hub: String,
    ttl: Duration,
}

impl Leases {
    /// Opens the bucket, creating it with `replicas` copies and entries living `ttl`
    /// if it does not exist. A bucket made with another time to live is refused: two
    /// hubs counting different times would not agree on when a lease ends.
    pub(crate) async fn open(
        js: &jetstream::Context,
        hub: &str,
        ttl: Duration,
        replicas: usize,
    ) -> Result<Leases, ClusterError> {
        let failed =
            |e: String| ClusterError::JetStream(format!("the lease bucket {LEASE_BUCKET}: {e}"));
        let kv = match js.get_key_value(LEASE_BUCKET).await {
            Ok(kv) => kv,
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: LEASE_BUCKET.to_owned(),
                    description: "swarmtodo: which hub is the authority of each list".to_owned(),
                    history: 1,
                    max_age: ttl,
                    storage: jetstream::stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| failed(e.to_string()))?,
        };
        let max_age = kv
            .status()
            .await
            .map_err(|e| failed(e.to_string()))?
            .max_age();
        if max_age != ttl {
            return Err(ClusterError::LeaseTtlMismatch {
                bucket: max_age,
                configured: ttl,
            });
        }
        Ok(Leases {
            kv,
            hub: hub.to_owned(),
            ttl,
        })
    }

    /// The leases' time to live.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Takes `doc` for this hub: refused with `cluster_lease_held` while another
    /// hub's lease lives (`cluster_lease_changing` when it ended between the two looks).
    pub(crate) async fn acquire(&self, doc: DocId) -> Result<Lease, ClusterError> {
        let sent = Instant::now();
        match self
            .kv
            .create(doc.to_string(), Bytes::from(self.hub.clone()))
            .await
        {
            Ok(revision) => Ok(self.lease(doc, revision, sent)),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                match self.holder(doc).await? {
                    Some((by, _)) => Err(ClusterError::LeaseHeld { doc, by }),
                    None => Err(ClusterError::LeaseChanging { doc }),
                }
            }
            Err(e) => Err(ClusterError::JetStream(format!(
                "taking the lease of {doc}: {e}"
            ))),
        }
    }

    /// Renews `lease` (a new revision and a new time to live): `cluster_lease_lost`
    /// when another hub holds the list now, or the entry ended.
    pub(crate) async fn renew(&self, lease: &mut Lease) -> Result<(), ClusterError> {
        let sent = Instant::now();
        match self
            .kv
            .update(
                lease.doc.to_string(),
                Bytes::from(self.hub.clone()),
                lease.revision,
            )
            .await
        {
            Ok(revision) => {
                *lease = self.lease(lease.doc, revision, sent);
                Ok(())
            }
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                Err(ClusterError::LeaseLost { doc: lease.doc })
            }
            Err(e) => Err(ClusterError::JetStream(format!(
                "renewing the lease of {}: {e}",
                lease.doc
            ))),
        }
    }

    /// Gives `lease` up at once, so another hub need not wait for it to end. Nothing
    /// happens if it was lost already.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<(), ClusterError> {
        match self
            .kv
            .purge_expect_revision(lease.doc.to_string(), Some(lease.revision))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == kv::PurgeErrorKind::WrongLastRevision => Ok(()),
            Err(e) => Err(ClusterError::JetStream(format!(
                "releasing the lease of {}: {e}",
                lease.doc
            ))),
        }
    }

    /// The hub holding `doc` and its lease's revision, if any.
    pub(crate) async fn holder(&self, doc: DocId) -> Result<Option<(String, u64)>, ClusterError> {
        let entry = self
            .kv
            .entry(doc.to_string())
            .await
            .map_err(|e| ClusterError::JetStream(format!("reading the lease of {doc}: {e}")))?;
        Ok(entry
            .filter(|e| e.operation == kv::Operation::Put)
            .map(|e| (String::from_utf8_lossy(&e.value).into_owned(), e.revision)))
    }

    fn lease(&self, doc: DocId, revision: u64, sent: Instant) -> Lease {
        Lease {
            doc,
            revision,
            sent,
            ttl: self.ttl,
        }
    }
}
