//! Tests of the wire codec: round trips, the JS peers' encodings, every limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::encoder::Writer;
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
