//! What stands in for `nats/` when the crate is built without the `nats` cargo feature:
//! the same types and methods, none of which can be made (each holds a value of a type
//! that has none). [`Cluster::connect`] checks
//! the settings and refuses with `cluster_not_built`; every other method belongs to a
//! value that cannot exist, so a hub built so runs alone and its code needs no feature
//! of its own. The compiler keeps the two halves alike: the hub and the simulations
//! build against either.

use std::time::Duration;

use bytes::Bytes;
use swarmtodo_store::{Batch, DocId, Loaded, StoredEvent};

use crate::directory::{Bucket, Keyed};
use crate::log::Read;
use crate::record::Snapshot;
use crate::tenure::{KeptSnapshot, LogPoint, Tenure};
use crate::{ClusterConfig, ClusterError, SessionMessage};

/// A hub's handle on the cluster: none can be made in a build without NATS.
#[derive(Debug, Clone)]
pub struct Cluster {
    never: Never,
}

impl Cluster {
    /// Checks `config`, then refuses: this build has no NATS (`cluster_not_built`).
    pub async fn connect(config: &ClusterConfig) -> Result<Cluster, ClusterError> {
        config.check()?;
        Err(ClusterError::NotBuilt)
    }

    /// Runs `task` on the runtime the cluster was connected on.
    pub fn spawn<F>(&self, _task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.never {}
    }

    /// This hub's id.
    pub fn hub(&self) -> &str {
        match self.never {}
    }

    /// How long a lease lasts unless renewed.
    pub fn lease_ttl(&self) -> Duration {
        match self.never {}
    }

    /// Reads list `doc`'s log after sequence `after`.
    pub async fn read(&self, _doc: DocId, _after: u64) -> Result<Read, ClusterError> {
        match self.never {}
    }

    /// The sequence of the last message of `doc`'s log.
    pub async fn last_seq(&self, _doc: DocId) -> Result<u64, ClusterError> {
        match self.never {}
    }

    /// Sends a call to hub `to` and waits for its answer.
    pub async fn forward(
        &self,
        _to: &str,
        _body: &[u8],
        _wait: Duration,
    ) -> Result<Vec<u8>, ClusterError> {
        match self.never {}
    }

    /// The calls other hubs forward to this one.
    pub async fn forwarded(&self) -> Result<Forwarded, ClusterError> {
        match self.never {}
    }

    /// Sends a message of a carried session to hub `to`.
    pub async fn session_send(
        &self,
        _to: &str,
        _session: &str,
        _op: &str,
        _seq: u64,
        _body: &[u8],
    ) -> Result<(), ClusterError> {
        match self.never {}
    }

    /// The messages of the sessions other hubs hold with this one.
    pub async fn sessions(&self) -> Result<SessionMessages, ClusterError> {
        match self.never {}
    }

    /// The hub that holds list `doc` now and its lease's revision, if any.
    pub async fn holder(&self, _doc: DocId) -> Result<Option<(String, u64)>, ClusterError> {
        match self.never {}
    }

    /// Takes list `doc`.
    pub async fn take(&self, _doc: DocId) -> Result<Tenure, ClusterError> {
        match self.never {}
    }

    /// Purges list `doc`'s snapshot parts but `keep`.
    pub async fn sweep_snapshot_parts(
        &self,
        _doc: DocId,
        _keep: Option<&str>,
    ) -> Result<usize, ClusterError> {
        match self.never {}
    }

    /// Appends a commit to the list's log.
    pub async fn append(&self, _tenure: &mut Tenure, _batch: &Batch) -> Result<u64, ClusterError> {
        match self.never {}
    }

    /// Encodes a snapshot for its rollup.
    pub async fn keep_snapshot(
        &self,
        _at: LogPoint,
        _snapshot: &Snapshot,
    ) -> Result<KeptSnapshot, ClusterError> {
        match self.never {}
    }

    /// Rolls the list's log up into `snapshot`.
    pub async fn roll_up(
        &self,
        _tenure: &mut Tenure,
        _snapshot: KeptSnapshot,
    ) -> Result<u64, ClusterError> {
        match self.never {}
    }

    /// True when the list's log is due for a rollup.
    pub fn rollup_due(&self, _tenure: &Tenure) -> bool {
        match self.never {}
    }

    /// Renews the term's lease.
    pub async fn renew(&self, _tenure: &mut Tenure) -> Result<(), ClusterError> {
        match self.never {}
    }

    /// Gives the term's lease back.
    pub async fn release(&self, _tenure: &mut Tenure) -> Result<(), ClusterError> {
        match self.never {}
    }

    /// Follows list `doc`'s log from its start.
    pub async fn follow(&self, _doc: DocId) -> Result<Follow, ClusterError> {
        match self.never {}
    }

    /// Every event of list `doc` as its log numbers them now.
    pub async fn events(&self, _doc: DocId) -> Result<Vec<StoredEvent>, ClusterError> {
        match self.never {}
    }

    /// List `doc`'s document as its log holds it now.
    pub async fn document(&self, _doc: DocId) -> Result<Option<Loaded>, ClusterError> {
        match self.never {}
    }

    /// Writes `value` at `key` in the directory's `bucket`.
    pub async fn directory_put(
        &self,
        _bucket: Bucket,
        _key: &str,
        _value: Bytes,
    ) -> Result<(), ClusterError> {
        match self.never {}
    }

    /// Watches the directory's `bucket`.
    pub async fn watch(&self, _bucket: Bucket) -> Result<Watched, ClusterError> {
        match self.never {}
    }
}

/// A reader of one list's events as the log takes them: none without NATS.
#[derive(Debug)]
pub struct Follow {
    never: Never,
}

impl Follow {
    /// The events numbered so far.
    pub fn numbered(&self) -> u64 {
        match self.never {}
    }

    /// The events the log took since the last call.
    pub async fn next(&mut self, _wait: Duration) -> Result<Vec<StoredEvent>, ClusterError> {
        match self.never {}
    }
}

/// A watch of one of the directory's buckets: none without NATS.
#[derive(Debug)]
pub struct Watched {
    never: Never,
}

impl Watched {
    /// True once the watch has brought the last value of every key.
    pub fn is_current(&self) -> bool {
        match self.never {}
    }

    /// The next key written.
    pub async fn next(&mut self) -> Option<Result<Keyed, ClusterError>> {
        match self.never {}
    }
}

/// The calls other hubs forward to this one: none without NATS.
#[derive(Debug)]
pub struct Forwarded {
    never: Never,
}

impl Forwarded {
    /// The next whole call.
    pub async fn next(&mut self) -> Option<ForwardedCall> {
        match self.never {}
    }
}

/// One call forwarded by another hub: none without NATS.
#[derive(Debug)]
pub struct ForwardedCall {
    /// What the other hub sent.
    pub body: Vec<u8>,
    never: Never,
}

impl ForwardedCall {
    /// Sends the answer back to the hub that forwarded the call.
    pub async fn answer(&self, _body: &[u8]) -> Result<(), ClusterError> {
        match self.never {}
    }
}

/// The messages of the sessions other hubs hold with this one: none without NATS.
#[derive(Debug)]
pub struct SessionMessages {
    never: Never,
}

impl SessionMessages {
    /// The next whole message.
    pub async fn next(&mut self) -> Option<SessionMessage> {
        match self.never {}
    }
}

/// What no value is. A field of a private type, so that the hub, which cannot see it,
/// takes the types above for ones it may hold: it is linted as in a build with NATS,
/// not as code after a value that cannot be.
#[derive(Debug, Clone, Copy)]
enum Never {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_build_without_nats_refuses_to_join_a_cluster_after_checking_the_settings() {
        let refused = Cluster::connect(&ClusterConfig::new("nats://127.0.0.1:4222", "hub-a"))
            .await
            .err();
        assert_eq!(
            refused.as_ref().map(ClusterError::code),
            Some("cluster_not_built")
        );
        let bad = Cluster::connect(&ClusterConfig::new("nats://127.0.0.1:4222", "hub a"))
            .await
            .err();
        assert_eq!(
            bad.as_ref().map(ClusterError::code),
            Some("cluster_bad_config")
        );
    }
}
