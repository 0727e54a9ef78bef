//! The hub: the authority node that speaks the automerge-repo sync protocol over
//! WebSocket (docs/DESIGN.md §2, §7, §8).
//!
//! - [`wire`]: the automerge-repo wire messages and their CBOR codec.
//! - [`syncmsg`]: validation of Automerge sync messages before Automerge sees them.
//! - [`core`]: the sans-I/O hub: messages in, effects (commit, send, close) out.
//! - [`server`]: the tokio runtime around the core: listener, connections, hub task.
//! - `persist`: the core's commits into the SQLite [`Store`].

pub mod core;
pub(crate) mod persist;
pub mod server;
pub mod syncmsg;
pub mod wire;

use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;

use automerge::ActorId;

use self::core::{HubConfig, HubCore};
use self::server::ServeError;
use self::wire::{DocumentId, PeerId};
use crate::authority::{Policy, Roles};
use crate::store::{Store, StoreError};

/// The agent id the hub's repairs are recorded under.
pub const HUB_AGENT: &str = "swarmtodo-hub";

/// A hub ready to serve: its store opened and its lists known (each is loaded when a
/// peer asks for it).
#[derive(Debug)]
pub struct Hub {
    core: HubCore,
    store: Store,
    known: BTreeSet<DocumentId>,
    access: server::Access,
    limits: server::ConnLimits,
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
        let known = persist::stored(&store, &mut core).await?;
        Ok(Hub {
            core,
            store,
            known,
            access: server::Access::Open,
            limits: server::ConnLimits::default(),
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
            shutdown,
        )
        .await
    }
}

impl HubConfig {
    /// The default configuration for a hub writing repairs as `actor`.
    pub fn new(actor: ActorId) -> HubConfig {
        let peer_id = PeerId::new(format!("swarmtodo-hub-{}", actor.to_hex_string()))
            .unwrap_or_else(|_| unreachable_peer_id());
        HubConfig {
            peer_id,
            actor,
            agent: HUB_AGENT.to_owned(),
            policy: Policy::default(),
            roles: Roles::default(),
            sync_limits: syncmsg::Limits::default(),
            sync_work: (core::SYNC_WORK_BURST, core::SYNC_WORK_PER_SECOND),
            list_creations: (core::LIST_CREATIONS_BURST, core::LIST_CREATIONS_PER_MINUTE),
        }
    }
}

#[allow(clippy::expect_used)] // "swarmtodo-hub" is a valid peer id: non-empty, short, no control characters.
fn unreachable_peer_id() -> PeerId {
    PeerId::new("swarmtodo-hub").expect("a constant, valid peer id")
}
