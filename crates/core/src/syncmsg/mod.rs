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

use self::chunks::Chunks;
use self::reader::Reader;
use crate::format::{HASH_BYTES, MESSAGE_TYPE_SYNC_V1, MESSAGE_TYPE_SYNC_V2};

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

/// The same message with its `have` said by the sender's heads alone, when it carries
/// no changes (a peer's first message about a list, an acknowledgement): what such a
/// sender holds is exactly the ancestors of its heads, so `have` as one entry whose
/// last sync is those heads, with an empty Bloom filter, tells a receiver as much as a
/// filter of every change since the last sync (about 1.2 KiB per 1,000 changes) in 32
/// bytes a head. A receiver that lacks one of the heads answers as automerge does to an
/// unknown last sync: with a reset, after which the sender sends what it has. `None`
/// when the message is invalid, carries changes, or would not be smaller.
pub fn summed_up(bytes: &[u8], limits: &Limits) -> Option<Vec<u8>> {
    let checked = validate(bytes, limits).ok()?;
    if checked.summary.chunks_count > 0 {
        return None;
    }
    let mut message = checked.message;
    message.have = vec![automerge::sync::Have {
        last_sync: message.heads.clone(),
        bloom: automerge::sync::BloomFilter::default(),
    }];
    let out = message.encode();
    (out.len() < bytes.len()).then_some(out)
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

/// The length raw DEFLATE `input` inflates to, if at most `bound`: the inflater the
/// validator runs on every compressed change and column (for fuzzing and benchmarks).
/// `Err` says why not: `"bound"`, or what is wrong with the stream.
pub fn inflated_len(input: &[u8], bound: usize) -> Result<usize, &'static str> {
    inflate::inflate(input, bound, &mut inflate::Discard).map_err(|e| match e {
        inflate::Error::Bound => "bound",
        inflate::Error::Invalid(why) => why,
    })
}

mod chunks;
mod inflate;
mod reader;
mod runs;
#[cfg(test)]
mod tests;
