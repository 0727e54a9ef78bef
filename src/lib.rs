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
//! - [`cluster`] (`swarmtodo-cluster`): many hubs on NATS JetStream — each list's log,
//!   one authority per list by a fenced lease.
//! - [`mcp`]: `swarmtodo mcp`, one agent's MCP server (stdio) over the hub's JSON API.
#![warn(missing_docs)]

pub mod mcp;

pub use swarmtodo_client as client;
pub use swarmtodo_cluster as cluster;
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

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn times_read_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_868_799_000), "2000-02-29 23:59:59");
        assert_eq!(utc(1_796_405_786_999), "2026-12-04 17:36:26");
    }
}
