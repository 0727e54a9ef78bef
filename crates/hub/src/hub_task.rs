//! The hub task: the one owner of the [`HubCore`]. It takes the connections' inputs in
//! batches, hands them to the core, and performs the core's effects with the one driver
//! the simulator uses too (`swarmtodo_store::drive`): commit, then send, then close.
//! Idle, it flushes what a busy moment deferred (`Input::Tick`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use automerge::ActorId;
use swarmtodo_core::model::Rebuilt;

use crate::channel::{Outbox, ToHub};
use crate::cluster::ClusterSide;
use crate::forward::{forward_in_background, Forward};
use crate::limits::{BATCH_FRAMES_MAX, TRIM_AFTER_CHANGES, TRIM_AFTER_LISTS_DROPPED};
use crate::metrics::{Kind, Metrics, Outcome};
use crate::rebuild::Rebuilder;
use crate::sessions::{carried_here, FromPeer, Sessions};
use crate::stream::Streams;
use swarmtodo_core::hub::{
    Answer, Call, CallId, Caller, Close, Commit, Compaction, ConnId, Effects, HubCore, Input,
    Stored, StoredList,
};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::{ApiError, ErrorCode};
use swarmtodo_store::drive::{self, Io};
use swarmtodo_store::persist;
use swarmtodo_store::{Store, StoreError};

/// The hub failed in a way that must stop it (a commit that is not durable).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store refused a commit: nothing of it was relayed, and the hub stopped.
    #[error("store: {0}")]
    Store(String),
    /// The hub task ended abnormally (a panic outside a list's merge).
    #[error("hub task: {0}")]
    HubTask(String),
    /// Accepting failed.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

/// The wall clock in milliseconds since the Unix epoch (what the core is told).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub(crate) async fn hub_task(
    mut core: HubCore,
    store: Store,
    known: BTreeSet<DocumentId>,
    mut rx: mpsc::Receiver<ToHub>,
    loaded_to: mpsc::WeakSender<ToHub>,
    metrics: Arc<Metrics>,
    cluster: Option<swarmtodo_cluster::Cluster>,
) -> Result<(), ServeError> {
    let rebuilder = Rebuilder::start(loaded_to.clone())
        .map_err(|e| tracing::warn!(error = %e, "no rebuilding thread: lists keep their documents"))
        .ok();
    let cluster = cluster.map(|c| ClusterSide::new(c, metrics.clone()));
    let mut sessions = None;
    if let Some(side) = &cluster {
        side.renew_in_background(loaded_to.clone());
        crate::forward::serve_forwarded(side.clone(), loaded_to.clone());
        sessions = Some(Sessions::serve(side.cluster().clone(), loaded_to.clone()));
    }
    let streams = Streams::new(cluster.as_ref().map(|side| side.cluster().clone()));
    let mut out = Relay {
        cluster,
        loading: BTreeSet::new(),
        elsewhere: None,
        sessions,
        carried: BTreeMap::new(),
        rebuilder,
        metrics: metrics.clone(),
        store,
        known,
        outboxes: BTreeMap::new(),
        loaded_to,
        calls: BTreeMap::new(),
        next_call: 0,
        streams,
    };
    // A message taken from the queue while gathering a batch, handled next.
    let mut stashed: Option<ToHub> = None;
    // Lists dropped from memory since the freed heap was last given back.
    let mut dropped = 0usize;
    loop {
        // What a busy moment deferred goes out before the hub idles: when nothing
        // waits, even after the connections had their turn to read (this task runs
        // again before they do otherwise, and would always find the queue empty).
        let deferred = core.deferred();
        if deferred && stashed.is_none() && rx.is_empty() {
            tokio::task::yield_now().await;
        }
        if deferred && stashed.is_none() && rx.is_empty() {
            let fx = core.handle(now_ms(), Input::Tick);
            perform(&mut core, &mut out, fx).await?;
        }
        let msg = match stashed.take() {
            Some(m) => m,
            // A list kept for API calls is due to leave memory: wake up for it.
            None => match core.next_wake_ms() {
                Some(at) => {
                    let wait = u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0);
                    match tokio::time::timeout(Duration::from_millis(wait), rx.recv()).await {
                        Ok(Some(m)) => m,
                        Ok(None) => break,
                        Err(_) => ToHub::Input(Input::Tick),
                    }
                }
                None => match rx.recv().await {
                    Some(m) => m,
                    None => break,
                },
            },
        };
        let input = match msg {
            ToHub::Open {
                id,
                outbox,
                who,
                address,
                events,
            } => {
                out.outboxes.insert(id, outbox);
                let fx = core.handle_batch(
                    now_ms(),
                    [
                        Input::Connected(id),
                        Input::Address(id, address),
                        Input::Subscribed(id, events),
                    ],
                );
                perform(&mut core, &mut out, fx).await?;
                match who {
                    Some(who) => Input::Identified(id, who),
                    None => continue,
                }
            }
            ToHub::Input(i) => match out.divert(i) {
                Some(i) => i,
                None => continue,
            },
            ToHub::Kick(id, close) => {
                if let Some(outbox) = out.outboxes.remove(&id) {
                    outbox.close(close);
                } else if let Some(carried) = out.carried.remove(&id) {
                    let _ = carried.try_send(FromPeer::Kick(close));
                }
                continue;
            }
            ToHub::Unavailable(doc, unavailable) => {
                out.loading.remove(&doc);
                tracing::info!(%doc, why = unavailable.why, holder = unavailable.holder, "list held elsewhere in the cluster");
                let fx = match (&unavailable.holder, &out.sessions) {
                    // Its peers are carried to the holder.
                    (Some(holder), Some(sessions)) => {
                        let (fx, handed) = core.hand_over(now_ms(), doc, &unavailable.why);
                        for h in handed {
                            let Some(outbox) = out.outboxes.remove(&h.conn) else {
                                continue;
                            };
                            // A peer carried here goes back to its own hub, which
                            // carries it to the holder.
                            if carried_here(h.conn) {
                                outbox.close(Close {
                                    code: 1012,
                                    reason: "list_moved".to_owned(),
                                    message: Some(format!(
                                        "the list moved to hub {holder}: reconnect"
                                    )),
                                });
                                continue;
                            }
                            let conn = h.conn;
                            let carried = sessions.carry(doc, holder.clone(), h, outbox);
                            out.carried.insert(conn, carried);
                            metrics.carried.fetch_add(1, Ordering::Relaxed);
                        }
                        fx
                    }
                    _ => core.unavailable(now_ms(), doc, &unavailable.why),
                };
                // The calls it answers `list_elsewhere` go to the holder instead.
                out.elsewhere = unavailable.holder.map(|h| (doc, h));
                let performed = perform(&mut core, &mut out, fx).await;
                out.elsewhere = None;
                performed?;
                continue;
            }
            ToHub::Lost(doc, why) => {
                let fx = core.lost(now_ms(), doc, &why);
                perform(&mut core, &mut out, fx).await?;
                continue;
            }
            ToHub::Loaded(doc, loaded) => {
                out.loading.remove(&doc);
                let loaded = match *loaded {
                    Ok(loaded) => loaded,
                    // One list damaged in the store: refused, the others served.
                    Err(e @ StoreError::Corrupt { .. }) => {
                        tracing::error!(%doc, error = %e, "a stored list does not load: its peers and calls are refused");
                        let fx = core.unreadable(now_ms(), doc, &e.to_string());
                        perform(&mut core, &mut out, fx).await?;
                        continue;
                    }
                    Err(e) => return Err(ServeError::Store(e.to_string())),
                };
                tracing::debug!(%doc, found = loaded.is_some(), "list loaded for a peer");
                let held = core.doc_count();
                let fx = core.loaded(now_ms(), doc, loaded);
                perform(&mut core, &mut out, fx).await?;
                dropped += held.saturating_sub(core.doc_count());
                continue;
            }
            ToHub::Rebuilt(doc, rebuilt) => {
                core.rebuilt(doc, *rebuilt);
                // The document it replaced is freed.
                give_back_freed_memory();
                continue;
            }
            ToHub::Call {
                caller,
                list,
                call,
                reply,
                forwarded,
            } => out.call(caller, list, call, reply, forwarded),
            ToHub::Subscribe { list, reply } => {
                let _ = reply.send(out.streams.subscribe(list));
                continue;
            }
            ToHub::Shutdown => {
                let fx = core.flush(now_ms());
                perform(&mut core, &mut out, fx).await?;
                if let Some(side) = &out.cluster {
                    side.index().drain().await;
                    for doc in side.held() {
                        side.release(doc).await;
                    }
                }
                break;
            }
        };
        if let Input::Disconnected(id) = &input {
            out.outboxes.remove(id);
        }
        let started = std::time::Instant::now();
        let held = core.doc_count();
        let fx = match input {
            // Frames and API calls already waiting are handled together: one answer per
            // list and peer for all of them, one transaction for their commits (under
            // load, one fan-out and one write to disk per batch, not per write).
            Input::Frame(..) | Input::Call { .. } => {
                let mut batch = vec![input];
                while batch.len() < BATCH_FRAMES_MAX {
                    match rx.try_recv() {
                        Ok(ToHub::Input(frame @ Input::Frame(..))) => {
                            batch.extend(out.divert(frame));
                        }
                        Ok(ToHub::Call {
                            caller,
                            list,
                            call,
                            reply,
                            forwarded,
                        }) => batch.push(out.call(caller, list, call, reply, forwarded)),
                        Ok(other) => {
                            stashed = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                // More input waiting: the hub is behind, and a list's news may go out
                // with a later batch's (one fan-out for several).
                let more_waiting = stashed.is_some() || !rx.is_empty();
                core.handle_batch_deferring(now_ms(), batch, more_waiting)
            }
            other => core.handle(now_ms(), other),
        };
        let handled = started.elapsed();
        let commits = fx.commits.len();
        let sends = fx.sends.len();
        let bulk = !fx.compactions.is_empty()
            || fx.commits.iter().map(|c| c.changes.len()).sum::<usize>() >= TRIM_AFTER_CHANGES
            || fx.window_changes_freed >= TRIM_AFTER_CHANGES;
        let performed = perform(&mut core, &mut out, fx).await;
        dropped += held.saturating_sub(core.doc_count());
        out.give_back_unloaded(&core);
        metrics
            .connections
            .store(core.conn_count() as u64, Ordering::Relaxed);
        metrics
            .lists_loaded
            .store(core.doc_count() as u64, Ordering::Relaxed);
        metrics
            .lists_stored
            .store(core.stored_count() as u64, Ordering::Relaxed);
        if commits > 0 {
            metrics.batch.observe(started.elapsed());
        }
        if bulk || dropped >= TRIM_AFTER_LISTS_DROPPED {
            dropped = 0;
            give_back_freed_memory();
        }
        if commits > 0 {
            tracing::debug!(
                handle_us = handled.as_micros() as u64,
                perform_us = (started.elapsed() - handled).as_micros() as u64,
                commits,
                sends,
                "merge relayed"
            );
        }
        if let Err(e) = performed {
            for (_, outbox) in std::mem::take(&mut out.outboxes) {
                outbox.close(Close {
                    code: 1011,
                    reason: "store_failed".to_owned(),
                    message: Some("the hub could not store a change and stopped".to_owned()),
                });
            }
            return Err(e);
        }
    }
    for (_, outbox) in out.outboxes {
        outbox.close(Close {
            code: 1001,
            reason: "shutdown".to_owned(),
            message: None,
        });
    }
    Ok(())
}

/// Returns freed heap memory to the system. A first sync of a long history allocates
/// several times the list's size for a moment (the changes decoded, the merge's report,
/// the commit), and glibc keeps freed memory in its arenas: without this, a hub that
/// was given ten 10,000-change lists kept 5 MiB more per list resident than its lists
/// hold. Called after such a batch, after a snapshot (whose rebuild frees the old
/// document) and after quiet lists gave back their sync windows; it walks the heap, a
/// few milliseconds at most.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases free memory of the allocator's own arenas;
        // it has no preconditions.
        unsafe {
            libc::malloc_trim(0);
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            // SAFETY: mallinfo2 only reads the allocator's statistics.
            let heap = unsafe { libc::mallinfo2() };
            tracing::debug!(
                in_use = heap.uordblks + heap.hblkhd,
                free_kept = heap.fordblks,
                "heap after giving back freed memory"
            );
        }
    }
}

/// An API call waiting for its answer: where it goes, what was asked, and when; in a
/// cluster, the call itself, to forward it to the list's authority if this hub is not
/// (a call forwarded here already has none).
struct Asked {
    reply: oneshot::Sender<Result<Answer, ApiError>>,
    kind: Kind,
    at: std::time::Instant,
    forwardable: Option<Forward>,
}

/// What the hub task performs the core's effects with (the driver's [`Io`]): the
/// store, the lists it holds, and the connections' outboxes.
struct Relay {
    store: Store,
    /// The hub's side of its cluster, if it is one of a cluster.
    cluster: Option<ClusterSide>,
    /// Lists being loaded for the core (a cluster hub holds their leases already).
    loading: BTreeSet<DocumentId>,
    /// While the core answers the calls of a list another hub holds: that hub, which
    /// they are forwarded to.
    elsewhere: Option<(DocumentId, String)>,
    /// In a cluster: the sync peers carried to and from other hubs.
    sessions: Option<Sessions>,
    /// The connections carried to another hub (no longer the core's): where what their
    /// peers send goes.
    carried: BTreeMap<ConnId, mpsc::Sender<FromPeer>>,
    known: BTreeSet<DocumentId>,
    outboxes: BTreeMap<ConnId, Outbox>,
    /// Where a list loaded for the core is sent ([`ToHub::Loaded`]).
    loaded_to: mpsc::WeakSender<ToHub>,
    /// Where the answers to API calls go, what each asked and when.
    calls: BTreeMap<CallId, Asked>,
    /// The number of the last call.
    next_call: u64,
    /// What the hub counts.
    metrics: Arc<Metrics>,
    /// Where lists' documents are rebuilt from their snapshots (none: the thread could
    /// not start, and lists keep their documents).
    rebuilder: Option<Rebuilder>,
    /// The event streams' readers, told of each durable commit's events (a hub alone)
    /// or fed from the lists' logs (a hub of a cluster).
    streams: Streams,
}

impl Relay {
    /// The input itself, unless it comes from a connection carried to another hub:
    /// then it goes to its session.
    fn divert(&mut self, input: Input) -> Option<Input> {
        let (Input::Frame(c, _) | Input::Disconnected(c)) = &input else {
            return Some(input);
        };
        let c = *c;
        let Some(carried) = self.carried.get(&c) else {
            return Some(input);
        };
        let sent = match input {
            Input::Frame(_, bytes) => carried.try_send(FromPeer::Frame(bytes)),
            _ => {
                let _ = carried.try_send(FromPeer::Gone);
                self.carried.remove(&c);
                return None;
            }
        };
        if sent.is_err() {
            // Its session is behind (or over): the peer goes.
            if let Some(carried) = self.carried.remove(&c) {
                let _ = carried.try_send(FromPeer::Kick(Close {
                    code: 1013,
                    reason: "list_elsewhere".to_owned(),
                    message: Some(
                        "the hub holding the list is behind: reconnect in a moment".to_owned(),
                    ),
                }));
            }
        }
        None
    }

    /// In a cluster: gives back the leases of the lists that left memory (and are not
    /// being loaded), so that another hub may take them at once.
    fn give_back_unloaded(&mut self, core: &HubCore) {
        let Some(side) = &self.cluster else {
            return;
        };
        // Every list held is in memory or being loaded, unless one left: look then only.
        if side.held_count() <= core.doc_count() + self.loading.len() {
            return;
        }
        for doc in side.held() {
            if !core.is_loaded(&doc) && !self.loading.contains(&doc) {
                let side = side.clone();
                tokio::spawn(async move { side.release(doc).await });
            }
        }
    }

    /// Numbers an API call, keeps where its answer goes, and makes it the core's input.
    fn call(
        &mut self,
        caller: Caller,
        list: String,
        call: Call,
        reply: oneshot::Sender<Result<Answer, ApiError>>,
        forwarded: bool,
    ) -> Input {
        self.next_call += 1;
        let id = CallId(self.next_call);
        let kind = match &call {
            Call::Read(_) | Call::Wait(..) => Kind::Read,
            Call::Create => Kind::Create,
            Call::Write(_) | Call::Delegate { .. } | Call::RollUp { .. } => Kind::Write,
            Call::Claim(_) => Kind::Claim,
        };
        // Kept only where it may go elsewhere: not for a list this hub holds.
        let elsewhere = self.cluster.as_ref().is_some_and(|side| {
            swarmtodo_core::hub::list_id(&list).is_ok_and(|doc| !side.holds(&doc))
        });
        let forwardable = (elsewhere && !forwarded).then(|| Forward {
            caller: caller.clone(),
            list: list.clone(),
            call: call.clone(),
        });
        self.calls.insert(
            id,
            Asked {
                reply,
                kind,
                at: std::time::Instant::now(),
                forwardable,
            },
        );
        Input::Call {
            id,
            caller,
            list,
            call,
        }
    }
}

/// Performs `fx` with the one driver (`swarmtodo_store::drive::perform`).
async fn perform(core: &mut HubCore, out: &mut Relay, fx: Effects) -> Result<(), ServeError> {
    drive::perform(core, out, fx)
        .await
        .map_err(|e| ServeError::Store(e.to_string()))
}

impl Io for Relay {
    fn now_ms(&self) -> i64 {
        now_ms()
    }

    /// All the merges of a batch go to disk in one transaction. In a cluster each goes
    /// to its list's log first; one the log refuses is refused (its list is dropped
    /// from memory) and not stored.
    async fn commit(&mut self, commits: &[Commit], at_ms: i64) -> Result<Vec<Stored>, StoreError> {
        let stored = match &self.cluster {
            None => persist::as_stored(
                persist::commit_all(&self.store, &mut self.known, commits, at_ms).await?,
            ),
            Some(side) => {
                let refused = append_to_logs(side, &self.store, commits, at_ms).await;
                let kept: Vec<Commit> = commits
                    .iter()
                    .zip(&refused)
                    .filter(|(_, r)| r.is_none())
                    .map(|(c, _)| c.clone())
                    .collect();
                let mut durable = persist::as_stored(
                    persist::commit_all(&self.store, &mut self.known, &kept, at_ms).await?,
                )
                .into_iter();
                // The store holds what the log does now: a log due for it is rolled up
                // into the list as the store has it.
                let docs: BTreeSet<DocumentId> = kept.iter().map(|c| c.doc).collect();
                for doc in docs {
                    side.roll_up_if_due(doc, &self.store).await;
                }
                // The summaries stored go to the cluster's index of lists too, and a
                // delegated task's list's link to every hub.
                for c in &kept {
                    if let Some(link) = &c.link {
                        crate::directory::share_link(side.cluster(), c.doc, link).await;
                    }
                    if let Some(summary) = &c.summary {
                        side.index().write(c.doc, summary);
                    }
                }
                refused
                    .into_iter()
                    .map(|r| {
                        r.unwrap_or_else(|| {
                            durable.next().unwrap_or_else(|| {
                                Stored::Refused("no answer from the store".to_owned())
                            })
                        })
                    })
                    .collect()
            }
        };
        self.streams.publish(commits, &stored, at_ms);
        self.metrics.committed(
            commits
                .iter()
                .zip(&stored)
                .filter(|(_, s)| matches!(s, Stored::Durable(_)))
                .map(|(c, _)| c),
        );
        Ok(stored)
    }

    /// The snapshot goes to the store; a rebuild goes to the rebuilding thread, whose
    /// document comes back to the hub task as [`ToHub::Rebuilt`].
    async fn compact(&mut self, c: Compaction) -> Option<Rebuilt> {
        if c.rebuild {
            if let Some(r) = &self.rebuilder {
                r.rebuild(c.doc, c.snapshot.clone());
            }
        }
        // A failed compaction loses nothing (the changes stay); log and go on.
        if let Err(e) = self
            .store
            .compact(persist::doc_id(&c.doc), c.snapshot, c.heads)
            .await
        {
            tracing::warn!(doc = %c.doc, error = %e, "compaction failed");
        }
        None
    }

    /// Each load is a task of its own, queued at the store after the batch's commits,
    /// whose result comes back to the hub task as [`ToHub::Loaded`] (a large list takes
    /// a while to rebuild, and the other peers must not wait for it).
    async fn load(
        &mut self,
        doc: DocumentId,
        actor: ActorId,
    ) -> Result<Option<Option<StoredList>>, StoreError> {
        if let Some(to_hub) = self.loaded_to.upgrade() {
            let store = self.store.clone();
            let side = self.cluster.clone();
            self.loading.insert(doc);
            tokio::spawn(async move {
                // In a cluster: the list's lease first, and the log in the store.
                if let Some(side) = side {
                    if let Err(unavailable) = side.take(doc, &store).await {
                        let _ = to_hub.send(ToHub::Unavailable(doc, unavailable)).await;
                        return;
                    }
                }
                let started = std::time::Instant::now();
                let loaded = persist::load(&store, doc, actor).await;
                tracing::debug!(%doc, ms = started.elapsed().as_millis() as u64, "list loaded from the store");
                let _ = to_hub.send(ToHub::Loaded(doc, Box::new(loaded))).await;
            });
        }
        Ok(None)
    }

    fn send(&mut self, c: ConnId, frame: Vec<u8>) -> bool {
        let Some(outbox) = self.outboxes.get(&c) else {
            return true;
        };
        let Err(full) = outbox.push(frame) else {
            return true;
        };
        if let Some(outbox) = self.outboxes.remove(&c) {
            if full {
                tracing::info!(conn = c.0, "outbox full: closing a slow reader");
                outbox.close(Close {
                    code: 1008,
                    reason: "slow_reader".to_owned(),
                    message: None,
                });
            }
        }
        false
    }

    fn relay(&mut self, c: ConnId, frame: Vec<u8>) {
        if let Some(outbox) = self.outboxes.get(&c) {
            if !outbox.offer(frame) {
                tracing::trace!(conn = c.0, "relay dropped for a peer that is behind");
            }
        }
    }

    fn close(&mut self, c: ConnId, close: Close) {
        if let Some(outbox) = self.outboxes.remove(&c) {
            outbox.close(close);
        }
    }

    fn answer(&mut self, id: CallId, answer: Result<Answer, ApiError>) {
        let Some(asked) = self.calls.remove(&id) else {
            return;
        };
        // Held by another hub: decided there.
        if let (Err(e), Some(forward), Some((doc, holder)), Some(side)) =
            (&answer, asked.forwardable, &self.elsewhere, &self.cluster)
        {
            if e.code == ErrorCode::ListElsewhere {
                self.metrics.forwarded.fetch_add(1, Ordering::Relaxed);
                forward_in_background(
                    side.clone(),
                    self.loaded_to.clone(),
                    *doc,
                    holder.clone(),
                    forward,
                    asked.reply,
                );
                return;
            }
        }
        let outcome = if answer.is_ok() {
            Outcome::Ok
        } else {
            Outcome::Refused
        };
        self.metrics.call(asked.kind, outcome, asked.at.elapsed());
        // The caller may have gone away: its write is durable all the same.
        let _ = asked.reply.send(answer);
    }
}

/// In a cluster: appends each commit that carries something for the log (changes,
/// events, keys; not a row of the index of lists alone) to its list's log, in order.
/// Per commit: `None` when appended or nothing to append, else how it was refused.
async fn append_to_logs(
    side: &ClusterSide,
    store: &Store,
    commits: &[Commit],
    at_ms: i64,
) -> Vec<Option<Stored>> {
    appended_in_order(commits, at_ms, |doc, batch| async move {
        side.append(doc, &batch, store).await
    })
    .await
}

/// [`append_to_logs`] with `append` appending one batch to its list's log. A list's
/// commits build on one another: after one is refused, the later ones of the list are
/// refused as it was, untried — appended, the log would hold changes whose dependencies
/// it lacks, and no hub could load the list from it again.
async fn appended_in_order<F, A>(
    commits: &[Commit],
    at_ms: i64,
    mut append: F,
) -> Vec<Option<Stored>>
where
    F: FnMut(DocumentId, swarmtodo_store::Batch) -> A,
    A: std::future::Future<Output = Result<(), Stored>>,
{
    // What the later commits of a list refused get.
    let mut refused: BTreeMap<DocumentId, Stored> = BTreeMap::new();
    let mut out = Vec::with_capacity(commits.len());
    for c in commits {
        if let Some(later) = refused.get(&c.doc) {
            out.push(Some(later.clone()));
            continue;
        }
        if c.changes.is_empty() && c.events.is_empty() && c.reported.is_empty() {
            out.push(None);
            continue;
        }
        let appended = match persist::batch(c, at_ms) {
            Ok(batch) => append(c.doc, batch).await,
            Err(e) => Err(Stored::Refused(e.to_string())),
        };
        if let Err(why) = &appended {
            tracing::warn!(doc = %c.doc, ?why, "the cluster's log refused a commit");
            let later = match why {
                Stored::Elsewhere(why) => Stored::Elsewhere(why.clone()),
                Stored::Refused(why) => Stored::Refused(format!(
                    "it follows a commit of the list the log refused ({why}): refused too; its writers send both again"
                )),
                Stored::Durable(_) => why.clone(),
            };
            refused.insert(c.doc, later);
        }
        out.push(appended.err());
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // In tests a panic is the failure report.

    use super::*;

    fn commit(doc: DocumentId, key: &str) -> Commit {
        Commit {
            reported: vec![key.to_owned()],
            ..Commit::empty(doc)
        }
    }

    /// After the log refuses a commit of a list, the later commits of that list in the
    /// batch are refused as it was without being appended; the other lists' are
    /// appended. (A list's next commit can depend on the refused one's changes: a log
    /// holding it could not be loaded.)
    #[tokio::test]
    async fn a_list_s_commits_after_one_the_log_refused_are_refused_untried() {
        let (a, b, c) = (
            DocumentId::from_bytes([1; 16]),
            DocumentId::from_bytes([2; 16]),
            DocumentId::from_bytes([3; 16]),
        );
        let commits = [
            commit(a, "a1"),
            commit(b, "b1"),
            commit(a, "a2"),
            commit(c, "c1"),
            commit(b, "b2"),
            commit(c, "c2"),
        ];
        let tried = std::cell::RefCell::new(Vec::new());
        let out = appended_in_order(&commits, 1, |doc, batch| {
            tried.borrow_mut().push(batch.reported[0].clone());
            let answer = match doc {
                d if d == a => Err(Stored::Elsewhere("held by hub-b".to_owned())),
                d if d == c => Err(Stored::Refused("too large".to_owned())),
                _ => Ok(()),
            };
            async move { answer }
        })
        .await;
        assert_eq!(*tried.borrow(), ["a1", "b1", "c1", "b2"]);
        assert_eq!(out[0], Some(Stored::Elsewhere("held by hub-b".to_owned())));
        assert_eq!(out[2], Some(Stored::Elsewhere("held by hub-b".to_owned())));
        assert_eq!((&out[1], &out[4]), (&None, &None));
        assert_eq!(out[3], Some(Stored::Refused("too large".to_owned())));
        assert!(
            matches!(&out[5], Some(Stored::Refused(why)) if why.contains("too large")),
            "{out:?}"
        );
    }
}
