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

// ---------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------

/// Decode one wire message from untrusted bytes.
pub fn decode(bytes: &[u8]) -> Result<WireMessage, WireError> {
    if bytes.len() > MESSAGE_BYTES_MAX {
        return Err(WireError::MessageTooLarge {
            len: bytes.len(),
            max: MESSAGE_BYTES_MAX,
        });
    }
    if bytes.is_empty() {
        return Err(WireError::Empty);
    }
    let mut d = Decoder::new(bytes);
    if d.datatype()? != Type::Map {
        return Err(WireError::Malformed("a message is a CBOR map".into()));
    }
    let fields = read_map(&mut d, 1, "message", MAP_ENTRIES_COUNT_MAX)?;
    if d.position() != bytes.len() {
        return Err(WireError::TrailingBytes(bytes.len() - d.position()));
    }
    let fields = Fields(fields);

    // The type first, so an unknown type is reported as such whatever else it holds.
    let kind = fields.required("type")?.text(TYPE_BYTES_MAX)?;
    let msg = match kind {
        "join" => WireMessage::Join {
            sender_id: fields.peer_id("senderId")?,
            supported_protocol_versions: fields
                .optional("supportedProtocolVersions")
                .map(|v| {
                    v.text_array(PROTOCOL_VERSIONS_COUNT_MAX, PROTOCOL_VERSION_BYTES_MAX)
                        .map(|list| list.into_iter().map(str::to_owned).collect())
                })
                .transpose()?,
            peer_metadata: fields.peer_metadata()?,
        },
        "peer" => WireMessage::Peer {
            sender_id: fields.peer_id("senderId")?,
            target_id: fields.peer_id("targetId")?,
            selected_protocol_version: fields
                .required("selectedProtocolVersion")?
                .text(PROTOCOL_VERSION_BYTES_MAX)?
                .to_owned(),
            peer_metadata: fields.peer_metadata()?,
        },
        "leave" => WireMessage::Leave {
            sender_id: fields.peer_id("senderId")?,
        },
        "request" => WireMessage::Request {
            sender_id: fields.peer_id("senderId")?,
            target_id: fields.peer_id("targetId")?,
            document_id: fields.document_id()?,
            data: fields.required("data")?.bytes()?.to_vec(),
        },
        "sync" => WireMessage::Sync {
            sender_id: fields.peer_id("senderId")?,
            target_id: fields.peer_id("targetId")?,
            document_id: fields.document_id()?,
            data: fields.required("data")?.bytes()?.to_vec(),
        },
        "doc-unavailable" => WireMessage::DocUnavailable {
            sender_id: fields.peer_id("senderId")?,
            target_id: fields.peer_id("targetId")?,
            document_id: fields.document_id()?,
        },
        "ephemeral" => WireMessage::Ephemeral {
            sender_id: fields.peer_id("senderId")?,
            target_id: fields.peer_id("targetId")?,
            document_id: fields.document_id()?,
            count: fields.required("count")?.whole_number()?,
            session_id: fields
                .required("sessionId")?
                .text(SESSION_ID_BYTES_MAX)?
                .to_owned(),
            data: fields.required("data")?.bytes()?.to_vec(),
        },
        "error" => WireMessage::Error {
            sender_id: fields.optional_peer_id("senderId")?,
            target_id: fields.optional_peer_id("targetId")?,
            message: fields
                .required("message")?
                .text(ERROR_TEXT_BYTES_MAX)?
                .to_owned(),
        },
        "remote-subscription-change" => WireMessage::RemoteSubscriptionChange {
            sender_id: fields.peer_id("senderId")?,
            target_id: fields.peer_id("targetId")?,
            add: fields.storage_ids("add")?,
            remove: fields.storage_ids("remove")?,
        },
        "remote-heads-changed" => WireMessage::RemoteHeadsChanged {
            sender_id: fields.peer_id("senderId")?,
            target_id: fields.peer_id("targetId")?,
            document_id: fields.document_id()?,
            new_heads: new_heads(fields.required("newHeads")?)?,
        },
        other => return Err(WireError::UnknownType(other.to_owned())),
    };
    Ok(msg)
}

/// One map entry: its key and the raw CBOR bytes of its value (exactly one item,
/// already checked to be well-formed and within the nesting limit).
#[derive(Debug, Clone, Copy)]
struct Entry<'b> {
    key: &'b str,
    value: Value<'b>,
}

/// The raw CBOR bytes of one value, with the name of the field it came from.
#[derive(Debug, Clone, Copy)]
struct Value<'b> {
    field: &'static str,
    bytes: &'b [u8],
    /// Nesting depth of this value.
    depth: usize,
}

/// Read a definite-length map whose keys are text; values are checked and kept raw.
fn read_map<'b>(
    d: &mut Decoder<'b>,
    depth: usize,
    field: &'static str,
    max: usize,
) -> Result<Vec<Entry<'b>>, WireError> {
    if depth > NESTING_DEPTH_MAX {
        return Err(WireError::TooDeep {
            max: NESTING_DEPTH_MAX,
        });
    }
    match d.datatype()? {
        Type::Map => {}
        Type::MapIndef => {
            return Err(WireError::Malformed(format!(
                "{field} is an indefinite-length map"
            )))
        }
        Type::Break | Type::Unknown(_) => {
            return Err(WireError::Malformed(format!("{field} is not CBOR")))
        }
        _ => {
            return Err(WireError::WrongType {
                field,
                expected: "a map",
            })
        }
    }
    let count = d
        .map()?
        .ok_or_else(|| WireError::Malformed(format!("{field} is an indefinite-length map")))?;
    if count > max as u64 {
        return Err(WireError::TooManyEntries { field, count, max });
    }
    let input = d.input();
    let mut entries: Vec<Entry<'b>> = Vec::new();
    let mut keys = std::collections::BTreeSet::new();
    for _ in 0..count {
        if d.datatype()? != Type::String {
            return Err(WireError::Malformed(format!(
                "a key of {field} is not text"
            )));
        }
        let key = d.str()?;
        if key.len() > KEY_BYTES_MAX {
            return Err(WireError::FieldTooLarge {
                field: "map key",
                len: key.len() as u64,
                max: KEY_BYTES_MAX,
            });
        }
        // A set, not a scan: newHeads may hold a thousand long keys.
        if !keys.insert(key) {
            return Err(WireError::DuplicateField(key.to_owned()));
        }
        let start = d.position();
        skip_value(d, depth + 1)?;
        let bytes = input.get(start..d.position()).unwrap_or_default();
        entries.push(Entry {
            key,
            value: Value {
                field,
                bytes,
                depth: depth + 1,
            },
        });
    }
    Ok(entries)
}

/// Step over one well-formed CBOR item at `depth`, refusing indefinite lengths and
/// nesting deeper than [`NESTING_DEPTH_MAX`]. Every item consumes at least one byte,
/// so the work is bounded by the input length whatever the declared counts say.
fn skip_value(d: &mut Decoder<'_>, depth: usize) -> Result<(), WireError> {
    if depth > NESTING_DEPTH_MAX {
        return Err(WireError::TooDeep {
            max: NESTING_DEPTH_MAX,
        });
    }
    match d.datatype()? {
        Type::Bool
        | Type::Null
        | Type::Undefined
        | Type::U8
        | Type::U16
        | Type::U32
        | Type::U64
        | Type::I8
        | Type::I16
        | Type::I32
        | Type::I64
        | Type::Int
        | Type::F16
        | Type::F32
        | Type::F64
        | Type::Simple => d.skip()?,
        Type::Bytes => {
            d.bytes()?;
        }
        Type::String => {
            d.str()?;
        }
        Type::Array => {
            let n = d.array()?.unwrap_or_default();
            for _ in 0..n {
                skip_value(d, depth + 1)?;
            }
        }
        Type::Map => {
            let n = d.map()?.unwrap_or_default();
            for _ in 0..n {
                skip_value(d, depth + 1)?;
                skip_value(d, depth + 1)?;
            }
        }
        Type::Tag => {
            d.tag()?;
            skip_value(d, depth + 1)?;
        }
        Type::BytesIndef | Type::StringIndef | Type::ArrayIndef | Type::MapIndef => {
            return Err(WireError::Malformed(
                "indefinite-length items are not used by automerge-repo".into(),
            ))
        }
        Type::Break => return Err(WireError::Malformed("unexpected break".into())),
        Type::Unknown(b) => {
            return Err(WireError::Malformed(format!(
                "unknown CBOR initial byte {b:#04x}"
            )))
        }
    }
    Ok(())
}

impl<'b> Value<'b> {
    fn named(self, field: &'static str) -> Self {
        Self { field, ..self }
    }

    fn decoder(&self) -> Decoder<'b> {
        Decoder::new(self.bytes)
    }

    fn datatype(&self) -> Result<Type, WireError> {
        Ok(self.decoder().datatype()?)
    }

    /// `undefined` and `null` stand for an absent field (JS `undefined` properties).
    fn is_absent(&self) -> bool {
        matches!(self.datatype(), Ok(Type::Undefined | Type::Null))
    }

    fn wrong(&self, expected: &'static str) -> WireError {
        WireError::WrongType {
            field: self.field,
            expected,
        }
    }

    fn text(&self, max: usize) -> Result<&'b str, WireError> {
        if self.datatype()? != Type::String {
            return Err(self.wrong("text"));
        }
        let s = self.decoder().str()?;
        if s.len() > max {
            return Err(WireError::FieldTooLarge {
                field: self.field,
                len: s.len() as u64,
                max,
            });
        }
        Ok(s)
    }

    fn bytes(&self) -> Result<&'b [u8], WireError> {
        if self.datatype()? != Type::Bytes {
            return Err(self.wrong("a byte string"));
        }
        Ok(self.decoder().bytes()?)
    }

    fn bool(&self) -> Result<bool, WireError> {
        if self.datatype()? != Type::Bool {
            return Err(self.wrong("a bool"));
        }
        Ok(self.decoder().bool()?)
    }

    /// A JS number that holds a whole number in 0..=2^53 − 1: a CBOR unsigned integer
    /// or a float, which is how cbor-x writes numbers of 2^32 and more.
    fn whole_number(&self) -> Result<u64, WireError> {
        let invalid = WireError::InvalidNumber { field: self.field };
        let mut d = self.decoder();
        let n = match d.datatype()? {
            Type::U8 | Type::U16 | Type::U32 | Type::U64 => d.u64()?,
            Type::I8 | Type::I16 | Type::I32 | Type::I64 | Type::Int => return Err(invalid),
            t @ (Type::F16 | Type::F32 | Type::F64) => {
                let x = if t == Type::F16 {
                    f16_to_f64(self.bytes)?
                } else {
                    d.f64()?
                };
                let whole = x.is_finite() && x >= 0.0 && x.fract() == 0.0;
                if !whole || x > JS_SAFE_INTEGER_MAX as f64 {
                    return Err(invalid);
                }
                // In range and whole, so the cast is exact.
                x as u64
            }
            _ => return Err(self.wrong("a number")),
        };
        if n > JS_SAFE_INTEGER_MAX {
            return Err(invalid);
        }
        Ok(n)
    }

    /// A definite-length array, with each element as a raw value.
    fn array(&self, max: usize) -> Result<Vec<Value<'b>>, WireError> {
        let mut d = self.decoder();
        if d.datatype()? != Type::Array {
            return Err(self.wrong("an array"));
        }
        let count = d.array()?.unwrap_or_default();
        if count > max as u64 {
            return Err(WireError::FieldTooLarge {
                field: self.field,
                len: count,
                max,
            });
        }
        let mut items = Vec::new();
        for _ in 0..count {
            let start = d.position();
            skip_value(&mut d, self.depth + 1)?;
            items.push(Value {
                field: self.field,
                bytes: self.bytes.get(start..d.position()).unwrap_or_default(),
                depth: self.depth + 1,
            });
        }
        Ok(items)
    }

    fn text_array(&self, count_max: usize, text_max: usize) -> Result<Vec<&'b str>, WireError> {
        self.array(count_max)?
            .iter()
            .map(|v| v.text(text_max))
            .collect()
    }

    fn map(&self, max: usize) -> Result<Fields<'b>, WireError> {
        let mut d = self.decoder();
        let entries = read_map(&mut d, self.depth, self.field, max)?;
        Ok(Fields(entries))
    }
}

/// Decode a CBOR half float (`0xf9` + 2 bytes); minicbor needs a feature for it.
fn f16_to_f64(bytes: &[u8]) -> Result<f64, WireError> {
    let [_, hi, lo] = bytes else {
        return Err(WireError::Malformed("truncated half float".into()));
    };
    let bits = u16::from_be_bytes([*hi, *lo]);
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f64::from(bits & 0x3ff);
    let magnitude = match exponent {
        0 => mantissa * 2f64.powi(-24),
        0x1f if mantissa == 0.0 => f64::INFINITY,
        0x1f => f64::NAN,
        e => (1.0 + mantissa / 1024.0) * 2f64.powi(e - 15),
    };
    Ok(sign * magnitude)
}

/// The entries of one map.
#[derive(Debug)]
struct Fields<'b>(Vec<Entry<'b>>);

impl<'b> Fields<'b> {
    fn get(&self, key: &'static str) -> Option<Value<'b>> {
        self.0
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.named(key))
    }

    fn optional(&self, key: &'static str) -> Option<Value<'b>> {
        self.get(key).filter(|v| !v.is_absent())
    }

    fn required(&self, key: &'static str) -> Result<Value<'b>, WireError> {
        self.optional(key).ok_or(WireError::MissingField(key))
    }

    fn peer_id(&self, key: &'static str) -> Result<PeerId, WireError> {
        let text = self.required(key)?.text(PEER_ID_BYTES_MAX)?;
        PeerId::new(text).map_err(|source| WireError::InvalidId { field: key, source })
    }

    fn optional_peer_id(&self, key: &'static str) -> Result<Option<PeerId>, WireError> {
        match self.optional(key) {
            None => Ok(None),
            Some(_) => self.peer_id(key).map(Some),
        }
    }

    fn document_id(&self) -> Result<DocumentId, WireError> {
        let field = "documentId";
        let text = self.required(field)?.text(DOCUMENT_ID_TEXT_BYTES_MAX)?;
        text.parse()
            .map_err(|source| WireError::InvalidId { field, source })
    }

    fn storage_ids(&self, key: &'static str) -> Result<Vec<StorageId>, WireError> {
        let Some(list) = self.optional(key) else {
            return Ok(Vec::new());
        };
        list.text_array(STORAGE_IDS_COUNT_MAX, STORAGE_ID_BYTES_MAX)?
            .into_iter()
            .map(|s| {
                StorageId::new(s).map_err(|source| WireError::InvalidId { field: key, source })
            })
            .collect()
    }

    fn peer_metadata(&self) -> Result<Option<PeerMetadata>, WireError> {
        let Some(value) = self.optional("peerMetadata") else {
            return Ok(None);
        };
        let fields = value.map(MAP_ENTRIES_COUNT_MAX)?;
        let storage_id = match fields.optional("storageId") {
            None => None,
            Some(v) => {
                let text = v
                    .named("peerMetadata.storageId")
                    .text(STORAGE_ID_BYTES_MAX)?;
                Some(StorageId::new(text).map_err(|source| WireError::InvalidId {
                    field: "peerMetadata.storageId",
                    source,
                })?)
            }
        };
        let is_ephemeral = match fields.optional("isEphemeral") {
            None => false,
            Some(v) => v.named("peerMetadata.isEphemeral").bool()?,
        };
        Ok(Some(PeerMetadata {
            storage_id,
            is_ephemeral,
        }))
    }
}

fn new_heads(value: Value<'_>) -> Result<BTreeMap<StorageId, HeadsInfo>, WireError> {
    let field = "newHeads";
    let entries = value.map(STORAGE_IDS_COUNT_MAX)?;
    let mut out = BTreeMap::new();
    for entry in &entries.0 {
        let storage_id =
            StorageId::new(entry.key).map_err(|source| WireError::InvalidId { field, source })?;
        let info = entry.value.named(field).map(MAP_ENTRIES_COUNT_MAX)?;
        let heads = info
            .required("heads")?
            .named("newHeads.heads")
            .text_array(HEADS_COUNT_MAX, HEAD_TEXT_BYTES_MAX)?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let timestamp = info
            .required("timestamp")?
            .named("newHeads.timestamp")
            .whole_number()?;
        out.insert(storage_id, HeadsInfo { heads, timestamp });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------

/// A tiny CBOR writer: definite lengths, shortest heads, infallible (it writes to a
/// `Vec`). The JS side decodes any valid CBOR, so this is all the encoder needs.
#[derive(Debug, Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn head(&mut self, major: u8, n: u64) {
        let m = major << 5;
        match n {
            0..=23 => self.0.push(m | n as u8),
            24..=0xff => self.0.extend([m | 24, n as u8]),
            0x100..=0xffff => {
                self.0.push(m | 25);
                self.0.extend((n as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                self.0.push(m | 26);
                self.0.extend((n as u32).to_be_bytes());
            }
            _ => {
                self.0.push(m | 27);
                self.0.extend(n.to_be_bytes());
            }
        }
    }

    fn uint(&mut self, n: u64) {
        self.head(0, n);
    }

    /// A JS number: like cbor-x, an unsigned integer below 2^32 and a float64 from
    /// there up to 2^53 − 1, because cbor-x reads 64-bit integers as `BigInt`, which
    /// automerge-repo does not expect.
    fn js_number(&mut self, n: u64) {
        if n <= u64::from(u32::MAX) || n > JS_SAFE_INTEGER_MAX {
            self.uint(n);
        } else {
            self.0.push(0xfb);
            // n < 2^53, so the float is exact.
            self.0.extend((n as f64).to_be_bytes());
        }
    }

    fn bytes(&mut self, b: &[u8]) {
        self.head(2, b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn text(&mut self, s: &str) {
        self.head(3, s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }

    fn array(&mut self, len: usize) {
        self.head(4, len as u64);
    }

    fn map(&mut self, len: usize) {
        self.head(5, len as u64);
    }

    fn bool(&mut self, b: bool) {
        self.0.push(if b { 0xf5 } else { 0xf4 });
    }

    fn field(&mut self, key: &str, value: &str) {
        self.text(key);
        self.text(value);
    }

    fn text_array<'a>(&mut self, items: impl ExactSizeIterator<Item = &'a str>) {
        self.array(items.len());
        for item in items {
            self.text(item);
        }
    }

    fn metadata(&mut self, m: &PeerMetadata) {
        self.map(1 + usize::from(m.storage_id.is_some()));
        if let Some(storage_id) = &m.storage_id {
            self.field("storageId", storage_id.as_str());
        }
        self.text("isEphemeral");
        self.bool(m.is_ephemeral);
    }
}

/// Encode a wire message as the CBOR map the JS client expects.
///
/// Optional fields that are absent, and empty `add`/`remove` lists, are left out.
/// Messages built with strings beyond the limits of this module encode fine but
/// [`decode`] will refuse them.
pub fn encode(msg: &WireMessage) -> Vec<u8> {
    match encode_parts(msg) {
        Parts::Targeted(split, target) => split.to(target),
        Parts::Whole(bytes) => bytes,
    }
}

/// A message encoded whole, or split around its target id.
enum Parts<'a> {
    Targeted(ToEach, &'a PeerId),
    Whole(Vec<u8>),
}

/// [`encode`]: messages with a mandatory target id are split around it.
fn encode_parts(msg: &WireMessage) -> Parts<'_> {
    let kind = msg.type_name();
    let mut w = Writer::default();
    // The map's head, `type`, `senderId`, then the key `targetId`: the same for every
    // message with a mandatory target.
    let head = |w: &mut Writer, fields: usize, sender_id: &PeerId| {
        w.map(fields);
        w.field("type", kind);
        w.field("senderId", sender_id.as_str());
        w.text("targetId");
    };
    let mut a = Writer::default();
    let target = match msg {
        WireMessage::Join {
            sender_id,
            supported_protocol_versions,
            peer_metadata,
        } => {
            w.map(
                2 + usize::from(supported_protocol_versions.is_some())
                    + usize::from(peer_metadata.is_some()),
            );
            w.field("type", kind);
            w.field("senderId", sender_id.as_str());
            if let Some(versions) = supported_protocol_versions {
                w.text("supportedProtocolVersions");
                w.text_array(versions.iter().map(String::as_str));
            }
            if let Some(m) = peer_metadata {
                w.text("peerMetadata");
                w.metadata(m);
            }
            return Parts::Whole(w.0);
        }
        WireMessage::Leave { sender_id } => {
            w.map(2);
            w.field("type", kind);
            w.field("senderId", sender_id.as_str());
            return Parts::Whole(w.0);
        }
        WireMessage::Error {
            sender_id,
            target_id,
            message,
        } => {
            w.map(2 + usize::from(sender_id.is_some()) + usize::from(target_id.is_some()));
            w.field("type", kind);
            if let Some(id) = sender_id {
                w.field("senderId", id.as_str());
            }
            if let Some(id) = target_id {
                w.field("targetId", id.as_str());
            }
            w.field("message", message);
            return Parts::Whole(w.0);
        }
        WireMessage::Peer {
            sender_id,
            target_id,
            selected_protocol_version,
            peer_metadata,
        } => {
            head(&mut w, 4 + usize::from(peer_metadata.is_some()), sender_id);
            a.field("selectedProtocolVersion", selected_protocol_version);
            if let Some(m) = peer_metadata {
                a.text("peerMetadata");
                a.metadata(m);
            }
            target_id
        }
        WireMessage::Request {
            sender_id,
            target_id,
            document_id,
            data,
        }
        | WireMessage::Sync {
            sender_id,
            target_id,
            document_id,
            data,
        } => {
            head(&mut w, 5, sender_id);
            a.field("documentId", &document_id.to_string());
            a.text("data");
            a.bytes(data);
            target_id
        }
        WireMessage::DocUnavailable {
            sender_id,
            target_id,
            document_id,
        } => {
            head(&mut w, 4, sender_id);
            a.field("documentId", &document_id.to_string());
            target_id
        }
        WireMessage::Ephemeral {
            sender_id,
            target_id,
            document_id,
            count,
            session_id,
            data,
        } => {
            head(&mut w, 7, sender_id);
            a.field("documentId", &document_id.to_string());
            a.text("count");
            a.js_number(*count);
            a.field("sessionId", session_id);
            a.text("data");
            a.bytes(data);
            target_id
        }
        WireMessage::RemoteSubscriptionChange {
            sender_id,
            target_id,
            add,
            remove,
        } => {
            head(
                &mut w,
                3 + usize::from(!add.is_empty()) + usize::from(!remove.is_empty()),
                sender_id,
            );
            for (key, list) in [("add", add), ("remove", remove)] {
                if !list.is_empty() {
                    a.text(key);
                    a.text_array(list.iter().map(StorageId::as_str));
                }
            }
            target_id
        }
        WireMessage::RemoteHeadsChanged {
            sender_id,
            target_id,
            document_id,
            new_heads,
        } => {
            head(&mut w, 5, sender_id);
            a.field("documentId", &document_id.to_string());
            a.text("newHeads");
            a.map(new_heads.len());
            for (storage_id, info) in new_heads {
                a.text(storage_id.as_str());
                a.map(2);
                a.text("heads");
                a.text_array(info.heads.iter().map(String::as_str));
                a.text("timestamp");
                a.js_number(info.timestamp);
            }
            target_id
        }
    };
    Parts::Targeted(
        ToEach {
            before: w.0,
            after: a.0,
        },
        target,
    )
}

/// One message for many peers, the same but for its `targetId` (a list's news from the
/// hub to each of its peers): encoded once, around the target id. [`ToEach::to`] gives
/// the bytes [`encode`] gives for the message with that target, at the cost of a copy
/// instead of an encoding (the document id's base58check alone costs more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToEach {
    /// The map's head and every field before the target id's value.
    before: Vec<u8>,
    /// Every field after it.
    after: Vec<u8>,
}

impl ToEach {
    /// `msg` encoded for any target (its own `targetId` is left out); `None` for a
    /// message without a mandatory target (`join`, `leave`, `error`).
    pub fn new(msg: &WireMessage) -> Option<ToEach> {
        match encode_parts(msg) {
            Parts::Targeted(split, _) => Some(split),
            Parts::Whole(_) => None,
        }
    }

    /// The bytes of the message for `target`.
    pub fn to(&self, target: &PeerId) -> Vec<u8> {
        let target = target.as_str();
        let mut w = Writer(Vec::with_capacity(
            self.before.len() + self.after.len() + target.len() + 9,
        ));
        w.0.extend_from_slice(&self.before);
        w.text(target);
        w.0.extend_from_slice(&self.after);
        w.0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        assert!(s.len().is_multiple_of(2), "odd hex");
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn peer(s: &str) -> PeerId {
        PeerId::new(s).unwrap()
    }

    fn storage(s: &str) -> StorageId {
        StorageId::new(s).unwrap()
    }

    fn doc(s: &str) -> DocumentId {
        s.parse().unwrap()
    }

    /// Frames captured on the socket between a JS `Repo` with `WebSocketClientAdapter`
    /// (peer `client-1`) and a JS `Repo` with `WebSocketServerAdapter` (peer `hub-1`),
    /// `@automerge/automerge-repo{,-network-websocket}` 2.5.6 and `@automerge/automerge`
    /// 3.5.0 under node: the client created a document, changed it, broadcast an
    /// ephemeral message, asked for an unknown document and subscribed to the server's
    /// storage; a raw socket then sent a `join` for protocol `"2"` (encoded with
    /// automerge-repo's own `cbor.encode`) and got the server's `error`.
    mod js {
        pub(super) const JOIN: &str = "b900046474797065646a6f696e6873656e646572496468636c69656e742d316c706565724d65746164617461b900026973746f726167654964782432396565373461382d356363632d346336322d383236652d3039333865343432343664366b6973457068656d6572616cf47819737570706f7274656450726f746f636f6c56657273696f6e73816131";
        pub(super) const PEER: &str = "b90005647479706564706565726873656e6465724964656875622d316c706565724d65746164617461b900026973746f726167654964782463313634663438302d323164372d343633302d623832342d3765666165383535306363376b6973457068656d6572616cf47773656c656374656450726f746f636f6c56657273696f6e613168746172676574496468636c69656e742d31";
        pub(super) const SYNC_FIRST: &str = "b9000564747970656473796e63687461726765744964656875622d31646461746158324201b6a9b3d8c7944165a9b9eeaa3b9c2ba93869e62d501cfb4d6f27140212bcb4ee00010008040a074b8df42398000202846a646f63756d656e744964781b363257727a6f6a724a5661624b326e777461514a515655334637676873656e646572496468636c69656e742d31";
        /// A sync carrying the whole document (a document chunk).
        pub(super) const SYNC_DOC: &str = "b9000564747970656473796e63687461726765744964656875622d3164646174615901cc4301b6a9b3d8c7944165a9b9eeaa3b9c2ba93869e62d501cfb4d6f27140212bcb4ee00010008040a074b8df42398019803856f4a83a90d1e6d008d030110a238ae38f721270add0f569cd57acee001b6a9b3d8c7944165a9b9eeaa3b9c2ba93869e62d501cfb4d6f27140212bcb4ee0701020302130423084004430456020c01050216111813261545210323103406420e560c5742800103040004017f0103197f96d7bad80603007f0003017f00020104070001cb00000001030102020f030704021b0f1c071d02340f35073600070e000001060000030e000001060000030e000001060000067e00050d017e6e14050100027e671e0d017e552d050100027e4e370d017ebc7fc60005017a057461736b7302743002743102743207636f6e74656e740673746174757300167e07636f6e74656e740673746174757300167e07636f6e74656e74067374617475730016cc0000020102197f4f17017f0217017f021701061602160216040002041601020416010204160106001616020016160200161652756e20746865207465737473203070656e64696e6752756e20746865207465737473203170656e64696e6752756e20746865207465737473203270656e64696e67cc0000030202846a646f63756d656e744964781b363257727a6f6a724a5661624b326e777461514a515655334637676873656e646572496468636c69656e742d31";
        pub(super) const EPHEMERAL: &str = "b90007647479706569657068656d6572616c687461726765744964656875622d316a646f63756d656e744964781b363257727a6f6a724a5661624b326e777461514a5156553346376764646174614fb900016568656c6c6f65776f726c6465636f756e74016973657373696f6e49646b3669643531686e376337756873656e646572496468636c69656e742d31";
        pub(super) const REQUEST: &str = "b9000564747970656772657175657374687461726765744964656875622d316a646f63756d656e744964781c326a396b6e7043736579686e4b38697a446d4c70475035574d645a5164646174614a420000010000000202846873656e646572496468636c69656e742d31";
        pub(super) const DOC_UNAVAILABLE: &str = "b9000464747970656f646f632d756e617661696c61626c656a646f63756d656e744964781c326a396b6e7043736579686e4b38697a446d4c70475035574d645a5168746172676574496468636c69656e742d316873656e6465724964656875622d31";
        /// `remove` is JS `undefined` (CBOR `0xf7`).
        pub(super) const SUBSCRIPTION_CHANGE: &str = "b900056474797065781a72656d6f74652d737562736372697074696f6e2d6368616e6765687461726765744964656875622d316361646481782463313634663438302d323164372d343633302d623832342d3765666165383535306363376672656d6f7665f76873656e646572496468636c69656e742d31";
        /// `peerMetadata` is `{}`.
        pub(super) const JOIN_V2: &str = "b900046474797065646a6f696e6873656e64657249646a6f6c642d636c69656e746c706565724d65746164617461b900007819737570706f7274656450726f746f636f6c56657273696f6e73816132";
        pub(super) const ERROR: &str = "b900046474797065656572726f726873656e6465724964656875622d31676d657373616765781c756e737570706f727465642070726f746f636f6c2076657273696f6e6874617267657449646a6f6c642d636c69656e74";
        /// Encoded with automerge-repo's `cbor.encode`: `timestamp` 1767225600123 is
        /// beyond 2^32, so cbor-x writes it as a float64.
        pub(super) const REMOTE_HEADS_CHANGED: &str = "b9000564747970657472656d6f74652d68656164732d6368616e6765646873656e6465724964656875622d3168746172676574496468636c69656e742d316a646f63756d656e744964781b363257727a6f6a724a5661624b326e777461514a51565533463767686e65774865616473b90001782463313634663438302d323164372d343633302d623832342d376566616538353530636337b9000265686561647381782c326664396342384d6e335236644a5868797234525464714d4c6f71765866345361784a6669773279595a39796974696d657374616d70fb4279b76daa87b000";
        /// Encoded with automerge-repo's `cbor.encode`: `count` 2^32 as a float64.
        pub(super) const EPHEMERAL_BIG_COUNT: &str = "b90007647479706569657068656d6572616c6873656e646572496468636c69656e742d31687461726765744964656875622d316a646f63756d656e744964781b363257727a6f6a724a5661624b326e777461514a5156553346376765636f756e74fb41f00000000000006973657373696f6e49646b3669643531686e37633775646461746144a1616101";
    }

    const JS_DOC: &str = "62WrzojrJVabK2nwtaQJQVU3F7g";
    const JS_MISSING_DOC: &str = "2j9knpCseyhnK8izDmLpGP5WMdZQ";

    #[test]
    fn decodes_messages_encoded_by_the_js_client_and_server() {
        let client = || peer("client-1");
        let hub = || peer("hub-1");
        let cases: Vec<(&str, &str, WireMessage)> = vec![
            (
                "join",
                js::JOIN,
                WireMessage::Join {
                    sender_id: client(),
                    supported_protocol_versions: Some(vec!["1".into()]),
                    peer_metadata: Some(PeerMetadata {
                        storage_id: Some(storage("29ee74a8-5ccc-4c62-826e-0938e44246d6")),
                        is_ephemeral: false,
                    }),
                },
            ),
            (
                "peer",
                js::PEER,
                WireMessage::Peer {
                    sender_id: hub(),
                    target_id: client(),
                    selected_protocol_version: "1".into(),
                    peer_metadata: Some(PeerMetadata {
                        storage_id: Some(storage("c164f480-21d7-4630-b824-7efae8550cc7")),
                        is_ephemeral: false,
                    }),
                },
            ),
            (
                "request",
                js::REQUEST,
                WireMessage::Request {
                    sender_id: client(),
                    target_id: hub(),
                    document_id: doc(JS_MISSING_DOC),
                    data: hex("42000001000000020284"),
                },
            ),
            (
                "doc-unavailable",
                js::DOC_UNAVAILABLE,
                WireMessage::DocUnavailable {
                    sender_id: hub(),
                    target_id: client(),
                    document_id: doc(JS_MISSING_DOC),
                },
            ),
            (
                "ephemeral",
                js::EPHEMERAL,
                WireMessage::Ephemeral {
                    sender_id: client(),
                    target_id: hub(),
                    document_id: doc(JS_DOC),
                    count: 1,
                    session_id: "6id51hn7c7u".into(),
                    // cbor-x's {"hello": "world"}
                    data: hex("b900016568656c6c6f65776f726c64"),
                },
            ),
            (
                "ephemeral with a float count",
                js::EPHEMERAL_BIG_COUNT,
                WireMessage::Ephemeral {
                    sender_id: client(),
                    target_id: hub(),
                    document_id: doc(JS_DOC),
                    count: 1 << 32,
                    session_id: "6id51hn7c7u".into(),
                    data: hex("a1616101"),
                },
            ),
            (
                "remote-subscription-change",
                js::SUBSCRIPTION_CHANGE,
                WireMessage::RemoteSubscriptionChange {
                    sender_id: client(),
                    target_id: hub(),
                    add: vec![storage("c164f480-21d7-4630-b824-7efae8550cc7")],
                    remove: vec![],
                },
            ),
            (
                "join asking for protocol 2",
                js::JOIN_V2,
                WireMessage::Join {
                    sender_id: peer("old-client"),
                    supported_protocol_versions: Some(vec!["2".into()]),
                    peer_metadata: Some(PeerMetadata::default()),
                },
            ),
            (
                "error",
                js::ERROR,
                WireMessage::Error {
                    sender_id: Some(hub()),
                    target_id: Some(peer("old-client")),
                    message: "unsupported protocol version".into(),
                },
            ),
            (
                "remote-heads-changed",
                js::REMOTE_HEADS_CHANGED,
                WireMessage::RemoteHeadsChanged {
                    sender_id: hub(),
                    target_id: client(),
                    document_id: doc(JS_DOC),
                    new_heads: BTreeMap::from([(
                        storage("c164f480-21d7-4630-b824-7efae8550cc7"),
                        HeadsInfo {
                            heads: vec!["2fd9cB8Mn3R6dJXhyr4RTdqMLoqvXf4SaxJfiw2yYZ9y".into()],
                            timestamp: 1_767_225_600_123,
                        },
                    )]),
                },
            ),
        ];
        for (name, fixture, expected) in cases {
            let decoded = decode(&hex(fixture)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(decoded, expected, "{name}");
            assert_eq!(
                decode(&encode(&decoded)).unwrap(),
                expected,
                "{name} re-encoded"
            );
        }
    }

    #[test]
    fn decodes_js_sync_messages_with_their_automerge_payload() {
        for (fixture, data_len) in [(js::SYNC_FIRST, 50), (js::SYNC_DOC, 460)] {
            let WireMessage::Sync {
                sender_id,
                target_id,
                document_id,
                data,
            } = decode(&hex(fixture)).unwrap()
            else {
                panic!("not a sync message")
            };
            assert_eq!(sender_id, peer("client-1"));
            assert_eq!(target_id, peer("hub-1"));
            assert_eq!(document_id.to_string(), JS_DOC);
            assert_eq!(data.len(), data_len);
            assert!(automerge::sync::Message::decode(&data).is_ok());
        }
    }

    fn all_variants() -> Vec<WireMessage> {
        let a = || peer("agent-7");
        let h = || peer("hub");
        let d = DocumentId::from_bytes([7; DOCUMENT_ID_BYTES]);
        vec![
            WireMessage::Join {
                sender_id: a(),
                supported_protocol_versions: Some(vec![PROTOCOL_VERSION.into()]),
                peer_metadata: Some(PeerMetadata {
                    storage_id: Some(storage("s-1")),
                    is_ephemeral: true,
                }),
            },
            WireMessage::Join {
                sender_id: a(),
                supported_protocol_versions: None,
                peer_metadata: None,
            },
            WireMessage::Peer {
                sender_id: h(),
                target_id: a(),
                selected_protocol_version: PROTOCOL_VERSION.into(),
                peer_metadata: Some(PeerMetadata::default()),
            },
            WireMessage::Peer {
                sender_id: h(),
                target_id: a(),
                selected_protocol_version: PROTOCOL_VERSION.into(),
                peer_metadata: None,
            },
            WireMessage::Leave { sender_id: a() },
            WireMessage::Request {
                sender_id: a(),
                target_id: h(),
                document_id: d,
                data: vec![0x42, 0, 0, 0, 0],
            },
            WireMessage::Sync {
                sender_id: h(),
                target_id: a(),
                document_id: d,
                data: vec![0x43; 300],
            },
            WireMessage::DocUnavailable {
                sender_id: h(),
                target_id: a(),
                document_id: d,
            },
            WireMessage::Ephemeral {
                sender_id: a(),
                target_id: h(),
                document_id: d,
                count: JS_SAFE_INTEGER_MAX,
                session_id: "session".into(),
                data: vec![],
            },
            WireMessage::Error {
                sender_id: None,
                target_id: None,
                message: "bad".into(),
            },
            WireMessage::Error {
                sender_id: Some(h()),
                target_id: Some(a()),
                message: String::new(),
            },
            WireMessage::RemoteSubscriptionChange {
                sender_id: a(),
                target_id: h(),
                add: vec![storage("s-1"), storage("s-2")],
                remove: vec![storage("s-3")],
            },
            WireMessage::RemoteSubscriptionChange {
                sender_id: a(),
                target_id: h(),
                add: vec![],
                remove: vec![],
            },
            WireMessage::RemoteHeadsChanged {
                sender_id: h(),
                target_id: a(),
                document_id: d,
                new_heads: BTreeMap::from([
                    (
                        storage("s-1"),
                        HeadsInfo {
                            heads: vec!["h1".into(), "h2".into()],
                            timestamp: 1_767_225_600_123,
                        },
                    ),
                    (
                        storage("s-2"),
                        HeadsInfo {
                            heads: vec![],
                            timestamp: 0,
                        },
                    ),
                ]),
            },
        ]
    }

    #[test]
    fn every_variant_round_trips() {
        let variants = all_variants();
        let names: std::collections::BTreeSet<_> =
            variants.iter().map(WireMessage::type_name).collect();
        assert_eq!(names.len(), 10, "a variant is missing from the table");
        for msg in variants {
            let bytes = encode(&msg);
            assert_eq!(decode(&bytes).unwrap(), msg, "{}", msg.type_name());
        }
    }

    /// Build CBOR by hand for the table of bad inputs.
    fn cbor(build: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer::default();
        build(&mut w);
        w.0
    }

    /// A `sync` map with `fields` entries, of which the caller writes the last
    /// `fields - 4` after the four usual ones.
    fn sync_with(fields: usize, rest: impl FnOnce(&mut Writer)) -> Vec<u8> {
        cbor(|w| {
            w.map(fields);
            w.field("type", "sync");
            w.field("senderId", "a");
            w.field("targetId", "b");
            w.field("documentId", JS_DOC);
            rest(w);
        })
    }

    fn nested_arrays(depth: usize) -> Vec<u8> {
        sync_with(6, |w| {
            w.text("data");
            w.bytes(b"x");
            w.text("extra");
            for _ in 0..depth {
                w.array(1);
            }
            w.uint(0);
        })
    }

    #[test]
    fn bad_inputs_are_refused_with_a_stable_code() {
        let valid = hex(js::JOIN);
        let mut trailing = valid.clone();
        trailing.push(0);
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", vec![], "empty"),
            (
                "oversize",
                vec![0xa0; MESSAGE_BYTES_MAX + 1],
                "message_too_large",
            ),
            ("break byte", vec![0xff, 0x00, 0x13], "malformed"),
            ("reserved byte", vec![0x1c], "malformed"),
            ("ascii garbage", b"\x7bhello world".to_vec(), "malformed"),
            ("truncated", valid[..valid.len() / 2].to_vec(), "malformed"),
            (
                "truncated by one",
                valid[..valid.len() - 1].to_vec(),
                "malformed",
            ),
            ("trailing byte", trailing, "trailing_bytes"),
            (
                "two messages",
                [valid.clone(), valid.clone()].concat(),
                "trailing_bytes",
            ),
            ("top level array", cbor(|w| w.array(0)), "malformed"),
            ("top level text", cbor(|w| w.text("join")), "malformed"),
            ("indefinite map", vec![0xbf, 0xff], "malformed"),
            ("no type", cbor(|w| w.map(0)), "missing_field"),
            (
                "type is a number",
                cbor(|w| {
                    w.map(1);
                    w.text("type");
                    w.uint(1);
                }),
                "wrong_type",
            ),
            (
                "unknown type",
                cbor(|w| {
                    w.map(1);
                    w.field("type", "hello");
                }),
                "unknown_type",
            ),
            (
                "type longer than any known",
                cbor(|w| {
                    w.map(1);
                    w.field("type", &"x".repeat(TYPE_BYTES_MAX + 1));
                }),
                "field_too_large",
            ),
            ("sync without data", sync_with(4, |_| {}), "missing_field"),
            (
                "sync with data as text",
                sync_with(5, |w| w.field("data", "abc")),
                "wrong_type",
            ),
            (
                "sync with undefined data",
                sync_with(5, |w| {
                    w.text("data");
                    w.0.push(0xf7);
                }),
                "missing_field",
            ),
            (
                "data longer than the message",
                sync_with(5, |w| {
                    w.text("data");
                    w.0.extend([0x5b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
                }),
                "malformed",
            ),
            (
                "unknown field declares 2^32 items",
                sync_with(5, |w| {
                    w.text("extra");
                    w.0.extend([0x9a, 0xff, 0xff, 0xff, 0xff]);
                }),
                "malformed",
            ),
            (
                "nested 17 deep",
                nested_arrays(NESTING_DEPTH_MAX),
                "too_deep",
            ),
            ("nested 100k deep", nested_arrays(100_000), "too_deep"),
            (
                "sender id is a number",
                cbor(|w| {
                    w.map(2);
                    w.field("type", "leave");
                    w.text("senderId");
                    w.uint(7);
                }),
                "wrong_type",
            ),
            (
                "empty sender id",
                cbor(|w| {
                    w.map(2);
                    w.field("type", "leave");
                    w.field("senderId", "");
                }),
                "invalid_id",
            ),
            (
                "sender id too long",
                cbor(|w| {
                    w.map(2);
                    w.field("type", "leave");
                    w.field("senderId", &"p".repeat(PEER_ID_BYTES_MAX + 1));
                }),
                "field_too_large",
            ),
            (
                "document id not base58check",
                cbor(|w| {
                    w.map(4);
                    w.field("type", "doc-unavailable");
                    w.field("senderId", "a");
                    w.field("targetId", "b");
                    w.field("documentId", "62WrzojrJVabK2nwtaQJQVU3F7h");
                }),
                "invalid_id",
            ),
            (
                "duplicate key",
                cbor(|w| {
                    w.map(3);
                    w.field("type", "leave");
                    w.field("senderId", "a");
                    w.field("senderId", "b");
                }),
                "duplicate_field",
            ),
            (
                "non-text key",
                cbor(|w| {
                    w.map(2);
                    w.field("type", "leave");
                    w.uint(1);
                    w.uint(2);
                }),
                "malformed",
            ),
            (
                "too many entries",
                cbor(|w| {
                    w.map(MAP_ENTRIES_COUNT_MAX + 1);
                    w.field("type", "leave");
                    for i in 0..MAP_ENTRIES_COUNT_MAX {
                        w.field(&format!("k{i}"), "v");
                    }
                }),
                "too_many_entries",
            ),
            (
                "too many protocol versions",
                cbor(|w| {
                    w.map(3);
                    w.field("type", "join");
                    w.field("senderId", "a");
                    w.text("supportedProtocolVersions");
                    w.text_array(["1"; PROTOCOL_VERSIONS_COUNT_MAX + 1].into_iter());
                }),
                "field_too_large",
            ),
            (
                "2^64 protocol versions declared",
                cbor(|w| {
                    w.map(3);
                    w.field("type", "join");
                    w.field("senderId", "a");
                    w.text("supportedProtocolVersions");
                    w.0.extend([0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
                }),
                "malformed",
            ),
            (
                "negative count",
                sync_ephemeral(|w| w.0.push(0x20)),
                "invalid_number",
            ),
            (
                "fractional count",
                sync_ephemeral(|w| w.0.extend(hex("fb3ff8000000000000"))),
                "invalid_number",
            ),
            (
                "count beyond 2^53",
                sync_ephemeral(|w| w.uint(1 << 60)),
                "invalid_number",
            ),
            (
                "NaN count as half float",
                sync_ephemeral(|w| w.0.extend([0xf9, 0x7e, 0x00])),
                "invalid_number",
            ),
            (
                "count as text",
                sync_ephemeral(|w| w.text("1")),
                "wrong_type",
            ),
            (
                "isEphemeral as text",
                cbor(|w| {
                    w.map(3);
                    w.field("type", "join");
                    w.field("senderId", "a");
                    w.text("peerMetadata");
                    w.map(1);
                    w.field("isEphemeral", "yes");
                }),
                "wrong_type",
            ),
            (
                "invalid UTF-8 in an unknown field",
                sync_with(6, |w| {
                    w.text("data");
                    w.bytes(b"x");
                    w.text("extra");
                    w.0.extend([0x62, 0xc3, 0x28]);
                }),
                "malformed",
            ),
        ];
        for (name, input, code) in cases {
            let err = decode(&input).expect_err(name);
            assert_eq!(err.code(), code, "{name}: {err}");
        }
    }

    fn sync_ephemeral(count: impl FnOnce(&mut Writer)) -> Vec<u8> {
        cbor(|w| {
            w.map(7);
            w.field("type", "ephemeral");
            w.field("senderId", "a");
            w.field("targetId", "b");
            w.field("documentId", JS_DOC);
            w.field("sessionId", "s");
            w.text("data");
            w.bytes(b"");
            w.text("count");
            count(w);
        })
    }

    #[test]
    fn numbers_are_written_the_way_cbor_x_writes_them() {
        // (value, cbor-x's bytes for that JS number)
        let cases: [(u64, &str); 4] = [
            (1, "01"),
            (70_000, "1a00011170"),
            (1 << 32, "fb41f0000000000000"),
            (1_767_225_600_123, "fb4279b76daa87b000"),
        ];
        for (n, expected) in cases {
            let mut w = Writer::default();
            w.js_number(n);
            assert_eq!(w.0, hex(expected), "{n}");
        }
    }

    #[test]
    fn unknown_fields_and_their_order_do_not_matter() {
        let msg = sync_with(7, |w| {
            w.text("future");
            w.map(1);
            w.text("nested");
            w.array(2);
            w.uint(1);
            w.0.extend([0xc2, 0x41, 0x01]); // a tagged bignum
            w.text("data");
            w.bytes(b"\x42");
            w.text("alsoNew");
            w.0.push(0xf6);
        });
        assert_eq!(
            decode(&msg).unwrap(),
            WireMessage::Sync {
                sender_id: peer("a"),
                target_id: peer("b"),
                document_id: doc(JS_DOC),
                data: vec![0x42],
            }
        );
    }

    #[test]
    fn document_ids_read_and_write_automerge_repo_forms() {
        let id = doc(JS_DOC);
        assert_eq!(id.to_string(), JS_DOC);
        assert_eq!(id.url(), format!("automerge:{JS_DOC}"));
        assert_eq!(doc(&id.url()), id);
        assert_eq!(DocumentId::from_bytes(*id.as_bytes()), id);
        let four_bytes = bs58::encode([1u8, 2, 3, 4]).with_check().into_string();
        let bad: Vec<(&str, IdError)> = vec![
            (
                "",
                IdError::Empty {
                    kind: "document id",
                },
            ),
            ("automerge:", IdError::NotBase58Check),
            ("0OIl", IdError::NotBase58Check),
            ("62WrzojrJVabK2nwtaQJQVU3F7h", IdError::NotBase58Check),
            (&four_bytes, IdError::WrongLength { len: 4 }),
            (
                "automerge:62WrzojrJVabK2nwtaQJQVU3F7g#heads",
                IdError::NotBase58Check,
            ),
        ];
        for (text, expected) in bad {
            assert_eq!(
                text.parse::<DocumentId>().unwrap_err(),
                expected,
                "{text:?}"
            );
        }
        let long = "1".repeat(DOCUMENT_ID_TEXT_BYTES_MAX + 1);
        assert!(matches!(
            long.parse::<DocumentId>(),
            Err(IdError::TooLong { .. })
        ));
    }

    fn arb_text(max: usize) -> impl Strategy<Value = String> {
        proptest::collection::vec(any::<char>(), 0..8).prop_map(move |chars| {
            let mut s: String = chars.into_iter().collect();
            while s.len() > max {
                s.pop();
            }
            s
        })
    }

    fn arb_id() -> impl Strategy<Value = String> {
        "[a-z0-9-]{1,12}"
    }

    fn arb_message() -> impl Strategy<Value = WireMessage> {
        let ids = (arb_id(), arb_id(), any::<[u8; DOCUMENT_ID_BYTES]>());
        (
            ids,
            0..10usize,
            proptest::collection::vec(any::<u8>(), 0..64),
            0..=JS_SAFE_INTEGER_MAX,
            arb_text(32),
            proptest::option::of((proptest::option::of(arb_id()), any::<bool>())),
        )
            .prop_map(|((s, t, d), variant, data, n, text, meta)| {
                let sender_id = peer(&s);
                let target_id = peer(&t);
                let document_id = DocumentId::from_bytes(d);
                let peer_metadata = meta.map(|(storage_id, is_ephemeral)| PeerMetadata {
                    storage_id: storage_id.map(|s| storage(&s)),
                    is_ephemeral,
                });
                match variant {
                    0 => WireMessage::Join {
                        sender_id,
                        supported_protocol_versions: Some(vec![text]),
                        peer_metadata,
                    },
                    1 => WireMessage::Peer {
                        sender_id,
                        target_id,
                        selected_protocol_version: text,
                        peer_metadata,
                    },
                    2 => WireMessage::Leave { sender_id },
                    3 => WireMessage::Request {
                        sender_id,
                        target_id,
                        document_id,
                        data,
                    },
                    4 => WireMessage::Sync {
                        sender_id,
                        target_id,
                        document_id,
                        data,
                    },
                    5 => WireMessage::DocUnavailable {
                        sender_id,
                        target_id,
                        document_id,
                    },
                    6 => WireMessage::Ephemeral {
                        sender_id,
                        target_id,
                        document_id,
                        count: n,
                        session_id: text,
                        data,
                    },
                    7 => WireMessage::Error {
                        sender_id: Some(sender_id),
                        target_id: None,
                        message: text,
                    },
                    8 => WireMessage::RemoteSubscriptionChange {
                        sender_id,
                        target_id: target_id.clone(),
                        add: vec![storage(target_id.as_str())],
                        remove: vec![],
                    },
                    _ => WireMessage::RemoteHeadsChanged {
                        sender_id,
                        target_id: target_id.clone(),
                        document_id,
                        new_heads: BTreeMap::from([(
                            storage(target_id.as_str()),
                            HeadsInfo {
                                heads: vec![text],
                                timestamp: n,
                            },
                        )]),
                    },
                }
            })
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn random_messages_round_trip(msg in arb_message()) {
            prop_assert_eq!(decode(&encode(&msg)).unwrap(), msg);
        }

        #[test]
        fn a_message_for_each_target_is_that_message_encoded_with_its_target(
            msg in arb_message(),
            target in "[a-zA-Z0-9-]{1,40}",
        ) {
            let target = peer(&target);
            let mut retargeted = msg.clone();
            let has_target = match &mut retargeted {
                WireMessage::Peer { target_id, .. }
                | WireMessage::Request { target_id, .. }
                | WireMessage::Sync { target_id, .. }
                | WireMessage::DocUnavailable { target_id, .. }
                | WireMessage::Ephemeral { target_id, .. }
                | WireMessage::RemoteSubscriptionChange { target_id, .. }
                | WireMessage::RemoteHeadsChanged { target_id, .. } => {
                    *target_id = target.clone();
                    true
                }
                WireMessage::Join { .. } | WireMessage::Leave { .. } | WireMessage::Error { .. } => false,
            };
            match ToEach::new(&msg) {
                Some(each) => {
                    prop_assert!(has_target);
                    prop_assert_eq!(each.to(&target), encode(&retargeted));
                    prop_assert_eq!(decode(&each.to(&target)).unwrap(), retargeted);
                }
                None => prop_assert!(!has_target),
            }
        }

        #[test]
        fn mutated_js_frames_never_panic(
            which in 0..4usize,
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
        ) {
            let fixture = [js::JOIN, js::SYNC_DOC, js::REMOTE_HEADS_CHANGED, js::SUBSCRIPTION_CHANGE][which];
            let mut bytes = hex(fixture);
            for (at, byte) in edits {
                let i = at % bytes.len();
                bytes[i] = byte;
            }
            bytes.truncate(cut % (bytes.len() + 1));
            if let Ok(msg) = decode(&bytes) {
                // Whatever is accepted re-encodes to something that decodes the same.
                prop_assert_eq!(decode(&encode(&msg)).unwrap(), msg);
            }
        }
    }
}
