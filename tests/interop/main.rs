//! Interoperability with automerge-repo peers this project did not write: the JS
//! reference implementation and samod.
//! One test binary; each module is one part (they share `tests/common`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

#[path = "../common/mod.rs"]
mod common;

mod js;
mod samod;
