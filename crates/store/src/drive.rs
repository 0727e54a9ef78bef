//! The one driver of the hub core's [`Effects`], for the server and the simulator alike.
//!
//! [`perform`] does what the core asks, in the order that keeps its promises: the
//! commits are made durable (one transaction for all of a batch) and the answers go back
//! to the core ([`HubCore::committed`]), which releases the events of durable commits
//! and isolates a list whose commit the store refused; then the snapshots are stored
//! (and a document rebuilt from one handed back, if the runtime rebuilt it at once), the
//! sync messages sent, then the event frames, then relays, closes and the answers to API
//! calls; a peer too far behind to take a frame is closed and the core is told
//! it is gone; last, the lists the core asked for are loaded. A runtime supplies the
//! I/O through [`Io`]: the server with its SQLite thread and WebSocket outboxes, the
//! simulator with a SQLite file and its simulated network — so what the simulator
//! checks is what the server does.

use std::collections::VecDeque;

use automerge::ActorId;
use swarmtodo_core::hub::{
    Answer, CallId, Close, Commit, Compaction, ConnId, Effects, HubCore, Input, Stored, StoredList,
};
use swarmtodo_core::model::Rebuilt;
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::ApiError;

use crate::StoreError;

/// The I/O a runtime gives the driver.
// The futures are awaited by `perform` only, on the runtime that calls it: they need not
// be `Send`.
#[allow(async_fn_in_trait)]
pub trait Io {
    /// The time commits are stamped with and the core is told (ms since the epoch).
    fn now_ms(&self) -> i64;

    /// Makes `commits` durable, all in one transaction. Per commit, in order: the
    /// sequence numbers of its events, or why the store refused it for its own content
    /// (the others are stored). An `Err` is the store itself failing: nothing of the
    /// batch is durable, and the hub must stop.
    async fn commit(&mut self, commits: &[Commit], at_ms: i64) -> Result<Vec<Stored>, StoreError>;

    /// Stores a snapshot in place of the changes it covers. A failure loses nothing
    /// (the changes stay): the runtime logs it. When the compaction asks for a rebuild
    /// ([`Compaction::rebuild`], [`crate::persist::rebuild`]): `Some` with the document
    /// when rebuilt at once, `None` when the rebuild goes on elsewhere and the runtime
    /// hands its result to [`HubCore::rebuilt`] later.
    async fn compact(&mut self, compaction: Compaction) -> Option<Rebuilt>;

    /// Loads list `doc` for the core, its document writing as `actor`: `Some` with the
    /// list (`None` inside: nothing stored) when done at once, `None` when the load
    /// goes on elsewhere and the runtime hands its result to [`HubCore::loaded`] later.
    async fn load(
        &mut self,
        doc: DocumentId,
        actor: ActorId,
    ) -> Result<Option<Option<StoredList>>, StoreError>;

    /// Queues a frame for connection `c` (nothing for a connection already gone).
    /// False when the peer is too far behind to take it: the runtime has closed it, and
    /// the driver tells the core it is gone.
    fn send(&mut self, c: ConnId, frame: Vec<u8>) -> bool;

    /// Queues a frame pushing events (see [`Io::send`]).
    fn send_events(&mut self, c: ConnId, frame: Vec<u8>) -> bool {
        self.send(c, frame)
    }

    /// Offers a relayed `ephemeral` frame: dropped for a peer that is behind, never a
    /// reason to close it.
    fn relay(&mut self, c: ConnId, frame: Vec<u8>);

    /// Closes connection `c` after what was queued for it.
    fn close(&mut self, c: ConnId, close: Close);

    /// Answers API call `id` (its writes are durable by now).
    fn answer(&mut self, id: CallId, answer: Result<Answer, ApiError>);
}

/// Performs `fx` and everything it leads to (a slow reader's disconnection, a list
/// loaded at once), in the order described in the module documentation. An `Err` is the
/// store failing: nothing of the failed batch was sent.
pub async fn perform<I: Io>(core: &mut HubCore, io: &mut I, fx: Effects) -> Result<(), StoreError> {
    let mut todo = VecDeque::from([fx]);
    while let Some(mut fx) = todo.pop_front() {
        let at_ms = io.now_ms();
        let stored = if fx.commits.is_empty() {
            Vec::new()
        } else {
            io.commit(&fx.commits, at_ms).await?
        };
        core.committed(at_ms, &mut fx, stored);
        for c in std::mem::take(&mut fx.compactions) {
            let doc = c.doc;
            if let Some(rebuilt) = io.compact(c).await {
                core.rebuilt(doc, rebuilt);
            }
        }
        let mut gone = Vec::new();
        for (c, frame) in fx.sends {
            if !io.send(c, frame) {
                gone.push(c);
            }
        }
        for (c, frame) in fx.events {
            if !gone.contains(&c) && !io.send_events(c, frame) {
                gone.push(c);
            }
        }
        for (c, frame) in fx.relays {
            if !gone.contains(&c) {
                io.relay(c, frame);
            }
        }
        for (c, close) in fx.closes {
            io.close(c, close);
        }
        for (id, answer) in fx.answers {
            io.answer(id, answer);
        }
        if !gone.is_empty() {
            todo.push_back(core.handle_batch(at_ms, gone.into_iter().map(Input::Disconnected)));
        }
        for doc in fx.loads {
            if let Some(loaded) = io.load(doc, core.actor().clone()).await? {
                todo.push_back(core.loaded(at_ms, doc, loaded));
            }
        }
    }
    Ok(())
}

/// Runs a future whose I/O never waits (a synchronous [`Io`], as the simulator's) to its
/// end on this thread, without a runtime. Panics if it would wait: a synchronous `Io`
/// that returns a pending future is a bug of that `Io`.
pub fn run_sync<T>(fut: impl std::future::Future<Output = T>) -> T {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("run_sync: a synchronous Io's future waited"),
    }
}
