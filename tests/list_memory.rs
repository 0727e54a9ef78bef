//! What a list costs in memory once a peer has synced it to a replica (the hub's case:
//! a list it never saw arrives with its whole history in one sync). Counted with a
//! global allocator that tracks live bytes, so the figures are exact and do not depend
//! on the machine: one test in this binary, nothing else allocating meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use automerge::sync;
use common::{actor, patch, status, task, upsert};
use swarmtodo::model::sync::SYNC_WINDOW_CHANGES;
use swarmtodo::model::{TodoList, WriteContext};
use swarmtodo::proto::Status;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only the sizes
// are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Tasks and changes of the list: a history three times the sync window.
const TASKS: usize = 1_000;
const CHANGES: usize = 3 * SYNC_WINDOW_CHANGES;

/// What one change of the sync window may cost: its bytes, its dependencies and the
/// heads after it, with the window's maps (measured: about 620 bytes for these
/// one-field changes).
const WINDOW_BYTES_PER_CHANGE_MAX: usize = 1_024;

fn lead_list() -> TodoList {
    let mut lead = TodoList::create(actor(1));
    let ops = (0..TASKS)
        .map(|i| upsert(task(&format!("t{i}"), &format!("Task {i}"))))
        .collect();
    lead.write(&patch(ops), &WriteContext::new("lead", 0, 1))
        .unwrap();
    let cycle = [Status::Pending, Status::Blocked, Status::Completed];
    for n in 1..CHANGES {
        let req = patch(vec![upsert(status(
            &format!("t{}", n % TASKS),
            cycle[n % 3],
        ))]);
        lead.write(&req, &WriteContext::new("lead", 0, n as u64))
            .unwrap();
    }
    lead
}

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
    let lead = lead_list();
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
