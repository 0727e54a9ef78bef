//! Validation of Automerge sync messages before Automerge sees them.
//!
//! The `data` of an automerge-repo `request` or `sync` message is an Automerge sync
//! message. automerge 0.12 trusts it more than a hub can afford to:
//!
//! - a Bloom filter with 0 bits per entry (a 10-byte message) is accepted by
//!   `receive_sync_message`, and the next `generate_sync_message` divides by zero;
//! - a Bloom filter with 2^32 − 1 probes (15 bytes) makes `generate_sync_message`
//!   allocate 16 GiB and abort;
//! - a compressed change chunk of 254 KiB inflates to ~790 MB before any checksum is
//!   looked at, and DEFLATE-compressed columns of document chunks do the same;
//! - an 81-byte change chunk declares 2^40 ops by run-length encoding, and
//!   `Change::from_bytes` walks every one of them before it returns.
//!
//! [`validate`] parses the whole format itself (message type, heads, need, the `have`
//! entries with their last-sync hashes and Bloom filters, every change chunk and the
//! flags) against [`Limits`], measures what every DEFLATE stream inflates to (and stops
//! at the bound), counts the ops (and changes) every chunk's columns declare by adding
//! up run lengths without expanding a run, and only then lets automerge decode the
//! message. Nothing here allocates in proportion to a count read from the input; what
//! it keeps of an inflated stream (to count the runs in it) stays under the inflation
//! bounds.
//!
//! ```
//! use automerge::{sync::{self, SyncDoc}, transaction::Transactable, AutoCommit, ROOT};
//! use swarmtodo_core::syncmsg::{self, Limits};
//!
//! let mut doc = AutoCommit::new();
//! doc.put(ROOT, "title", "Ship it").unwrap();
//! let msg = doc.sync().generate_sync_message(&mut sync::State::new()).unwrap();
//! let checked = syncmsg::validate(&msg.clone().encode(), &Limits::default()).unwrap();
//! assert_eq!(checked.into_message(), msg);
//!
//! // Bloom filter with 0 bits per entry: refused before automerge parses it.
//! let bad = [0x42, 0, 0, 1, 0, 3, 1, 0, 1, 0];
//! assert_eq!(syncmsg::validate(&bad, &Limits::default()).unwrap_err().code(), "bloom_invalid");
//! ```

use automerge::sync::Message;

pub use crate::limits::{
    BLOOM_BITS_PER_ENTRY_MAX, BLOOM_BYTES_HARD_MAX, BLOOM_BYTES_MAX, BLOOM_PROBES_MAX,
    CHANGES_COUNT_MAX, CHANGE_BYTES_MAX, COLUMNS_COUNT_MAX, HAVE_COUNT_MAX, HEADS_COUNT_MAX,
    INFLATED_BYTES_MAX, OPS_PER_CHANGE_MAX, OPS_PER_MESSAGE_MAX, SYNC_MESSAGE_BYTES_MAX,
};

use crate::format::{
    CHUNK_CHECKSUM_BYTES, CHUNK_MAGIC, CHUNK_TYPE_BUNDLE, CHUNK_TYPE_CHANGE, CHUNK_TYPE_COMPRESSED,
    CHUNK_TYPE_DOCUMENT, HASH_BYTES, MESSAGE_TYPE_SYNC_V1, MESSAGE_TYPE_SYNC_V2,
};
/// Bit of a column specification that marks DEFLATE-compressed column data.
const COLUMN_DEFLATE_BIT: u32 = 0b1000;
/// Bits of a column specification that give the column's type.
const COLUMN_TYPE_BITS: u32 = 0b0111;
/// A column specification's id is what is left above the type and deflate bits.
const COLUMN_ID_SHIFT: u32 = 4;
/// Column types (the storage format's). A group column holds, for each row, how many
/// rows of the columns with its id that follow it belong to that row.
const COLUMN_TYPE_GROUP: u32 = 0;
const COLUMN_TYPE_ACTOR: u32 = 1;
const COLUMN_TYPE_INTEGER: u32 = 2;
const COLUMN_TYPE_DELTA: u32 = 3;
const COLUMN_TYPE_BOOLEAN: u32 = 4;
const COLUMN_TYPE_STRING: u32 = 5;
const COLUMN_TYPE_VALUE_METADATA: u32 = 6;
/// Raw value bytes, sliced by the metadata column: no rows of its own.
const COLUMN_TYPE_VALUE: u32 = 7;

/// The limits a sync message is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest message.
    pub message_bytes_max: usize,
    /// Most hashes in `heads`, in `need` and in each `lastSync`.
    pub heads_count_max: usize,
    /// Most `have` entries.
    pub have_count_max: usize,
    /// Largest Bloom filter (never more than [`BLOOM_BYTES_HARD_MAX`]).
    pub bloom_bytes_max: usize,
    /// Most change chunks.
    pub changes_count_max: usize,
    /// Largest chunk as sent, and largest compressed change after inflation.
    pub change_bytes_max: usize,
    /// Most bytes all DEFLATE streams of the message may inflate to together.
    pub inflated_bytes_max: usize,
    /// Most ops one change may declare (and most predecessors its ops may name).
    pub ops_per_change_max: usize,
    /// Most ops all chunks may declare together, predecessors and successors, and the
    /// changes of documents and bundles included.
    pub ops_per_message_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            message_bytes_max: SYNC_MESSAGE_BYTES_MAX,
            heads_count_max: HEADS_COUNT_MAX,
            have_count_max: HAVE_COUNT_MAX,
            bloom_bytes_max: BLOOM_BYTES_MAX,
            changes_count_max: CHANGES_COUNT_MAX,
            change_bytes_max: CHANGE_BYTES_MAX,
            inflated_bytes_max: INFLATED_BYTES_MAX,
            ops_per_change_max: OPS_PER_CHANGE_MAX,
            ops_per_message_max: OPS_PER_MESSAGE_MAX,
        }
    }
}

/// Why a sync message was refused. [`SyncMsgError::code`] is a stable string for close
/// reasons and logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyncMsgError {
    /// The message is larger than [`Limits::message_bytes_max`].
    #[error("sync message is {len} bytes, the limit is {max}")]
    MessageTooLarge {
        /// Message length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The first byte is not a known sync message type.
    #[error("unknown sync message type {0:#04x}")]
    UnknownVersion(u8),
    /// The message does not follow the sync message format (truncated, bad LEB128).
    #[error("malformed sync message at byte {at}: {reason}")]
    Malformed {
        /// Offset in the message.
        at: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// `heads`, `need` or a `lastSync` lists more hashes than allowed.
    #[error("{field} has {count} hashes, the limit is {max}")]
    TooManyHashes {
        /// Which list.
        field: &'static str,
        /// Declared count.
        count: u64,
        /// The limit.
        max: usize,
    },
    /// The heads are not in ascending order (automerge always sorts them, and asserts
    /// it when it encodes sync state).
    #[error("heads are not sorted")]
    HeadsUnsorted,
    /// More `have` entries than allowed.
    #[error("{count} have entries, the limit is {max}")]
    TooManyHaves {
        /// Declared count.
        count: u64,
        /// The limit.
        max: usize,
    },
    /// A Bloom filter is larger than allowed.
    #[error("Bloom filter of {len} bytes, the limit is {max}")]
    BloomTooLarge {
        /// Declared length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A Bloom filter's parameters would crash or stall automerge.
    #[error("invalid Bloom filter: {reason}")]
    BloomInvalid {
        /// What is wrong.
        reason: &'static str,
    },
    /// More change chunks than allowed.
    #[error("{count} changes, the limit is {max}")]
    TooManyChanges {
        /// Count so far (or declared).
        count: u64,
        /// The limit.
        max: usize,
    },
    /// A chunk is larger than allowed.
    #[error("change chunk of {len} bytes, the limit is {max}")]
    ChangeTooLarge {
        /// Declared length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A change chunk is not well-formed.
    #[error("invalid change chunk {index}: {reason}")]
    ChunkInvalid {
        /// Ordinal of the chunk in the message, from 0.
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A DEFLATE stream is not valid.
    #[error("invalid DEFLATE data in chunk {index}: {reason}")]
    DeflateInvalid {
        /// Ordinal of the chunk in the message, from 0.
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// Compressed data would inflate beyond the limit.
    #[error("compressed data in chunk {index} inflates beyond {max} bytes")]
    InflateBound {
        /// Ordinal of the chunk in the message, from 0.
        index: usize,
        /// The limit that was hit.
        max: usize,
    },
    /// A chunk's columns declare more ops than a limit allows (run-length encoding
    /// lets a few bytes declare any number).
    #[error("chunk {index} declares {count} ops, the limit is {max} {limit}")]
    TooManyOps {
        /// Ordinal of the chunk in the message, from 0.
        index: usize,
        /// Ops declared: by the chunk, or by the message up to and including it.
        count: u64,
        /// Which limit: [`OPS_LIMIT_PER_CHANGE`] or [`OPS_LIMIT_PER_MESSAGE`].
        limit: &'static str,
        /// The limit.
        max: usize,
    },
    /// The checks passed but automerge still refused the message.
    #[error("automerge refused the sync message: {0}")]
    Automerge(String),
}

/// [`SyncMsgError::TooManyOps::limit`] when one change declares more than
/// [`Limits::ops_per_change_max`].
pub const OPS_LIMIT_PER_CHANGE: &str = "ops per change";
/// [`SyncMsgError::TooManyOps::limit`] when the message's chunks together declare more
/// than [`Limits::ops_per_message_max`].
pub const OPS_LIMIT_PER_MESSAGE: &str = "ops per message";

impl SyncMsgError {
    /// A stable, machine-readable code for this error.
    pub fn code(&self) -> &'static str {
        match self {
            Self::MessageTooLarge { .. } => "message_too_large",
            Self::UnknownVersion(_) => "unknown_version",
            Self::Malformed { .. } => "malformed",
            Self::TooManyHashes { .. } => "too_many_hashes",
            Self::HeadsUnsorted => "heads_unsorted",
            Self::TooManyHaves { .. } => "too_many_haves",
            Self::BloomTooLarge { .. } => "bloom_too_large",
            Self::BloomInvalid { .. } => "bloom_invalid",
            Self::TooManyChanges { .. } => "too_many_changes",
            Self::ChangeTooLarge { .. } => "change_too_large",
            Self::ChunkInvalid { .. } => "chunk_invalid",
            Self::DeflateInvalid { .. } => "deflate_invalid",
            Self::InflateBound { .. } => "inflate_bound",
            Self::TooManyOps { .. } => "too_many_ops",
            Self::Automerge(_) => "automerge_rejected",
        }
    }
}

/// The sync message format version (its first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncVersion {
    /// `0x42`: changes as a list of chunks.
    V1,
    /// `0x43`: may carry the whole document as one chunk.
    V2,
}

/// What [`check`] counted in a message that passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Format version.
    pub version: SyncVersion,
    /// Hashes in `heads`.
    pub heads_count: usize,
    /// Hashes in `need`.
    pub need_count: usize,
    /// `have` entries.
    pub have_count: usize,
    /// Change chunks (a whole document counts as one).
    pub chunks_count: usize,
    /// Bytes of all change chunks as sent.
    pub change_bytes: usize,
    /// Bytes all DEFLATE streams inflate to.
    pub inflated_bytes: usize,
    /// Ops all chunks declare, counting each predecessor or successor an op names and
    /// each change of a document or bundle as one more: what
    /// [`Limits::ops_per_message_max`] bounds.
    pub ops_count: u64,
    /// Whether the message carries the flags section.
    pub has_flags: bool,
}

/// A sync message that passed [`validate`], decoded by automerge.
#[derive(Debug, Clone)]
pub struct Checked {
    message: Message,
    summary: Summary,
}

impl Checked {
    /// The decoded message.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// The decoded message, to hand to `receive_sync_message`.
    pub fn into_message(self) -> Message {
        self.message
    }

    /// What the checks counted.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }
}

/// Check an untrusted sync message against `limits`, then decode it with automerge.
pub fn validate(bytes: &[u8], limits: &Limits) -> Result<Checked, SyncMsgError> {
    let summary = check(bytes, limits)?;
    let message = Message::decode(bytes).map_err(|e| SyncMsgError::Automerge(e.to_string()))?;
    Ok(Checked { message, summary })
}

/// Check an untrusted sync message against `limits` without handing it to automerge.
pub fn check(bytes: &[u8], limits: &Limits) -> Result<Summary, SyncMsgError> {
    if bytes.len() > limits.message_bytes_max {
        return Err(SyncMsgError::MessageTooLarge {
            len: bytes.len(),
            max: limits.message_bytes_max,
        });
    }
    let mut r = Reader::new(bytes);
    let version = match r.byte().map_err(|e| e.malformed())? {
        MESSAGE_TYPE_SYNC_V1 => SyncVersion::V1,
        MESSAGE_TYPE_SYNC_V2 => SyncVersion::V2,
        other => return Err(SyncMsgError::UnknownVersion(other)),
    };

    let heads = hashes(&mut r, "heads", limits.heads_count_max)?;
    if !heads.windows(2).all(|w| w[0] <= w[1]) {
        return Err(SyncMsgError::HeadsUnsorted);
    }
    let need = hashes(&mut r, "need", limits.heads_count_max)?;

    let have_count = r.leb128_u64().map_err(|e| e.malformed())?;
    if have_count > limits.have_count_max as u64 {
        return Err(SyncMsgError::TooManyHaves {
            count: have_count,
            max: limits.have_count_max,
        });
    }
    for _ in 0..have_count {
        hashes(&mut r, "lastSync", limits.heads_count_max)?;
        let bloom_len = r.leb128_u64().map_err(|e| e.malformed())?;
        let bloom_max = limits.bloom_bytes_max.min(BLOOM_BYTES_HARD_MAX);
        if bloom_len > bloom_max as u64 {
            return Err(SyncMsgError::BloomTooLarge {
                len: bloom_len,
                max: bloom_max,
            });
        }
        let bloom = r.take(bloom_len).map_err(|e| e.malformed())?;
        check_bloom(bloom)?;
    }

    let entries = r.leb128_u64().map_err(|e| e.malformed())?;
    if entries > limits.changes_count_max as u64 {
        return Err(SyncMsgError::TooManyChanges {
            count: entries,
            max: limits.changes_count_max,
        });
    }
    let mut chunks = Chunks {
        limits,
        count: 0,
        bytes: 0,
        inflated: 0,
        ops: 0,
    };
    for _ in 0..entries {
        let len = r.leb128_u64().map_err(|e| e.malformed())?;
        let entry = r.take(len).map_err(|e| e.malformed())?;
        chunks.entry(entry)?;
    }

    // The flags section is optional; automerge ignores anything after it, which is how
    // the format stays open to additions, so this does too.
    let has_flags = !r.is_empty();
    if has_flags {
        let len = r.leb128_u64().map_err(|e| e.malformed())?;
        r.take(len).map_err(|e| e.malformed())?;
    }

    Ok(Summary {
        version,
        heads_count: heads.len(),
        need_count: need.len(),
        have_count: have_count as usize,
        chunks_count: chunks.count,
        change_bytes: chunks.bytes,
        inflated_bytes: chunks.inflated,
        ops_count: chunks.ops,
        has_flags,
    })
}

/// A length-prefixed list of hashes, as borrowed 32-byte slices.
fn hashes<'a>(
    r: &mut Reader<'a>,
    field: &'static str,
    max: usize,
) -> Result<Vec<&'a [u8]>, SyncMsgError> {
    let count = r.leb128_u64().map_err(|e| e.malformed())?;
    if count > max as u64 {
        return Err(SyncMsgError::TooManyHashes { field, count, max });
    }
    let mut out = Vec::new();
    for _ in 0..count {
        out.push(r.take(HASH_BYTES as u64).map_err(|e| e.malformed())?);
    }
    Ok(out)
}

/// An empty filter is automerge's "no filter". Otherwise the parameters must be in
/// range and the bit array exactly as long as they imply, so that automerge's probe
/// arithmetic neither divides by zero nor allocates by a count from the wire.
fn check_bloom(bloom: &[u8]) -> Result<(), SyncMsgError> {
    if bloom.is_empty() {
        return Ok(());
    }
    let invalid = |reason| SyncMsgError::BloomInvalid { reason };
    let mut r = Reader::new(bloom);
    let entries = r
        .leb128_u32()
        .map_err(|_| invalid("bad number of entries"))?;
    let bits_per_entry = r.leb128_u32().map_err(|_| invalid("bad bits per entry"))?;
    let probes = r
        .leb128_u32()
        .map_err(|_| invalid("bad number of probes"))?;
    if entries == 0 {
        return Err(invalid("parameters for an empty filter"));
    }
    if !(1..=BLOOM_BITS_PER_ENTRY_MAX).contains(&bits_per_entry) {
        return Err(invalid("bits per entry out of range"));
    }
    if !(1..=BLOOM_PROBES_MAX).contains(&probes) {
        return Err(invalid("number of probes out of range"));
    }
    // Both factors fit in 32 bits, so the product fits in 64.
    let bits_bytes = (u64::from(entries) * u64::from(bits_per_entry)).div_ceil(8);
    if r.remaining() as u64 != bits_bytes {
        return Err(invalid("bit array length does not match the parameters"));
    }
    Ok(())
}

/// Walks the change chunks of one message and keeps the running totals.
#[derive(Debug)]
struct Chunks<'l> {
    limits: &'l Limits,
    /// Chunks seen so far.
    count: usize,
    /// Bytes of chunks seen so far.
    bytes: usize,
    /// Bytes inflated so far, over all DEFLATE streams.
    inflated: usize,
    /// Ops declared so far, over all chunks (as [`Summary::ops_count`] counts them).
    ops: u64,
}

impl Chunks<'_> {
    /// One entry of the `changes` list: one or more whole chunks. automerge
    /// concatenates the entries and parses the result as a sequence of chunks, so
    /// requiring whole chunks per entry makes both readings the same.
    fn entry(&mut self, entry: &[u8]) -> Result<(), SyncMsgError> {
        if entry.is_empty() {
            return Err(self.invalid("empty change entry"));
        }
        let mut r = Reader::new(entry);
        while !r.is_empty() {
            if self.count >= self.limits.changes_count_max {
                return Err(SyncMsgError::TooManyChanges {
                    count: self.count as u64 + 1,
                    max: self.limits.changes_count_max,
                });
            }
            self.chunk(&mut r)?;
            self.count += 1;
        }
        Ok(())
    }

    fn invalid(&self, reason: &'static str) -> SyncMsgError {
        SyncMsgError::ChunkInvalid {
            index: self.count,
            reason,
        }
    }

    fn chunk(&mut self, r: &mut Reader<'_>) -> Result<(), SyncMsgError> {
        let magic = r
            .take(CHUNK_MAGIC.len() as u64)
            .map_err(|_| self.invalid("truncated header"))?;
        if magic != CHUNK_MAGIC {
            return Err(self.invalid("bad magic bytes"));
        }
        r.take(CHUNK_CHECKSUM_BYTES as u64)
            .map_err(|_| self.invalid("truncated header"))?;
        let chunk_type = r.byte().map_err(|_| self.invalid("truncated header"))?;
        let len = r
            .leb128_u64()
            .map_err(|_| self.invalid("bad chunk length"))?;
        if len > self.limits.change_bytes_max as u64 {
            return Err(SyncMsgError::ChangeTooLarge {
                len,
                max: self.limits.change_bytes_max,
            });
        }
        let data = r
            .take(len)
            .map_err(|_| self.invalid("chunk longer than its entry"))?;
        self.bytes += data.len();
        match chunk_type {
            CHUNK_TYPE_CHANGE => self.change(data),
            // A change chunk whose whole body is one DEFLATE stream.
            CHUNK_TYPE_COMPRESSED => {
                let body = self.inflate_kept(data, self.limits.change_bytes_max)?;
                self.change(&body)
            }
            CHUNK_TYPE_DOCUMENT => self.document(data),
            CHUNK_TYPE_BUNDLE => self.bundle(data),
            _ => Err(self.invalid("unknown chunk type")),
        }
    }

    /// Change chunk: dependencies, actor, sequence number, the first op's counter,
    /// time, message, other actors, op column metadata, op column data, then extra
    /// bytes automerge keeps as they are. automerge walks every op the columns declare
    /// before it returns the change, so they must agree on how many there are, and
    /// that number must be within the limits.
    fn change(&mut self, data: &[u8]) -> Result<(), SyncMsgError> {
        let mut r = Reader::new(data);
        self.skip_hashes(&mut r)?;
        self.actor_id(&mut r)?;
        r.leb128_u64()
            .map_err(|_| self.invalid("bad sequence number"))?;
        let start_op = r.leb128_u64().map_err(|_| self.invalid("bad start op"))?;
        if start_op == 0 {
            return Err(self.invalid("start op is zero"));
        }
        r.skip_leb128().map_err(|_| self.invalid("bad time"))?;
        let message_len = r.leb128_u64().map_err(|_| self.invalid("bad message"))?;
        r.take(message_len)
            .map_err(|_| self.invalid("bad message"))?;
        self.actor_ids(&mut r)?;
        let columns = self.columns(&mut r)?;
        // automerge refuses these before reading an op.
        if columns.iter().any(|c| c.deflate) {
            return Err(self.invalid("compressed column in a change"));
        }
        let ops = self.rows(&mut r, &columns)?;
        let max = self.limits.ops_per_change_max;
        if ops.widest > max as u64 {
            return Err(SyncMsgError::TooManyOps {
                index: self.count,
                count: ops.widest,
                limit: OPS_LIMIT_PER_CHANGE,
                max,
            });
        }
        if ops.disagree {
            return Err(self.invalid("op columns disagree on the number of ops"));
        }
        // Op counters are 32-bit in automerge: it refuses a change that starts past
        // them (once it has walked the ops), and the last op's counter must fit too.
        let last_op = start_op.saturating_add(ops.ops.saturating_sub(1));
        if last_op > u64::from(u32::MAX) {
            return Err(self.invalid("op counters past 2^32"));
        }
        self.add_ops(ops.declared())
    }

    /// Document chunk: actors, heads, change and op column metadata, then the change
    /// and op column data. Each compressed column is inflated on load.
    fn document(&mut self, data: &[u8]) -> Result<(), SyncMsgError> {
        let mut r = Reader::new(data);
        self.actor_ids(&mut r)?;
        self.skip_hashes(&mut r)?;
        let change_columns = self.columns(&mut r)?;
        let op_columns = self.columns(&mut r)?;
        let changes = self.rows(&mut r, &change_columns)?;
        self.add_ops(changes.declared())?;
        let ops = self.rows(&mut r, &op_columns)?;
        self.add_ops(ops.declared())
    }

    /// Bundle chunk: dependencies, actors, change columns and their data, op columns
    /// and their data. Each compressed column is inflated on load.
    fn bundle(&mut self, data: &[u8]) -> Result<(), SyncMsgError> {
        let mut r = Reader::new(data);
        self.skip_hashes(&mut r)?;
        self.actor_ids(&mut r)?;
        let change_columns = self.columns(&mut r)?;
        let changes = self.rows(&mut r, &change_columns)?;
        self.add_ops(changes.declared())?;
        let op_columns = self.columns(&mut r)?;
        let ops = self.rows(&mut r, &op_columns)?;
        self.add_ops(ops.declared())
    }

    /// Count `declared` ops against the message's limit.
    fn add_ops(&mut self, declared: u64) -> Result<(), SyncMsgError> {
        self.ops = self.ops.saturating_add(declared);
        let max = self.limits.ops_per_message_max;
        if self.ops > max as u64 {
            return Err(SyncMsgError::TooManyOps {
                index: self.count,
                count: self.ops,
                limit: OPS_LIMIT_PER_MESSAGE,
                max,
            });
        }
        Ok(())
    }

    fn actor_id(&self, r: &mut Reader<'_>) -> Result<(), SyncMsgError> {
        let len = r.leb128_u64().map_err(|_| self.invalid("bad actor id"))?;
        r.take(len).map_err(|_| self.invalid("bad actor id"))?;
        Ok(())
    }

    fn actor_ids(&self, r: &mut Reader<'_>) -> Result<(), SyncMsgError> {
        let count = r
            .leb128_u64()
            .map_err(|_| self.invalid("bad actor count"))?;
        for _ in 0..count {
            self.actor_id(r)?;
        }
        Ok(())
    }

    fn skip_hashes(&self, r: &mut Reader<'_>) -> Result<(), SyncMsgError> {
        let count = r.leb128_u64().map_err(|_| self.invalid("bad hash count"))?;
        for _ in 0..count {
            r.take(HASH_BYTES as u64)
                .map_err(|_| self.invalid("truncated hashes"))?;
        }
        Ok(())
    }

    /// Column metadata: a count, then (specification, data length) pairs.
    fn columns(&self, r: &mut Reader<'_>) -> Result<Vec<Column>, SyncMsgError> {
        let count = r
            .leb128_u64()
            .map_err(|_| self.invalid("bad column count"))?;
        if count > COLUMNS_COUNT_MAX {
            return Err(self.invalid("too many columns"));
        }
        let mut columns = Vec::new();
        for _ in 0..count {
            let spec = r
                .leb128_u32()
                .map_err(|_| self.invalid("bad column specification"))?;
            let len = r
                .leb128_u64()
                .map_err(|_| self.invalid("bad column length"))?;
            columns.push(Column {
                spec,
                deflate: spec & COLUMN_DEFLATE_BIT != 0,
                len,
            });
        }
        Ok(columns)
    }

    /// The data of `columns`, in order: the rows each declares, counted run by run
    /// (each compressed column inflated under the bound first), and whether they agree.
    ///
    /// A group column starts a group: the columns with its id that follow it have, for
    /// each of its rows, as many rows as its value there. Every other column has a row
    /// per op (or per change). automerge's encoders write a column in full, or not at
    /// all when every row would be null or false.
    fn rows(&mut self, r: &mut Reader<'_>, columns: &[Column]) -> Result<Rows, SyncMsgError> {
        let mut rows = Rows::default();
        // Rows of each column outside a group; at most COLUMNS_COUNT_MAX of them.
        let mut outer = Vec::new();
        let mut group: Option<(u32, u64)> = None;
        for column in columns {
            let data = r
                .take(column.len)
                .map_err(|_| self.invalid("column data past the end of the chunk"))?;
            let id = column.spec >> COLUMN_ID_SHIFT;
            let kind = column.spec & COLUMN_TYPE_BITS;
            if group.is_some_and(|(group_id, _)| group_id != id) {
                group = None;
            }
            if kind == COLUMN_TYPE_VALUE {
                // Bytes that the metadata column slices: no rows of their own.
                if column.deflate {
                    self.inflate(data, usize::MAX)?;
                }
                continue;
            }
            let counted = if column.deflate {
                let kept = self.inflate_kept(data, usize::MAX)?;
                runs::count(kind, &kept)
            } else {
                runs::count(kind, data)
            }
            .map_err(|reason| self.invalid(reason))?;
            rows.widest = rows.widest.max(counted.rows).max(counted.sum);
            match group {
                Some((_, sum)) if kind != COLUMN_TYPE_GROUP => {
                    if counted.rows != 0 && counted.rows != sum {
                        rows.disagree = true;
                    }
                }
                _ => {
                    outer.push(counted.rows);
                    if kind == COLUMN_TYPE_GROUP {
                        group = Some((id, counted.sum));
                        rows.grouped = rows.grouped.saturating_add(counted.sum);
                    }
                }
            }
        }
        rows.ops = outer.iter().copied().max().unwrap_or(0);
        if outer.iter().any(|&n| n != 0 && n != rows.ops) {
            rows.disagree = true;
        }
        Ok(rows)
    }

    /// Inflate one DEFLATE stream without keeping the output, refusing it once it
    /// passes `bound` or the message's remaining inflation budget.
    fn inflate(&mut self, data: &[u8], bound: usize) -> Result<(), SyncMsgError> {
        self.inflate_into(data, bound, &mut inflate::Discard)
    }

    /// Inflate one DEFLATE stream as [`Chunks::inflate`] does, keeping the output (so
    /// it never holds more than the bounds allow).
    fn inflate_kept(&mut self, data: &[u8], bound: usize) -> Result<Vec<u8>, SyncMsgError> {
        let mut kept = inflate::Keep::default();
        self.inflate_into(data, bound, &mut kept)?;
        Ok(kept.0)
    }

    fn inflate_into(
        &mut self,
        data: &[u8],
        bound: usize,
        sink: &mut impl inflate::Sink,
    ) -> Result<(), SyncMsgError> {
        let budget = self.limits.inflated_bytes_max.saturating_sub(self.inflated);
        let (bound, max) = if bound < budget {
            (bound, bound)
        } else {
            (budget, self.limits.inflated_bytes_max)
        };
        match inflate::inflate(data, bound, sink) {
            Ok(len) => {
                self.inflated += len;
                Ok(())
            }
            Err(inflate::Error::Bound) => Err(SyncMsgError::InflateBound {
                index: self.count,
                max,
            }),
            Err(inflate::Error::Invalid(reason)) => Err(SyncMsgError::DeflateInvalid {
                index: self.count,
                reason,
            }),
        }
    }
}

/// One column of a chunk, as its metadata describes it.
#[derive(Debug, Clone, Copy)]
struct Column {
    /// The column specification: id, deflate bit, type.
    spec: u32,
    deflate: bool,
    len: u64,
}

/// What the columns of one chunk section (a change's ops, a document's changes, …)
/// declare.
#[derive(Debug, Default, Clone, Copy)]
struct Rows {
    /// Rows of the longest column outside a group: the ops (or changes).
    ops: u64,
    /// Rows all groups give the columns they group: the predecessors (or successors,
    /// or dependencies).
    grouped: u64,
    /// Rows of the longest column, or the largest group total.
    widest: u64,
    /// Whether a column has rows but not as many as its section (or group) does.
    disagree: bool,
}

impl Rows {
    /// What the section costs automerge to read: a step for each op and for each op id
    /// a group lists, or more if a column declares more (which automerge then refuses,
    /// or reads past).
    fn declared(&self) -> u64 {
        self.ops.saturating_add(self.grouped).max(self.widest)
    }
}

/// Counting the rows of a column without expanding its runs.
///
/// automerge's column encodings, all of them sequences of LEB128 numbers:
///
/// - run-length (actor, integer, string, value metadata and group columns, and delta
///   columns, which run-length encode the differences): a signed count, then for `n >
///   0` one value repeated `n` times, for `n < 0` `-n` values as they are, for `n = 0`
///   an unsigned count of nulls;
/// - boolean: unsigned counts of alternating runs, starting with `false`;
/// - value bytes: raw, sliced by the metadata column.
///
/// Values are skipped without being decoded, except a group column's counts, which are
/// added up. A run of 2^40 costs what a run of one does, and a run of values stops at
/// the end of the data because each value takes at least a byte, so counting is linear
/// in the column's bytes. Sums saturate: anything past `u64::MAX` is past every limit.
mod runs {
    use super::{
        COLUMN_TYPE_ACTOR, COLUMN_TYPE_BOOLEAN, COLUMN_TYPE_DELTA, COLUMN_TYPE_GROUP,
        COLUMN_TYPE_INTEGER, COLUMN_TYPE_STRING, COLUMN_TYPE_VALUE_METADATA,
    };

    /// What one column declares.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub(super) struct Counted {
        /// Rows.
        pub(super) rows: u64,
        /// For a group column, the sum of its values: the rows of the columns it groups.
        pub(super) sum: u64,
    }

    /// The rows a column of type `kind` declares.
    pub(super) fn count(kind: u32, data: &[u8]) -> Result<Counted, &'static str> {
        let mut r = Cursor { data, pos: 0 };
        match kind {
            COLUMN_TYPE_BOOLEAN => r.boolean(),
            // A group's values are counts, to add up.
            COLUMN_TYPE_GROUP => r.run_length(Cursor::unsigned),
            COLUMN_TYPE_ACTOR | COLUMN_TYPE_INTEGER | COLUMN_TYPE_VALUE_METADATA => {
                r.run_length(|r| r.unsigned().map(|_| 0))
            }
            COLUMN_TYPE_DELTA => r.run_length(|r| r.signed().map(|_| 0)),
            COLUMN_TYPE_STRING => r.run_length(Cursor::bytes),
            // Value bytes have no rows of their own.
            _ => Ok(Counted::default()),
        }
    }

    /// A cursor over column data that reads LEB128 as automerge's column decoders do
    /// (the `leb128` crate): overlong encodings are accepted, values past 64 bits are
    /// not.
    struct Cursor<'a> {
        data: &'a [u8],
        pos: usize,
    }

    impl Cursor<'_> {
        fn is_empty(&self) -> bool {
            self.pos >= self.data.len()
        }

        fn byte(&mut self) -> Result<u8, &'static str> {
            let b = *self
                .data
                .get(self.pos)
                .ok_or("column data ends mid-value")?;
            self.pos += 1;
            Ok(b)
        }

        fn unsigned(&mut self) -> Result<u64, &'static str> {
            // Most numbers of a column are one byte.
            if let Some(&b) = self.data.get(self.pos) {
                if b & 0x80 == 0 {
                    self.pos += 1;
                    return Ok(u64::from(b));
                }
            }
            let mut value = 0u64;
            let mut shift = 0u32;
            loop {
                let byte = self.byte()?;
                if shift == 63 && byte > 1 {
                    return Err("column value larger than 64 bits");
                }
                value |= u64::from(byte & 0x7f) << shift;
                if byte & 0x80 == 0 {
                    return Ok(value);
                }
                shift += 7;
            }
        }

        fn signed(&mut self) -> Result<i64, &'static str> {
            if let Some(&b) = self.data.get(self.pos) {
                if b & 0x80 == 0 {
                    self.pos += 1;
                    // Bit 6 is the sign.
                    return Ok(i64::from(b) - if b & 0x40 != 0 { 0x80 } else { 0 });
                }
            }
            let mut value = 0i64;
            let mut shift = 0u32;
            loop {
                let byte = self.byte()?;
                if shift == 63 && byte != 0 && byte != 0x7f {
                    return Err("column value larger than 64 bits");
                }
                value |= i64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    if shift < 64 && byte & 0x40 != 0 {
                        value |= -1 << shift;
                    }
                    return Ok(value);
                }
            }
        }

        /// Skip length-prefixed bytes.
        fn bytes(&mut self) -> Result<u64, &'static str> {
            let len = self.unsigned()?;
            self.pos = usize::try_from(len)
                .ok()
                .and_then(|len| self.pos.checked_add(len))
                .filter(|&end| end <= self.data.len())
                .ok_or("column value past the end of the column")?;
            Ok(0)
        }

        /// Add up the runs. `value` reads one value and returns what it adds to the
        /// sum (a group's count, else 0).
        fn run_length(
            &mut self,
            value: impl Fn(&mut Self) -> Result<u64, &'static str>,
        ) -> Result<Counted, &'static str> {
            let mut counted = Counted::default();
            while !self.is_empty() {
                let run = self.signed()?;
                if run > 0 {
                    let n = run.unsigned_abs();
                    let v = value(self)?;
                    counted.rows = counted.rows.saturating_add(n);
                    counted.sum = counted.sum.saturating_add(v.saturating_mul(n));
                } else if run < 0 {
                    let n = run.unsigned_abs();
                    counted.rows = counted.rows.saturating_add(n);
                    // Each value takes a byte at least: the loop ends with the data.
                    for _ in 0..n {
                        counted.sum = counted.sum.saturating_add(value(self)?);
                    }
                } else {
                    let nulls = self.unsigned()?;
                    counted.rows = counted.rows.saturating_add(nulls);
                }
            }
            Ok(counted)
        }

        fn boolean(&mut self) -> Result<Counted, &'static str> {
            let mut counted = Counted::default();
            while !self.is_empty() {
                counted.rows = counted.rows.saturating_add(self.unsigned()?);
            }
            Ok(counted)
        }
    }
}

/// Why a [`Reader`] stopped.
#[derive(Debug, Clone, Copy)]
struct ReadError {
    at: usize,
    reason: &'static str,
}

impl ReadError {
    fn malformed(self) -> SyncMsgError {
        SyncMsgError::Malformed {
            at: self.at,
            reason: self.reason,
        }
    }
}

/// A cursor over untrusted bytes. Every read is bounds-checked.
#[derive(Debug)]
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    fn is_empty(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    fn fail(&self, reason: &'static str) -> ReadError {
        ReadError {
            at: self.pos,
            reason,
        }
    }

    fn byte(&mut self) -> Result<u8, ReadError> {
        let b = *self
            .bytes
            .get(self.pos)
            .ok_or_else(|| self.fail("unexpected end of input"))?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, len: u64) -> Result<&'a [u8], ReadError> {
        if len > self.remaining() as u64 {
            return Err(self.fail("length past the end of input"));
        }
        // len <= remaining, so it fits in usize and the range is in bounds.
        let end = self.pos + len as usize;
        let out = self.bytes.get(self.pos..end).unwrap_or_default();
        self.pos = end;
        Ok(out)
    }

    /// Unsigned LEB128 with automerge's rules: at most 64 bits, no overlong encoding.
    fn leb128_u64(&mut self) -> Result<u64, ReadError> {
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let byte = self.byte()?;
            if shift < 64 {
                value |= u64::from(byte & 0x7f) << shift;
            }
            shift += 7;
            if byte & 0x80 == 0 {
                if shift > 64 && byte > 1 {
                    return Err(self.fail("LEB128 larger than 64 bits"));
                }
                if shift > 7 && byte == 0 {
                    return Err(self.fail("overlong LEB128"));
                }
                return Ok(value);
            }
            if shift > 64 {
                return Err(self.fail("LEB128 larger than 64 bits"));
            }
        }
    }

    /// Skip one LEB128 number, signed or not, without decoding it. automerge reads at
    /// most ten bytes; whether the value fits is its business.
    fn skip_leb128(&mut self) -> Result<(), ReadError> {
        for _ in 0..10 {
            if self.byte()? & 0x80 == 0 {
                return Ok(());
            }
        }
        Err(self.fail("LEB128 longer than ten bytes"))
    }

    fn leb128_u32(&mut self) -> Result<u32, ReadError> {
        let value = self.leb128_u64()?;
        u32::try_from(value).map_err(|_| self.fail("LEB128 larger than 32 bits"))
    }
}

/// A DEFLATE (RFC 1951) decoder that measures the inflated length under a bound.
///
/// It follows zlib's rules (which automerge's `flate2` backend, zlib-rs, shares):
/// over-subscribed Huffman codes are refused, incomplete ones are allowed only for a
/// single code of length one, a dynamic block must code end-of-block, and a distance
/// may not reach before the start of the output. The output itself goes to a [`Sink`];
/// validation uses [`Discard`], so a bomb costs time in proportion to its compressed
/// size and no memory at all.
mod inflate {
    /// Why inflating stopped.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Error {
        /// The stream is not valid DEFLATE.
        Invalid(&'static str),
        /// The output would exceed the bound.
        Bound,
    }

    /// Where inflated bytes go.
    pub(super) trait Sink {
        /// Bytes copied as they are (a stored block) or one literal.
        fn bytes(&mut self, bytes: &[u8]);
        /// `length` bytes copied from `distance` bytes back. The decoder has checked
        /// that `distance` is within the output so far.
        fn copy(&mut self, distance: usize, length: usize);
    }

    /// Keeps nothing.
    #[derive(Debug)]
    pub(super) struct Discard;

    impl Sink for Discard {
        fn bytes(&mut self, _: &[u8]) {}
        fn copy(&mut self, _: usize, _: usize) {}
    }

    /// Keeps the output, to read what was compressed. It grows only as the decoder
    /// produces bytes, so never past the bound given to [`inflate`].
    #[derive(Debug, Default)]
    pub(super) struct Keep(pub(super) Vec<u8>);

    impl Sink for Keep {
        fn bytes(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }

        fn copy(&mut self, distance: usize, length: usize) {
            // The decoder checked 1 <= distance <= len. A copy longer than its distance
            // repeats the last `distance` bytes: everything from `start` on has that
            // period, so copying as much of it as there is (a whole number of periods
            // until the last piece) doubles what can be copied next.
            if distance == 0 || distance > self.0.len() {
                return;
            }
            let start = self.0.len() - distance;
            let mut left = length;
            while left > 0 {
                let n = left.min(self.0.len() - start);
                // start + n <= the length so far.
                self.0.extend_from_within(start..start + n);
                left -= n;
            }
        }
    }

    const CODE_BITS_MAX: usize = 15;
    const LITERAL_LENGTH_CODES_MAX: usize = 286;
    const DISTANCE_CODES_MAX: usize = 30;
    const FIXED_LITERAL_LENGTH_CODES: usize = 288;
    const CODE_LENGTH_CODES: usize = 19;
    const END_OF_BLOCK: u16 = 256;

    const LENGTH_BASE: [u16; 29] = [
        3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115,
        131, 163, 195, 227, 258,
    ];
    const LENGTH_EXTRA: [u8; 29] = [
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
    ];
    const DISTANCE_BASE: [u16; 30] = [
        1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
        2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
    ];
    const DISTANCE_EXTRA: [u8; 30] = [
        0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12,
        13, 13,
    ];
    const CODE_LENGTH_ORDER: [usize; CODE_LENGTH_CODES] = [
        16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
    ];

    /// Least-significant-bit-first reader.
    struct Bits<'a> {
        input: &'a [u8],
        pos: usize,
        buf: u32,
        count: u32,
    }

    impl<'a> Bits<'a> {
        /// Up to 16 bits.
        fn take(&mut self, n: u32) -> Result<u32, Error> {
            while self.count < n {
                let byte = *self
                    .input
                    .get(self.pos)
                    .ok_or(Error::Invalid("truncated stream"))?;
                self.pos += 1;
                self.buf |= u32::from(byte) << self.count;
                self.count += 8;
            }
            let value = self.buf & ((1u32 << n) - 1);
            self.buf >>= n;
            self.count -= n;
            Ok(value)
        }

        /// Drop the bits left in the current byte (fewer than 8 are ever buffered).
        fn align(&mut self) {
            self.buf = 0;
            self.count = 0;
        }

        fn bytes(&mut self, n: usize) -> Result<&'a [u8], Error> {
            let end = self
                .pos
                .checked_add(n)
                .filter(|&end| end <= self.input.len())
                .ok_or(Error::Invalid("truncated stored block"))?;
            let out = self.input.get(self.pos..end).unwrap_or_default();
            self.pos = end;
            Ok(out)
        }
    }

    /// A canonical Huffman code: how many codes of each length, and the symbols
    /// ordered by code.
    struct Huffman {
        count: [u16; CODE_BITS_MAX + 1],
        symbol: [u16; FIXED_LITERAL_LENGTH_CODES],
    }

    impl Huffman {
        /// Build from code lengths, refusing over-subscribed sets. Also returns how
        /// many codes of the longest length are left unused (0 for a complete code),
        /// for the callers' completeness rules.
        fn new(lengths: &[u8]) -> Result<(Self, i32), Error> {
            let mut h = Huffman {
                count: [0; CODE_BITS_MAX + 1],
                symbol: [0; FIXED_LITERAL_LENGTH_CODES],
            };
            for &len in lengths {
                let slot = h
                    .count
                    .get_mut(usize::from(len))
                    .ok_or(Error::Invalid("code length above 15"))?;
                *slot += 1;
            }
            if usize::from(h.count[0]) == lengths.len() {
                // No codes at all: complete, and any attempt to decode fails.
                return Ok((h, 0));
            }
            let mut left: i32 = 1;
            for len in 1..=CODE_BITS_MAX {
                left <<= 1;
                left -= i32::from(h.count[len]);
                if left < 0 {
                    return Err(Error::Invalid("over-subscribed Huffman code"));
                }
            }
            let mut offsets = [0u16; CODE_BITS_MAX + 2];
            for len in 1..=CODE_BITS_MAX {
                offsets[len + 1] = offsets[len] + h.count[len];
            }
            for (symbol, &len) in lengths.iter().enumerate() {
                if len != 0 {
                    let slot = &mut offsets[usize::from(len)];
                    if let Some(s) = h.symbol.get_mut(usize::from(*slot)) {
                        *s = symbol as u16;
                    }
                    *slot += 1;
                }
            }
            Ok((h, left))
        }

        /// zlib's rule for literal/length and distance codes: complete, or a single
        /// code of length one.
        fn new_complete_or_single(lengths: &[u8]) -> Result<Self, Error> {
            let (h, left) = Self::new(lengths)?;
            let only_length_one =
                usize::from(h.count[0]) + usize::from(h.count[1]) == lengths.len();
            if left > 0 && !only_length_one {
                return Err(Error::Invalid("incomplete Huffman code"));
            }
            Ok(h)
        }

        fn decode(&self, bits: &mut Bits<'_>) -> Result<u16, Error> {
            let mut code: i32 = 0;
            let mut first: i32 = 0;
            let mut index: i32 = 0;
            for len in 1..=CODE_BITS_MAX {
                code |= bits.take(1)? as i32;
                let count = i32::from(self.count[len]);
                if code - count < first {
                    let at = (index + code - first) as usize;
                    return self
                        .symbol
                        .get(at)
                        .copied()
                        .ok_or(Error::Invalid("bad Huffman code"));
                }
                index += count;
                first += count;
                first <<= 1;
                code <<= 1;
            }
            Err(Error::Invalid("bad Huffman code"))
        }
    }

    fn fixed_codes() -> Result<(Huffman, Huffman), Error> {
        let mut lengths = [0u8; FIXED_LITERAL_LENGTH_CODES];
        for (symbol, len) in lengths.iter_mut().enumerate() {
            *len = match symbol {
                0..=143 => 8,
                144..=255 => 9,
                256..=279 => 7,
                _ => 8,
            };
        }
        // The fixed distance code uses 30 of 32 five-bit codes; the other two are
        // invalid symbols, which decoding reports.
        let (literal, _) = Huffman::new(&lengths)?;
        let (distance, _) = Huffman::new(&[5; DISTANCE_CODES_MAX])?;
        Ok((literal, distance))
    }

    fn dynamic_codes(bits: &mut Bits<'_>) -> Result<(Huffman, Huffman), Error> {
        let literal_count = bits.take(5)? as usize + 257;
        let distance_count = bits.take(5)? as usize + 1;
        let code_length_count = bits.take(4)? as usize + 4;
        if literal_count > LITERAL_LENGTH_CODES_MAX || distance_count > DISTANCE_CODES_MAX {
            return Err(Error::Invalid("too many length or distance codes"));
        }
        let mut code_lengths = [0u8; CODE_LENGTH_CODES];
        for &symbol in CODE_LENGTH_ORDER.iter().take(code_length_count) {
            code_lengths[symbol] = bits.take(3)? as u8;
        }
        let (code_length_code, left) = Huffman::new(&code_lengths)?;
        if left != 0 || usize::from(code_length_code.count[0]) == CODE_LENGTH_CODES {
            return Err(Error::Invalid("incomplete code length code"));
        }

        let total = literal_count + distance_count;
        let mut lengths = [0u8; LITERAL_LENGTH_CODES_MAX + DISTANCE_CODES_MAX];
        let mut i = 0;
        while i < total {
            let symbol = code_length_code.decode(bits)?;
            let (value, repeat) = match symbol {
                0..=15 => (symbol as u8, 1),
                16 => {
                    let previous = *i
                        .checked_sub(1)
                        .and_then(|p| lengths.get(p))
                        .ok_or(Error::Invalid("repeat with no previous length"))?;
                    (previous, 3 + bits.take(2)? as usize)
                }
                17 => (0, 3 + bits.take(3)? as usize),
                _ => (0, 11 + bits.take(7)? as usize),
            };
            if i + repeat > total {
                return Err(Error::Invalid("code lengths overflow"));
            }
            for slot in &mut lengths[i..i + repeat] {
                *slot = value;
            }
            i += repeat;
        }
        if lengths[usize::from(END_OF_BLOCK)] == 0 {
            return Err(Error::Invalid("no end-of-block code"));
        }
        let literal = Huffman::new_complete_or_single(&lengths[..literal_count])?;
        let distance = Huffman::new_complete_or_single(&lengths[literal_count..total])?;
        Ok((literal, distance))
    }

    /// Inflate `input` into `sink`, returning the inflated length, or
    /// [`Error::Bound`] as soon as the output would pass `bound` bytes. Input after
    /// the final block is ignored, as `flate2` does.
    pub(super) fn inflate(
        input: &[u8],
        bound: usize,
        sink: &mut impl Sink,
    ) -> Result<usize, Error> {
        let mut bits = Bits {
            input,
            pos: 0,
            buf: 0,
            count: 0,
        };
        let mut out: usize = 0;
        let grow = |out: &mut usize, n: usize| -> Result<(), Error> {
            match out.checked_add(n) {
                Some(total) if total <= bound => {
                    *out = total;
                    Ok(())
                }
                _ => Err(Error::Bound),
            }
        };
        loop {
            let last = bits.take(1)? == 1;
            match bits.take(2)? {
                0 => {
                    bits.align();
                    let header = bits.bytes(4)?;
                    let len = u16::from_le_bytes([header[0], header[1]]);
                    let inverted = u16::from_le_bytes([header[2], header[3]]);
                    if len != !inverted {
                        return Err(Error::Invalid("stored block length check failed"));
                    }
                    let data = bits.bytes(usize::from(len))?;
                    grow(&mut out, data.len())?;
                    sink.bytes(data);
                }
                kind @ (1 | 2) => {
                    let (literal, distance) = if kind == 1 {
                        fixed_codes()?
                    } else {
                        dynamic_codes(&mut bits)?
                    };
                    loop {
                        let symbol = literal.decode(&mut bits)?;
                        if symbol < END_OF_BLOCK {
                            grow(&mut out, 1)?;
                            sink.bytes(&[symbol as u8]);
                            continue;
                        }
                        if symbol == END_OF_BLOCK {
                            break;
                        }
                        let index = usize::from(symbol - END_OF_BLOCK - 1);
                        let (base, extra) = LENGTH_BASE
                            .get(index)
                            .zip(LENGTH_EXTRA.get(index))
                            .ok_or(Error::Invalid("invalid length code"))?;
                        let length = usize::from(*base) + bits.take(u32::from(*extra))? as usize;
                        let index = usize::from(distance.decode(&mut bits)?);
                        let (base, extra) = DISTANCE_BASE
                            .get(index)
                            .zip(DISTANCE_EXTRA.get(index))
                            .ok_or(Error::Invalid("invalid distance code"))?;
                        let dist = usize::from(*base) + bits.take(u32::from(*extra))? as usize;
                        if dist > out {
                            return Err(Error::Invalid("distance too far back"));
                        }
                        grow(&mut out, length)?;
                        sink.copy(dist, length);
                    }
                }
                _ => return Err(Error::Invalid("invalid block type")),
            }
            if last {
                return Ok(out);
            }
        }
    }

    #[cfg(test)]
    pub(super) mod testing {
        use super::Sink;

        /// Keeps everything, to compare with what `flate2` inflates.
        #[derive(Debug, Default)]
        pub(crate) struct Collect(pub(crate) Vec<u8>);

        impl Sink for Collect {
            fn bytes(&mut self, bytes: &[u8]) {
                self.0.extend_from_slice(bytes);
            }
            fn copy(&mut self, distance: usize, length: usize) {
                for _ in 0..length {
                    let b = self.0[self.0.len() - distance];
                    self.0.push(b);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::inflate::testing::Collect;
    use super::*;
    use automerge::sync::{self, SyncDoc};
    use automerge::transaction::Transactable;
    use automerge::{AutoCommit, ReadDoc, ROOT};
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn leb(mut n: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }

    /// LSB-first bit writer for hand-made DEFLATE streams.
    #[derive(Default)]
    struct BitWriter {
        out: Vec<u8>,
        bits: u64,
        count: u32,
    }

    impl BitWriter {
        fn put(&mut self, value: u32, n: u32) {
            self.bits |= u64::from(value) << self.count;
            self.count += n;
            while self.count >= 8 {
                self.out.push(self.bits as u8);
                self.bits >>= 8;
                self.count -= 8;
            }
        }

        /// A Huffman code is sent most significant bit first.
        fn code(&mut self, code: u32, len: u32) {
            let reversed = code.reverse_bits() >> (32 - len);
            self.put(reversed, len);
        }

        fn finish(mut self) -> Vec<u8> {
            if self.count > 0 {
                self.out.push(self.bits as u8);
            }
            self.out
        }
    }

    /// A fixed-Huffman DEFLATE stream of one zero byte followed by `matches` copies of
    /// 258 bytes at distance 1: 13 bits of input for every 258 bytes of output.
    fn zeros_bomb(matches: usize) -> Vec<u8> {
        let mut w = BitWriter::default();
        w.put(1, 1); // final block
        w.put(1, 2); // fixed Huffman codes
        w.code(0x30, 8); // literal 0
        for _ in 0..matches {
            w.code(0xc5, 8); // length symbol 285: 258 bytes
            w.code(0, 5); // distance symbol 0: distance 1
        }
        w.code(0, 7); // end of block
        w.finish()
    }

    fn chunk(chunk_type: u8, data: &[u8]) -> Vec<u8> {
        let mut out = CHUNK_MAGIC.to_vec();
        out.extend([0xde, 0xad, 0xbe, 0xef]); // checksum, which automerge checks later
        out.push(chunk_type);
        out.extend(leb(data.len() as u64));
        out.extend_from_slice(data);
        out
    }

    /// A V1 message with no heads, need or have, carrying `entries`.
    fn with_changes(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = vec![MESSAGE_TYPE_SYNC_V1, 0, 0, 0];
        out.extend(leb(entries.len() as u64));
        for entry in entries {
            out.extend(leb(entry.len() as u64));
            out.extend_from_slice(entry);
        }
        out
    }

    /// A V1 message with one `have` whose Bloom filter is `bloom`.
    fn with_bloom(bloom: &[u8]) -> Vec<u8> {
        let mut out = vec![MESSAGE_TYPE_SYNC_V1, 0, 0, 1, 0];
        out.extend(leb(bloom.len() as u64));
        out.extend_from_slice(bloom);
        out.push(0);
        out
    }

    /// A boolean column (whose data is any number of runs, so that zeros are valid
    /// whatever their length), compressed.
    const DEFLATED_BOOLEAN_COLUMN: u32 = (1 << COLUMN_ID_SHIFT) | COLUMN_DEFLATE_BIT | 4;

    /// A document chunk whose only column is DEFLATE-compressed `column`.
    fn document_with_deflated_column(column: &[u8]) -> Vec<u8> {
        let mut data = vec![0, 0]; // no actors, no heads
        data.push(1); // one change column
        data.extend(leb(u64::from(DEFLATED_BOOLEAN_COLUMN)));
        data.extend(leb(column.len() as u64));
        data.push(0); // no op columns
        data.extend_from_slice(column);
        chunk(CHUNK_TYPE_DOCUMENT, &data)
    }

    fn check_code(bytes: &[u8], limits: &Limits) -> &'static str {
        match check(bytes, limits) {
            Ok(summary) => panic!("accepted: {summary:?}"),
            Err(e) => e.code(),
        }
    }

    /// The 10-byte message found crashing automerge: one `have` whose Bloom filter has one entry,
    /// 0 bits per entry and one probe. automerge 0.12 accepts it, and its next
    /// `generate_sync_message` divides by zero.
    const ZERO_BITS_PER_ENTRY: [u8; 10] = [0x42, 0, 0, 1, 0, 3, 1, 0, 1, 0];
    /// The 15-byte message found crashing automerge: one entry, 1 bit per entry, 2^32 − 1 probes.
    /// `generate_sync_message` allocates 16 GiB for the probes and aborts.
    const MAX_PROBES: [u8; 15] = [
        0x42, 0, 0, 1, 0, 8, 1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0,
    ];

    #[test]
    fn messages_that_crashed_automerge_are_refused_before_it_sees_them() {
        let limits = Limits::default();
        assert_eq!(check_code(&ZERO_BITS_PER_ENTRY, &limits), "bloom_invalid");
        assert_eq!(check_code(&MAX_PROBES, &limits), "bloom_invalid");
        // automerge's own decoder accepts both (decoding alone is harmless; what
        // crashes is the next generate_sync_message), which is why this module exists.
        assert!(Message::decode(&ZERO_BITS_PER_ENTRY).is_ok());
        assert!(Message::decode(&MAX_PROBES).is_ok());
        // validate refuses them too, and never reaches automerge's decoder.
        assert_eq!(
            validate(&ZERO_BITS_PER_ENTRY, &limits).unwrap_err().code(),
            "bloom_invalid"
        );
    }

    #[test]
    fn compression_bombs_are_refused_under_the_bound() {
        let limits = Limits::default();
        // 16_400 matches inflate to 4.03 MiB from 26 KiB: past CHANGE_BYTES_MAX.
        let matches = CHANGE_BYTES_MAX / 258 + 10;
        let bomb = zeros_bomb(matches);
        assert!(bomb.len() < 32 * 1024);
        let msg = with_changes(&[chunk(CHUNK_TYPE_COMPRESSED, &bomb)]);
        assert_eq!(
            check(&msg, &limits).unwrap_err(),
            SyncMsgError::InflateBound {
                index: 0,
                max: CHANGE_BYTES_MAX
            }
        );
        // The same stream in a document column, against a smaller total budget.
        let small = Limits {
            inflated_bytes_max: 1024 * 1024,
            ..Limits::default()
        };
        let msg = with_changes(&[document_with_deflated_column(&bomb)]);
        assert_eq!(
            check(&msg, &small).unwrap_err(),
            SyncMsgError::InflateBound {
                index: 0,
                max: 1024 * 1024
            }
        );
        // The budget is for the whole message: two streams of 600 KiB each pass
        // alone and fail together.
        let half = zeros_bomb(600 * 1024 / 258);
        let one = with_changes(&[document_with_deflated_column(&half)]);
        assert_eq!(
            check(&one, &small).unwrap().inflated_bytes,
            1 + 258 * (600 * 1024 / 258)
        );
        let two = with_changes(&[
            document_with_deflated_column(&half),
            document_with_deflated_column(&half),
        ]);
        assert_eq!(check_code(&two, &small), "inflate_bound");
        // And in a bundle chunk's column.
        let mut bundle = vec![0, 0]; // no dependencies, no actors
        bundle.push(1); // one change column
        bundle.extend(leb(u64::from(DEFLATED_BOOLEAN_COLUMN)));
        bundle.extend(leb(bomb.len() as u64));
        bundle.extend_from_slice(&bomb);
        bundle.push(0); // no op columns
        let msg = with_changes(&[chunk(CHUNK_TYPE_BUNDLE, &bundle)]);
        assert_eq!(check_code(&msg, &small), "inflate_bound");
    }

    #[test]
    fn the_hand_made_bomb_is_real_deflate() {
        let mut out = Collect::default();
        let stream = zeros_bomb(3);
        assert_eq!(
            inflate::inflate(&stream, usize::MAX, &mut out),
            Ok(1 + 3 * 258)
        );
        assert!(out.0.iter().all(|&b| b == 0));
    }

    fn sleb(mut n: i64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if (n == 0 && byte & 0x40 == 0) || (n == -1 && byte & 0x40 != 0) {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }

    /// `data` as a DEFLATE stream of stored (uncompressed) blocks.
    fn stored(data: &[u8]) -> Vec<u8> {
        let blocks: Vec<&[u8]> = if data.is_empty() {
            vec![&[]]
        } else {
            data.chunks(usize::from(u16::MAX)).collect()
        };
        let mut out = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            out.push(u8::from(i + 1 == blocks.len())); // final?, stored
            let len = block.len() as u16;
            out.extend(len.to_le_bytes());
            out.extend((!len).to_le_bytes());
            out.extend_from_slice(block);
        }
        out
    }

    /// Columns of a hand-made chunk: specification and data of each.
    type Cols = Vec<(u32, Vec<u8>)>;

    /// Column metadata (count, then specification and length of each).
    fn column_meta(columns: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let mut out = leb(columns.len() as u64);
        for (spec, data) in columns {
            out.extend(leb(u64::from(*spec)));
            out.extend(leb(data.len() as u64));
        }
        out
    }

    fn column_data(columns: &[(u32, Vec<u8>)]) -> Vec<u8> {
        columns.iter().flat_map(|(_, d)| d.clone()).collect()
    }

    /// The body of a change chunk by actor `[actor; 16]` (seq 1, no dependencies, time
    /// 0, no message) whose first op is `start_op`, with these op columns.
    fn change_body(actor: u8, start_op: u64, columns: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let mut data = vec![0, 16];
        data.extend([actor; 16]);
        data.push(1);
        data.extend(leb(start_op));
        data.extend([0, 0, 0]); // time, message length, other actors
        data.extend(column_meta(columns));
        data.extend(column_data(columns));
        data
    }

    /// Op columns that declare `n` ops by run-length encoding alone: `n` times "put
    /// null at key x" in the root, with no predecessors.
    fn rle_ops(n: u64) -> Cols {
        let run = sleb(i64::try_from(n).unwrap());
        vec![
            (0x15, [run.clone(), vec![1, b'x']].concat()), // key: run of "x"
            (0x34, leb(n)),                                // insert: n times false
            (0x42, [run.clone(), vec![1]].concat()),       // action: run of 1 (put)
            (0x56, [run.clone(), vec![0]].concat()),       // value metadata: run of null
            (0x70, [run, vec![0]].concat()),               // pred: run of 0
        ]
    }

    /// A change chunk (its checksum not computed) of `n` run-length encoded ops, a few
    /// dozen bytes whatever `n`.
    fn rle_change(actor: u8, n: u64) -> Vec<u8> {
        chunk(CHUNK_TYPE_CHANGE, &change_body(actor, 1, &rle_ops(n)))
    }

    fn document_chunk(changes: &[(u32, Vec<u8>)], ops: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let mut data = vec![0, 0]; // no actors, no heads
        data.extend(column_meta(changes));
        data.extend(column_meta(ops));
        data.extend(column_data(changes));
        data.extend(column_data(ops));
        chunk(CHUNK_TYPE_DOCUMENT, &data)
    }

    fn bundle_chunk(changes: &[(u32, Vec<u8>)], ops: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let mut data = vec![0, 0]; // no dependencies, no actors
        data.extend(column_meta(changes));
        data.extend(column_data(changes));
        data.extend(column_meta(ops));
        data.extend(column_data(ops));
        chunk(CHUNK_TYPE_BUNDLE, &data)
    }

    #[test]
    fn the_run_length_change_is_what_automerge_reads() {
        // Without a bound, automerge walks every op such a change declares.
        let change = automerge::Change::from_bytes(rle_change(7, 5)).unwrap();
        assert_eq!(change.len(), 5);
        assert!(rle_change(7, 1 << 40).len() < 100);
    }

    #[test]
    fn a_change_declaring_a_trillion_ops_by_run_length_is_refused() {
        let limits = Limits::default();
        let trillion = 1u64 << 40;
        let msg = with_changes(&[rle_change(7, trillion)]);
        let err = check(&msg, &limits).unwrap_err();
        assert_eq!(
            err,
            SyncMsgError::TooManyOps {
                index: 0,
                count: trillion,
                limit: OPS_LIMIT_PER_CHANGE,
                max: OPS_PER_CHANGE_MAX,
            }
        );
        assert_eq!(err.code(), "too_many_ops");
        assert_eq!(
            err.to_string(),
            "chunk 0 declares 1099511627776 ops, the limit is 1048576 ops per change"
        );
        assert_eq!(validate(&msg, &limits).unwrap_err().code(), "too_many_ops");

        let run = |n: u64| sleb(i64::try_from(n).unwrap());
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "compressed change",
                chunk(
                    CHUNK_TYPE_COMPRESSED,
                    &stored(&change_body(7, 1, &rle_ops(trillion))),
                ),
            ),
            ("a trillion nulls", {
                let mut ops = rle_ops(5);
                ops[0] = (0x15, [vec![0], leb(trillion)].concat()); // null run
                chunk(CHUNK_TYPE_CHANGE, &change_body(7, 1, &ops))
            }),
            ("a trillion falses", {
                let mut ops = rle_ops(5);
                ops[1] = (0x34, [leb(5), leb(trillion)].concat()); // 5 false, then true
                chunk(CHUNK_TYPE_CHANGE, &change_body(7, 1, &ops))
            }),
            ("one op with a trillion predecessors", {
                let mut ops = rle_ops(1);
                ops[4] = (0x70, [run(1), leb(trillion)].concat());
                ops.push((0x71, [run(trillion), leb(0)].concat())); // pred actor 0
                ops.push((0x73, [run(trillion), sleb(1)].concat())); // pred counter +1
                chunk(CHUNK_TYPE_CHANGE, &change_body(7, 1, &ops))
            }),
            (
                "document ops",
                document_chunk(&[], &[(0x42, [run(trillion), vec![1]].concat())]),
            ),
            (
                "document changes",
                document_chunk(&[(0x01, [run(trillion), vec![0]].concat())], &[]),
            ),
            (
                "compressed document column",
                document_chunk(
                    &[],
                    &[(
                        0x42 | COLUMN_DEFLATE_BIT,
                        stored(&[run(trillion), vec![1]].concat()),
                    )],
                ),
            ),
            (
                "bundle ops",
                bundle_chunk(&[], &[(0x42, [run(trillion), vec![1]].concat())]),
            ),
            (
                "bundle changes",
                bundle_chunk(&[(0x01, [run(trillion), vec![0]].concat())], &[]),
            ),
        ];
        for (what, chunk) in cases {
            assert!(chunk.len() < 200, "{what}: {} bytes", chunk.len());
            let err = check(&with_changes(&[chunk]), &limits).unwrap_err();
            assert_eq!(err.code(), "too_many_ops", "{what}: {err}");
        }
    }

    #[test]
    fn the_op_limits_hold_at_their_boundaries() {
        let limits = Limits::default();
        let max = OPS_PER_CHANGE_MAX as u64;
        let at = check(&with_changes(&[rle_change(7, max)]), &limits).unwrap();
        assert_eq!(at.ops_count, max);
        assert_eq!(
            check(&with_changes(&[rle_change(7, max + 1)]), &limits).unwrap_err(),
            SyncMsgError::TooManyOps {
                index: 0,
                count: max + 1,
                limit: OPS_LIMIT_PER_CHANGE,
                max: OPS_PER_CHANGE_MAX,
            }
        );
        // Changes each within the limit add up against the message's.
        let full: Vec<Vec<u8>> = (0..OPS_PER_MESSAGE_MAX / OPS_PER_CHANGE_MAX)
            .map(|i| rle_change(i as u8, max))
            .collect();
        let summary = check(&with_changes(&full), &limits).unwrap();
        assert_eq!(summary.ops_count, OPS_PER_MESSAGE_MAX as u64);
        let one_more = [full, vec![rle_change(99, 1)]].concat();
        let err = check(&with_changes(&one_more), &limits).unwrap_err();
        assert_eq!(err.code(), "too_many_ops");
        assert!(err.to_string().ends_with("ops per message"), "{err}");

        // With small limits, against what automerge itself counts.
        let small = Limits {
            ops_per_change_max: 5,
            ops_per_message_max: 8,
            ..Limits::default()
        };
        assert_eq!(
            automerge::Change::from_bytes(rle_change(7, 5))
                .unwrap()
                .len(),
            5
        );
        assert_eq!(
            check(&with_changes(&[rle_change(7, 5)]), &small)
                .unwrap()
                .ops_count,
            5
        );
        assert_eq!(
            check_code(&with_changes(&[rle_change(7, 6)]), &small),
            "too_many_ops"
        );
        let eight = with_changes(&[rle_change(1, 5), rle_change(2, 3)]);
        assert_eq!(check(&eight, &small).unwrap().ops_count, 8);
        let nine = with_changes(&[rle_change(1, 5), rle_change(2, 4)]);
        assert_eq!(
            check(&nine, &small).unwrap_err(),
            SyncMsgError::TooManyOps {
                index: 1,
                count: 9,
                limit: OPS_LIMIT_PER_MESSAGE,
                max: 8,
            }
        );
        // Predecessors count as ops: one op naming 5 of them is 6 in all.
        let mut ops = rle_ops(1);
        ops[4] = (0x70, [sleb(1), leb(5)].concat());
        ops.push((0x71, [sleb(5), leb(0)].concat()));
        ops.push((0x73, [sleb(5), sleb(1)].concat()));
        let preds = with_changes(&[chunk(CHUNK_TYPE_CHANGE, &change_body(7, 9, &ops))]);
        assert_eq!(check(&preds, &small).unwrap().ops_count, 6);
        let five = Limits {
            ops_per_message_max: 5,
            ..small
        };
        assert_eq!(check_code(&preds, &five), "too_many_ops");
    }

    #[test]
    fn op_columns_must_agree_and_op_counters_fit_32_bits() {
        let limits = Limits::default();
        let code = |start_op: u64, ops: &[(u32, Vec<u8>)]| {
            let change = chunk(CHUNK_TYPE_CHANGE, &change_body(7, start_op, ops));
            let automerge_reads = automerge::Change::from_bytes(change.clone()).is_ok();
            match check(&with_changes(&[change]), &limits) {
                Ok(_) => ("ok", automerge_reads),
                Err(e) => (e.code(), automerge_reads),
            }
        };
        let with = |at: usize, column: (u32, Vec<u8>)| {
            let mut ops = rle_ops(5);
            ops[at] = column;
            ops
        };
        // (what, start op, columns, code, whether automerge reads the change)
        let cases: Vec<(&str, u64, Cols, &str, bool)> = vec![
            ("agreeing columns", 1, rle_ops(5), "ok", true),
            (
                // automerge's encoders leave out a column of nulls.
                "an empty column",
                1,
                [vec![(0x01, vec![]), (0x02, vec![])], rle_ops(5)].concat(),
                "ok",
                true,
            ),
            (
                "a longer key column (automerge ignores the extra row)",
                1,
                with(0, (0x15, [sleb(6), vec![1, b'x']].concat())),
                "chunk_invalid",
                true,
            ),
            (
                "a shorter insert column",
                1,
                with(1, (0x34, leb(4))),
                "chunk_invalid",
                false,
            ),
            (
                "predecessor columns shorter than their group",
                1,
                [
                    with(4, (0x70, [sleb(5), leb(1)].concat())),
                    vec![
                        (0x71, [sleb(4), leb(0)].concat()),
                        (0x73, [sleb(4), sleb(1)].concat()),
                    ],
                ]
                .concat(),
                "chunk_invalid",
                false,
            ),
            (
                "literal runs, values as they are",
                1,
                with(2, (0x42, [sleb(-5), vec![1; 5]].concat())),
                "ok",
                true,
            ),
            (
                "a literal run past the column's end",
                1,
                with(2, (0x42, [sleb(-5), vec![1; 4]].concat())),
                "chunk_invalid",
                false,
            ),
            (
                "a compressed column",
                1,
                with(
                    2,
                    (
                        0x42 | COLUMN_DEFLATE_BIT,
                        stored(&[sleb(5), vec![1]].concat()),
                    ),
                ),
                "chunk_invalid",
                false,
            ),
            (
                "the last op at 2^32 - 1",
                u64::from(u32::MAX) - 4,
                rle_ops(5),
                "ok",
                true,
            ),
            (
                "the last op past 2^32 - 1",
                u64::from(u32::MAX) - 3,
                rle_ops(5),
                "chunk_invalid",
                true,
            ),
            (
                "no ops, starting past 2^32 - 1",
                1 << 32,
                vec![],
                "chunk_invalid",
                false,
            ),
            ("start op 0", 0, rle_ops(5), "chunk_invalid", false),
        ];
        for (what, start_op, ops, expected, automerge_reads) in cases {
            assert_eq!(
                code(start_op, &ops),
                (expected, automerge_reads),
                "{what}: (code, whether automerge reads it)"
            );
        }
    }

    #[test]
    fn column_runs_are_counted_without_expanding_them() {
        use runs::{count, Counted};
        type Case = (&'static str, u32, Vec<u8>, Result<Counted, &'static str>);
        let rows = |rows| Ok(Counted { rows, sum: 0 });
        let cases: Vec<Case> = vec![
            ("empty", COLUMN_TYPE_INTEGER, vec![], rows(0)),
            (
                "run",
                COLUMN_TYPE_INTEGER,
                [sleb(3), leb(300)].concat(),
                rows(3),
            ),
            (
                "literal",
                COLUMN_TYPE_ACTOR,
                [sleb(-2), leb(1), leb(300)].concat(),
                rows(2),
            ),
            (
                "nulls",
                COLUMN_TYPE_ACTOR,
                [sleb(0), leb(1 << 40)].concat(),
                rows(1 << 40),
            ),
            (
                "all three",
                COLUMN_TYPE_VALUE_METADATA,
                [sleb(2), leb(7), sleb(0), leb(3), sleb(-1), leb(8)].concat(),
                rows(6),
            ),
            (
                "delta",
                COLUMN_TYPE_DELTA,
                [sleb(4), sleb(-1), sleb(-2), sleb(i64::MIN), sleb(5)].concat(),
                rows(6),
            ),
            (
                "strings",
                COLUMN_TYPE_STRING,
                [sleb(-2), vec![2, b'h', b'i', 0], sleb(9), vec![1, b'x']].concat(),
                rows(11),
            ),
            (
                "booleans",
                COLUMN_TYPE_BOOLEAN,
                [leb(0), leb(4), leb(0), leb(2)].concat(),
                rows(6),
            ),
            (
                "group",
                COLUMN_TYPE_GROUP,
                [sleb(3), leb(2), sleb(-2), leb(1), leb(5), sleb(0), leb(4)].concat(),
                Ok(Counted { rows: 9, sum: 12 }),
            ),
            (
                "group past u64",
                COLUMN_TYPE_GROUP,
                [sleb(i64::MAX), leb(u64::MAX)].concat(),
                Ok(Counted {
                    rows: i64::MAX as u64,
                    sum: u64::MAX,
                }),
            ),
            (
                "runs past u64 saturate",
                COLUMN_TYPE_INTEGER,
                [sleb(i64::MAX), leb(1), sleb(0), leb(u64::MAX)].concat(),
                rows(u64::MAX),
            ),
            ("value bytes", COLUMN_TYPE_VALUE, vec![0xff; 3], rows(0)),
            (
                "overlong, as automerge's column decoder reads it",
                COLUMN_TYPE_INTEGER,
                vec![0x83, 0x80, 0x00, 0x01],
                rows(3),
            ),
            (
                "truncated value",
                COLUMN_TYPE_INTEGER,
                [sleb(3), vec![0x80]].concat(),
                Err("column data ends mid-value"),
            ),
            (
                "string past the end",
                COLUMN_TYPE_STRING,
                [sleb(1), vec![5, b'h']].concat(),
                Err("column value past the end of the column"),
            ),
            (
                "count past 64 bits",
                COLUMN_TYPE_BOOLEAN,
                [vec![0xff; 9], vec![0x02]].concat(),
                Err("column value larger than 64 bits"),
            ),
            (
                "literal of 2^63 values ends with the data",
                COLUMN_TYPE_INTEGER,
                [sleb(i64::MIN), vec![1; 3]].concat(),
                Err("column data ends mid-value"),
            ),
        ];
        for (what, kind, data, expected) in cases {
            assert_eq!(count(kind, &data), expected, "{what}");
        }
    }

    #[test]
    fn changes_automerge_writes_declare_what_automerge_reads() {
        // Small changes, one with thousands of ops, ones that overwrite, delete and
        // resolve a conflict (predecessors), and the compressed forms of all of them.
        let mut doc = doc_with_tasks(1, 20);
        let list = doc.get(ROOT, "tasks").unwrap().unwrap().1;
        for i in 0..1500 {
            let task = doc
                .put_object(&list, format!("big{i}"), automerge::ObjType::Map)
                .unwrap();
            doc.put(&task, "content", format!("Task number {i}"))
                .unwrap();
            doc.put(&task, "status", "pending").unwrap();
        }
        doc.commit();
        for i in 0..10 {
            let task = doc.get(&list, format!("t{i}")).unwrap().unwrap().1;
            doc.put(&task, "status", "completed").unwrap();
            doc.delete(&list, format!("big{i}")).unwrap();
        }
        doc.commit();
        let mut other = doc.fork().with_actor(automerge::ActorId::from([2; 16]));
        let task = doc.get(&list, "t19").unwrap().unwrap().1;
        doc.put(&task, "status", "cancelled").unwrap();
        other.put(&task, "status", "in_progress").unwrap();
        doc.merge(&mut other).unwrap();
        doc.put(&task, "status", "pending").unwrap();
        doc.commit();

        let (mut largest, mut compressed, mut two_preds) = (0, 0, 0);
        for mut change in doc.get_changes(&[]) {
            let ops = change.decode().operations;
            let expected: u64 = ops.iter().map(|op| 1 + op.pred.len() as u64).sum();
            largest = largest.max(ops.len());
            two_preds += ops.iter().filter(|op| op.pred.len() == 2).count();
            let raw = change.raw_bytes().to_vec();
            let sent = change.bytes().to_vec();
            if sent[8] == CHUNK_TYPE_COMPRESSED {
                compressed += 1;
            }
            for bytes in [raw, sent] {
                let summary = check(&with_changes(&[bytes]), &Limits::default()).unwrap();
                assert_eq!(summary.ops_count, expected, "{}", change.hash());
            }
        }
        assert!(largest >= 4500, "a change with thousands of ops: {largest}");
        assert!(compressed >= 1, "automerge compressed a change");
        assert!(two_preds >= 1, "an op with two predecessors");

        // The whole document as one chunk: its ops and their successors, its changes
        // and their dependencies. Deletions are not ops of a document.
        let changes = doc.get_changes(&[]);
        let decoded: Vec<_> = changes.iter().map(|c| c.decode()).collect();
        let ops: u64 = decoded
            .iter()
            .flat_map(|c| &c.operations)
            .map(|op| u64::from(!matches!(op.action, automerge::legacy::OpType::Delete)))
            .sum();
        let preds: u64 = decoded
            .iter()
            .flat_map(|c| &c.operations)
            .map(|op| op.pred.len() as u64)
            .sum();
        let deps: u64 = decoded.iter().map(|c| 1 + c.deps.len() as u64).sum();
        for saved in [doc.save(), doc.save_nocompress()] {
            let summary = check(&with_changes(&[saved]), &Limits::default()).unwrap();
            assert_eq!(summary.ops_count, ops + preds + deps);
        }
    }

    #[test]
    fn bad_messages_are_refused_with_a_stable_code() {
        let limits = Limits::default();
        let valid = real_messages().remove(0);
        let hash = |b: u8| [b; HASH_BYTES];
        let mut unsorted = vec![MESSAGE_TYPE_SYNC_V1, 2];
        unsorted.extend(hash(2));
        unsorted.extend(hash(1));
        unsorted.extend([0, 0, 0]);
        let mut change_too_large = CHUNK_MAGIC.to_vec();
        change_too_large.extend([0, 0, 0, 0, CHUNK_TYPE_CHANGE]);
        change_too_large.extend(leb(CHANGE_BYTES_MAX as u64 + 1));
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", vec![], "malformed"),
            (
                "unknown type byte",
                vec![0x44, 0, 0, 0, 0],
                "unknown_version",
            ),
            ("truncated", valid[..valid.len() - 1].to_vec(), "malformed"),
            ("truncated heads", vec![0x42, 1, 0xaa], "malformed"),
            (
                "overlong LEB128",
                vec![0x42, 0x80, 0x00, 0, 0, 0],
                "malformed",
            ),
            (
                "LEB128 above 64 bits",
                [vec![0x42], vec![0xff; 10], vec![0x01]].concat(),
                "malformed",
            ),
            (
                "oversize",
                vec![0x42; SYNC_MESSAGE_BYTES_MAX + 1],
                "message_too_large",
            ),
            (
                "2^40 heads declared",
                [vec![0x42], leb(1 << 40)].concat(),
                "too_many_hashes",
            ),
            (
                "too many needs",
                [vec![0x42, 0], leb(HEADS_COUNT_MAX as u64 + 1)].concat(),
                "too_many_hashes",
            ),
            ("unsorted heads", unsorted, "heads_unsorted"),
            (
                "too many haves",
                [vec![0x42, 0, 0], leb(HAVE_COUNT_MAX as u64 + 1)].concat(),
                "too_many_haves",
            ),
            (
                "Bloom filter over the limit",
                [vec![0x42, 0, 0, 1, 0], leb(BLOOM_BYTES_MAX as u64 + 1)].concat(),
                "bloom_too_large",
            ),
            (
                "Bloom filter for 0 entries",
                with_bloom(&[0, 10, 7]),
                "bloom_invalid",
            ),
            (
                "Bloom filter with 0 probes",
                with_bloom(&[1, 10, 0, 0, 0]),
                "bloom_invalid",
            ),
            (
                "Bloom filter, 33 bits per entry",
                with_bloom(&[1, 33, 7, 0, 0, 0, 0, 0]),
                "bloom_invalid",
            ),
            (
                "Bloom filter, 33 probes",
                with_bloom(&[1, 10, 33, 0, 0]),
                "bloom_invalid",
            ),
            (
                "Bloom filter, bits too short",
                with_bloom(&[2, 10, 7, 0, 0]),
                "bloom_invalid",
            ),
            (
                "Bloom filter, a byte too many",
                with_bloom(&[1, 10, 7, 0, 0, 0]),
                "bloom_invalid",
            ),
            (
                "Bloom filter, truncated parameters",
                with_bloom(&[1, 10]),
                "bloom_invalid",
            ),
            (
                "Bloom filter, 2^32 entries",
                with_bloom(&[0x80, 0x80, 0x80, 0x80, 0x10, 1, 1]),
                "bloom_invalid",
            ),
            (
                "2^40 changes declared",
                [vec![0x42, 0, 0, 0], leb(1 << 40)].concat(),
                "too_many_changes",
            ),
            (
                "change longer than the limit",
                with_changes(&[change_too_large]),
                "change_too_large",
            ),
            (
                "empty change entry",
                with_changes(&[vec![]]),
                "chunk_invalid",
            ),
            ("bad magic", with_changes(&[vec![0; 12]]), "chunk_invalid"),
            (
                "unknown chunk type",
                with_changes(&[chunk(9, b"x")]),
                "chunk_invalid",
            ),
            (
                "chunk longer than its entry",
                with_changes(&[chunk(CHUNK_TYPE_CHANGE, b"abc")[..11].to_vec()]),
                "chunk_invalid",
            ),
            (
                "chunk split over two entries",
                with_changes(&[
                    chunk(CHUNK_TYPE_CHANGE, b"abc")[..6].to_vec(),
                    chunk(CHUNK_TYPE_CHANGE, b"abc")[6..].to_vec(),
                ]),
                "chunk_invalid",
            ),
            (
                "document column past the chunk",
                with_changes(&[chunk(CHUNK_TYPE_DOCUMENT, &[0, 0, 1, 0x10, 50, 0, 1, 2])]),
                "chunk_invalid",
            ),
            (
                "document with too many columns",
                with_changes(&[chunk(CHUNK_TYPE_DOCUMENT, &[0, 0, 0xff, 0x01])]),
                "chunk_invalid",
            ),
            (
                "compressed chunk, block type 3",
                with_changes(&[chunk(CHUNK_TYPE_COMPRESSED, &[0x07])]),
                "deflate_invalid",
            ),
            (
                "compressed chunk, truncated stream",
                with_changes(&[chunk(CHUNK_TYPE_COMPRESSED, &zeros_bomb(10)[..4])]),
                "deflate_invalid",
            ),
            (
                "compressed chunk, distance before the start",
                with_changes(&[chunk(CHUNK_TYPE_COMPRESSED, &{
                    let mut w = BitWriter::default();
                    w.put(1, 1);
                    w.put(1, 2);
                    w.code(0xc5, 8);
                    w.code(0, 5);
                    w.code(0, 7);
                    w.finish()
                })]),
                "deflate_invalid",
            ),
            (
                "stored block with a bad length check",
                with_changes(&[chunk(
                    CHUNK_TYPE_COMPRESSED,
                    &[0x01, 2, 0, 0, 0, b'h', b'i'],
                )]),
                "deflate_invalid",
            ),
            (
                "too many change chunks in one entry",
                with_changes(&[[rle_change(1, 1), rle_change(2, 1)].concat()]),
                "too_many_changes",
            ),
        ];
        let one_change = Limits {
            changes_count_max: 1,
            ..Limits::default()
        };
        for (name, bytes, code) in cases {
            let limits = if name.starts_with("too many change chunks") {
                &one_change
            } else {
                &limits
            };
            let err = check(&bytes, limits).expect_err(name);
            assert_eq!(err.code(), code, "{name}: {err}");
        }
    }

    fn sync_until_quiet(
        a: &mut AutoCommit,
        b: &mut AutoCommit,
        mut on_message: impl FnMut(&Message),
    ) {
        let (mut sa, mut sb) = (sync::State::new(), sync::State::new());
        for _ in 0..20 {
            let ma = a.sync().generate_sync_message(&mut sa);
            let mb = b.sync().generate_sync_message(&mut sb);
            if ma.is_none() && mb.is_none() {
                return;
            }
            if let Some(m) = ma {
                on_message(&m);
                b.sync().receive_sync_message(&mut sb, m).unwrap();
            }
            if let Some(m) = mb {
                on_message(&m);
                a.sync().receive_sync_message(&mut sa, m).unwrap();
            }
        }
        panic!("sync did not settle");
    }

    fn doc_with_tasks(actor: u8, tasks: usize) -> AutoCommit {
        let mut doc = AutoCommit::new().with_actor(automerge::ActorId::from([actor; 16]));
        let list = doc
            .put_object(ROOT, "tasks", automerge::ObjType::Map)
            .unwrap();
        doc.commit();
        for i in 0..tasks {
            let task = doc
                .put_object(&list, format!("t{i}"), automerge::ObjType::Map)
                .unwrap();
            doc.put(&task, "content", format!("Run the tests, round {i}"))
                .unwrap();
            doc.put(&task, "status", "pending").unwrap();
            doc.commit();
        }
        doc
    }

    /// Sync messages that automerge 0.12 generates, all of which must pass.
    fn real_messages() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut a = doc_with_tasks(1, 5);
        let mut b = doc_with_tasks(2, 3);
        sync_until_quiet(&mut a, &mut b, |m| out.push(m.clone().encode()));
        out
    }

    fn passes_and_decodes_to(msg: &Message) -> Summary {
        let bytes = msg.clone().encode();
        let checked = validate(&bytes, &Limits::default())
            .unwrap_or_else(|e| panic!("{e} ({} bytes)", bytes.len()));
        assert_eq!(checked.message(), msg);
        checked.summary().clone()
    }

    #[test]
    fn messages_automerge_generates_pass_and_decode_to_the_same_message() {
        let mut a = doc_with_tasks(1, 20);
        let mut b = doc_with_tasks(2, 7);
        let mut seen = 0;
        sync_until_quiet(&mut a, &mut b, |m| {
            passes_and_decode_to_count(m, &mut seen);
        });
        assert!(seen >= 3);
        assert_eq!(a.get_heads(), b.get_heads());

        // Concurrent edits to the same task after the first sync.
        let list = a.get(ROOT, "tasks").unwrap().unwrap().1;
        let task = a.get(&list, "t3").unwrap().unwrap().1;
        a.put(&task, "status", "completed").unwrap();
        let task_b = b.get(&list, "t3").unwrap().unwrap().1;
        b.put(&task_b, "status", "cancelled").unwrap();
        sync_until_quiet(&mut a, &mut b, |m| {
            passes_and_decode_to_count(m, &mut seen);
        });
        assert_eq!(a.get_heads(), b.get_heads());
        assert_eq!(a.get_heads().len(), 2);
    }

    fn passes_and_decode_to_count(m: &Message, seen: &mut usize) {
        passes_and_decodes_to(m);
        *seen += 1;
    }

    #[test]
    fn a_whole_document_with_compressed_columns_passes() {
        // A fresh peer gets the whole document as one chunk (a V2 message), whose
        // larger columns automerge DEFLATE-compresses.
        let mut big = doc_with_tasks(1, 1000);
        let mut empty = AutoCommit::new();
        let mut with_changes = Vec::new();
        sync_until_quiet(&mut big, &mut empty, |m| {
            let summary = passes_and_decodes_to(m);
            if summary.chunks_count > 0 {
                with_changes.push(summary);
            }
        });
        assert_eq!(empty.get_heads(), big.get_heads());
        assert!(!with_changes.is_empty());
        for summary in with_changes {
            assert_eq!(summary.version, SyncVersion::V2);
            assert_eq!(summary.chunks_count, 1, "the document travels as one chunk");
            assert!(
                summary.inflated_bytes > 5 * summary.change_bytes,
                "compressed columns were measured: {summary:?}"
            );
        }
    }

    #[test]
    fn many_changes_in_v1_messages_pass() {
        // A peer that never sends flags is taken for a V1-only peer, so the other
        // side sends every change as its own chunk.
        let mut big = doc_with_tasks(1, 1000);
        let mut old = AutoCommit::new();
        let (mut s_big, mut s_old) = (sync::State::new(), sync::State::new());
        let mut chunks = 0;
        for _ in 0..10 {
            let from_old = old.sync().generate_sync_message(&mut s_old).map(|mut m| {
                m.flags = None;
                m.version = sync::MessageVersion::V1;
                m
            });
            if let Some(m) = from_old {
                passes_and_decodes_to(&m);
                big.sync().receive_sync_message(&mut s_big, m).unwrap();
            }
            if let Some(m) = big.sync().generate_sync_message(&mut s_big) {
                let summary = passes_and_decodes_to(&m);
                chunks += summary.chunks_count;
                old.sync().receive_sync_message(&mut s_old, m).unwrap();
            }
        }
        assert_eq!(old.get_heads(), big.get_heads());
        assert_eq!(chunks, 1001, "one chunk per change");
    }

    #[test]
    fn compressed_change_chunks_pass_and_inflate_like_zlib() {
        let mut doc = doc_with_tasks(1, 0);
        let list = doc.get(ROOT, "tasks").unwrap().unwrap().1;
        for i in 0..50 {
            let task = doc
                .put_object(&list, format!("t{i}"), automerge::ObjType::Map)
                .unwrap();
            doc.put(&task, "content", "a long description ".repeat(5))
                .unwrap();
        }
        doc.commit();
        let mut change = doc.get_last_local_change().unwrap().clone();
        let raw = change.raw_bytes().to_vec();
        let compressed = change.bytes().to_vec();
        assert_eq!(
            compressed[8], CHUNK_TYPE_COMPRESSED,
            "automerge compressed it"
        );

        // Our inflater produces exactly the change body that zlib-rs compressed.
        let mut r = Reader::new(&compressed[9..]);
        let len = r.leb128_u64().unwrap();
        let body = r.take(len).unwrap();
        let mut out = Collect::default();
        let n = inflate::inflate(body, usize::MAX, &mut out).unwrap();
        let mut raw_reader = Reader::new(&raw[9..]);
        let raw_len = raw_reader.leb128_u64().unwrap();
        assert_eq!(out.0, raw_reader.take(raw_len).unwrap());
        assert_eq!(n as u64, raw_len);
        // So does the one validation keeps, to count the ops in it.
        let mut kept = inflate::Keep::default();
        assert_eq!(inflate::inflate(body, usize::MAX, &mut kept), Ok(n));
        assert_eq!(kept.0, out.0);

        // In a sync message it passes, and automerge applies it.
        let msg = Message {
            heads: doc.get_heads(),
            need: vec![],
            have: vec![],
            changes: vec![compressed].into(),
            flags: None,
            version: sync::MessageVersion::V1,
        };
        let summary = passes_and_decodes_to(&msg);
        assert_eq!(summary.inflated_bytes as u64, raw_len);
        let mut base = doc_with_tasks(1, 0);
        let mut fresh = base.fork();
        fresh
            .sync()
            .receive_sync_message(&mut sync::State::new(), msg)
            .unwrap();
        base.merge(&mut doc).unwrap();
        assert_eq!(fresh.get_heads(), base.get_heads());
    }

    /// Sync messages produced by `@automerge/automerge` 3.5.0 under node: a document
    /// with 120 changes syncing with a document with one, until both were quiet
    /// (`Automerge.generateSyncMessage` / `receiveSyncMessage`).
    const JS_MESSAGES: [&str; 4] = [
        // a2b, 198 bytes
        "4201ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b983462776436950001009b01790a07a3db35d6d5587fc834b43c17c635d51533ecd1375aecc91aa794203259c94f7186177f5f4d475e48b1754615b0bfa001fedd97ea2ff58ff6153d3cd5c7d396762fb2e39627b22d9bd0d3276d11bfcd1c7cf07c08d3a0be9288d3a81f4e195ab9b9268d6ae5376cd5bf724d94a0c9d27515488e4dcb124097f0a954a91ee73738110a180a831427f95c1657952f88c6560c63089cc4a15aee00020284",
        // b2a, 228 bytes
        "43014d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e9301ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b98346277643695010005010a07e521019301856f4a8353b1ecbe0088010110bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb014d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e93060102030213022302400256020b01040204130415082102230234024203560357018001027f007f017f027f007f007f0700017f0000017f0100017f007f046e6f746500010200020101017e04017e001662020000020284",
        // a2b, 3484 bytes
        "43024d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e93ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b983462776436950001014d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e939b01790a07a3db35d6d5587fc834b43c17c635d51533ecd1375aecc91aa794203259c94f7186177f5f4d475e48b1754615b0bfa001fedd97ea2ff58ff6153d3cd5c7d396762fb2e39627b22d9bd0d3276d11bfcd1c7cf07c08d3a0be9288d3a81f4e195ab9b9268d6ae5376cd5bf724d94a0c9d27515488e4dcb124097f0a954a91ee73738110a180a831427f95c1657952f88c6560c63089cc4a15aee019419856f4a83248b0eac0089190210aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa10bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb024d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e93ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b983462776436950701050306130c230e4007430556030c010a0ae406191a1bc8081dae02210a2b6834f2014a175e155fb002800103f900007f01f900017f887f7f010a20da002114227fff607ef1dbbad8068fa4c5a779f800007f00f800017f007f00f70001fa00070002f800007f018a1e0005c1e7421467000550e7ceecde6db3b375eeb765f647922749f224491e84002a76eca8a8340b282a766c51c0868a0a8a8a2da1da000b8a8a62ce59822f4b2cc0b7e9e027ff67fe825ffddff83bfef0ffe45fa8b6fc1a8bb5165a2cbfd5629b851ecbefb5d86761d4f2c72c8e5ba8865f03d6022df05bc136a007ea05fb8031681c9c006a6d2db5b9ccc61e5b7b6deeb371c5d6559bd76c4cd97a61f3a58d3a472b1cae74d0eea8c3e10107fd8e6e38bce9e0b5a3370ea71dac0e694d886b43e80ce9508887431808e976887742980de96d88ef42a80f6b7d981bc2e80aeb6898c7c2180c6b28cc7b617c086b2ecc8f616ca236935b8813d449f214314c3d201f12f3d467f20bd110d1b608b747d01dd19908cf463012d1e3089f44b010d1b708bf47d018d5ce287745713eaa0b51fe13c5b3a89e47f96f143fa2aa8af1ef189a626a8eb125864b31f5c4d81bc3684c63318ec75013576d9c4be3688b6b4f9c7be3b81cd79538afc63119d7549c2fe2589e505d822b12d89f507b821d095c4fa83fc11b09bc4ae875826f1258e56ab5cb352e0ebaea7479c8c52d57032e6fbb987135ebf2ad8b7549d527b93e8923497525793489bb490d263994c4fba43e243997c4464f9b3c6ef670dcd3098f273ddcf734ecf181874f9ee63d7ef6b035a58614b7a5703aa5ee14cfa4f028a591141fa7f035a58514bfa5b023adc63477a6712eadf3695e48e3695acfd27c9ec6625a3fd2acca6077464d1936677031a34b19f664f05f46a3198e65509d554d96b559b466d596e59e2cfab2ba9ce5952c26b29acc722a8b65392dcfb12e877d39edcfb13d876b395dcfb13f879739bdcaf1750e2bf35a95e7ea3c0ee47530cfce3c6ee6752bcf813ca6f39ac973368fb5bed6f9acf771d8d7119f5d3eeef8baeb73d0c73b5fef7d7ef0b141da286e128e49c7c513c23de9be382c7c943e89f3c216a3ad860d06a78c4e1b761b3c347a643862f0c5e8abe182c1f6827614d858c0d982ce1578be802705f3b4c067052c16cc8f02ab8a682a9ae6225b8ae8299ade22fb8a182f9a8922278b585632cb4bac2b617fc9b497d851427fc9dc28f166096f4a66bac49912d696cdba32ebcb3852365d651e2d63b06c86cabc57c65cd97c2cf353195b02b335604380d381e90e7826c048601e077c12e05b60be075c0cb0ab627657d854c1c58ab954614f05a3153356e178e57f63a81365606064636060a6162d364a8f86c3304a07e2839a060025d5e93b146a1806f07995f6bd79a7bd6fe7af385fceb7f36f9cd9f77ddf5e242649929084a12ca1ec5b4394a649428862b25496525124d590733deff3edf97db8bfdcd7755f8fc0932010c43141bc9030e5a978228863fffd2524ecdfbff9fd4f582024ac22212ae00c26cc810309317462420a1112b6c00a08f70c2b03475808ddcdc2e00a164507d91c38c062e844961207797f411ce6fd65e0883f84eef687e32861e5fe37e862ff3c38c5bf89fee30b6ca384cdfa8ab6714ffa2ac13dbe2e7487af175cea9b4117f816c149bea4eddcbfbde9db296133de52f4b8b706dce5ed41b779fbc145de59749e7709bce94989e7fee1c98ca784bdf194a3473d75e09027826ef20c816f783ea0b33d2be05feeb41ddc2beeec1d94b0d7ee2af490bb09dceaee43d7b947c1b9eecfe84cf70ff09a2b6327f7922b6f2725eca5eb1ebadfd5066e740da26b5ce3e0abaeafe874d76ff03767d62eee4567c12e4ad80b6703bad7d901ae758ea02b9d93e0cbceefe880f30ff88b236737f7bca3783725ecb9a3051d767483ab1dafd0b71d6fc1171d3fd1c98e737b28611fedf97bb8dfd96f819fdaefa31fda1f832bec5174d03e074eb56fa0b76ca97b296173b6c2bddc53b60af063db0374a7ed29f8966d1a7dd3f6117cce96b88f3b66bdb88f12f6d65a829eb05683bbad8fd0edd6e7e062eb7bf475eb17f01fcbf9fddceb96cbfb2961939632f498a516dc6179826eb6bc00175816d0d72cdfc0bfcd170e70af9aaf1ea0848d9befa087cd8de036f33374bdf92538cffc097dc5bc06fe61ba74907bd9947b9012366aba8b1e30b5829b4c03e8bba6d7e06cd332fa92e91778c578e510f727e38d4394b021633dfa993104ae330ea3ef18df80338dabe80bc64df092e1da61ee0543d1614a58bfa119fdc4d005ae318ca1cb0c33e074c33afabc21e908256c517ffd08f77b7d29b857df8e7ea4ef0157ea27d025fa5970401f4327ea538e52c2e675378f724febcac1615d27fa812e02bead9b4217ea3e8093755be80d6d9a9012f64e1b147247b555e087da87e8fbda3e7050fb0e9daffd0cded22453ee9f9a0c4a099bd2dc46bfd2dc03776ac2e816cd20f8a6661e9da3f90a8ea90322eeefea2c11256c425d891e513780dbd5bde806f508f8ba7a119da5fe0e5e57a51fe3feaaca3946091b53d5a007552de066553ffa9eea15f89a6a099da1fa095e55661ee7feaccc3f4e091b56d6a1fb94f7c1f5ca217495320abea25c41a72937c0cb8aec13dc1f1485272861038a267444f1007c57318a2e574c9f101196ae58479f57249d1411f6519e7f12f72dbf058ec843e86e79185c269f4417c917c0c9f22df4862ced9488b0b7b2127c4513b26a7097ac07dd26eb0717cae6d0b9b265704c1a388d7d4bb34e8b081b97de410f4b1bc1add23e749d74149c23fd82be2c5d07af4a32cf605f92fc3322c28624f5e8679210b8563282ae944c8233246be854c916f89338ef2cf7acb8e4ac88b05e713bfa91b8075c218ea283e239708a78f36c3cf91fed933d8e15410c0697a9054e015c61dcff7d9c157a11d2dbe01529649c1b79b90204489394dc9f5d89d5fef5f3f9feeaedbd2f8f6f8fc3f33030ce67e37c43244aa2265aa227466226566263e4ec9bfaa74a2bd28ab422ad482bd28ab422ad8251311a46c71818136361ecc382e5c41258b2ae581a968e6560995816967d58b19e58036bc19aef86b5631d5827d685751f366c27b6c056b0556c99756c03dbc4b6b0edc38efdc41ed80bf68abd61cf7c609fd817f67d38709c380247c15171341c1d47f6268e85631f4e9c27cec05970569c0d67c73970667fe1dc870bd7892b70155c1557c3d5710d5c1357ceecc38dfbc41db80bee8abbe1eeb807ee897be1de4fef7e7cfcfa7af776f7c3c317bf3f9e3efd87c9e72bb9b671fd84eb0aae2bb8aee02f5dc1972bb9fd836dfc067f01f900007f018a1e00ab6264605458c0344b9c53a9ee6ada59494ea5fa4529ec8a75d7ab4fb1702ad6adadfcc2c6a958d75c3e8f9353b1ee66c9096e4ec5baf5459f783915eb5a0be608702ad6ddce3d26c4a958b731fb8308a762fdf13479c67a2639223048dd28aea7791828501503007a01021d021d021d021d021d021d021d021d021d021d021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021f021f021f021f021f021f021f021f021f021f021f021f021f021f021f021f021f021f021f021fab67f9c9c050cfc8c4224b24961bc52cf4080379aa6200fbc5c0502fc6c4204b24961bc50cf4080379aa620085d6bb4d04311885d156a604bfedbf0d4a58315a08182176b77f3222741cdfecc88feff6f6ba8ee7c7793ccfc7f3715cafafdbf973a4eff37affbceeff8e5963d15835368d5de3d038352e8d410413d128132953299329d329132a532a932ad3aad0aaf83cd1aad0aad0aad0aad0aad0aad0aad0aad2aad2aafaf2d1aad2aad2aad2aad2aad2aad2aad1aad1aad1aaf9a5a255a355a355a355a355a355a755a755a755a755f7b34eab4eab4eab4eab4eab41ab41ab41ab41ab41abe13f9056835683568356935693569356935693569356d3c140ab49ab49ab45ab45ab45ab45ab45ab45ab45abe5baa2d5a255d02a6815b40a5a05ad825641aba0553845372dea184daed1e41c4deed1e4204d2ed2e4244d6ed2e4284d56db257cf66cb54dc56f327ed3f19b90df94fc26e5ff5afe17851f007978020284",
        // b2a, 138 bytes
        "43024d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e93ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b983462776436950001024d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e93ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b983462776436950000020284",
    ];

    /// The `data` of the `sync` frame in which the JS client sent a whole new document
    /// to the JS server (see the wire tests).
    const JS_DOC_SYNC: &str = "4301b6a9b3d8c7944165a9b9eeaa3b9c2ba93869e62d501cfb4d6f27140212bcb4ee00010008040a074b8df42398019803856f4a83a90d1e6d008d030110a238ae38f721270add0f569cd57acee001b6a9b3d8c7944165a9b9eeaa3b9c2ba93869e62d501cfb4d6f27140212bcb4ee0701020302130423084004430456020c01050216111813261545210323103406420e560c5742800103040004017f0103197f96d7bad80603007f0003017f00020104070001cb00000001030102020f030704021b0f1c071d02340f35073600070e000001060000030e000001060000030e000001060000067e00050d017e6e14050100027e671e0d017e552d050100027e4e370d017ebc7fc60005017a057461736b7302743002743102743207636f6e74656e740673746174757300167e07636f6e74656e740673746174757300167e07636f6e74656e74067374617475730016cc0000020102197f4f17017f0217017f021701061602160216040002041601020416010204160106001616020016160200161652756e20746865207465737473203070656e64696e6752756e20746865207465737473203170656e64696e6752756e20746865207465737473203270656e64696e67cc000003020284";

    #[test]
    fn messages_the_js_client_generates_pass() {
        let mut totals = (0, 0);
        for fixture in JS_MESSAGES.iter().chain([&JS_DOC_SYNC]) {
            let bytes = hex(fixture);
            let checked = validate(&bytes, &Limits::default()).unwrap();
            assert_eq!(checked.message().clone().encode(), bytes);
            totals.0 += checked.summary().chunks_count;
            totals.1 += checked.summary().inflated_bytes;
        }
        assert!(totals.0 >= 2, "the fixtures carry changes");
        // Feed them to a Rust document: it converges with what the JS side built.
        let mut doc = AutoCommit::new();
        let mut state = sync::State::new();
        for fixture in JS_MESSAGES.iter().step_by(2) {
            let msg = validate(&hex(fixture), &Limits::default()).unwrap();
            doc.sync()
                .receive_sync_message(&mut state, msg.into_message())
                .unwrap();
        }
        let list = doc.get(ROOT, "tasks").unwrap().unwrap().1;
        assert_eq!(doc.length(&list), 120);
    }

    /// Messages that cover every part of the format: heads, need, have with a Bloom
    /// filter, change chunks, compressed columns and flags.
    fn corpus() -> Vec<Vec<u8>> {
        let mut out = real_messages();
        let mut big = doc_with_tasks(3, 60);
        let mut empty = AutoCommit::new();
        sync_until_quiet(&mut big, &mut empty, |m| out.push(m.clone().encode()));
        out.extend(JS_MESSAGES.iter().map(|h| hex(h)));
        out.push(ZERO_BITS_PER_ENTRY.to_vec());
        out.push(with_changes(&[chunk(
            CHUNK_TYPE_COMPRESSED,
            &zeros_bomb(4),
        )]));
        out
    }

    fn mutate(rng: &mut TestRng, bytes: &mut Vec<u8>) {
        for _ in 0..rng.below(4) + 1 {
            if bytes.is_empty() {
                bytes.push(rng.byte());
                continue;
            }
            let at = rng.below(bytes.len());
            match rng.below(6) {
                0 => bytes[at] = rng.byte(),
                1 => bytes[at] ^= 1 << rng.below(8),
                2 => bytes.truncate(at),
                3 => bytes.insert(at, rng.byte()),
                4 => {
                    bytes.remove(at);
                }
                _ => bytes[at] = [0x00, 0x01, 0x7f, 0x80, 0xff][rng.below(5)],
            }
        }
    }

    /// Seed and number of cases for a fuzz loop: the defaults, or
    /// `SWARMTODO_FUZZ_SEED` / `SWARMTODO_FUZZ_CASES` to replay a failure or search
    /// longer.
    fn fuzz_budget(seed: u64, cases: usize) -> (u64, usize) {
        let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
        (
            env("SWARMTODO_FUZZ_SEED").unwrap_or(seed),
            env("SWARMTODO_FUZZ_CASES").map_or(cases, |c: u64| c as usize),
        )
    }

    /// xorshift64*, so a failing case prints a seed to replay it.
    struct TestRng(u64);

    impl TestRng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn byte(&mut self) -> u8 {
            self.next() as u8
        }
    }

    #[test]
    fn mutated_messages_never_panic_and_what_passes_automerge_decodes() {
        let corpus = corpus();
        let limits = Limits::default();
        let (seed, cases) = fuzz_budget(0x5eed_f50c, 20_000);
        let mut rng = TestRng(seed);
        let mut passed = 0;
        for case in 0..cases {
            let mut bytes = corpus[rng.below(corpus.len())].clone();
            mutate(&mut rng, &mut bytes);
            if check(&bytes, &limits).is_ok() {
                passed += 1;
                assert!(
                    Message::decode(&bytes).is_ok(),
                    "seed {seed:#x}, case {case}: check passed what automerge cannot decode: {bytes:02x?}"
                );
            }
        }
        assert!(
            passed > 1000,
            "the mutations still exercise the accepting paths"
        );
    }

    #[test]
    fn what_passes_does_not_crash_automerge_sync() {
        // Beyond decoding: a document that receives a message that passed, then
        // generates its answer, must not panic (the Bloom filter crashes live here).
        let corpus = corpus();
        let limits = Limits::default();
        let (seed, cases) = fuzz_budget(0xb100_f11e, 2_000);
        let mut rng = TestRng(seed);
        let base = doc_with_tasks(4, 10);
        for case in 0..cases {
            let mut bytes = corpus[rng.below(corpus.len())].clone();
            mutate(&mut rng, &mut bytes);
            let Ok(checked) = validate(&bytes, &limits) else {
                continue;
            };
            let mut doc = base.clone();
            let outcome = std::panic::catch_unwind(move || {
                let mut state = sync::State::new();
                let _ = doc
                    .sync()
                    .receive_sync_message(&mut state, checked.into_message());
                let _ = doc.sync().generate_sync_message(&mut state);
            });
            assert!(outcome.is_ok(), "seed {seed:#x}, case {case}: {bytes:02x?}");
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = check(&bytes, &Limits::default());
            let mut with_type = vec![MESSAGE_TYPE_SYNC_V1];
            with_type.extend(&bytes);
            let _ = check(&with_type, &Limits::default());
        }

        #[test]
        fn random_deflate_never_panics_and_respects_the_bound(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            bound in 0usize..4096,
        ) {
            let mut out = Collect::default();
            let mut kept = inflate::Keep::default();
            let result = inflate::inflate(&bytes, bound, &mut out);
            prop_assert_eq!(inflate::inflate(&bytes, bound, &mut kept), result);
            if let Ok(n) = result {
                prop_assert!(n <= bound);
                prop_assert_eq!(n, out.0.len());
                prop_assert_eq!(&kept.0, &out.0);
            }
        }
    }
}
