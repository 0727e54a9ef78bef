//! The hub: the authority node that speaks the automerge-repo sync protocol over
//! WebSocket (DESIGN.md §2, §7, §8).
//!
//! - [`wire`]: the automerge-repo wire messages and their CBOR codec.
//! - [`syncmsg`]: validation of Automerge sync messages before Automerge sees them.

pub mod syncmsg;
pub mod wire;
