//! What a list costs in memory, counted exactly (a global allocator that tracks live
//! bytes): loaded in one piece, synced in one piece (a hub's first sync of a list it
//! never saw), rebuilt from its own save, and grown change by change.
//!
//! `cargo run --release --example list_memory -- FILE` where FILE is a saved list, e.g.
//! the side-by-side bench's `target/side-by-side/seed-1000-tasks-60000-changes.automerge`.
#![allow(clippy::print_stdout)] // A measuring tool: its output is the report.

use std::time::Instant;

use automerge::sync::{self, SyncDoc};
use automerge::{ActorId, Automerge};
use swarmtodo::memory::live;
use swarmtodo::model::TodoList;

#[global_allocator]
static ALLOCATOR: swarmtodo::memory::Counting = swarmtodo::memory::Counting;

fn mib(bytes: usize) -> f64 {
    bytes as f64 / 1_048_576.0
}

/// Changes applied in one piece before the rest are applied one at a time.
const FIRST_PIECE: usize = 10_000;
/// Changes between two reports while growing.
const GROWTH_STEP: usize = 10_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: list_memory FILE (a saved list)")?;
    let bytes = std::fs::read(&path)?;
    let before = live();
    let doc = Automerge::load(&bytes)?;
    let alone = live() - before;
    let changes = doc.get_changes(&[]);
    println!(
        "{path}: {} changes, {} bytes saved",
        changes.len(),
        bytes.len()
    );
    println!("automerge document alone:   {:6.2} MiB", mib(alone));

    let before = live();
    let loaded = TodoList::load(&bytes, ActorId::from([1u8; 16]))?;
    println!(
        "loaded in one piece:        {:6.2} MiB",
        mib(live() - before)
    );
    drop(loaded);

    // A first sync, as a hub gets a list it never saw.
    let mut peer = doc.clone();
    let before = live();
    let mut replica = TodoList::create(ActorId::from([2u8; 16]));
    let (mut theirs, mut ours) = (sync::State::new(), sync::State::new());
    let started = Instant::now();
    for _ in 0..10 {
        let Some(m) = peer.generate_sync_message(&mut theirs) else {
            break;
        };
        replica.receive_sync_message(&mut ours, sync::Message::decode(&m.encode())?)?;
        if let Some(m) = replica.generate_sync_message(&mut ours) {
            peer.receive_sync_message(&mut theirs, sync::Message::decode(&m.encode())?)?;
        }
    }
    drop(ours);
    println!(
        "synced in one piece:        {:6.2} MiB ({:?})",
        mib(live() - before),
        started.elapsed()
    );
    let started = Instant::now();
    let _ = replica.save_and_compact();
    println!(
        "rebuilt from its save:      {:6.2} MiB ({:?})",
        mib(live() - before),
        started.elapsed()
    );
    drop(replica);

    // Growth change by change after a first piece.
    if changes.len() > FIRST_PIECE {
        let mut list = TodoList::create(ActorId::from([3u8; 16]));
        let (first, rest) = changes.split_at(FIRST_PIECE);
        list.apply_changes(first.to_vec())?;
        let _ = list.save_and_compact();
        let mut at_rebuild = live();
        for (n, c) in rest.iter().enumerate() {
            list.apply_changes(vec![c.clone()])?;
            let total = FIRST_PIECE + n + 1;
            if total.is_multiple_of(GROWTH_STEP) {
                let grown = live() - at_rebuild;
                let started = Instant::now();
                let before = live();
                let _ = list.save_and_compact();
                println!(
                    "grown to {total:6} changes: +{:6.2} MiB since the last rebuild; \
                     rebuilding gives back {:6.2} MiB ({:?})",
                    mib(grown),
                    mib(before - live()),
                    started.elapsed()
                );
                at_rebuild = live();
            }
        }
    }
    Ok(())
}
