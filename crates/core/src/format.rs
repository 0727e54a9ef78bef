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
/// Bit of a column specification that marks DEFLATE-compressed column data.
pub(crate) const COLUMN_DEFLATE_BIT: u32 = 0b1000;
/// Bits of a column specification that give the column's type.
pub(crate) const COLUMN_TYPE_BITS: u32 = 0b0111;
/// A column specification's id is what is left above the type and deflate bits.
pub(crate) const COLUMN_ID_SHIFT: u32 = 4;
/// Column types (the storage format's). A group column holds, for each row, how many
/// rows of the columns with its id that follow it belong to that row.
pub(crate) const COLUMN_TYPE_GROUP: u32 = 0;
pub(crate) const COLUMN_TYPE_ACTOR: u32 = 1;
pub(crate) const COLUMN_TYPE_INTEGER: u32 = 2;
pub(crate) const COLUMN_TYPE_DELTA: u32 = 3;
pub(crate) const COLUMN_TYPE_BOOLEAN: u32 = 4;
pub(crate) const COLUMN_TYPE_STRING: u32 = 5;
pub(crate) const COLUMN_TYPE_VALUE_METADATA: u32 = 6;
/// Raw value bytes, sliced by the metadata column: no rows of its own.
pub(crate) const COLUMN_TYPE_VALUE: u32 = 7;
