//! Every limit of the store, in one place; the const asserts at the end tie them to each
//! other and to SQLite's own ceiling.

/// Most requests waiting for the store thread. When the queue is full an async caller
/// waits for a free slot (backpressure onto the connection that caused the write),
/// nothing is dropped.
pub const STORE_QUEUE_MAX: usize = 1024;

/// Longest a connection waits for another connection's lock on the same file before a
/// call fails with `SQLITE_BUSY` (only several processes or several [`Db`](crate::Db)s on one file
/// ever wait).
pub const STORE_BUSY_TIMEOUT_MS: u64 = 5_000;

/// Longest list name, in bytes.
pub const LIST_NAME_BYTES_MAX: usize = 256;

/// Largest single change, in bytes (as Automerge encodes it, compressed when larger than
/// its compression threshold): what a peer may send in a sync message, so that every
/// stored change can be sent again.
pub use swarmtodo_core::limits::CHANGE_BYTES_MAX;

/// Most lists [`Db::lists`](crate::Db::lists) returns at once (a page of `GET /v1/lists`).
pub use swarmtodo_proto::LISTS_PAGE_MAX;

/// Largest snapshot (a saved whole document), in bytes.
pub const SNAPSHOT_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Largest event, in bytes of JSON.
pub const EVENT_BYTES_MAX: usize = 1024 * 1024;

/// Longest event kind (`tasks_changed`, `violation`, …), in bytes.
pub const EVENT_KIND_BYTES_MAX: usize = 64;

/// Longest reported key, in bytes.
pub const REPORTED_KEY_BYTES_MAX: usize = 4096;

/// Most changes, events or keys in one batch (each counted on its own).
pub const BATCH_ITEMS_MAX: usize = 1 << 20;

/// Most bytes of changes, events and keys together in one batch: one transaction's
/// worth of memory.
pub const BATCH_BYTES_MAX: usize = 512 * 1024 * 1024;

/// Most events one [`Db::events_since`](crate::Db::events_since) call returns, whatever limit it is asked for.
pub const EVENTS_PAGE_MAX: usize = 10_000;

/// Most heads a snapshot may claim to cover.
pub const SNAPSHOT_HEADS_MAX: usize = 1024;

/// SQLite's own ceiling on a string or blob (`SQLITE_MAX_LENGTH`, compiled default).
const SQLITE_LENGTH_MAX: usize = 1_000_000_000;

const _: () = assert!(CHANGE_BYTES_MAX <= BATCH_BYTES_MAX);
const _: () = assert!(EVENT_BYTES_MAX <= BATCH_BYTES_MAX);
const _: () = assert!(REPORTED_KEY_BYTES_MAX <= BATCH_BYTES_MAX);
const _: () = assert!(SNAPSHOT_BYTES_MAX < SQLITE_LENGTH_MAX);
const _: () = assert!(BATCH_BYTES_MAX < SQLITE_LENGTH_MAX);
const _: () = assert!(EVENTS_PAGE_MAX <= i64::MAX as usize);
const _: () = assert!(STORE_QUEUE_MAX > 0);
