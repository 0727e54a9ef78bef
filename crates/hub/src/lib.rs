//! The hub: the authority node that speaks the automerge-repo sync protocol over
//! WebSocket (docs/DESIGN.md §2, §7, §8). The sans-I/O core it drives is
//! [`swarmtodo_core::hub`]; its store is [`swarmtodo_store`].
//!
//! - [`server`]: the tokio runtime around the core: the listener and the connections;
//!   the hub task (which owns the core and drives its effects) beside it, and what the
//!   two exchange (`channel.rs`).
//! - [`limits`]: every bound of the runtime, as named constants.
//! - [`config`]: the configuration file (policy, roles, tokens, limits).
//! - [`memory`]: a counting allocator for memory measurements.

mod access;
mod board;
mod channel;
mod cluster;
pub mod config;
mod directory;
mod forward;
pub mod http;
mod hub_task;
pub mod limits;
pub mod memory;
mod metrics;
mod past;
mod rebuild;
pub mod server;
mod sessions;
mod stream;

use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;

use automerge::ActorId;

use self::server::ServeError;
use swarmtodo_core::hub::{HubConfig, HubCore};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_store::{Store, StoreError};

pub use cluster::TERM_ENDED_LOG;
pub use swarmtodo_core::hub::HUB_AGENT;

/// A hub ready to serve: its store opened and its lists known (each is loaded when a
/// peer asks for it).
#[derive(Debug)]
pub struct Hub {
    core: HubCore,
    store: Store,
    known: BTreeSet<DocumentId>,
    access: server::Access,
    limits: server::ConnLimits,
    cluster: Option<swarmtodo_cluster::Cluster>,
}

impl Hub {
    /// Opens (or creates) the SQLite file at `path`; its lists are loaded when a peer
    /// asks for them.
    pub async fn open(path: &Path) -> Result<Hub, StoreError> {
        let store = Store::open(path.to_path_buf()).await?;
        Hub::with_store(store, HubConfig::new(ActorId::random())).await
    }

    /// Opens (or creates) the SQLite file at `path` with the given core configuration.
    pub async fn open_with(path: &Path, config: HubConfig) -> Result<Hub, StoreError> {
        let store = Store::open(path.to_path_buf()).await?;
        Hub::with_store(store, config).await
    }

    /// A hub on an opened store with the given core configuration.
    pub async fn with_store(store: Store, config: HubConfig) -> Result<Hub, StoreError> {
        let mut core = HubCore::new(config);
        let known = swarmtodo_store::persist::stored(&store, &mut core).await?;
        Ok(Hub {
            core,
            store,
            known,
            access: server::Access::Open,
            limits: server::ConnLimits::default(),
            cluster: None,
        })
    }

    /// Who may connect (default: anyone who reaches the socket).
    pub fn with_access(mut self, access: server::Access) -> Hub {
        self.access = access;
        self
    }

    /// The bounds on connections (default: the named constants of [`server`]).
    pub fn with_limits(mut self, limits: server::ConnLimits) -> Hub {
        self.limits = limits;
        self
    }

    /// Makes the hub one of a cluster (docs/DESIGN.md §10): it acts for a list only
    /// while it holds the list's lease, and commits to the list's log before its
    /// store. Its core must have been made with
    /// [`HubConfig::every_list_stored`](swarmtodo_core::hub::HubConfig::every_list_stored)
    /// and the peer id [`swarmtodo_cluster::CLUSTER_PEER_ID`]; `cluster` connected on
    /// a runtime of its own ([`swarmtodo_cluster::Cluster::connect`]).
    pub fn with_cluster(mut self, cluster: swarmtodo_cluster::Cluster) -> Hub {
        self.cluster = Some(cluster);
        self
    }

    /// Serves on `listener` until `shutdown` resolves (see [`server::run`]).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        server::run(
            listener,
            self.core,
            self.store,
            self.known,
            self.access,
            self.limits,
            self.cluster,
            shutdown,
        )
        .await
    }
}
