//! What a hub does on NATS (the `nats` cargo feature): [`Cluster`], its connection and
//! what it opened there — the log stream, the lease bucket, the directory's buckets —
//! and the subjects hubs forward calls and carry sessions on.

mod directory;
mod follow;
mod forward;
mod lease;
mod log;
mod tenure;

use std::time::Duration;

use swarmtodo_store::DocId;

pub use self::directory::Watched;
pub use self::follow::Follow;
pub use self::forward::{
    call_subject, Forwarded, ForwardedCall, SessionMessages, CALL_SUBJECT_PREFIX, OP, SEQ, SESSION,
    SESSION_SUBJECT_PREFIX,
};
pub use self::lease::LEASE_BUCKET;
pub use self::log::{subject, LOG_STREAM, LOG_SUBJECT_PREFIX, SNAPSHOT_SUBJECT_PREFIX};
use crate::limits::NATS_REQUEST_TIMEOUT;
use crate::log::Read;
use crate::{ClusterConfig, ClusterError};

/// The headers of a log record (docs/DESIGN.md §10).
pub mod headers {
    pub use super::log::{HUB, KIND, LEASE, PART, SNAPSHOT_PARTS};
}

/// One hub's handle on the cluster.
#[derive(Debug, Clone)]
pub struct Cluster {
    hub: String,
    client: async_nats::Client,
    /// The runtime it was connected on, where its own tasks run.
    runtime: tokio::runtime::Handle,
    log: log::Log,
    leases: lease::Leases,
    directory: directory::Directory,
    rollup_after: u64,
}

impl Cluster {
    /// Connects to NATS and opens (or makes) the log stream and the lease bucket. The
    /// connection's own task, and those of [`Cluster::spawn`], run on the runtime this
    /// is called on: a hub gives the cluster a runtime of its own, so that no long merge
    /// of the hub's delays the renewal of a lease.
    pub async fn connect(config: &ClusterConfig) -> Result<Cluster, ClusterError> {
        config.check()?;
        let hub = &config.hub;
        let client = async_nats::ConnectOptions::new()
            .name(format!("swarmtodo hub {hub}"))
            .request_timeout(Some(NATS_REQUEST_TIMEOUT))
            .connect(config.url.split(',').map(str::trim).collect::<Vec<_>>())
            .await
            .map_err(|e| ClusterError::Connect {
                url: config.url.clone(),
                reason: e.to_string(),
            })?;
        let mut js = async_nats::jetstream::new(client.clone());
        js.set_timeout(NATS_REQUEST_TIMEOUT);
        let log = log::Log::open(js.clone(), config.replicas).await?;
        let leases = lease::Leases::open(&js, hub, config.lease_ttl, config.replicas).await?;
        let directory = directory::Directory::open(&js, config.replicas).await?;
        Ok(Cluster {
            hub: hub.clone(),
            client,
            runtime: tokio::runtime::Handle::current(),
            log,
            leases,
            directory,
            rollup_after: config.rollup_after_commits,
        })
    }

    /// Runs `task` on the runtime the cluster was connected on.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime.spawn(task)
    }

    /// This hub's id.
    pub fn hub(&self) -> &str {
        &self.hub
    }

    /// How long a lease lasts unless renewed (renew every third of it).
    pub fn lease_ttl(&self) -> Duration {
        self.leases.ttl()
    }

    /// Reads list `doc`'s log after sequence `after` (0: from its start), up to its end
    /// as it is now.
    pub async fn read(&self, doc: DocId, after: u64) -> Result<Read, ClusterError> {
        self.log.read(doc, after).await
    }

    /// The sequence of the last message of `doc`'s log (0: none).
    pub async fn last_seq(&self, doc: DocId) -> Result<u64, ClusterError> {
        self.log.last_seq(doc).await
    }

    /// Sends a call (`body`) to hub `to` and waits up to `wait` (at most
    /// [`limits::FORWARD_WAIT_MAX`]) for its answer.
    pub async fn forward(
        &self,
        to: &str,
        body: &[u8],
        wait: Duration,
    ) -> Result<Vec<u8>, ClusterError> {
        forward::forward(&self.client, to, body, wait).await
    }

    /// The calls other hubs forward to this one.
    pub async fn forwarded(&self) -> Result<Forwarded, ClusterError> {
        Forwarded::subscribe(self.client.clone(), &self.hub).await
    }

    /// Sends `body` to hub `to` as message `seq` (see [`SessionMessage::seq`]), `op`, of
    /// session `session` (a sync peer of a list `to` holds, carried by this hub; or that
    /// peer's answers, carried back).
    ///
    /// [`SessionMessage::seq`]: crate::SessionMessage::seq
    pub async fn session_send(
        &self,
        to: &str,
        session: &str,
        op: &str,
        seq: u64,
        body: &[u8],
    ) -> Result<(), ClusterError> {
        forward::session_send(&self.client, to, session, op, seq, body).await
    }

    /// The messages of the sessions other hubs hold with this one.
    pub async fn sessions(&self) -> Result<SessionMessages, ClusterError> {
        SessionMessages::subscribe(&self.client, &self.hub).await
    }

    /// The hub that holds list `doc` now and its lease's revision, if any.
    pub async fn holder(&self, doc: DocId) -> Result<Option<(String, u64)>, ClusterError> {
        self.leases.holder(doc).await
    }
}
