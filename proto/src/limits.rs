//! Every limit of the wire types, in one place: what one task, list, write, event and
//! automerge-repo wire message may hold (docs/DESIGN.md §7). The other crates build
//! their limits on these.

// The task model and todo_write.

/// Longest task id accepted, in bytes.
pub const TASK_ID_BYTES_MAX: usize = 128;
/// Longest `content` or `active_form`, in bytes.
pub const TASK_TEXT_BYTES_MAX: usize = 4 * 1024;
/// Longest agent id (owner), in bytes.
pub const AGENT_ID_BYTES_MAX: usize = 128;
/// Most dependencies one task may name.
pub const BLOCKED_BY_COUNT_MAX: usize = 64;
/// Most tasks in one list.
pub const LIST_TASKS_MAX: usize = 10_000;
/// Most change hashes one `tasks_changed` event lists (the last ones of its merge).
pub const TASKS_CHANGED_HASHES_MAX: usize = 1_024;
/// Most tasks (and as many values, agents and changes) one violation or conflict lists:
/// a violation over thousands of tasks names the first of them and counts all
/// (`tasks_total`), so that every event the hub stores and sends has a bounded size.
pub const VIOLATION_TASKS_MAX: usize = 64;
/// Longest text value an event quotes, in bytes (a longer one is cut at a character
/// boundary and ends with `…`).
pub const EVENT_VALUE_BYTES_MAX: usize = TASK_TEXT_BYTES_MAX;
/// Most operations in one `todo_write` (patch ops or replace tasks).
pub const WRITE_OPS_MAX: usize = LIST_TASKS_MAX;
/// Longest `explanation`, in bytes.
pub const EXPLANATION_BYTES_MAX: usize = 1024;
/// Longest list name, in bytes (a list's document id is a hash of its name).
pub const LIST_NAME_BYTES_MAX: usize = 256;
/// Most lists in one page of `GET /v1/lists` (`next` says where the following page
/// starts).
pub const LISTS_PAGE_MAX: usize = 1000;
/// Most changes a task's history answers with (the latest; `total` counts all).
pub const HISTORY_ENTRIES_MAX: usize = 500;

// The automerge-repo wire messages (proto/src/wire.rs).

/// Largest wire message (one WebSocket frame) [`decode`](crate::wire::decode) accepts. A sync message
/// carrying a whole document has to fit; anything larger is refused before parsing.
pub const MESSAGE_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Largest peer id. JS peer ids are short random strings; samod's are `peer-<u64>`.
pub const PEER_ID_BYTES_MAX: usize = 256;
/// Largest storage id. automerge-repo storage ids are UUID strings (36 bytes).
pub const STORAGE_ID_BYTES_MAX: usize = 256;
/// Largest document id text (`automerge:` + base58check of 20 bytes is 38 bytes).
/// Checked before base58 decoding, whose cost grows with the square of the length.
pub const DOCUMENT_ID_TEXT_BYTES_MAX: usize = 64;
/// Largest `type` value; every known type is shorter.
pub const TYPE_BYTES_MAX: usize = 64;
/// Largest protocol version string.
pub const PROTOCOL_VERSION_BYTES_MAX: usize = 32;
/// Most entries in `supportedProtocolVersions`.
pub const PROTOCOL_VERSIONS_COUNT_MAX: usize = 16;
/// Largest ephemeral `sessionId`.
pub const SESSION_ID_BYTES_MAX: usize = 256;
/// Largest `message` of an `error` message.
pub const ERROR_TEXT_BYTES_MAX: usize = 4096;
/// Most storage ids in `add`, `remove` or `newHeads`.
pub const STORAGE_IDS_COUNT_MAX: usize = 1024;
/// Most heads of one document in one message: per storage id in `newHeads`, and in a
/// sync message's `heads`, `need` and each `lastSync`. A document has as many heads as
/// concurrent branches not yet merged; a thousand is already pathological.
pub const HEADS_COUNT_MAX: usize = 1024;
/// Largest encoded head in `newHeads` (base58check or base64 of a 32-byte hash).
pub const HEAD_TEXT_BYTES_MAX: usize = 128;
/// Most entries in any one map, known and unknown fields together.
pub const MAP_ENTRIES_COUNT_MAX: usize = 64;
/// Largest map key.
pub const KEY_BYTES_MAX: usize = 256;
/// Deepest nesting of maps, arrays and tags; the message map itself is depth 1.
pub const NESTING_DEPTH_MAX: usize = 16;
const _: () = assert!(NESTING_DEPTH_MAX >= 5, "newHeads needs five levels");
const _: () = assert!(MAP_ENTRIES_COUNT_MAX >= 8, "ephemeral has seven fields");
