//! The hub's history-independent sync path (`swarmtodo::model::sync`) against
//! automerge's stock `receive_sync_message` / `generate_sync_message`, on random
//! histories: after every step, the same messages, the same sync states, the same heads.
//!
//! The reference is a plain Automerge document driven only by the stock functions (the
//! message with its changes, as a stock hub would receive it); the hub under test is a
//! `TodoList`. Peers are `TodoList`s using the stock functions. Messages are lost,
//! duplicated and delivered late; peers reconnect with fresh states; the hub makes its
//! own changes (as repairs do).
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::collections::VecDeque;

use crate::common::{actor, patch, task, upsert};
use automerge::sync::{Message, State, SyncDoc};
use automerge::{Automerge, ReadDoc};
use proptest::prelude::*;
use swarmtodo::model::sync::{SentIndex, SYNC_WINDOW_CHANGES};
use swarmtodo::model::{TodoList, WriteContext};

/// One hub-side peer connection: the peer replica, its state toward the hub, the hub's
/// two states toward it (fast, stock), and the messages in flight each way.
struct Peer {
    list: TodoList,
    state: State,
    hub_fast: State,
    /// The hub's index of `hub_fast`'s changes in flight, kept across steps as the hub
    /// keeps it (and not reset on reconnect: a stale one must be noticed).
    hub_sent: SentIndex,
    hub_stock: State,
    to_hub: VecDeque<Vec<u8>>,
    to_peer: VecDeque<Vec<u8>>,
}

struct World {
    hub: TodoList,
    reference: Automerge,
    peers: Vec<Peer>,
    writes: u64,
    /// Whether the hub keeps its window for its peers after each step, as the hub
    /// core does after answering (`TodoList::keep_window_for`).
    keep_window: bool,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// Peer writes a task (one of a few ids, so writes overlap).
    PeerWrites(usize, u8),
    /// The hub makes a change of its own (like a repair).
    HubWrites(u8),
    /// Peer generates a message for the hub.
    PeerSends(usize),
    /// The hub generates a message for the peer (fast and stock, compared).
    HubSends(usize),
    /// The oldest message to the hub arrives (`dup`: and stays queued, to arrive again).
    HubReceives(usize, bool),
    /// The oldest message to the peer arrives.
    PeerReceives(usize),
    /// The oldest message in flight to the hub is lost.
    LoseToHub(usize),
    /// The peer reconnects: every state starts over, messages in flight are gone.
    Reconnect(usize),
    /// The hub gives back its window (a quiet list, `TodoList::forget_window`), changes
    /// in flight to its peers included.
    HubForgetsWindow,
}

fn step() -> impl Strategy<Value = Step> {
    let p = 0usize..3;
    prop_oneof![
        3 => (p.clone(), 0u8..6).prop_map(|(p, t)| Step::PeerWrites(p, t)),
        1 => (0u8..6).prop_map(Step::HubWrites),
        4 => p.clone().prop_map(Step::PeerSends),
        5 => p.clone().prop_map(Step::HubSends),
        5 => (p.clone(), proptest::bool::weighted(0.1)).prop_map(|(p, d)| Step::HubReceives(p, d)),
        5 => p.clone().prop_map(Step::PeerReceives),
        1 => p.clone().prop_map(Step::LoseToHub),
        1 => p.prop_map(Step::Reconnect),
        1 => Just(Step::HubForgetsWindow),
    ]
}

impl World {
    fn new(peers: usize) -> World {
        let hub = TodoList::create(actor(0xA0));
        let reference = hub.doc().clone();
        let peers = (0..peers)
            .map(|i| Peer {
                list: TodoList::create(actor(i as u8 + 1)),
                state: State::new(),
                hub_fast: State::new(),
                hub_sent: SentIndex::default(),
                hub_stock: State::new(),
                to_hub: VecDeque::new(),
                to_peer: VecDeque::new(),
            })
            .collect();
        World {
            hub,
            reference,
            peers,
            writes: 0,
            keep_window: true,
        }
    }

    fn write(&mut self, who: Option<usize>, t: u8) {
        self.writes += 1;
        let req = patch(vec![upsert(task(
            &format!("t{t}"),
            &format!("version {}", self.writes),
        ))]);
        let ctx = WriteContext::new("agent", 1_000 + self.writes as i64, self.writes);
        match who {
            Some(p) => {
                self.peers[p].list.write(&req, &ctx).unwrap();
            }
            None => {
                let (_, merge) = self.hub.write(&req, &ctx).unwrap();
                self.reference
                    .apply_changes(merge.changes.into_iter().map(|c| c.change))
                    .unwrap();
            }
        }
    }

    fn run(&mut self, s: Step) {
        self.step(s);
        if self.keep_window {
            self.hub
                .keep_window_for(self.peers.iter().map(|p| &p.hub_fast));
        }
    }

    fn step(&mut self, s: Step) {
        match s {
            Step::PeerWrites(p, t) => self.write(Some(p), t),
            Step::HubWrites(t) => self.write(None, t),
            Step::PeerSends(p) => {
                let peer = &mut self.peers[p];
                if let Some(m) = peer.list.generate_sync_message_stock(&mut peer.state) {
                    peer.to_hub.push_back(m.encode());
                }
            }
            Step::HubSends(p) => {
                let peer = &mut self.peers[p];
                let fast = self
                    .hub
                    .generate_sync_message_indexed(&mut peer.hub_fast, &mut peer.hub_sent);
                let stock = self.reference.generate_sync_message(&mut peer.hub_stock);
                let queued = !self.reference.get_missing_deps(&[]).is_empty();
                assert_messages_equal(fast.as_ref(), stock.as_ref(), queued);
                assert_eq!(peer.hub_fast, peer.hub_stock, "hub states after generating");
                if let Some(m) = fast {
                    peer.to_peer.push_back(m.encode());
                }
            }
            Step::HubReceives(p, dup) => {
                let peer = &mut self.peers[p];
                let Some(bytes) = (if dup {
                    peer.to_hub.front().cloned()
                } else {
                    peer.to_hub.pop_front()
                }) else {
                    return;
                };
                self.hub
                    .receive_sync_message_indexed(
                        &mut peer.hub_fast,
                        &mut peer.hub_sent,
                        Message::decode(&bytes).unwrap(),
                    )
                    .unwrap();
                self.reference
                    .receive_sync_message(&mut peer.hub_stock, Message::decode(&bytes).unwrap())
                    .unwrap();
                assert_eq!(self.hub.heads(), self.reference.get_heads(), "hub heads");
                assert_eq!(peer.hub_fast, peer.hub_stock, "hub states after receiving");
            }
            Step::PeerReceives(p) => {
                let peer = &mut self.peers[p];
                if let Some(bytes) = peer.to_peer.pop_front() {
                    peer.list
                        .receive_sync_message_stock(
                            &mut peer.state,
                            Message::decode(&bytes).unwrap(),
                        )
                        .unwrap();
                }
            }
            Step::LoseToHub(p) => {
                self.peers[p].to_hub.pop_front();
            }
            Step::HubForgetsWindow => {
                self.hub.forget_window();
            }
            Step::Reconnect(p) => {
                let peer = &mut self.peers[p];
                peer.state = State::new();
                peer.hub_fast = State::new();
                peer.hub_stock = State::new();
                peer.to_hub.clear();
                peer.to_peer.clear();
            }
        }
    }

    /// Syncs everyone to quiescence (every message delivered), comparing all the way.
    /// After a lost message stock sync can trade the same messages for ever (a change
    /// counted as sent is not sent again), or fall silent (a side waits for an answer
    /// to the message that was lost); like a real client, a peer that makes no
    /// progress, or goes quiet without the hub's heads, reconnects with fresh states.
    fn settle(&mut self) {
        for round in 0..50 {
            let mut quiet = true;
            for p in 0..self.peers.len() {
                self.run(Step::PeerSends(p));
                self.run(Step::HubSends(p));
                let mut exchanges = 0;
                while !self.peers[p].to_hub.is_empty() || !self.peers[p].to_peer.is_empty() {
                    quiet = false;
                    exchanges += 1;
                    if exchanges > EXCHANGES_BEFORE_RECONNECT {
                        self.run(Step::Reconnect(p));
                        break;
                    }
                    self.run(Step::HubReceives(p, false));
                    self.run(Step::PeerReceives(p));
                    self.run(Step::PeerSends(p));
                    self.run(Step::HubSends(p));
                }
            }
            if quiet {
                let behind: Vec<usize> = (0..self.peers.len())
                    .filter(|&p| self.peers[p].list.heads() != self.hub.heads())
                    .collect();
                if behind.is_empty() {
                    break;
                }
                for p in behind {
                    self.run(Step::Reconnect(p));
                }
            }
            assert!(round < 49, "no quiescence");
        }
        for p in &self.peers {
            assert_eq!(p.list.heads(), self.hub.heads(), "converged");
        }
    }
}

/// Message exchanges without quiescence after which a peer reconnects.
const EXCHANGES_BEFORE_RECONNECT: usize = 40;

/// Same message, field by field (for a readable failure), then byte for byte.
///
/// One difference is by design: a replica holds changes whose dependencies are missing
/// itself (`pending`), where a stock document queues them inside Automerge, and
/// `Automerge::save` appends the queue to the document. So when the reference has
/// queued changes, its whole-document message may carry them after the document.
fn assert_messages_equal(fast: Option<&Message>, stock: Option<&Message>, stock_queued: bool) {
    match (fast, stock) {
        (None, None) => {}
        (Some(f), Some(s)) => {
            assert_eq!(f.heads, s.heads, "heads");
            assert_eq!(f.need, s.need, "need");
            assert_eq!(f.have, s.have, "have");
            assert_eq!(f.flags, s.flags, "flags");
            assert_eq!(f.version, s.version, "version");
            let chunks = |m: &Message| m.changes.iter().map(<[u8]>::to_vec).collect::<Vec<_>>();
            let (fc, sc) = (chunks(f), chunks(s));
            if fc != sc && stock_queued && fc.len() == 1 && sc.len() == 1 {
                assert!(
                    sc[0].starts_with(&fc[0]),
                    "the reference's document differs"
                );
                return;
            }
            assert_eq!(
                fc.iter().map(Vec::len).collect::<Vec<_>>(),
                sc.iter().map(Vec::len).collect::<Vec<_>>(),
                "change chunk sizes"
            );
            assert!(fc == sc, "change bytes differ");
            assert_eq!(f.clone().encode(), s.clone().encode(), "bytes");
        }
        (f, s) => panic!("fast sent {f:?}, stock sent {s:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Random interleavings of writes, sends, receives, losses, duplicates and
    /// reconnects: the fast path and the stock functions agree at every step.
    #[test]
    fn fast_sync_equals_stock_sync(steps in proptest::collection::vec(step(), 1..160)) {
        let mut w = World::new(3);
        for s in steps {
            w.run(s);
        }
        w.settle();
    }
}

/// The fast path must actually be taken: in a steady session every message is
/// answered from the window. (With a history of fewer than 3 changes even one new
/// change is "more than a third of the document", and stock sends the whole document:
/// the list starts with some history.)
#[test]
fn steady_session_is_answered_from_the_window() {
    let mut w = World::new(3);
    for t in 0..30 {
        w.run(Step::HubWrites(t % 6));
    }
    w.settle();
    let before = w.hub.sync_counters();
    for i in 0..200u64 {
        w.run(Step::PeerWrites((i % 3) as usize, (i % 6) as u8));
        w.settle();
    }
    let c = w.hub.sync_counters();
    let (fast, stock) = (c.fast - before.fast, c.stock - before.stock);
    eprintln!("steady session: {fast} fast, {stock} stock");
    assert!(fast > 1_000, "fast path taken {fast} times");
    assert_eq!(stock, 0, "a peer in step never needs the history");
}

/// A peer that was away for more than the window's worth of changes is served by the
/// stock path, and then the fast path again; equal to stock all along.
#[test]
fn a_peer_behind_the_window_falls_back_and_returns() {
    let mut w = World::new(2);
    w.settle();
    // Peer 1 goes away; the hub moves on by more than the window.
    w.run(Step::Reconnect(1));
    for i in 0..(SYNC_WINDOW_CHANGES as u64 + 50) {
        w.run(Step::PeerWrites(0, (i % 6) as u8));
        w.run(Step::PeerSends(0));
        w.run(Step::HubReceives(0, false));
        w.run(Step::HubSends(0));
        w.run(Step::PeerReceives(0));
    }
    let before = w.hub.sync_counters();
    w.settle();
    let mid = w.hub.sync_counters();
    assert!(
        mid.stock > before.stock,
        "the returning peer needed the history"
    );
    for i in 0..20u64 {
        w.run(Step::PeerWrites(1, (i % 6) as u8));
        w.settle();
    }
    let end = w.hub.sync_counters();
    assert_eq!(end.stock, mid.stock, "back in step, back on the window");
}

/// A peer whose acknowledgements arrive late — an overloaded hub reads them seconds
/// after they were sent — while the list moves on by more than the window: the window
/// keeps what that peer still needs, so neither its messages nor the hub's answers walk
/// the history; once it is back in step the window returns to its size. Equal to stock
/// all along. Without keeping (the control), the same run needs the history.
#[test]
fn a_peer_whose_acknowledgements_lag_past_the_window_stays_on_it() {
    let lag = SYNC_WINDOW_CHANGES + 500;
    let mut stock_steps = Vec::new();
    for keep in [true, false] {
        let mut w = World::new(2);
        w.keep_window = keep;
        w.run(Step::PeerWrites(0, 0));
        w.settle();
        let before = w.hub.sync_counters();
        let mut longest = 0;
        for i in 0..lag {
            w.run(Step::PeerWrites(0, (i % 6) as u8));
            w.run(Step::PeerSends(0));
            w.run(Step::HubReceives(0, false));
            w.run(Step::HubSends(0));
            w.run(Step::PeerReceives(0));
            // Peer 1 hears every change and answers, but its answers wait in the
            // hub's queue.
            w.run(Step::HubSends(1));
            w.run(Step::PeerReceives(1));
            w.run(Step::PeerSends(1));
            longest = longest.max(w.hub.window_len());
        }
        while !w.peers[1].to_hub.is_empty() {
            w.run(Step::HubReceives(1, false));
            w.run(Step::HubSends(1));
            w.run(Step::PeerReceives(1));
            longest = longest.max(w.hub.window_len());
        }
        let c = w.hub.sync_counters();
        stock_steps.push(c.stock - before.stock);
        w.settle();
        if keep {
            assert!(
                longest > lag,
                "the window kept the lagging peer's changes: {longest}"
            );
            assert_eq!(
                w.hub.window_len(),
                SYNC_WINDOW_CHANGES,
                "back to its size once the peer caught up"
            );
        } else {
            assert_eq!(longest, SYNC_WINDOW_CHANGES);
        }
    }
    eprintln!("lagging peer: stock steps {stock_steps:?} (kept, not kept)");
    assert_eq!(stock_steps[0], 0, "kept: the history is never walked");
    assert!(stock_steps[1] > 0, "the control needs the history");
}

/// What the overloaded hub showed (side-by-side bench, 100 writers): writers whose
/// messages wait in the hub's queue. Their changes reach the hub long after they were
/// made, on top of what the writer had heard by then: the hub's state of a thousand
/// changes earlier. What such a peer shares with the hub, what it says it last synced,
/// and what the hub has in flight to it reach back that far; keeping the window for
/// the lowest shared head alone (the newest change of a writer counts as shared as
/// soon as it arrives) dropped them, and every later message of the peer went the
/// stock way.
#[test]
fn writers_whose_messages_lag_stay_on_the_window() {
    let mut w = World::new(3);
    // A history long enough that a lagging peer's changes stay under a third of it
    // (past that, stock sends the whole document, and so do we).
    for i in 0..3_000u64 {
        w.run(Step::HubWrites((i % 6) as u8));
    }
    w.settle();
    let before = w.hub.sync_counters();
    let mut longest = 0;
    for i in 0..600 {
        // Peer 0 writes fast and keeps up.
        for t in 0..3 {
            w.run(Step::PeerWrites(0, ((i + t) % 6) as u8));
        }
        w.run(Step::PeerSends(0));
        w.run(Step::HubReceives(0, false));
        w.run(Step::HubSends(0));
        w.run(Step::PeerReceives(0));
        // Peers 1 and 2 hear every change and write on top of it; what they say
        // waits in the hub's queue, and the hub takes one of their messages every
        // third step.
        for p in [1, 2] {
            w.run(Step::PeerWrites(p, (i % 6) as u8));
            w.run(Step::HubSends(p));
            w.run(Step::PeerReceives(p));
            w.run(Step::PeerSends(p));
            if i % 3 == p - 1 {
                w.run(Step::HubReceives(p, false));
            }
        }
        longest = longest.max(w.hub.window_len());
    }
    for p in [1, 2] {
        while !w.peers[p].to_hub.is_empty() {
            w.run(Step::HubReceives(p, false));
            w.run(Step::HubSends(p));
            w.run(Step::PeerReceives(p));
        }
    }
    let c = w.hub.sync_counters();
    w.settle();
    eprintln!(
        "lagging writers: {} window steps, {} stock; window up to {longest}",
        c.fast - before.fast,
        c.stock - before.stock
    );
    assert!(
        longest > SYNC_WINDOW_CHANGES,
        "the peers lagged past the window"
    );
    assert_eq!(c.stock - before.stock, 0, "the history is never walked");
}

/// A peer that connects in step with a list longer than the window says "last sync:
/// never" with a Bloom filter of its whole history. The next change is answered from
/// the window (the changes after the heads it sent), equal to stock, with no walk of the
/// history: N agents connecting to a long list must not cost N history walks on the
/// first write.
#[test]
fn a_fresh_peer_in_step_with_a_long_list_is_answered_from_the_window() {
    let mut w = World::new(2);
    for i in 0..(SYNC_WINDOW_CHANGES as u64 + 50) {
        w.run(Step::HubWrites((i % 6) as u8));
    }
    w.settle();
    // Peer 1 reconnects holding everything: its first message is "last sync: never".
    w.run(Step::Reconnect(1));
    w.run(Step::PeerSends(1));
    w.run(Step::HubReceives(1, false));
    w.run(Step::HubSends(1));
    w.run(Step::PeerReceives(1));
    // The peer has nothing to add and stays silent; the hub writes.
    w.run(Step::PeerSends(1));
    assert!(
        w.peers[1].to_hub.is_empty(),
        "an in-step peer says nothing more"
    );
    let before = w.hub.sync_counters();
    w.run(Step::HubWrites(1));
    w.run(Step::HubSends(1)); // compared with stock inside
    let after = w.hub.sync_counters();
    assert_eq!(after.stock, before.stock, "answered from the window");
    assert!(after.fast > before.fast);
    w.settle();
}

/// Concurrent writers: every peer writes before hearing of the others, so their heads,
/// and what they share with the hub, are sets of changes the hub never had as its own
/// heads. The window still answers (a bounded walk back from those changes), equal to
/// stock at every step; a stock step per message would cost the history each time.
#[test]
fn concurrent_writers_are_answered_from_the_window() {
    let mut w = World::new(3);
    for t in 0..30 {
        w.run(Step::HubWrites(t % 6));
    }
    w.settle();
    let before = w.hub.sync_counters();
    for i in 0..100u64 {
        for p in 0..3 {
            w.run(Step::PeerWrites(p, ((i + p as u64) % 6) as u8));
        }
        for p in 0..3 {
            w.run(Step::PeerSends(p));
        }
        for p in [2, 0, 1] {
            w.run(Step::HubReceives(p, false));
            w.run(Step::HubSends(p));
        }
        w.settle();
    }
    let c = w.hub.sync_counters();
    let (fast, stock) = (c.fast - before.fast, c.stock - before.stock);
    eprintln!("concurrent writers: {fast} fast, {stock} stock");
    assert!(fast > 1_000, "fast path taken {fast} times");
    assert_eq!(stock, 0, "concurrent writers never need the history");
}

/// The window grows by doubling up to its size and not past it; a copy of it (a fork)
/// has exactly its length as capacity. A fork taken just short of a full window must
/// keep recording (the growth step once asked for more than the room left).
#[test]
fn a_fork_just_short_of_a_full_window_keeps_recording() {
    let mut list = TodoList::create(actor(1));
    for n in 0..(SYNC_WINDOW_CHANGES - 5) {
        let req = patch(vec![upsert(task(
            &format!("t{}", n % 20),
            &format!("v{n}"),
        ))]);
        list.write(&req, &WriteContext::new("lead", 0, n as u64))
            .unwrap();
    }
    let mut fork = list.fork(actor(2));
    let start = fork.window_end();
    for n in 0..20u64 {
        let req = patch(vec![upsert(task("f", &format!("f{n}")))]);
        fork.write(&req, &WriteContext::new("lead", 0, 10_000 + n))
            .unwrap();
    }
    assert_eq!(fork.window_end(), start + 20);
    // And the window still answers: a peer one change behind is sent that change.
    let mut peer = list.fork(actor(3));
    peer.merge_from(&fork).unwrap();
    assert_eq!(peer.heads(), fork.heads());
}
