//! Arbitrary change bytes through the validator into a hub core: a peer joins a list of
//! three tasks and sends a sync message whose changes are the fuzzer's bytes (split in
//! up to four), and then a second message that syncs normally. The core never panics,
//! and the hub's list still reads and still syncs.
#![no_main]

use automerge::sync::{self, SyncDoc};
use libfuzzer_sys::fuzz_target;
use swarmtodo_core::hub::{ConnId, HubConfig, HubCore, Input};
use swarmtodo_core::model::{parse_write_request, TodoList, WriteContext};
use swarmtodo_proto::wire::{self, list_document_id, PeerId, WireMessage};

fn leb(mut n: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fuzz_target!(|bytes: &[u8]| {
    let actor = automerge::ActorId::from([0xA0u8; 16]);
    let config = HubConfig::new(actor);
    let hub_id = config.peer_id.clone();
    let mut core = HubCore::new(config);
    let doc = list_document_id("fuzz");
    let mut list = TodoList::create(automerge::ActorId::from([1u8; 16]));
    let plan = parse_write_request(
        r#"{"mode":"patch","ops":[
            {"op":"upsert","task":{"id":"a","content":"A"}},
            {"op":"upsert","task":{"id":"b","content":"B","blocked_by":["a"]}},
            {"op":"upsert","task":{"id":"c","content":"C","status":"in_progress","owner":"w"}}]}"#,
    )
    .expect("the plan parses");
    list.write(&plan, &WriteContext::new("lead", 1, 1))
        .expect("the plan applies");
    core.load_doc(doc, list.doc().clone(), Vec::new());

    let c = ConnId(1);
    let peer = PeerId::new("fuzzer".to_owned()).expect("a peer id");
    core.handle(1, Input::Connected(c));
    let join = wire::encode(&WireMessage::Join {
        sender_id: peer.clone(),
        supported_protocol_versions: Some(vec!["1".into()]),
        peer_metadata: None,
    });
    core.handle(1, Input::Frame(c, join));
    let frame = |data: Vec<u8>| {
        wire::encode(&WireMessage::Sync {
            sender_id: peer.clone(),
            target_id: hub_id.clone(),
            document_id: doc,
            data,
        })
    };
    // A V1 sync message: no heads, need or have, the fuzzer's bytes as up to four changes.
    let parts: Vec<&[u8]> = match bytes.first() {
        Some(&n) if bytes.len() > 1 => {
            let n = usize::from(n % 4) + 1;
            bytes[1..].chunks((bytes.len() - 1).div_ceil(n)).collect()
        }
        _ => vec![bytes],
    };
    let mut data = vec![0x42, 0, 0, 0];
    leb(parts.len() as u64, &mut data);
    for p in &parts {
        leb(p.len() as u64, &mut data);
        data.extend_from_slice(p);
    }
    core.handle(2, Input::Frame(c, frame(data)));
    core.handle(3, Input::Tick);

    // The list still reads, and a well-behaved message still gets an answer.
    if let Some(d) = core.doc(&doc) {
        let _ = d.list().read();
    }
    let replica = list.doc().clone();
    let mut state = sync::State::new();
    if let Some(m) = SyncDoc::generate_sync_message(&replica, &mut state) {
        core.handle(4, Input::Frame(c, frame(m.encode())));
    }
    core.handle(5, Input::Disconnected(c));
});
