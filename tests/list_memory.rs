//! What a list and an idle peer cost in memory: a list synced to a replica in one piece
//! (the hub's case: a list it never saw arrives with its whole history), and a peer in
//! step left idle at the hub. Counted with a global allocator that tracks live bytes, so
//! the figures are exact and do not depend on the machine; the tests of this binary take
//! turns (`MEASURING`), nothing else allocating meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

mod common;

use std::sync::Mutex;

use automerge::sync;
use common::{actor, list_with_history};
use swarmtodo::hub::core::{ConnId, HubConfig, HubCore, Input};
use swarmtodo::hub::wire::{self, PeerId, WireMessage};
use swarmtodo::memory::live;
use swarmtodo::model::sync::SYNC_WINDOW_CHANGES;
use swarmtodo::model::TodoList;

#[global_allocator]
static ALLOCATOR: swarmtodo::memory::Counting = swarmtodo::memory::Counting;

/// One test at a time, taken before anything is built: a list built on another thread
/// while one test measures would count in its figures.
static MEASURING: Mutex<()> = Mutex::new(());

/// Tasks and changes of the list: a history three times the sync window.
const TASKS: usize = 1_000;
const CHANGES: usize = 3 * SYNC_WINDOW_CHANGES;

/// What one change of the sync window may cost: its bytes, its dependencies and the
/// heads after it, with the window's maps (measured: about 620 bytes for these
/// one-field changes).
const WINDOW_BYTES_PER_CHANGE_MAX: usize = 1_024;

/// Syncs `from` (a stock Automerge peer) into `to` until neither has more to say.
fn sync_into(from: &mut automerge::Automerge, to: &mut TodoList) {
    use automerge::sync::SyncDoc;
    let (mut theirs, mut ours) = (sync::State::new(), sync::State::new());
    for _ in 0..10 {
        let a = from.generate_sync_message(&mut theirs);
        let quiet = a.is_none();
        if let Some(m) = a {
            let m = sync::Message::decode(&m.encode()).unwrap();
            to.receive_sync_message(&mut ours, m).unwrap();
        }
        match to.generate_sync_message(&mut ours) {
            Some(m) => {
                let m = sync::Message::decode(&m.encode()).unwrap();
                from.receive_sync_message(&mut theirs, m).unwrap();
            }
            None if quiet => return,
            None => {}
        }
    }
    panic!("the sync did not settle in 10 rounds");
}

#[test]
fn a_list_synced_in_one_piece_keeps_a_bounded_window_and_shrinks_when_rebuilt() {
    let _turn = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let lead = list_with_history(TASKS, CHANGES);
    let mut peer = lead.doc().clone();
    drop(lead);

    // What the list's document and index cost when loaded in one piece (its window is
    // empty: the history is longer than the window).
    let saved = peer.save();
    let before = live();
    let loaded = TodoList::load(&saved, actor(3)).unwrap();
    let loaded_bytes = live() - before;
    drop(loaded);

    let before = live();
    let mut replica = TodoList::create(actor(2));
    sync_into(&mut peer, &mut replica);
    let synced_bytes = live() - before;
    assert_eq!(replica.heads(), peer.get_heads());

    let snapshot = replica.save_and_compact();
    let rebuilt_bytes = live() - before;
    eprintln!(
        "loaded {loaded_bytes} B, synced {synced_bytes} B, rebuilt {rebuilt_bytes} B, \
         snapshot {} B",
        snapshot.len()
    );
    assert_eq!(
        TodoList::load(&snapshot, actor(4)).unwrap().read(),
        replica.read(),
        "the rebuilt list reads as the synced one"
    );
    // The window holds the last SYNC_WINDOW_CHANGES changes whatever the history: a
    // queue sized for the whole first sync (3× the window here) would break this.
    let window_max = SYNC_WINDOW_CHANGES * WINDOW_BYTES_PER_CHANGE_MAX;
    assert!(
        rebuilt_bytes <= loaded_bytes + window_max,
        "the rebuilt list holds {rebuilt_bytes} B: more than the loaded list \
         ({loaded_bytes} B) plus a full window ({window_max} B)"
    );
    assert!(
        rebuilt_bytes < synced_bytes,
        "rebuilding gave nothing back ({synced_bytes} B → {rebuilt_bytes} B)"
    );
}

/// What a list may keep per task beside its automerge document, its sync window given
/// back: its index (every field as stored; here a 58-byte content and a 32-byte active
/// form). Measured: 212 bytes a task (exact: the same every run). No table of the
/// tasks' objects (automerge knows where each object sits), no tree of the order, no
/// object id per task: any of them back would break this.
const INDEX_BYTES_PER_TASK_MAX: usize = 256;

/// Content of every task of [`a_loaded_list_costs_its_document_and_a_small_index`]: as
/// long as agents write them, past what a short string keeps inline.
fn long_content(i: usize) -> String {
    format!("Task {i}: read the failing test, find the cause and fix it")
}

#[test]
fn a_loaded_list_costs_its_document_and_a_small_index() {
    let _turn = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let mut lead = TodoList::create(actor(1));
    let ops = (0..TASKS)
        .map(|i| {
            let mut t = common::task(&format!("t{i}"), &long_content(i));
            t.owner = Some(Some(format!("worker-{}", i % 10)));
            t.active_form = Some(Some(format!("Fixing the cause of failure {i}")));
            common::upsert(t)
        })
        .collect();
    common::write(&mut lead, "lead", common::patch(ops));
    let saved = lead.save();
    drop(lead);

    let before = live();
    let doc = automerge::Automerge::load(&saved).unwrap();
    let doc_bytes = live() - before;
    drop(doc);
    let before = live();
    let mut list = TodoList::load(&saved, actor(3)).unwrap();
    // Without its sync window (a short history is all in it), as a hub keeps a list
    // nobody wrote to for a while.
    list.forget_window();
    let list_bytes = live() - before;
    assert_eq!(list.len(), TASKS);
    let per_task = list_bytes.saturating_sub(doc_bytes) / TASKS;
    eprintln!("document {doc_bytes} B, list {list_bytes} B: {per_task} B a task beside it");
    assert!(
        per_task <= INDEX_BYTES_PER_TASK_MAX,
        "the list keeps {per_task} B a task beside its document; at most \
         {INDEX_BYTES_PER_TASK_MAX} B"
    );
    // Nothing of the texts is lost by not keeping them: a read has them all.
    let read = list.read();
    assert_eq!(read.tasks.len(), TASKS);
    assert!(read
        .tasks
        .iter()
        .all(|t| t.content.starts_with("Task ") && t.active_form.is_some()));
}

/// What the hub core may keep for one idle peer in step (its connection, its sync
/// state, its place in the window). Measured: about 1.3 KiB; a filter of these tests'
/// history is 3.8 KiB.
const IDLE_PEER_BYTES_MAX: usize = 3 * 1024;
/// Peers that join in the idle-peer test.
const IDLE_PEERS: u64 = 50;

fn peer_id(n: u64) -> PeerId {
    PeerId::new(format!("peer-{n}")).unwrap()
}

/// A peer that joins holding the list says "last sync: never" with a Bloom filter of
/// its whole history (about 1.2 bytes per change); the hub must not keep that filter
/// once it knows the peer's heads, or every idle agent costs it the history's filter.
#[test]
fn an_idle_peer_in_step_costs_the_hub_little_whatever_the_history() {
    let _turn = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let lead = list_with_history(TASKS, CHANGES);
    let config = HubConfig::new(actor(0xA0));
    let hub_id = config.peer_id.clone();
    let mut core = HubCore::new(config);
    let doc = swarmtodo::client::list_document_id("idle");
    core.load_doc(doc, lead.doc().clone(), Vec::new());
    let mut replica = lead.fork(actor(5));
    let mut filters = 0;
    let before = live();
    for n in 1..=IDLE_PEERS {
        let c = ConnId(n);
        core.handle(0, Input::Connected(c));
        let join = WireMessage::Join {
            sender_id: peer_id(n),
            supported_protocol_versions: Some(vec!["1".into()]),
            peer_metadata: None,
        };
        core.handle(0, Input::Frame(c, wire::encode(&join)));
        let mut state = sync::State::new();
        for _ in 0..10 {
            let Some(m) = replica.generate_sync_message(&mut state) else {
                break;
            };
            filters += m
                .have
                .iter()
                .map(|h| h.bloom.to_bytes().len())
                .sum::<usize>();
            let frame = WireMessage::Sync {
                sender_id: peer_id(n),
                target_id: hub_id.clone(),
                document_id: doc,
                data: m.encode(),
            };
            let fx = core.handle(0, Input::Frame(c, wire::encode(&frame)));
            for (_, bytes) in fx.sends.iter().filter(|(to, _)| *to == c) {
                if let WireMessage::Sync { data, .. } = wire::decode(bytes).unwrap() {
                    replica
                        .receive_sync_message(&mut state, sync::Message::decode(&data).unwrap())
                        .unwrap();
                }
            }
        }
    }
    let per_peer = (live() - before) / IDLE_PEERS as usize;
    let filter = filters / IDLE_PEERS as usize;
    eprintln!("{per_peer} B per idle peer; its messages carried {filter} B of Bloom filters");
    assert!(
        filter > IDLE_PEER_BYTES_MAX,
        "the peers' filters ({filter} B) are too small for this test to tell"
    );
    assert!(
        per_peer <= IDLE_PEER_BYTES_MAX,
        "the hub keeps {per_peer} B per idle peer (at most {IDLE_PEER_BYTES_MAX})"
    );
}
