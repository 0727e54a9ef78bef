//! What an idle peer in step costs the hub core, counted by a global allocator: a list
//! loaded from FILE, then CONNS peers that hold the list join and sync (as the
//! side-by-side bench's agents do), then are left idle.
//!
//! `cargo run --release --example conn_memory -- FILE [CONNS]`
#![allow(clippy::print_stdout)] // A measuring tool: its output is the report.

use automerge::sync;
use automerge::ActorId;
use swarmtodo::hub::core::{ConnId, Effects, HubConfig, HubCore, Input};
use swarmtodo::hub::wire::{self, PeerId, WireMessage};
use swarmtodo::memory::live;
use swarmtodo::model::TodoList;

#[global_allocator]
static ALLOCATOR: swarmtodo::memory::Counting = swarmtodo::memory::Counting;

fn peer(n: u64) -> PeerId {
    PeerId::new(format!("peer-{n}")).unwrap_or_else(|e| panic!("{e}"))
}

fn payloads(fx: &Effects, c: ConnId) -> Vec<Vec<u8>> {
    fx.sends
        .iter()
        .filter(|(to, _)| *to == c)
        .filter_map(|(_, b)| match wire::decode(b) {
            Ok(WireMessage::Sync { data, .. }) => Some(data),
            _ => None,
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: conn_memory FILE [CONNS]")?;
    let conns: u64 = args.next().map_or(Ok(200), |a| a.parse())?;
    let bytes = std::fs::read(&path)?;
    let list = TodoList::load(&bytes, ActorId::from([1u8; 16]))?;
    let config = HubConfig::new(ActorId::from([0xA0u8; 16]));
    let hub_id = config.peer_id.clone();
    let mut core = HubCore::new(config);
    let doc = swarmtodo::client::list_document_id("memory");
    core.load_doc(doc, list.doc().clone(), Vec::new());
    let mut replica = list.fork(ActorId::from([2u8; 16]));

    let before = live();
    let mut have_bytes = 0usize;
    for n in 1..=conns {
        let c = ConnId(n);
        core.handle(0, Input::Connected(c));
        let join = wire::encode(&WireMessage::Join {
            sender_id: peer(n),
            supported_protocol_versions: Some(vec!["1".into()]),
            peer_metadata: None,
        });
        core.handle(0, Input::Frame(c, join));
        let mut state = sync::State::new();
        for _ in 0..10 {
            let Some(m) = replica.generate_sync_message(&mut state) else {
                break;
            };
            have_bytes += m
                .have
                .iter()
                .map(|h| h.bloom.to_bytes().len())
                .sum::<usize>();
            let frame = wire::encode(&WireMessage::Sync {
                sender_id: peer(n),
                target_id: hub_id.clone(),
                document_id: doc,
                data: m.encode(),
            });
            let fx = core.handle(0, Input::Frame(c, frame));
            for data in payloads(&fx, c) {
                replica.receive_sync_message(&mut state, sync::Message::decode(&data)?)?;
            }
        }
    }
    let per = (live() - before) as f64 / conns as f64;
    println!(
        "{conns} idle peers in step: {:.1} KiB each in the hub core \
         (their messages carried {:.1} KiB of Bloom filters each)",
        per / 1024.0,
        have_bytes as f64 / conns as f64 / 1024.0
    );
    Ok(())
}
