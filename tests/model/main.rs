//! The model and the authority: `todo_write`, the rules and repairs, the sync window,
//! and properties over random histories.
//! One test binary; each module is one part (they share `tests/common`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

#[path = "../common/mod.rs"]
mod common;

mod authority_rules;
mod history;
mod properties;
mod sync_fast;
mod todo;
