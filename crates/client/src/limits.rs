//! Every limit and timeout of the client, in one place.

use std::time::Duration;

/// Once in sync, how long a sync waits for trailing messages (a repair) before it
/// returns.
pub const SYNC_SETTLE: Duration = Duration::from_millis(50);
/// How long a sync may take before it fails.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the client waits, after the hub's `error` message, for the close that
/// follows it (its code and reason go into [`ClientError::Closed`](crate::ClientError)).
pub const CLOSE_AFTER_ERROR_WAIT: Duration = Duration::from_millis(500);
/// How long the connection and handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most round trips one [`Connection::sync`](crate::Connection::sync) makes before
/// giving up.
pub const SYNC_ROUNDS_MAX: usize = 10_000;
/// Events a [`Connection`](crate::Connection) keeps for
/// [`Connection::take_events`](crate::Connection::take_events), and a
/// [`SyncedList`](crate::SyncedList)'s subscribers may lag behind by, before the oldest
/// are dropped (the store keeps them all: read them back from there).
pub const EVENTS_BUFFERED_MAX: usize = 1_024;
/// First wait before reconnecting; doubled after every failure up to
/// [`RECONNECT_BACKOFF_MAX`].
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Write notifications queued for the sync task (more are coalesced: one sync sends
/// every pending change).
pub(crate) const NUDGES_MAX: usize = 1;

/// How long one call of the JSON API ([`crate::http::Api`]) may take, connecting
/// included (a write is answered once durable, well within it).
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer of the JSON API the client reads (a snapshot of a full list of long
/// tasks fits).
pub const HTTP_ANSWER_BYTES_MAX: usize = 64 * 1024 * 1024;
