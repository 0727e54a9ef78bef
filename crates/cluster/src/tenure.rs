//! A hub's term as one list's authority: its lease and where the log ends for it.
//!
//! Taking a list is three steps: create the lease, find the log's end, append a fence
//! after it. From the fence on, the log refuses every append that does not follow what
//! this holder wrote — a former holder that wakes up and appends after the sequence it
//! last saw is refused by the log, whatever its clock says. The holder appends only
//! while its lease is live by its own count and renews it every third of its time to
//! live; an append refused, or a renewal refused, ends the term: the hub stops acting
//! for the list and takes it again (reading what the log holds) if it can.

use swarmtodo_store::DocId;

use crate::lease::Lease;
use crate::log::{Entry, Logged};
#[cfg(doc)]
use crate::Cluster;

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
// Made and read on NATS only (`nats/tenure.rs`).
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub struct KeptSnapshot {
    pub(crate) at: LogPoint,
    pub(crate) events: u64,
    /// The message's payload, and the subject keeping the snapshot in parts past one
    /// message.
    pub(crate) kept: (bytes::Bytes, Option<String>),
}

/// One hub's term as authority of one list.
#[derive(Debug)]
pub struct Tenure {
    pub(crate) lease: Lease,
    /// The sequence of the last record this holder wrote (its fence, at first).
    pub(crate) last: u64,
    /// An append failed half-way or was refused: nothing more may be appended.
    pub(crate) ended: bool,
    /// [`Tenure::ignore_clock`].
    pub(crate) clock_ignored: bool,
    /// How many events the log holds up to [`Tenure::last`], once the holder read it
    /// ([`Tenure::caught_up`]): a snapshot must carry exactly these.
    pub(crate) events: Option<u64>,
    /// The subject keeping the list's last snapshot in parts, if it is kept so: purged
    /// when a newer snapshot takes its place.
    pub(crate) parts: Option<String>,
    /// Commits in the log after its last snapshot (or its start), once known.
    pub(crate) since_snapshot: u64,
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
