//! swarmtodo: the shared, live, typed todo state of agent swarms.
//!
//! This crate is the `swarmtodo` binary (hub, simulator, demo, schema) and one place to
//! depend on for all of it. The work is done by the crates it re-exports, from the bottom
//! layer up (ARCHITECTURE.md draws them):
//!
//! - [`proto`] (`swarmtodo-proto`): the JSON types with their schemas, and the
//!   automerge-repo wire messages ([`proto::wire`]).
//! - [`model`], [`authority`] (`swarmtodo-core`): the list as an Automerge document,
//!   `todo_write` / `todo_read`, the invariant checks, events and repairs; with the
//!   sync-message validator and the sans-I/O hub core ([`hub::core`]). No I/O.
//! - [`store`] (`swarmtodo-store`): SQLite storage, and the core's commits into it.
//! - [`client`] (`swarmtodo-client`): the Rust client (no SQLite, no hub).
//! - [`hub`] (`swarmtodo-hub`, with the core's parts it drives): listener, connections,
//!   the hub task, configuration ([`config`]).
//! - [`sim`] (`swarmtodo-sim`): deterministic and live simulations of swarms.
#![warn(missing_docs)]

pub use swarmtodo_client as client;
pub use swarmtodo_core::{authority, model};
pub use swarmtodo_hub::{config, memory};
pub use swarmtodo_proto as proto;
pub use swarmtodo_sim as sim;
pub use swarmtodo_store as store;

/// The hub: the server (`swarmtodo-hub`) and the parts of the core it drives.
pub mod hub {
    pub use swarmtodo_core::hub as core;
    pub use swarmtodo_core::syncmsg;
    pub use swarmtodo_hub::*;
    pub use swarmtodo_proto::wire;
    pub use swarmtodo_store::persist;
}
