//! The automerge-repo wire messages (network protocol version `"1"`) and their CBOR
//! codec.
//!
//! These are the messages that the JS `@automerge/automerge-repo` WebSocket adapters
//! (`WebSocketClientAdapter`, `WebSocketServerAdapter`) and the Rust `samod` crate
//! exchange: one CBOR map per WebSocket binary frame, with the field names of the JS
//! objects (`type`, `senderId`, `targetId`, `documentId`, `data`, …). The JS side
//! encodes with `cbor-x` (`tagUint8Array: false`, `useRecords: false`), so byte
//! arrays are plain CBOR byte strings, maps have definite lengths, and numbers of
//! 2^32 and more (timestamps, counters) arrive as CBOR floats.
//!
//! [`decode`] takes untrusted bytes. It checks the frame size against
//! [`MESSAGE_BYTES_MAX`] before it parses anything, bounds every string, list and map
//! by a named limit, refuses nesting deeper than [`NESTING_DEPTH_MAX`], never
//! allocates more than the input length implies, and never panics. Fields it does not
//! know are skipped, so newer peers that add fields still interoperate.
//!
//! ```
//! use swarmtodo_proto::wire::{self, DocumentId, PeerId, WireMessage};
//!
//! let doc: DocumentId = "automerge:62WrzojrJVabK2nwtaQJQVU3F7g".parse().unwrap();
//! let msg = WireMessage::Sync {
//!     sender_id: PeerId::new("hub-1").unwrap(),
//!     target_id: PeerId::new("client-1").unwrap(),
//!     document_id: doc,
//!     data: vec![0x42, 0, 0, 0, 0],
//! };
//! let bytes = wire::encode(&msg);
//! assert_eq!(wire::decode(&bytes).unwrap(), msg);
//! assert_eq!(wire::decode(&bytes[1..]).unwrap_err().code(), "malformed");
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use minicbor::data::Type;
use minicbor::Decoder;

mod decoder;
mod encoder;
#[cfg(test)]
mod tests;

pub use self::decoder::decode;
pub use self::encoder::{encode, ToEach};
pub use crate::limits::{
    DOCUMENT_ID_TEXT_BYTES_MAX, ERROR_TEXT_BYTES_MAX, HEADS_COUNT_MAX, HEAD_TEXT_BYTES_MAX,
    KEY_BYTES_MAX, MAP_ENTRIES_COUNT_MAX, MESSAGE_BYTES_MAX, NESTING_DEPTH_MAX, PEER_ID_BYTES_MAX,
    PROTOCOL_VERSIONS_COUNT_MAX, PROTOCOL_VERSION_BYTES_MAX, SESSION_ID_BYTES_MAX,
    STORAGE_IDS_COUNT_MAX, STORAGE_ID_BYTES_MAX, TYPE_BYTES_MAX,
};

/// The only automerge-repo network protocol version this codec speaks.
pub const PROTOCOL_VERSION: &str = "1";

/// Largest integer a JS number holds exactly (2^53 − 1); floats above are refused.
pub const JS_SAFE_INTEGER_MAX: u64 = (1 << 53) - 1;

/// Bytes in a document id.
pub const DOCUMENT_ID_BYTES: usize = 16;
/// The scheme of automerge URLs.
pub const AUTOMERGE_URL_PREFIX: &str = "automerge:";

const _: () = assert!(DOCUMENT_ID_TEXT_BYTES_MAX >= AUTOMERGE_URL_PREFIX.len() + 28);

/// Why an id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The id is the empty string.
    #[error("{kind} is empty")]
    Empty {
        /// Which kind of id.
        kind: &'static str,
    },
    /// The id is longer than its limit.
    #[error("{kind} is {len} bytes, the limit is {max}")]
    TooLong {
        /// Which kind of id.
        kind: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The document id is not base58check text.
    #[error("document id is not base58check")]
    NotBase58Check,
    /// The document id decodes to the wrong number of bytes.
    #[error("document id decodes to {len} bytes, expected {DOCUMENT_ID_BYTES}")]
    WrongLength {
        /// Decoded length.
        len: usize,
    },
}

fn check_id_text(kind: &'static str, s: &str, max: usize) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if s.len() > max {
        return Err(IdError::TooLong {
            kind,
            len: s.len(),
            max,
        });
    }
    Ok(())
}

/// A text id newtype: 1..=`$max` bytes, checked by [`check_id_text`].
macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            #[doc = concat!("A ", $kind, " of 1..=[`", stringify!($max), "`] bytes.")]
            pub fn new(id: impl Into<String>) -> Result<Self, IdError> {
                let id = id.into();
                check_id_text($kind, &id, $max)?;
                Ok(Self(id))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }
    };
}

text_id!(
    /// The id of one running peer (a browser tab, an agent process, the hub).
    PeerId,
    "peer id",
    PEER_ID_BYTES_MAX
);
text_id!(
    /// The id of a peer's storage, which outlives the peer's process.
    StorageId,
    "storage id",
    STORAGE_ID_BYTES_MAX
);

/// The automerge-repo document id of the list called `name`: the first 16 bytes of
/// SHA-256("swarmtodo list\0" + name). Every peer computes the same id, so two agents
/// creating one list at the same moment end with one document (and, since the first
/// change of a list is the same everywhere, with one root).
pub fn list_document_id(name: &str) -> DocumentId {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"swarmtodo list\0");
    h.update(name.as_bytes());
    let digest = h.finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    DocumentId::from_bytes(id)
}

/// The id of one Automerge document: 16 bytes, written as base58check like
/// automerge-repo does (`62WrzojrJVabK2nwtaQJQVU3F7g`).
///
/// [`FromStr`] also takes the URL form `automerge:<base58check>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DocumentId([u8; DOCUMENT_ID_BYTES]);

impl DocumentId {
    /// The document id with these bytes.
    pub const fn from_bytes(bytes: [u8; DOCUMENT_ID_BYTES]) -> Self {
        Self(bytes)
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; DOCUMENT_ID_BYTES] {
        &self.0
    }

    /// The automerge URL, `automerge:<base58check>`.
    pub fn url(&self) -> String {
        format!("{AUTOMERGE_URL_PREFIX}{self}")
    }
}

impl fmt::Display for DocumentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&bs58::encode(&self.0).with_check().into_string())
    }
}

impl fmt::Debug for DocumentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DocumentId({self})")
    }
}

impl FromStr for DocumentId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        check_id_text("document id", s, DOCUMENT_ID_TEXT_BYTES_MAX)?;
        let text = s.strip_prefix(AUTOMERGE_URL_PREFIX).unwrap_or(s);
        let bytes = bs58::decode(text)
            .with_check(None)
            .into_vec()
            .map_err(|_| IdError::NotBase58Check)?;
        let bytes: [u8; DOCUMENT_ID_BYTES] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| IdError::WrongLength { len: bytes.len() })?;
        Ok(Self(bytes))
    }
}

/// As its base58check text (how hubs of a cluster name a list to one another).
impl serde::Serialize for DocumentId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DocumentId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What a peer tells about itself in `join` and `peer`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerMetadata {
    /// The peer's storage, absent for peers without storage.
    pub storage_id: Option<StorageId>,
    /// True when the peer will not come back with this storage id, so its sync state
    /// is not worth persisting.
    pub is_ephemeral: bool,
}

/// The heads one storage holds of a document (`newHeads` of `remote-heads-changed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadsInfo {
    /// The heads, encoded as automerge-repo encodes them (text).
    pub heads: Vec<String>,
    /// Milliseconds since the Unix epoch on the peer that first saw the heads.
    pub timestamp: u64,
}

/// One automerge-repo wire message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireMessage {
    /// First message of a client: who it is and which protocol versions it speaks.
    Join {
        /// The joining peer.
        sender_id: PeerId,
        /// Versions the client speaks. Absent means an old client, which speaks `"1"`.
        supported_protocol_versions: Option<Vec<String>>,
        /// What the client tells about itself.
        peer_metadata: Option<PeerMetadata>,
    },
    /// The server's answer to `join`.
    Peer {
        /// The server.
        sender_id: PeerId,
        /// The client that joined.
        target_id: PeerId,
        /// The version the server chose.
        selected_protocol_version: String,
        /// What the server tells about itself.
        peer_metadata: Option<PeerMetadata>,
    },
    /// The sender is about to disconnect.
    Leave {
        /// The leaving peer.
        sender_id: PeerId,
    },
    /// The first sync message for a document the sender does not have yet.
    Request {
        /// Sender.
        sender_id: PeerId,
        /// Receiver.
        target_id: PeerId,
        /// The document.
        document_id: DocumentId,
        /// An Automerge sync message (validate with [`super::syncmsg`]).
        data: Vec<u8>,
    },
    /// A sync message for a document.
    Sync {
        /// Sender.
        sender_id: PeerId,
        /// Receiver.
        target_id: PeerId,
        /// The document.
        document_id: DocumentId,
        /// An Automerge sync message (validate with [`super::syncmsg`]).
        data: Vec<u8>,
    },
    /// Neither the sender nor its peers have the document.
    DocUnavailable {
        /// Sender.
        sender_id: PeerId,
        /// Receiver.
        target_id: PeerId,
        /// The document.
        document_id: DocumentId,
    },
    /// An application message that is relayed but never stored.
    Ephemeral {
        /// Sender.
        sender_id: PeerId,
        /// Receiver.
        target_id: PeerId,
        /// The document it is about.
        document_id: DocumentId,
        /// Sequence number within `session_id`, to drop gossip loops.
        count: u64,
        /// The sender's session.
        session_id: String,
        /// The payload (CBOR, chosen by the application).
        data: Vec<u8>,
    },
    /// A protocol error; the sender closes the connection after it.
    Error {
        /// Sender, which the JS server sets and samod leaves out.
        sender_id: Option<PeerId>,
        /// Receiver, which the JS server sets and samod leaves out.
        target_id: Option<PeerId>,
        /// What went wrong, for humans.
        message: String,
    },
    /// The sender changes which storage ids it wants heads gossip about.
    RemoteSubscriptionChange {
        /// Sender.
        sender_id: PeerId,
        /// Receiver.
        target_id: PeerId,
        /// Storage ids to add; JS sends none as `undefined`.
        add: Vec<StorageId>,
        /// Storage ids to remove; JS sends none as `undefined`.
        remove: Vec<StorageId>,
    },
    /// The heads of a document changed on some storage.
    RemoteHeadsChanged {
        /// Sender.
        sender_id: PeerId,
        /// Receiver.
        target_id: PeerId,
        /// The document.
        document_id: DocumentId,
        /// New heads by storage id.
        new_heads: BTreeMap<StorageId, HeadsInfo>,
    },
}

impl WireMessage {
    /// The `type` field of this message.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Join { .. } => "join",
            Self::Peer { .. } => "peer",
            Self::Leave { .. } => "leave",
            Self::Request { .. } => "request",
            Self::Sync { .. } => "sync",
            Self::DocUnavailable { .. } => "doc-unavailable",
            Self::Ephemeral { .. } => "ephemeral",
            Self::Error { .. } => "error",
            Self::RemoteSubscriptionChange { .. } => "remote-subscription-change",
            Self::RemoteHeadsChanged { .. } => "remote-heads-changed",
        }
    }

    /// The sender, where the message names one.
    pub fn sender_id(&self) -> Option<&PeerId> {
        match self {
            Self::Join { sender_id, .. }
            | Self::Peer { sender_id, .. }
            | Self::Leave { sender_id }
            | Self::Request { sender_id, .. }
            | Self::Sync { sender_id, .. }
            | Self::DocUnavailable { sender_id, .. }
            | Self::Ephemeral { sender_id, .. }
            | Self::RemoteSubscriptionChange { sender_id, .. }
            | Self::RemoteHeadsChanged { sender_id, .. } => Some(sender_id),
            Self::Error { sender_id, .. } => sender_id.as_ref(),
        }
    }

    /// The document the message is about, if any.
    pub fn document_id(&self) -> Option<DocumentId> {
        match self {
            Self::Request { document_id, .. }
            | Self::Sync { document_id, .. }
            | Self::DocUnavailable { document_id, .. }
            | Self::Ephemeral { document_id, .. }
            | Self::RemoteHeadsChanged { document_id, .. } => Some(*document_id),
            Self::Join { .. }
            | Self::Peer { .. }
            | Self::Leave { .. }
            | Self::Error { .. }
            | Self::RemoteSubscriptionChange { .. } => None,
        }
    }
}

/// Why [`decode`] refused a message. [`WireError::code`] is a stable string for close
/// reasons and logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame is larger than [`MESSAGE_BYTES_MAX`].
    #[error("message is {len} bytes, the limit is {max}")]
    MessageTooLarge {
        /// Frame length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The frame is empty.
    #[error("message is empty")]
    Empty,
    /// The bytes are not well-formed CBOR of the shape automerge-repo uses
    /// (truncated, invalid UTF-8, indefinite lengths, non-text keys, …).
    #[error("malformed message: {0}")]
    Malformed(String),
    /// Bytes are left after the message map.
    #[error("{0} bytes after the end of the message")]
    TrailingBytes(usize),
    /// Maps, arrays or tags nest deeper than [`NESTING_DEPTH_MAX`].
    #[error("values nest deeper than {max}")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// A map has more entries than its limit ([`MAP_ENTRIES_COUNT_MAX`], or
    /// [`STORAGE_IDS_COUNT_MAX`] for `newHeads`).
    #[error("{field} has {count} entries, the limit is {max}")]
    TooManyEntries {
        /// The map.
        field: &'static str,
        /// Declared entry count.
        count: u64,
        /// The limit.
        max: usize,
    },
    /// A key appears twice in one map.
    #[error("field {0:?} appears twice")]
    DuplicateField(String),
    /// The `type` is not one this codec knows.
    #[error("unknown message type {0:?}")]
    UnknownType(String),
    /// A required field is absent (or `undefined`/`null`).
    #[error("missing field {0}")]
    MissingField(&'static str),
    /// A field has the wrong CBOR type.
    #[error("field {field} should be {expected}")]
    WrongType {
        /// The field.
        field: &'static str,
        /// What it should be.
        expected: &'static str,
    },
    /// A string or list field is longer than its limit.
    #[error("field {field} is {len} long, the limit is {max}")]
    FieldTooLarge {
        /// The field.
        field: &'static str,
        /// Its length (bytes for text, entries for lists).
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A number is negative, fractional, not finite or above 2^53 − 1.
    #[error("field {field} is not a whole number in 0..=2^53-1")]
    InvalidNumber {
        /// The field.
        field: &'static str,
    },
    /// An id field is not a valid id.
    #[error("field {field}: {source}")]
    InvalidId {
        /// The field.
        field: &'static str,
        /// Why.
        source: IdError,
    },
}

impl WireError {
    /// A stable, machine-readable code for this error.
    pub fn code(&self) -> &'static str {
        match self {
            Self::MessageTooLarge { .. } => "message_too_large",
            Self::Empty => "empty",
            Self::Malformed(_) => "malformed",
            Self::TrailingBytes(_) => "trailing_bytes",
            Self::TooDeep { .. } => "too_deep",
            Self::TooManyEntries { .. } => "too_many_entries",
            Self::DuplicateField(_) => "duplicate_field",
            Self::UnknownType(_) => "unknown_type",
            Self::MissingField(_) => "missing_field",
            Self::WrongType { .. } => "wrong_type",
            Self::FieldTooLarge { .. } => "field_too_large",
            Self::InvalidNumber { .. } => "invalid_number",
            Self::InvalidId { .. } => "invalid_id",
        }
    }
}

impl From<minicbor::decode::Error> for WireError {
    fn from(e: minicbor::decode::Error) -> Self {
        Self::Malformed(e.to_string())
    }
}
