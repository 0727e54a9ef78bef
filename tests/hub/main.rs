//! The hub end to end: real `swarmtodo serve` processes and real clients; its core
//! driven directly; every attack a hostile peer can try.
//! One test binary; each module is one part (they share `tests/common`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod bad_input;
mod board;
mod cli;
#[cfg(feature = "nats")]
mod cluster;
mod delegation;
mod e2e;
mod hostile_peers;
mod http;
mod hub_core;
mod identity;
mod limits;
mod mcp;
mod presence;
mod relay;
mod watch;
