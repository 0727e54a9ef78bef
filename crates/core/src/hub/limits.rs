//! The hub core's bounds: connections, lists, history work, relays, compaction and fan-out.

/// API calls that may wait for one list to load; more are refused (retry).
pub const CALLS_WAITING_MAX: usize = 4_096;
/// How long a list no peer syncs stays in memory after its last API call (a burst of
/// calls is decided on the list in memory, not loaded for each).
pub const CALLED_LIST_IDLE_MS: i64 = 30_000;
/// Most waits (version barriers) open at once on one hub; more are refused (retry).
pub const WAITS_MAX: usize = 256;
/// Longest a wait may wait, in ms.
pub const WAIT_MS_MAX: i64 = 60_000;
/// Most lists kept in memory for API calls alone; past it the longest idle leaves.
pub const CALLED_LISTS_KEPT_MAX: usize = 256;
/// Most often one list's row in the store's index of lists (`GET /v1/lists`: version,
/// tasks by status) is written, in ms: the index is at most this far behind the list.
pub const LIST_SUMMARY_INTERVAL_MS: i64 = 1_000;
/// How long an agent may have no connection syncing a list and make no API call on it
/// before it has left (`agent_left`), on a list without a lease (`Policy::lease_ms`,
/// which takes its place). A reconnect within it is no leaving.
pub const AGENT_GONE_MS: i64 = 30_000;
/// Most agents one list follows (present, or gone within their window); past it the
/// agent gone longest is let go early.
pub const AGENTS_TRACKED_MAX: usize = 1_024;

/// Most documents one connection may sync at once.
pub const DOCS_PER_CONN_MAX: usize = 1_024;
/// Most lists one hub has, stored or being created: a creation past it is refused with
/// `docs_limit` (the store and the hub's set of list ids grow with it).
pub const DOCS_MAX: usize = 100_000;
/// Lists one identity (a token's agent; without a token, a remote address) may create
/// at once, before [`LIST_CREATIONS_PER_MINUTE`] paces it: a list in memory costs the
/// hub tens of KiB even empty, and the per-connection bound ([`DOCS_PER_CONN_MAX`])
/// starts over with each connection. A creation past it is refused with
/// `list_creation_rate`. A swarm creates a few lists per task, not hundreds a minute.
pub const LIST_CREATIONS_BURST: u32 = 100;
/// Lists one identity may create per minute once its burst is spent (see
/// [`LIST_CREATIONS_BURST`]).
pub const LIST_CREATIONS_PER_MINUTE: u32 = 60;
/// Identities whose creation budget the hub remembers; past it, those whose budget is
/// full again are forgotten (a full budget is what a new identity gets).
pub(super) const CREATORS_KEPT_MAX: usize = 10_000;
/// Bytes of frames that may wait for one list to be loaded from the store (its peers'
/// first requests, and what they send meanwhile): a load of a long list takes a while,
/// and what waits is held in memory. A frame past it closes its connection with 1013
/// `list_loading` (reconnect in a moment).
pub const LOAD_WAITING_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Of [`LOAD_WAITING_BYTES_MAX`], the bytes frames may take as they came. Past them, a
/// message without changes waits summed up by its heads: a peer's first message carries
/// a Bloom filter of the whole list (about 1.2 KiB per 1,000 changes), its heads say as
/// much in 32 bytes a head, so the rest holds the first messages of every connection a
/// hub takes (`CONNECTIONS_MAX`) coming back at once. (A peer ahead of the hub whose
/// message waited so is answered with a reset, and sends what it has.)
pub const LOAD_WAITING_AS_SENT_BYTES_MAX: usize = LOAD_WAITING_BYTES_MAX / 2;
/// Incremental changes stored for a list before the hub compacts it into a snapshot
/// (loading then costs one snapshot plus at most this many changes), or
/// [`COMPACT_AFTER_GROWTH_PERCENT`] of its changes if that is more.
pub const COMPACT_AFTER_CHANGES: usize = 1_000;
/// Growth, in percent of its changes, after which a long list is compacted (see
/// [`COMPACT_AFTER_CHANGES`]): a snapshot is a save of the whole list, so with a fixed
/// count a longer history made every write dearer — at 60,000 changes and 2,000
/// writes/s, two whole-list saves a second on the hub task. Loading a list then costs
/// its snapshot plus at most a tenth more.
pub const COMPACT_AFTER_GROWTH_PERCENT: usize = 10;
/// Growth, in percent of its changes, after which a list's document in memory is rebuilt
/// from the snapshot the hub is storing anyway (`TodoList::adopt_rebuilt`). A
/// document grown change by change holds several times the memory of the same document
/// loaded (a 1,000-task list grown from 50,000 to 60,000 changes: 24 MiB more, 21.5 of
/// them given back by the rebuild; `examples/list_memory.rs`). The rebuild costs a load,
/// about 3.4 µs per change of history (200 ms at 60,000 changes) — off the hub's task,
/// but CPU all the same, and a second copy of the document for that moment — so it runs
/// only after growth by this share: about 14 µs per change, amortised.
pub const REBUILD_AFTER_GROWTH_PERCENT: usize = 25;
/// Changes a rebuilt document may lack and still take its list's place: the hub's task
/// applies them to it first (tens of microseconds each, so at most tens of milliseconds).
/// A rebuild that waited longer — its thread runs only when the hub's core is otherwise
/// idle — is dropped, and the list's next compaction asks for another.
pub const REBUILD_CATCH_UP_MAX: usize = 1_000;
/// Time without a write after which a list gives back its sync window's changes
/// (`TodoList::forget_window`: ≈0.7 MiB for a list that took its last
/// `SYNC_WINDOW_CHANGES` at once, a first sync of a long history). The window serves
/// peers whose acknowledgements lag behind the writes; ten seconds after the last write
/// they have long caught up, and a peer that comes back later is synced by the stock
/// path (a millisecond at 1,000 changes, tens at 60,000).
pub const SYNC_WINDOW_QUIET_MS: i64 = 10_000;

/// History work one connection may make the hub do before it must wait, in units: a
/// sync step the recent-changes window cannot answer (a fresh peer that needs the
/// whole list, a peer far behind, a sync that lost a message and starts over) walks the
/// list's history and costs [`CHANGE_WORK_UNITS`] per change plus one per op of the
/// list. A step is allowed while the budget is positive (so any peer can make its first
/// full sync of even the largest list) and may leave it in debt, which time repays.
/// One unit is about 10 ns of hub time (release build, this 2-core machine: a
/// whole-history step costs ≈1 µs per change), so the burst is ≈0.5 s of hub time.
pub const SYNC_WORK_BURST: i64 = 50_000_000;
/// Work units a connection earns back per second: ≈5 % of one core.
pub const SYNC_WORK_PER_SECOND: i64 = 5_000_000;
/// Work units one change of the history costs a stock sync step (automerge rebuilds
/// each change it sends from its op columns: ~100× the cost of an op).
pub const CHANGE_WORK_UNITS: i64 = 100;

/// Bytes of `ephemeral` messages one connection may have relayed per second, on
/// average: presence and cursors are a few small messages a second, and each relayed byte
/// costs the hub a copy per peer of the list (at 100 peers, 6.4 MB/s of output for one
/// sender at this rate). Over it, the messages are dropped, not relayed.
pub const EPHEMERAL_BYTES_PER_SECOND: i64 = 64 * 1024;
/// … in bursts up to this many bytes.
pub const EPHEMERAL_BURST_BYTES: i64 = 256 * 1024;
/// `ephemeral` messages one connection may have relayed per second, on average (each
/// costs a frame per peer of the list whatever its size).
pub const EPHEMERAL_MESSAGES_PER_SECOND: i64 = 50;
/// … in bursts up to this many messages.
pub const EPHEMERAL_BURST_MESSAGES: i64 = 100;

/// How long a busy hub may hold a list's news for its other peers to send it with a
/// later batch's (see [`HubCore::handle_batch_deferring`]).
pub const FANOUT_DEFER_MAX_MS: i64 = 20;

/// Writes (frames that changed a list) a batch must hold, with more input waiting, for
/// the hub to count as behind and defer news: a batch of one write is what a hub that
/// keeps up sees (one agent at a time), and deferring there only adds latency.
pub const FANOUT_DEFER_WRITERS_MIN: usize = 2;

/// Sync messages a busy hub sends a peer that has not shown it has the first of them
/// yet (its heads do not cover the list as it was when that one left); news for it waits
/// beyond that, and goes in one message when its heads catch up, when it writes (a
/// writer is answered at once), or when the hub's queue runs dry (see
/// [`HubCore::handle_batch_deferring`]). Under overload a lagging peer otherwise gets a
/// message per fan-out, each costing the hub what the peer lags by, and answers each.
pub const FANOUT_UNACKED_MAX: usize = 4;

/// A peer is held back by [`FANOUT_UNACKED_MAX`] only while it spoke this recently: a
/// peer behind a busy hub keeps sending (its answers, its writes), while one that has
/// everything may have nothing to answer a message that only named heads it had.
pub const FANOUT_HOLD_HEARD_MAX_MS: i64 = 1_000;

/// Window positions remembered per peer for [`FANOUT_UNACKED_MAX`] (the oldest go
/// beyond this: a peer past the limit is held anyway).
pub(super) const UNACKED_KEPT_MAX: usize = 64;

/// Bytes of task changes one `tasks_changed` event carries before the next event
/// takes the rest: well under the store's `EVENT_BYTES_MAX`, which a write of many long
/// tasks (or a list's first sync) would otherwise exceed — and a commit the store
/// refuses stops the hub.
pub(super) const TASKS_CHANGED_BYTES_SPLIT: usize = 256 * 1024;
