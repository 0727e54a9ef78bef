//! Encoding: a [`WireMessage`] to CBOR as the JS peers write it, and one encoding sent
//! to many peers ([`ToEach`]).

#[allow(clippy::wildcard_imports)] // The codec's own types and limits.
use super::*;

/// A tiny CBOR writer: definite lengths, shortest heads, infallible (it writes to a
/// `Vec`). The JS side decodes any valid CBOR, so this is all the encoder needs.
#[derive(Debug, Default)]
pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn head(&mut self, major: u8, n: u64) {
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

    pub(super) fn uint(&mut self, n: u64) {
        self.head(0, n);
    }

    /// A JS number: like cbor-x, an unsigned integer below 2^32 and a float64 from
    /// there up to 2^53 − 1, because cbor-x reads 64-bit integers as `BigInt`, which
    /// automerge-repo does not expect.
    pub(super) fn js_number(&mut self, n: u64) {
        if n <= u64::from(u32::MAX) || n > JS_SAFE_INTEGER_MAX {
            self.uint(n);
        } else {
            self.0.push(0xfb);
            // n < 2^53, so the float is exact.
            self.0.extend((n as f64).to_be_bytes());
        }
    }

    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.head(2, b.len() as u64);
        self.0.extend_from_slice(b);
    }

    pub(super) fn text(&mut self, s: &str) {
        self.head(3, s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }

    pub(super) fn array(&mut self, len: usize) {
        self.head(4, len as u64);
    }

    pub(super) fn map(&mut self, len: usize) {
        self.head(5, len as u64);
    }

    pub(super) fn bool(&mut self, b: bool) {
        self.0.push(if b { 0xf5 } else { 0xf4 });
    }

    pub(super) fn field(&mut self, key: &str, value: &str) {
        self.text(key);
        self.text(value);
    }

    pub(super) fn text_array<'a>(&mut self, items: impl ExactSizeIterator<Item = &'a str>) {
        self.array(items.len());
        for item in items {
            self.text(item);
        }
    }

    pub(super) fn metadata(&mut self, m: &PeerMetadata) {
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
