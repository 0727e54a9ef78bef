//! swarmtodo: the shared, live, typed todo state of agent swarms.
//!
//! - [`model`]: the todo list as an Automerge document, a replica with `todo_write` and
//!   `todo_read` (docs/DESIGN.md §3, §5).
//! - [`authority`]: the invariant checks, events and repairs run after every merge
//!   (docs/DESIGN.md §4).
//! - [`proto`]: the wire types every client reads.
//! - [`sim`]: deterministic simulation of swarms against the real hub core (one seed,
//!   simulated time and network, SQLite store).
//!
//! The model and the authority do no I/O and read no clock.
#![warn(missing_docs)]

pub mod authority;
pub mod client;
pub mod config;
pub mod hub;
pub mod memory;
pub mod model;
pub mod sim;
pub mod store;

/// The wire types (re-exported from `swarmtodo-proto`).
pub use swarmtodo_proto as proto;
