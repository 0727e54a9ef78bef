//! Criterion benches of the hub core's per-message cost, driven
//! without sockets: in-process peers exchange real automerge-repo frames with a
//! [`HubCore`].
//!
//! - `hub_write_fanout/{changes}`: one peer's sync message carrying one new change
//!   (a single-task status write): validate, merge, authority, and a sync message for
//!   each of `PEERS` up-to-date peers.
//! - `hub_ack/{changes}`: an up-to-date peer's acknowledgement of a change the hub sent
//!   it (its natural reply: new heads, no change).
//! - `hub_reannounce/{changes}`: an up-to-date peer that starts over with a fresh sync
//!   state ("last sync: never"): the stock path, whose cost follows the history by
//!   nature (the Bloom filter covers the whole history); the per-connection work budget
//!   bounds how often one connection may cause it.
//!
//! History sizes: 1,000 and 60,000 changes on a 1,000-task list (setup builds them).
//!
//! Run: `cargo bench --bench hub`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A bench's setup failing is a bug to see at once.

use std::hint::black_box;
use std::time::{Duration, Instant};

use automerge::{sync, ActorId};
use criterion::{BenchmarkId, Criterion};
use swarmtodo::hub::core::{ConnId, Effects, HubConfig, HubCore, Input};
use swarmtodo::hub::wire::{self, DocumentId, PeerId, WireMessage};
use swarmtodo::model::{TodoList, WriteContext};
use swarmtodo::proto::{PatchOp, Status, TaskPatch, WriteMode, WriteRequest};

/// Up-to-date peers a write is fanned out to.
const PEERS: usize = 100;
/// Tasks in the list.
const TASKS: usize = 1_000;
/// History sizes measured.
const HISTORIES: [usize; 2] = [1_000, 60_000];

struct Peer {
    conn: ConnId,
    id: PeerId,
    list: TodoList,
    state: sync::State,
}

fn req(ops: Vec<PatchOp>) -> WriteRequest {
    WriteRequest {
        mode: WriteMode::Patch { ops },
        expected_version: None,
        explanation: None,
    }
}

fn upsert(id: String, content: Option<String>, status: Option<Status>) -> PatchOp {
    PatchOp::Upsert {
        task: TaskPatch {
            id: Some(id),
            content,
            status,
            ..TaskPatch::default()
        },
    }
}

fn frame(peer: &mut Peer, hub: &PeerId, doc: DocumentId) -> Option<Vec<u8>> {
    // The hub does not answer a message that tells it nothing new; a real peer does
    // not wait for that answer before sending its next change.
    peer.state.in_flight = false;
    let m = peer.list.generate_sync_message(&mut peer.state)?;
    Some(wire::encode(&WireMessage::Sync {
        sender_id: peer.id.clone(),
        target_id: hub.clone(),
        document_id: doc,
        data: m.encode(),
    }))
}

/// One real status change by peer `w`, as the frame it sends.
fn write_frame(fx: &mut Fixture, w: usize) -> (ConnId, Vec<u8>) {
    fx.round += 1;
    let id = format!("t{}", fx.round as usize % TASKS);
    let writer = &mut fx.peers[w];
    // Always a real change: a status other than the current one.
    let current = writer.list.raw_task(&id).and_then(|t| t.status.clone());
    let next = [Status::Pending, Status::Blocked, Status::Completed]
        .into_iter()
        .find(|s| current.as_deref() != Some(s.as_str()));
    let op = upsert(id, None, next);
    writer
        .list
        .write(&req(vec![op]), &WriteContext::new("writer", 0, fx.round))
        .unwrap();
    (writer.conn, frame(writer, &fx.hub, fx.doc).unwrap())
}

/// Delivers the core's sends to the peers; returns the frames the peers answer with.
fn deliver(
    fx: Effects,
    peers: &mut [Peer],
    hub: &PeerId,
    doc: DocumentId,
) -> Vec<(usize, Vec<u8>)> {
    let mut replies = Vec::new();
    for (conn, bytes) in fx.sends {
        let Some(i) = peers.iter().position(|p| p.conn == conn) else {
            continue;
        };
        if let Ok(WireMessage::Sync { data, .. }) = wire::decode(&bytes) {
            let m = sync::Message::decode(&data).unwrap();
            let p = &mut peers[i];
            p.list.receive_sync_message(&mut p.state, m).unwrap();
            if let Some(f) = frame(p, hub, doc) {
                replies.push((i, f));
            }
        }
    }
    replies
}

/// Runs frames through the core until nobody has anything to say.
fn settle(
    core: &mut HubCore,
    peers: &mut [Peer],
    hub: &PeerId,
    doc: DocumentId,
    mut pending: Vec<(usize, Vec<u8>)>,
) {
    for _ in 0..100 {
        if pending.is_empty() {
            return;
        }
        let mut next = Vec::new();
        for (i, f) in pending {
            let fx = core.handle(0, Input::Frame(peers[i].conn, f));
            next.extend(deliver(fx, peers, hub, doc));
        }
        pending = next;
    }
    panic!("sync did not settle");
}

struct Fixture {
    core: HubCore,
    peers: Vec<Peer>,
    hub: PeerId,
    doc: DocumentId,
    round: u64,
}

fn fixture(history: usize) -> Fixture {
    let t0 = Instant::now();
    let mut lead = TodoList::create(ActorId::from([1u8; 16]));
    let ops = (0..TASKS)
        .map(|i| upsert(format!("t{i}"), Some(format!("Task {i}")), None))
        .collect();
    lead.write(&req(ops), &WriteContext::new("lead", 0, 1))
        .unwrap();
    let cycle = [Status::Pending, Status::Blocked, Status::Completed];
    for n in 1..history {
        let op = upsert(format!("t{}", n % TASKS), None, Some(cycle[n % 3]));
        lead.write(&req(vec![op]), &WriteContext::new("lead", 0, n as u64))
            .unwrap();
    }
    let doc = swarmtodo::client::list_document_id("bench");
    let config = HubConfig::new(ActorId::from([0xA0u8; 16]));
    let hub = config.peer_id.clone();
    let mut core = HubCore::new(config);
    core.load_doc(doc, lead.doc().clone(), Vec::new());
    let mut peers = Vec::new();
    for i in 0..=PEERS {
        let conn = ConnId(i as u64 + 1);
        let id = PeerId::new(format!("peer-{i}")).unwrap();
        core.handle(0, Input::Connected(conn));
        let join = wire::encode(&WireMessage::Join {
            sender_id: id.clone(),
            supported_protocol_versions: Some(vec!["1".into()]),
            peer_metadata: None,
        });
        core.handle(0, Input::Frame(conn, join));
        let list = lead.fork(ActorId::from([10 + i as u8; 16]));
        let mut state = sync::State::new();
        let first = list.generate_sync_message(&mut state).unwrap();
        let mut p = Peer {
            conn,
            id,
            list,
            state: sync::State::new(),
        };
        std::mem::swap(&mut p.state, &mut state);
        let f = wire::encode(&WireMessage::Sync {
            sender_id: p.id.clone(),
            target_id: hub.clone(),
            document_id: doc,
            data: first.encode(),
        });
        peers.push(p);
        let idx = peers.len() - 1;
        settle(&mut core, &mut peers, &hub, doc, vec![(idx, f)]);
    }
    eprintln!(
        "setup: {history} changes, {} peers in {:.1} s",
        PEERS + 1,
        t0.elapsed().as_secs_f64()
    );
    Fixture {
        core,
        peers,
        hub,
        doc,
        round: 0,
    }
}

fn bench(c: &mut Criterion) {
    let mut write_group = c.benchmark_group("hub_write_fanout");
    write_group
        .measurement_time(Duration::from_secs(5))
        .sample_size(20);
    let mut fixtures: Vec<(usize, Fixture)> = HISTORIES.iter().map(|&h| (h, fixture(h))).collect();
    for (history, fx) in &mut fixtures {
        write_group.bench_with_input(BenchmarkId::from_parameter(*history), history, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (conn, f) = write_frame(fx, 0);
                    let start = Instant::now();
                    let out = fx.core.handle(0, Input::Frame(conn, black_box(f)));
                    total += start.elapsed();
                    assert!(out.sends.len() >= PEERS, "fanned out to every peer");
                    let replies = deliver(out, &mut fx.peers, &fx.hub, fx.doc);
                    settle(&mut fx.core, &mut fx.peers, &fx.hub, fx.doc, replies);
                }
                total
            });
        });
    }
    write_group.finish();

    let mut ack_group = c.benchmark_group("hub_ack");
    ack_group
        .measurement_time(Duration::from_secs(5))
        .sample_size(20);
    for (history, fx) in &mut fixtures {
        ack_group.bench_with_input(BenchmarkId::from_parameter(*history), history, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    // Peer 0 writes; every peer gets the change and acknowledges it.
                    let (conn, f) = write_frame(fx, 0);
                    let out = fx.core.handle(0, Input::Frame(conn, f));
                    let mut replies = deliver(out, &mut fx.peers, &fx.hub, fx.doc);
                    let i = replies.iter().position(|(i, _)| *i == 1).unwrap();
                    let (_, ack) = replies.swap_remove(i);
                    let conn = fx.peers[1].conn;
                    let start = Instant::now();
                    let out = fx.core.handle(0, Input::Frame(conn, black_box(ack)));
                    total += start.elapsed();
                    replies.extend(deliver(out, &mut fx.peers, &fx.hub, fx.doc));
                    settle(&mut fx.core, &mut fx.peers, &fx.hub, fx.doc, replies);
                }
                total
            });
        });
    }
    ack_group.finish();

    let mut re_group = c.benchmark_group("hub_reannounce");
    re_group
        .measurement_time(Duration::from_secs(5))
        .sample_size(10);
    for (history, fx) in &mut fixtures {
        re_group.bench_with_input(BenchmarkId::from_parameter(*history), history, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    // An up-to-date peer re-announces its heads from a fresh state.
                    // Each time from another peer: one connection may not do this
                    // often (the work budget).
                    fx.round += 1;
                    let p = &mut fx.peers[1 + fx.round as usize % PEERS];
                    let mut fresh = sync::State::new();
                    let m = p.list.generate_sync_message(&mut fresh).unwrap();
                    let f = wire::encode(&WireMessage::Sync {
                        sender_id: p.id.clone(),
                        target_id: fx.hub.clone(),
                        document_id: fx.doc,
                        data: m.encode(),
                    });
                    let conn = p.conn;
                    // Two minutes apart: the budget repays one whole-history sync.
                    let now_ms = fx.round as i64 * 120_000;
                    let start = Instant::now();
                    let out = fx.core.handle(now_ms, Input::Frame(conn, black_box(f)));
                    total += start.elapsed();
                    assert!(out.closes.is_empty(), "{:?}", out.closes);
                    let replies = deliver(out, &mut fx.peers, &fx.hub, fx.doc);
                    settle(&mut fx.core, &mut fx.peers, &fx.hub, fx.doc, replies);
                }
                total
            });
        });
    }
    re_group.finish();
    for (history, fx) in &fixtures {
        let c = fx.core.doc(&fx.doc).unwrap().list().sync_counters();
        eprintln!(
            "{history} changes: sync steps from the window {}, by the stock path {}",
            c.fast, c.stock
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
