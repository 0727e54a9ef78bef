//! A hub's lease on one list, as the hub counts it: the holder stops acting
//! [`LEASE_MARGIN`] before its own count of the lease's time to live runs out, so by its
//! clock it lets go before the bucket does (`nats/lease.rs` takes, renews and releases
//! it).

use std::time::{Duration, Instant};

use swarmtodo_store::DocId;

use crate::limits::LEASE_MARGIN;

/// A hub's lease on one list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The list.
    pub doc: DocId,
    /// The entry's revision: the fencing token.
    pub revision: u64,
    /// When the request that granted or renewed it was sent.
    pub(crate) sent: Instant,
    /// Its time to live.
    pub(crate) ttl: Duration,
}

impl Lease {
    /// How long the holder may still act on it (`None`: it must not).
    pub fn remaining(&self) -> Option<Duration> {
        (self.sent + self.ttl)
            .checked_duration_since(Instant::now())?
            .checked_sub(LEASE_MARGIN)
            .filter(|d| !d.is_zero())
    }

    /// True while the holder may act on it.
    pub fn is_live(&self) -> bool {
        self.remaining().is_some()
    }
}
