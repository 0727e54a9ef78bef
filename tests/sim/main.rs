//! The simulator: deterministic runs with planted bugs the checker must catch, and live
//! runs against a real hub.
//! One test binary; each module is one part.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

mod deterministic;
mod live;
