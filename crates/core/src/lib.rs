//! The sans-I/O core of swarmtodo: everything that decides, nothing that waits.
//!
//! - [`model`]: the todo list as an Automerge document, a replica with `todo_write` and
//!   `todo_read` (docs/DESIGN.md §3, §5), and the sync window ([`model::sync`]).
//! - [`authority`]: the invariant checks, events and repairs run after every merge
//!   (docs/DESIGN.md §4).
//! - [`syncmsg`]: validation of Automerge sync messages before Automerge sees them.
//! - [`hub`]: the hub core: messages in, effects (commit, send, close) out.
//! - [`limits`]: every limit of the core in one place.
//!
//! Architecture invariant: this crate does no I/O, reads no clock and draws no random
//! numbers; time and randomness come in as arguments. Its dependencies say so: no tokio,
//! no SQLite (checked by a test of the workspace).
#![warn(missing_docs)]

pub mod authority;
mod format;
pub mod hub;
pub mod limits;
pub mod model;
pub mod syncmsg;

/// The wire types (re-exported from `swarmtodo-proto`).
pub use swarmtodo_proto as proto;
