//! Every bound of the hub's runtime (connections, frames, queues, buffers, timeouts,
//! rates), as named constants; the ones a test needs small are also in [`ConnLimits`]
//! (the `[limits]` table of the `serve --config` file). The hub core's own bounds are
//! `swarmtodo_core::hub`'s.

use std::time::Duration;

use swarmtodo_proto::wire::MESSAGE_BYTES_MAX;

/// Most connections served at once.
pub const CONNECTIONS_MAX: usize = 10_000;
/// Frames queued for one connection before it counts as a slow reader and is closed.
pub const OUTBOX_FRAMES_MAX: usize = 256;
/// Bytes queued for one connection before it counts as a slow reader and is closed
/// (besides tungstenite's own write buffer). A frame is refused only when this much is
/// queued already, so that one message larger than the bound (a single large change;
/// sync messages carry at most `SYNC_CHANGES_BYTES_MAX` of changes) still goes out:
/// what one stalled peer can pin is this plus one message (`MESSAGE_BYTES_MAX`).
pub const OUTBOX_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Bytes queued for a connection past which relayed `ephemeral` messages to it are
/// dropped instead of queued (`Effects::relays`): a quarter of [`OUTBOX_BYTES_MAX`], so
/// that a flood of relays never makes an honest receiver a slow reader, and its sync
/// messages and events always have room.
pub const RELAY_OUTBOX_BYTES_MAX: usize = OUTBOX_BYTES_MAX / 4;
/// Frames queued for a connection past which relays to it are dropped: a quarter of
/// [`OUTBOX_FRAMES_MAX`], for the same reason.
pub const RELAY_OUTBOX_FRAMES_MAX: usize = OUTBOX_FRAMES_MAX / 4;
/// How long a hub of a cluster waits at its start to hear the cluster's directory (the
/// index of lists, the tokens hubs made, the links of delegated lists) before it takes
/// its first connection; past it, it serves and hears the rest as it comes.
pub const DIRECTORY_HEARD_WAIT_MAX: Duration = Duration::from_secs(10);
/// Inputs queued for the hub task (connections wait when it is full).
pub const HUB_QUEUE_MAX: usize = 4_096;
/// Largest WebSocket frame accepted.
pub const FRAME_BYTES_MAX: usize = 1024 * 1024;
/// Most frames and API calls the hub handles before it answers (those already queued
/// when it turns to the queue; it never waits for more).
pub const BATCH_FRAMES_MAX: usize = 256;
/// Frames a connection's writer takes from its outbox for one write to the socket.
pub const WRITE_COALESCE_FRAMES_MAX: usize = 64;
/// WebSocket read buffer per connection (tungstenite grows it on demand up to a message).
pub const READ_BUFFER_BYTES: usize = 4 * 1024;
/// WebSocket write buffer per connection before a flush.
pub const WRITE_BUFFER_BYTES: usize = 4 * 1024;
/// Most bytes tungstenite may hold unsent for one connection. A message larger than
/// this cannot be sent: the connection is closed (logged "write to the peer failed").
/// A peer far behind gets what it lacks over several sync messages, each with at most
/// `SYNC_CHANGES_BYTES_MAX` of changes (see ARCHITECTURE.md), well under this.
pub const WRITE_BUFFER_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Events a list's live stream holds for its slowest reader; one further behind reads
/// them from the store instead.
pub const STREAM_BUFFERED_MAX: usize = 1_024;
/// Events of a list the follower of its log keeps at a hub of a cluster while some
/// reader follows the list: a reader resuming within them reads them from memory, not
/// the log.
pub const STREAM_RECENT_MAX: usize = 256;
/// Events one read of the store brings to an event stream (and frames its body queues).
pub const STREAM_PAGE_MAX: usize = 256;
/// How long an event stream stays silent before it sends a comment line
/// (`: keep-alive`): proxies and clients that close quiet connections keep it, and a
/// reader gone away is noticed within this time, not at the next event.
pub const STREAM_KEEPALIVE: Duration = Duration::from_secs(15);
/// Largest body of an HTTP API request (a `todo_write` of a whole list of long tasks
/// goes as several patches).
pub const HTTP_BODY_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Task histories read at once (each a load of its list from the store and a pass over
/// its whole history, off the hub's task, on a blocking thread); more wait their turn.
pub const HISTORY_READS_MAX: usize = 2;
/// An HTTP API request's body must have arrived whole within this (after its head).
pub const HTTP_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The read buffer for an HTTP API request's head (request line and headers): a head
/// that does not fit is refused with 431 (hyper checks it per read, so a head a little
/// past it may pass).
pub const HTTP_HEAD_BYTES_MAX: usize = 64 * 1024;
/// A connection must finish the WebSocket handshake (or send an HTTP request's head)
/// within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection that sends nothing for this long is closed (clients ping).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// A connection whose WebSocket upgrade is done must send `join` (its first message)
/// within this, or it is closed with `join_timeout`: an upgraded connection that never
/// joins costs a connection slot, a socket and two tasks, and without a bound a peer
/// could hold every slot (`CONNECTIONS_MAX`) with upgrades that never join. Clients
/// join as soon as the upgrade is done.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections open at once from one remote IP address (upgrades in progress
/// included). One address cannot hold every slot (`CONNECTIONS_MAX`) and lock the
/// others out. Above what one machine's swarm opens: the live 1,000-agent simulation and
/// the side-by-side bench open about 1,000 loopback connections at once.
pub const CONNECTIONS_PER_ADDRESS_MAX: usize = 4_096;
/// Most connections open at once with one token (one agent: its sessions, each syncing
/// any number of lists over one connection). A leaked or hostile token cannot hold
/// every slot.
pub const CONNECTIONS_PER_TOKEN_MAX: usize = 256;
/// How long a closing connection may take to flush its last frames and close.
pub const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// How long shutdown waits for queued work and peers to leave.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Frames per second one connection may send on average …
pub const FRAMES_PER_SECOND_MAX: u32 = 1_000;
/// … with bursts up to this many.
pub const FRAMES_BURST_MAX: u32 = 2_000;

const _: () = assert!(FRAME_BYTES_MAX <= MESSAGE_BYTES_MAX);
const _: () = assert!(WRITE_BUFFER_BYTES < WRITE_BUFFER_BYTES_MAX);

/// The bounds on connections, configurable (`[limits]` of the `serve --config` file)
/// so that tests can use small ones; the defaults are the named constants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    /// See [`JOIN_TIMEOUT`].
    pub join_timeout: Duration,
    /// See [`CONNECTIONS_PER_ADDRESS_MAX`].
    pub per_address_max: usize,
    /// See [`CONNECTIONS_PER_TOKEN_MAX`].
    pub per_token_max: usize,
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            join_timeout: JOIN_TIMEOUT,
            per_address_max: CONNECTIONS_PER_ADDRESS_MAX,
            per_token_max: CONNECTIONS_PER_TOKEN_MAX,
        }
    }
}

/// Changes merged in one batch, or given back by the sync windows of quiet lists,
/// after which the hub hands the memory it freed back to the system (see
/// [`give_back_freed_memory`]).
pub const TRIM_AFTER_CHANGES: usize = 1_000;

/// Lists dropped from memory (their last peer left) after which the hub hands the
/// memory it freed back to the system: glibc keeps the freed lists' heap in its arenas
/// otherwise, and a hub whose peers came and went would keep the RSS of its busiest
/// moment. A trim costs a few milliseconds; a list costs tens of KiB at least.
pub const TRIM_AFTER_LISTS_DROPPED: usize = 64;
/// Rebuilds waiting for the rebuilding thread (`rebuild.rs`), each with its list's
/// snapshot. A rebuild only gives memory back: past this many, a list's next one is
/// skipped (logged), and its document stays as it grew until its next rebuild is due.
pub const REBUILDS_QUEUED_MAX: usize = 64;
/// Heap arenas glibc's allocator may keep for the hub process (`memory::limit_heap_arenas`,
/// set by `swarmtodo serve`). With an arena per busy thread, a list rebuilt on the
/// rebuilding thread lives in another arena than the document it replaces, whose freed
/// pages stay mapped among live ones: 6.84 MiB resident per 10,000-change list in the
/// side-by-side bench, 5.47 MiB with one arena (5.94 with two); sustained writes at 100
/// agents 2,172/s with the default, 2,137/s with one (the hub's work is on one task).
pub const HEAP_ARENAS_MAX: usize = 1;

/// How long a hub of a cluster waits for the answer to a call it forwarded to the list's
/// authority, beyond the call's own waiting (a `wait`): a commit to the log, or taking
/// and replaying a list first, with time to spare. Past it the caller is answered
/// `list_elsewhere` (the call may have taken effect: read before retrying).
pub const FORWARD_ANSWER_WAIT: Duration = Duration::from_secs(30);

/// How many leases' time a hub of a cluster waits for word from a hub whose sync peers
/// it holds (sessions send `alive` every third of a lease) before it lets those peers
/// go: the other hub was killed, or cut from NATS.
pub const SESSION_SILENT_MAX: u32 = 3;

/// Most lists a hub of a cluster remembers another hub holding (for a third of a lease
/// each, so that forwarded calls and carried peers skip trying the lease); past it the
/// memory starts over.
pub const HOLDERS_KNOWN_MAX: usize = 10_000;
