//! Every limit and timing of the cluster, in one place.

use std::time::Duration;

/// Largest payload of one log message, in bytes. A record larger than this is split
/// into parts (`record.rs`); with the part's headers it stays under NATS's default
/// `max_payload` of 1 MiB, so a stock server takes it.
pub const LOG_PART_BYTES_MAX: usize = 1_000_000;

/// Largest record (a commit's changes, events and keys, encoded), in bytes: a list's
/// first sync of a long history is one commit. Beyond it an append is refused with
/// `cluster_too_large` before anything is written.
pub const LOG_RECORD_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Most parts of one record.
pub const LOG_RECORD_PARTS_MAX: usize = LOG_RECORD_BYTES_MAX.div_ceil(LOG_PART_BYTES_MAX);

/// How many commits a list's log takes after its last snapshot (or its start) before
/// the holder rolls it up into a new one, by default: a hub taking the list reads the
/// snapshot and at most about this many commits.
pub const LOG_ROLLUP_AFTER_COMMITS: u64 = 1_000;

/// Longest hub id, in bytes (it names the holder of a lease and the writer of a record).
pub const HUB_ID_BYTES_MAX: usize = 128;

/// How long a lease lasts unless renewed, by default. The holder renews it every third
/// of this; a hub that stops (a crash, a pause, a cut from NATS) loses the lists it held
/// after at most this long, and another hub takes them.
pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(5);

/// Shortest lease a cluster may be configured with.
pub const LEASE_TTL_MIN: Duration = Duration::from_secs(1);

/// How long before its lease ends by the bucket's clock a holder stops acting: the
/// holder counts from the moment it *sent* the request that granted the lease, which is
/// before the server stamped it, and keeps this much more in hand for the time between
/// its last check and an append reaching the log.
pub const LEASE_MARGIN: Duration = Duration::from_millis(250);

/// Most times taking a list retries its fence when the log moved under it (a former
/// holder's last appends landing): past this the take fails and the list stays free.
pub const FENCE_ATTEMPTS_MAX: usize = 8;

/// Longest a JetStream request (an append, a lease update, a read) waits for its answer.
pub const NATS_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Most messages one fetch of a log read brings.
pub const READ_BATCH_MESSAGES: usize = 256;

/// Most bytes one fetch of a log read brings (a few of the largest parts).
pub const READ_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// How long the server keeps a log read's consumer after its last fetch, if the hub
/// that made it does not delete it (it died mid-read).
pub const READ_CONSUMER_IDLE: Duration = Duration::from_secs(30);

/// How often a follower of a list's log reads it when no record rang its doorbell: what
/// the doorbell missed (it is made again after a fault) is read within this.
pub const FOLLOW_POLL: Duration = Duration::from_secs(5);

/// How often a follower reads the log while its doorbell cannot be made (NATS failing).
pub const FOLLOW_RETRY: Duration = Duration::from_millis(500);

const _: () = assert!(READ_BATCH_BYTES > LOG_PART_BYTES_MAX + 64 * 1024);
const _: () = assert!(LEASE_TTL_MIN.as_millis() > 2 * LEASE_MARGIN.as_millis());
const _: () = assert!(LEASE_TTL_DEFAULT.as_millis() >= LEASE_TTL_MIN.as_millis());
const _: () = assert!(LOG_PART_BYTES_MAX < 1024 * 1024);

/// Largest payload of one part of a forwarded call or of its answer, in bytes (as a log
/// part: under NATS's default `max_payload`).
pub const FORWARD_PART_BYTES_MAX: usize = LOG_PART_BYTES_MAX;

/// Largest forwarded call or answer, in bytes: a write of a full list, or a read of one,
/// with room to spare. A larger one is refused with `cluster_too_large`.
pub const FORWARD_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Most parts of one forwarded call or answer.
pub const FORWARD_PARTS_MAX: usize = FORWARD_BYTES_MAX.div_ceil(FORWARD_PART_BYTES_MAX);

/// Most forwarded calls a hub holds half received (their first parts come, the others
/// not yet); one more is dropped, and its sender times out.
pub const FORWARDS_PARTIAL_MAX: usize = 64;

/// Longest a hub waits for the answer to a call it forwarded (a `wait` call waits up to
/// a minute at the authority); past it the call is answered `list_elsewhere`, and its
/// outcome is unknown.
pub const FORWARD_WAIT_MAX: Duration = Duration::from_secs(75);
