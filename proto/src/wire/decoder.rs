//! Decoding: untrusted bytes to a [`WireMessage`], every string, list and map bounded
//! by a named limit, nesting bounded, unknown fields skipped.

#[allow(clippy::wildcard_imports)] // The codec's own types and limits.
use super::*;

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
