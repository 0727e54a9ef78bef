//! Every limit of the core, in one place (the wire types' own are in
//! [`swarmtodo_proto::limits`]); the const asserts at the end tie the ones that depend on
//! each other. The hub core's connection and fan-out bounds are beside the hub core.

pub use crate::proto::limits::HEADS_COUNT_MAX;
use crate::proto::limits::{
    BLOCKED_BY_COUNT_MAX, LIST_TASKS_MAX, MESSAGE_BYTES_MAX, WRITE_OPS_MAX,
};

// A sync message from a peer (crate::syncmsg), before automerge sees it.

/// Largest sync message. It travels inside one wire message, so it can be no larger.
pub const SYNC_MESSAGE_BYTES_MAX: usize = MESSAGE_BYTES_MAX;
/// Most `have` entries. automerge sends zero or one.
pub const HAVE_COUNT_MAX: usize = 8;
/// Largest Bloom filter. automerge spends 10 bits per change, so 2 MiB summarises
/// about 1.6 million changes.
pub const BLOOM_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Most change chunks in one message. A first sync without V2 messages sends every
/// change of the document as its own chunk.
pub const CHANGES_COUNT_MAX: usize = 65_536;
/// Largest single chunk as sent, and largest compressed change after inflation. A V2
/// message carries the whole document as one chunk.
pub const CHANGE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Most bytes all DEFLATE streams of one message may inflate to. automerge compresses
/// columns by a few times; a DEFLATE bomb reaches 1032 times.
pub const INFLATED_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Most bits per entry in a Bloom filter. automerge uses 10.
pub const BLOOM_BITS_PER_ENTRY_MAX: u32 = 32;
/// Most probes per hash in a Bloom filter. automerge uses 7; `generate_sync_message`
/// allocates and computes this many per change of the document.
pub const BLOOM_PROBES_MAX: u32 = 32;
/// Bloom filters above this size are refused whatever [`Limits`](crate::syncmsg::Limits) say: automerge
/// computes probe positions as `u32` over `8 × bytes`, which overflows from 2^29
/// bytes, and adds two of them, which overflows from 2^28.
pub const BLOOM_BYTES_HARD_MAX: usize = (1 << 28) - 1;
/// Most columns in one chunk. automerge's formats define fewer than 32.
pub const COLUMNS_COUNT_MAX: u64 = 128;
/// Most ops one change may declare, and most predecessors its ops may name together.
///
/// automerge reads a change op by op (`Change::from_bytes` walks them all before it
/// returns; applying then builds each one), and run-length encoding lets a few bytes
/// declare any number, so the count needs a bound of its own. Bytes cannot give one: a
/// change that deletes a long run of list elements is a few dozen bytes whatever its
/// length. A change of a todo list has a handful to a few thousand ops; the largest
/// write the protocol allows ([`WRITE_OPS_MAX`] tasks, each
/// a map with seven fields and up to
/// [`BLOCKED_BY_COUNT_MAX`] dependencies) has about
/// 750,000, and a peer must be able to send what it was allowed to write. At 2^20, one
/// change costs automerge about 0.3 s to read and 2.5 s to apply (release build).
pub const OPS_PER_CHANGE_MAX: usize = 1 << 20;
/// Most ops all chunks of one message may declare together, counting each predecessor
/// (or successor) an op names and each change of a document or bundle chunk as one
/// more: automerge decodes and allocates each of them.
///
/// Without it, [`CHANGES_COUNT_MAX`] changes each within [`OPS_PER_CHANGE_MAX`] would
/// add up to 2^36. A first sync carries the whole document (as one chunk, or as all of
/// its changes), so this is also the largest document a peer can hand the hub at once:
/// room for 400 ops of history for each task of the largest list
/// ([`LIST_TASKS_MAX`]), or four of the largest changes.
pub const OPS_PER_MESSAGE_MAX: usize = 1 << 22;
const _: () = assert!(BLOOM_BYTES_MAX <= BLOOM_BYTES_HARD_MAX);
const _: () = assert!(CHANGE_BYTES_MAX <= SYNC_MESSAGE_BYTES_MAX);
const _: () = assert!(INFLATED_BYTES_MAX >= CHANGE_BYTES_MAX);
const _: () = assert!(OPS_PER_CHANGE_MAX <= OPS_PER_MESSAGE_MAX);
const _: () = assert!(SYNC_MESSAGE_BYTES_MAX <= MESSAGE_BYTES_MAX);
// The largest write: for each task, its map, its 7 fields, its dependency list and that
// list's entries; and the removal of a task it replaces.
const _: () = assert!(OPS_PER_CHANGE_MAX >= WRITE_OPS_MAX * (1 + 7 + 1 + BLOCKED_BY_COUNT_MAX + 1));
const _: () = assert!(OPS_PER_MESSAGE_MAX >= 400 * LIST_TASKS_MAX);

// A replica (crate::model).

/// Most changes held back waiting for their dependencies before a replica refuses more.
pub const PENDING_CHANGES_MAX: usize = 10_000;
/// Changes the sync window remembers per list (≈0.5 KiB each: the change's bytes, its
/// hash and the heads after it) when no peer needs older ones. A peer whose shared
/// heads are older than the window is synced by the stock path, whose cost follows the
/// history.
pub const SYNC_WINDOW_CHANGES: usize = 1_024;
/// Changes the window may hold while a peer still needs them (`TodoList::keep_window_for`):
/// an overloaded hub's acknowledgements arrive late, so its peers' shared heads fall
/// behind by the hub's backlog. With a fixed window they fell out of it at 2,000
/// offered writes/s in the side-by-side bench, every acknowledgement then walked the
/// whole history, and the hub never caught up again. Past this many the oldest go
/// whatever a peer needs (≈8 MiB for the list while it lasts).
pub const SYNC_WINDOW_CHANGES_MAX: usize = 16_384;
/// Changes kept below the oldest shared head a peer stands at: the walk back from a
/// set of heads (`SyncWindow::since`) may pass a little below the lowest of them when
/// writers were concurrent.
pub const SYNC_WINDOW_FLOOR_SLACK: u64 = 64;
/// Most bytes of changes in one sync message a replica generates (one larger change
/// goes alone). More goes over several messages, oldest first, each answered by the
/// peer before the next (see `TodoList::generate_sync_message`): a hub reads frames up
/// to `FRAME_BYTES_MAX` (1 MiB), and this leaves room in one for the Bloom filter, the
/// heads and the envelope. Concurrent writers' changes are ~0.5 KiB each, so this is
/// about a thousand changes per message.
pub const SYNC_CHANGES_BYTES_MAX: usize = 512 * 1024;

// The authority (crate::authority).

/// Most check → repair → check rounds for one merge. A repair only writes valid values,
/// so the second round finds nothing; the bound makes a bug a reported stop, not a loop.
pub const REPAIR_ROUNDS_MAX: usize = 4;
