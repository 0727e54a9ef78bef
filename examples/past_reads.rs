//! What reading a list as it was costs: `todo_read` at the version before the last
//! change, and one task at the parents of the last change (what the authority reads to
//! repair a change that broke a rule), read at those heads (`TodoList::read_at`,
//! `TodoList::raw_task_at`) against a copy of the document at those heads
//! (`Automerge::fork_at`, then indexed), which is how they were read before.
//!
//! `cargo run --release --example past_reads -- FILE` where FILE is a saved list, e.g.
//! the side-by-side bench's `target/side-by-side/seed-1000-tasks-60000-changes.automerge`.
#![allow(clippy::print_stdout)] // A measuring tool: its output is the report.

use std::time::{Duration, Instant};

use automerge::ActorId;
use swarmtodo::model::TodoList;

/// Reads timed per way; the median is printed.
const ROUNDS: usize = 5;

fn median<T>(mut f: impl FnMut() -> T) -> (Duration, T) {
    let started = Instant::now();
    let out = f();
    let mut times = vec![started.elapsed()];
    for _ in 1..ROUNDS {
        let started = Instant::now();
        std::hint::black_box(f());
        times.push(started.elapsed());
    }
    times.sort();
    (times[ROUNDS / 2], out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: past_reads FILE (a saved list)")?;
    let list = TodoList::load(&std::fs::read(&path)?, ActorId::from([1u8; 16]))?;
    let changes = list.doc().get_changes(&[]);
    let last = changes.last().ok_or("the list has no change")?;
    let parents = last.deps().to_vec();
    let version = TodoList::version_of(&parents);
    let id = list
        .read()
        .tasks
        .get(list.len() / 2)
        .map(|t| t.id.clone())
        .ok_or("the list has no task")?;
    println!("{path}: {} changes, {} tasks", changes.len(), list.len());

    let (copy_read, by_copy) = median(|| {
        list.doc()
            .fork_at(&parents)
            .map(|past| TodoList::from_doc(past).read())
    });
    let (view_read, by_view) = median(|| list.read_at(&version));
    if by_copy.ok() != by_view.ok() {
        return Err("todo_read at the version differs between the two ways".into());
    }
    println!("todo_read at a version: copy {copy_read:?}, read at its heads {view_read:?}");

    let (copy_task, by_copy) = median(|| {
        list.doc()
            .fork_at(&parents)
            .map(|past| TodoList::from_doc(past).raw_task(&id))
    });
    let (view_task, by_view) = median(|| list.raw_task_at(&id, &parents));
    if by_copy.ok().flatten() != by_view {
        return Err("the task at the heads differs between the two ways".into());
    }
    println!("one task at some heads:  copy {copy_task:?}, read at its heads {view_task:?}");
    Ok(())
}
