//! Many hubs on one NATS JetStream (docs/DESIGN.md §10): each list's log, and one
//! authority per list by a fenced lease.
//!
//! What a hub does on NATS is in `nats/` (the `nats` cargo feature, on by default);
//! what it knows and decides without NATS is beside it, so that a build without the
//! feature keeps the same API ([`Cluster`] then cannot be made: `without_nats.rs`).
//!
//! - [`Cluster::connect`] joins a hub to the cluster: the log stream and the lease
//!   bucket are made on first use, with one copy or three (a three-server NATS cluster
//!   keeps them by Raft).
//! - The log (`nats/log.rs`; its records, `log.rs` and `record.rs`): a subject per list
//!   in one stream; a commit — a merge's changes, its events and the keys they
//!   reported — is one record (in parts past the size of a message), so a reader sees
//!   all of a commit or none of it. The holder rolls the log up into a snapshot of the
//!   list now and then, and the records before it go.
//! - The lease (`nats/lease.rs`; as the holder counts it, `lease.rs`): a key per list in
//!   a bucket whose entries end after the lease's time to live unless renewed; its
//!   revision is the fencing token.
//! - The term (`tenure.rs`, `nats/tenure.rs`): taking a list fences its log, and every
//!   append names the sequence it follows, so a former holder that wakes up is refused
//!   by the log itself.
//! - Forwarding (`nats/forward.rs`): a call that reaches a hub which is not the list's
//!   authority goes to the hub that is, over NATS, and its answer comes back.
//! - The replay (`replay.rs`): a hub's own SQLite store brought up to the log before it
//!   acts for a list it took.
//! - The directory (`directory.rs`, `nats/directory.rs`): the index of lists, the tokens
//!   hubs made and the links of delegated tasks' lists, a bucket each that every hub
//!   watches.
//! - Following (`nats/follow.rs`): a list's events and document read from its log by
//!   any hub, its events followed as the log takes them (the JSON API's event stream
//!   and a task's history, wherever they are asked for).

mod directory;
mod lease;
pub mod limits;
mod log;
#[cfg(feature = "nats")]
mod nats;
pub mod record;
mod replay;
mod tenure;
#[cfg(not(feature = "nats"))]
mod without_nats;

use std::time::Duration;

use swarmtodo_store::DocId;

pub use self::directory::{token_key, token_sha256, Bucket, Keyed};
pub use self::lease::Lease;
use self::limits::{HUB_ID_BYTES_MAX, LEASE_TTL_DEFAULT, LEASE_TTL_MIN, LOG_ROLLUP_AFTER_COMMITS};
pub use self::log::{document_of, number_events, Entry, Logged, Read};
#[cfg(feature = "nats")]
pub use self::nats::{
    call_subject, headers, subject, Cluster, Follow, Forwarded, ForwardedCall, SessionMessages,
    Watched, CALL_SUBJECT_PREFIX, LEASE_BUCKET, LOG_STREAM, LOG_SUBJECT_PREFIX, OP, SEQ, SESSION,
    SESSION_SUBJECT_PREFIX, SNAPSHOT_SUBJECT_PREFIX,
};
pub use self::record::Snapshot;
pub use self::replay::{replay_into, Replayed};
pub use self::tenure::{KeptSnapshot, LogPoint, Tenure};
#[cfg(not(feature = "nats"))]
pub use self::without_nats::{Cluster, Follow, Forwarded, ForwardedCall, SessionMessages, Watched};

/// The automerge-repo peer id every hub of a cluster answers `join` with and sends as:
/// a sync peer carried to another hub (docs/DESIGN.md §10) hears the hub it joined and
/// the one that holds its list as one peer.
pub const CLUSTER_PEER_ID: &str = "swarmtodo-cluster";

/// How a hub joins a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The NATS server(s), as `nats://host:port` (several separated by commas).
    pub url: String,
    /// This hub's id: names it as a lease's holder and a record's writer. Unique in
    /// the cluster.
    pub hub: String,
    /// Copies of the log and the leases NATS keeps: 1, or 3 on a three-server cluster.
    pub replicas: usize,
    /// How long a lease lasts unless renewed ([`LEASE_TTL_DEFAULT`]).
    pub lease_ttl: Duration,
    /// Commits a list's log takes after its last snapshot before the holder rolls it
    /// up ([`LOG_ROLLUP_AFTER_COMMITS`]; at least 1).
    pub rollup_after_commits: u64,
}

impl ClusterConfig {
    /// A hub `hub` on the NATS server at `url`, one copy, the default lease.
    pub fn new(url: impl Into<String>, hub: impl Into<String>) -> ClusterConfig {
        ClusterConfig {
            url: url.into(),
            hub: hub.into(),
            replicas: 1,
            lease_ttl: LEASE_TTL_DEFAULT,
            rollup_after_commits: LOG_ROLLUP_AFTER_COMMITS,
        }
    }

    /// Refuses settings no hub can run with (`cluster_bad_config`), before any
    /// connection is tried.
    pub fn check(&self) -> Result<(), ClusterError> {
        let hub = &self.hub;
        if hub.is_empty()
            || hub.len() > HUB_ID_BYTES_MAX
            || !hub
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ClusterError::BadConfig(format!(
                "hub id {hub:?}: give 1 to {HUB_ID_BYTES_MAX} letters, digits, '-' or '_'"
            )));
        }
        if self.lease_ttl < LEASE_TTL_MIN {
            return Err(ClusterError::BadConfig(format!(
                "a lease of {:?} is shorter than the {LEASE_TTL_MIN:?} allowed",
                self.lease_ttl
            )));
        }
        if self.rollup_after_commits == 0 {
            return Err(ClusterError::BadConfig(
                "rollup_after_commits is 0: give at least 1".to_owned(),
            ));
        }
        if !matches!(self.replicas, 1 | 3) {
            return Err(ClusterError::BadConfig(format!(
                "{} replicas: give 1, or 3 on a three-server NATS cluster",
                self.replicas
            )));
        }
        Ok(())
    }
}

/// One message of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMessage {
    /// The session it belongs to.
    pub session: String,
    /// What it is.
    pub op: String,
    /// Its number among the messages its sender sent in this session, from 1, so that
    /// the receiver sees a message lost on the way (NATS keeps nothing for a hub that is
    /// away); 0 for one sent without a number (a `close` for a session the sender does
    /// not know).
    pub seq: u64,
    /// What it carries.
    pub body: Vec<u8>,
}

/// What the cluster refused or failed to do. [`ClusterError::code`] is stable.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// NATS could not be reached.
    #[error("cannot reach NATS at {url}: {reason} (is nats-server running there, with -js?)")]
    Connect {
        /// The address given.
        url: String,
        /// What failed.
        reason: String,
    },
    /// The hub's cluster settings are not usable.
    #[error("cluster settings: {0}")]
    BadConfig(String),
    /// This build of swarmtodo has no NATS: it was built without the `nats` cargo
    /// feature.
    #[error(
        "this swarmtodo was built without NATS (the `nats` cargo feature): build it with \
         its default features to join a cluster, or run the hub alone"
    )]
    NotBuilt,
    /// A JetStream request failed (the server is down, has no JetStream, timed out).
    #[error("JetStream: {0}")]
    JetStream(String),
    /// The lease bucket counts another time to live than this hub was given.
    #[error(
        "the lease bucket keeps leases {bucket:?}, this hub was given {configured:?}: give \
         every hub of the cluster the same lease"
    )]
    LeaseTtlMismatch {
        /// The bucket's.
        bucket: Duration,
        /// This hub's.
        configured: Duration,
    },
    /// Another hub is the list's authority.
    #[error("list {doc} is held by hub {by}: send its writes there, or wait for its lease to end")]
    LeaseHeld {
        /// The list.
        doc: DocId,
        /// The holder.
        by: String,
    },
    /// The list's lease was held a moment ago and is free now: its holder just gave it
    /// back or let it end.
    #[error("list {doc} is changing hands between hubs: retry")]
    LeaseChanging {
        /// The list.
        doc: DocId,
    },
    /// This hub's term as the list's authority ended: another hub took it.
    #[error("this hub lost list {doc} to another hub: stop acting for it, take it again")]
    LeaseLost {
        /// The list.
        doc: DocId,
    },
    /// This hub's lease ran out before it could renew it.
    #[error("this hub's lease on list {doc} ran out: stop acting for it, take it again")]
    LeaseExpired {
        /// The list.
        doc: DocId,
    },
    /// The log refused an append: the list's log moved past what the writer saw
    /// (another hub took the list and fenced it).
    #[error(
        "the log of list {doc} refused an append after sequence {expected}: another hub \
         holds the list"
    )]
    Fenced {
        /// The list.
        doc: DocId,
        /// The sequence the append named.
        expected: u64,
    },
    /// A snapshot does not carry the events the log holds: it is not the list as the
    /// log holds it, and is not written.
    #[error(
        "a snapshot of list {doc} carries {carried} events where the log holds {logged:?}: \
         the hub's store and the log differ; the log is left as it is"
    )]
    SnapshotMismatch {
        /// The list.
        doc: DocId,
        /// The events the log holds (`None`: the holder has not read it).
        logged: Option<u64>,
        /// The events the snapshot carries.
        carried: u64,
    },
    /// The log moved on between the point a snapshot was made for and its rollup: it
    /// is not the list as the log holds it now, and is not written.
    #[error(
        "a snapshot of list {doc} was made for the log at {made_at}, which is at {log_at} \
         now: the log is left as it is; the next rollup makes a new one"
    )]
    SnapshotStale {
        /// The list.
        doc: DocId,
        /// Where the log ended when the snapshot was made.
        made_at: u64,
        /// Where it ends now.
        log_at: u64,
    },
    /// A record is larger than its limit.
    #[error("{what} is {bytes} bytes, more than the {max} allowed")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// No hub listens on the subject of the hub a call was forwarded to: it stopped.
    #[error(
        "hub {hub} does not answer on NATS: it stopped, and the lists it held move to \
         another hub when their leases end; retry"
    )]
    NoResponder {
        /// The hub.
        hub: String,
    },
    /// The hub a call was forwarded to did not answer in time: the call may or may not
    /// have taken effect there.
    #[error(
        "hub {hub} did not answer a forwarded call within {wait:?}: it may be paused or \
         overloaded; the call may have taken effect there, read the list before retrying"
    )]
    ForwardTimeout {
        /// The hub.
        hub: String,
        /// How long it was waited for.
        wait: Duration,
    },
    /// What came back from the hub a call was forwarded to is not a whole answer.
    #[error("hub {hub} answered a forwarded call with a broken message: {why}")]
    BadForward {
        /// The hub.
        hub: String,
        /// What is wrong.
        why: String,
    },
    /// The hub's own store failed or refused what the log holds.
    #[error("the hub's store: {0}")]
    Store(#[from] swarmtodo_store::StoreError),
    /// The hub's own store holds more of a list than the cluster's log: it was written
    /// outside the cluster.
    #[error(
        "the hub's store holds {stored} events of list {doc}, the cluster's log {logged}: \
         the store was written outside the cluster; give the hub a fresh data file"
    )]
    StoreAhead {
        /// The list.
        doc: DocId,
        /// Events in the store.
        stored: u64,
        /// Events in the log.
        logged: u64,
    },
    /// A record of the log does not decode.
    #[error("record {seq} of the log does not decode: {reason}")]
    CorruptRecord {
        /// Its sequence.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
}

impl ClusterError {
    /// A stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ClusterError::Connect { .. } => "cluster_connect",
            ClusterError::BadConfig(_) => "cluster_bad_config",
            ClusterError::NotBuilt => "cluster_not_built",
            ClusterError::JetStream(_) => "cluster_jetstream",
            ClusterError::LeaseTtlMismatch { .. } => "cluster_lease_ttl_mismatch",
            ClusterError::LeaseHeld { .. } => "cluster_lease_held",
            ClusterError::LeaseChanging { .. } => "cluster_lease_changing",
            ClusterError::LeaseLost { .. } => "cluster_lease_lost",
            ClusterError::LeaseExpired { .. } => "cluster_lease_expired",
            ClusterError::Fenced { .. } => "cluster_fenced",
            ClusterError::TooLarge { .. } => "cluster_too_large",
            ClusterError::SnapshotMismatch { .. } => "cluster_snapshot_mismatch",
            ClusterError::SnapshotStale { .. } => "cluster_snapshot_stale",
            ClusterError::NoResponder { .. } => "cluster_no_responder",
            ClusterError::ForwardTimeout { .. } => "cluster_forward_timeout",
            ClusterError::BadForward { .. } => "cluster_bad_forward",
            ClusterError::Store(_) => "cluster_store",
            ClusterError::StoreAhead { .. } => "cluster_store_ahead",
            ClusterError::CorruptRecord { .. } => "cluster_corrupt_record",
        }
    }
}
