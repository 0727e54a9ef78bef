//! The bytes of Automerge's binary formats that the core reads itself (the sync-message
//! validator and the replica's loader), defined once.

/// First byte of a version 1 sync message.
pub(crate) const MESSAGE_TYPE_SYNC_V1: u8 = 0x42;
/// First byte of a version 2 sync message (it may carry whole documents).
pub(crate) const MESSAGE_TYPE_SYNC_V2: u8 = 0x43;
/// Bytes of a change hash.
pub(crate) const HASH_BYTES: usize = 32;
/// Magic bytes that open every Automerge storage chunk.
pub(crate) const CHUNK_MAGIC: [u8; 4] = [0x85, 0x6f, 0x4a, 0x83];
/// Bytes of a chunk's checksum, after the magic bytes.
pub(crate) const CHUNK_CHECKSUM_BYTES: usize = 4;
/// Storage chunk type of a whole (or partial) document.
pub(crate) const CHUNK_TYPE_DOCUMENT: u8 = 0;
/// Storage chunk type of one change.
pub(crate) const CHUNK_TYPE_CHANGE: u8 = 1;
/// Storage chunk type of one DEFLATE-compressed change.
pub(crate) const CHUNK_TYPE_COMPRESSED: u8 = 2;
/// Storage chunk type of a bundle of changes.
pub(crate) const CHUNK_TYPE_BUNDLE: u8 = 3;
