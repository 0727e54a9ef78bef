//! One agent on one list, live: a replica, a real client [`Connection`] to the hub
//! process, and the scenario's behaviours at the scenario's rate.
//!
//! The session syncs continuously (`Connection::sync` returns once the hub has
//! acknowledged everything and been quiet for `SYNC_SETTLE`), acts between syncs, and
//! reconnects with the client's backoff when the connection is cut, the hub is killed,
//! or a sync makes no progress for [`SYNC_STALL`]. A cancelled sync is never resumed:
//! its connection is dropped (automerge's sync never resends what it counts as sent).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::{ActorId, ChangeHash};
use tokio::sync::{oneshot, watch};

use super::access::authed;
use super::raw;
use super::shared::{ms, Control, RaceHold, RaceOrder, Shared, Status};
use crate::behave::SEEN_VERSIONS_MAX;
use crate::behave::{self, RogueMove};
use crate::check::SideOutcome;
use crate::outcome::{Injection, Stats};
use crate::rng::Rng;
use crate::scenario::{Action, Mix, RoleSpec};
use swarmtodo_client::{ClientError, Connection, RECONNECT_BACKOFF_MAX, RECONNECT_BACKOFF_MIN};
use swarmtodo_core::model::{TodoList, WriteContext};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::{Rule, Status as TaskStatus, Version, WriteRequest};

/// A sync that has not returned for this long is given up: the connection is dropped
/// and a new one made (what a robust client's timeout does; counted as a stall reset,
/// which a healthy hub never causes).
pub const SYNC_STALL: Duration = Duration::from_secs(15);
/// Longest sleep of an idle, disconnected session before it looks at its clock again.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// How long a session that started a race waits for its sibling's start. The sibling
/// answers between two of its syncs (each about `SYNC_SETTLE`); past this wait the
/// race is withdrawn and counts for nothing.
pub const RACE_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The tasks of `list` held for races (see [`RaceHold`]).
fn held(shared: &Shared, list: usize) -> Vec<String> {
    shared
        .holds
        .lock()
        .map(|h| {
            h.iter()
                .filter(|r| r.list == list)
                .flat_map(|r| r.tasks.iter().cloned())
                .collect()
        })
        .unwrap_or_default()
}

/// What a session is, fixed for the run.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// Its index among all sessions.
    pub(crate) index: usize,
    /// The agent id.
    pub(crate) name: String,
    /// Which of the agent's sessions this is (0 for an agent of one session).
    pub(crate) session: usize,
    /// The agent's token (`?token=`).
    pub(crate) token: String,
    /// The agent's role.
    pub(crate) role: RoleSpec,
    /// The list (index) and its document.
    pub(crate) list: usize,
    pub(crate) doc: DocumentId,
    /// Actions per second on this list (the agent's rate shared among its lists).
    pub(crate) rate_per_s: f64,
    /// The behaviour mix.
    pub(crate) mix: Mix,
    /// The list's workers.
    pub(crate) workers: Vec<String>,
    /// The agent's other sessions on this list (indexes): whom a race may pick.
    pub(crate) siblings: Vec<usize>,
    /// The actor of the rogue's raw writes.
    pub(crate) raw_actor: ActorId,
}

/// A session's state; what is left of it when it ends is what the checker reads.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) spec: Spec,
    pub(crate) replica: TodoList,
    seen: VecDeque<Version>,
    /// Own changes the hub has not acknowledged, with when they were written.
    unacked: Vec<(ChangeHash, Instant)>,
    /// Own changes the hub acknowledged.
    pub(crate) acked: BTreeSet<ChangeHash>,
    rng: Rng,
    next_task: u64,
    /// Connected and in sync after the last sync (a rogue injects only then).
    ready: bool,
    connections: u64,
    pub(crate) stats: Stats,
    pub(crate) injected: Vec<Injection>,
    pub(crate) sides: Vec<SideOutcome>,
    /// Write → acknowledgement, milliseconds.
    pub(crate) ack_latencies_ms: Vec<u64>,
    /// Connection cuts this session saw.
    pub(crate) cuts: u64,
}

/// Unix milliseconds now (changes carry real time, as any agent's do).
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl Session {
    /// A session with `replica` (possibly holding the list's first plan already).
    pub(crate) fn new(spec: Spec, replica: TodoList, rng: Rng) -> Session {
        Session {
            spec,
            replica,
            seen: VecDeque::new(),
            unacked: Vec::new(),
            acked: BTreeSet::new(),
            rng,
            next_task: 0,
            ready: false,
            connections: 0,
            stats: Stats::default(),
            injected: Vec::new(),
            sides: Vec::new(),
            ack_latencies_ms: Vec::new(),
            cuts: 0,
        }
    }

    /// Changes written before the session started (the first plan), to be acknowledged.
    pub(crate) fn note_written(&mut self, hash: ChangeHash, at: Instant) {
        self.unacked.push((hash, at));
    }

    fn peer_id(&mut self) -> String {
        self.connections += 1;
        let name = match self.spec.session {
            0 => self.spec.name.clone(),
            s => format!("{}-s{s}", self.spec.name),
        };
        format!("{name}-l{}-c{}", self.spec.list, self.connections)
    }

    fn publish(&self, shared: &Shared, connected: bool) {
        let status = Status {
            connected,
            in_sync: connected && self.ready,
            heads: self.replica.heads(),
        };
        if let Ok(mut all) = shared.status.lock() {
            if let Some(s) = all.get_mut(self.spec.index) {
                *s = status;
            }
        }
    }

    /// Runs until told to stop; returns the session for the checker.
    pub(crate) async fn run(
        mut self,
        shared: Arc<Shared>,
        mut control: watch::Receiver<Control>,
    ) -> Session {
        let mut conn: Option<Connection> = None;
        let mut backoff = RECONNECT_BACKOFF_MIN;
        let mut retry_at = Instant::now();
        let mut cuts_seen = 0;
        let acts = self.spec.mix.total() > 0;
        let mut next_act = {
            // The first action anywhere in the first interval: a swarm does not start in
            // lockstep.
            let first = behave::interval_ms(&mut self.rng, self.spec.rate_per_s);
            Instant::now() + Duration::from_millis(self.rng.range(1, first.max(1)))
        };
        // A sync was cancelled by a control change: its connection must not be reused.
        let mut cancelled = false;
        loop {
            let ctl = *control.borrow_and_update();
            if ctl.stop || control.has_changed().is_err() {
                break;
            }
            if self.answer_race(&shared) {
                self.publish(&shared, conn.is_some());
            }
            if ctl.cuts != cuts_seen {
                cuts_seen = ctl.cuts;
                if conn.take().is_some() {
                    // Dropped without a goodbye, as a cut cable would; the client waits
                    // its first backoff and reconnects.
                    self.cuts += 1;
                    self.ready = false;
                    retry_at = Instant::now() + RECONNECT_BACKOFF_MIN;
                    self.publish(&shared, false);
                }
            }
            if (cancelled || !ctl.online) && conn.take().is_some() {
                self.ready = false;
                retry_at = Instant::now() + RECONNECT_BACKOFF_MIN;
                self.publish(&shared, false);
            }
            cancelled = false;
            if acts && shared.storm.load(Ordering::Relaxed) && Instant::now() >= next_act {
                let url = authed(&shared.url_of(self.spec.index), &self.spec.token);
                self.act(&shared, &url, conn.is_some()).await;
                let gap = behave::interval_ms(&mut self.rng, self.spec.rate_per_s);
                next_act = Instant::now() + Duration::from_millis(gap);
                self.publish(&shared, conn.is_some());
            }
            if conn.is_none() && ctl.online && Instant::now() >= retry_at {
                let url = authed(&shared.url_of(self.spec.index), &self.spec.token);
                let peer = self.peer_id();
                let connected = tokio::select! {
                    c = Connection::connect(&url, &peer) => Some(c),
                    _ = control.changed() => None,
                };
                match connected {
                    Some(Ok(c)) => {
                        conn = Some(c);
                        backoff = RECONNECT_BACKOFF_MIN;
                        self.stats.connects += 1;
                    }
                    Some(Err(_)) => {
                        retry_at = Instant::now() + backoff;
                        backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                    }
                    None => {}
                }
                continue;
            }
            let Some(c) = conn.as_mut() else {
                let mut wake = Instant::now() + IDLE_POLL;
                if acts && shared.storm.load(Ordering::Relaxed) {
                    wake = wake.min(next_act);
                }
                if ctl.online {
                    wake = wake.min(retry_at);
                }
                tokio::select! {
                    () = tokio::time::sleep_until(wake.into()) => {}
                    _ = control.changed() => {}
                }
                continue;
            };
            let before = self.replica.heads();
            let doc = self.spec.doc;
            let synced = tokio::select! {
                r = tokio::time::timeout(SYNC_STALL, c.sync(doc, &mut self.replica)) => Some(r),
                _ = control.changed() => None,
            };
            match synced {
                // Cut, partitioned or stopped in the middle of a sync: handled at the top
                // of the loop, and that session is over either way.
                None => cancelled = true,
                Some(Err(_)) => {
                    self.stats.stall_resets += 1;
                    conn = None;
                    self.ready = false;
                    retry_at = Instant::now() + RECONNECT_BACKOFF_MIN;
                    self.publish(&shared, false);
                }
                Some(Ok(Err(e))) => {
                    self.lost(e);
                    conn = None;
                    self.ready = false;
                    retry_at = Instant::now() + backoff;
                    backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                    self.publish(&shared, false);
                }
                Some(Ok(Ok(_))) => {
                    let in_sync = c.in_sync(doc, &self.replica);
                    self.synced(&shared, &before, in_sync);
                    self.publish(&shared, true);
                }
            }
        }
        // A race asked of this session now goes unanswered: its sender learns at once.
        if let Ok(mut orders) = shared.orders.lock() {
            if let Some(slot) = orders.get_mut(self.spec.index) {
                *slot = None;
            }
        }
        self.publish(&shared, false);
        self
    }

    /// A connection that ended with an error: the hub was killed (the socket ended), or
    /// it closed us on purpose (counted: a well-behaved agent must not be closed).
    fn lost(&mut self, e: ClientError) {
        match e {
            ClientError::Closed(why) if why != "connection ended" => {
                *self.stats.closes.entry(why).or_default() += 1;
            }
            ClientError::Protocol(_) | ClientError::Model(_) => self.stats.agent_errors += 1,
            _ => {}
        }
    }

    fn synced(&mut self, shared: &Shared, before: &[ChangeHash], in_sync: bool) {
        let heads = self.replica.heads();
        if heads != before {
            if self.seen.len() >= SEEN_VERSIONS_MAX {
                self.seen.pop_front();
            }
            self.seen.push_back(self.replica.version());
        }
        self.ready = in_sync && self.replica.pending_changes() == 0;
        if self.ready && !self.unacked.is_empty() {
            let now = Instant::now();
            let mut holds = shared.holds.lock().ok();
            for (h, t) in self.unacked.drain(..) {
                self.acked.insert(h);
                self.ack_latencies_ms.push(ms(now - t));
                if let Some(holds) = holds.as_mut() {
                    for r in holds.iter_mut() {
                        r.unacked.remove(&h);
                    }
                }
            }
            if let Some(holds) = holds.as_mut() {
                holds.retain(|r| !r.unacked.is_empty());
            }
        }
        if let Ok(mut t) = shared.tracker.lock() {
            t.observe(self.spec.list, self.spec.index, &self.replica);
        }
    }

    async fn act(&mut self, shared: &Shared, url: &str, connected: bool) {
        let action = behave::pick_action(&mut self.rng, &self.spec.mix);
        self.stats.ops += 1;
        let done = if action.is_rogue() {
            self.rogue(shared, url, action).await
        } else if action == Action::RaceStart {
            self.race(shared, connected).await
        } else {
            let held = held(shared, self.spec.list);
            let writer = behave::Writer {
                name: &self.spec.name,
                lead: self.spec.role == RoleSpec::Lead,
                replica: &self.replica,
                seen: &self.seen,
                workers: &self.spec.workers,
                next_task: &mut self.next_task,
                session: self.spec.session,
                held: &held,
            };
            match behave::request(&mut self.rng, writer, action) {
                Some(req) => {
                    self.write(shared, &req);
                    true
                }
                None => false,
            }
        };
        if !done {
            self.stats.idle += 1;
        }
    }

    /// A validated write through the model. Returns the new change, if any.
    fn write(&mut self, shared: &Shared, req: &WriteRequest) -> Option<ChangeHash> {
        let ctx = WriteContext::new(self.spec.name.clone(), wall_ms(), self.rng.next_u64());
        match self.replica.write(req, &ctx) {
            Ok((result, _)) if result.changed => {
                self.stats.writes += 1;
                let hash = self.replica.doc().get_last_local_change().map(|c| c.hash());
                if let Some(h) = hash {
                    self.written(shared, h);
                }
                hash
            }
            Ok(_) => {
                self.stats.idle += 1;
                None
            }
            Err(e) => {
                self.stats.refused_write(&e);
                None
            }
        }
    }

    fn written(&mut self, shared: &Shared, hash: ChangeHash) {
        let now = Instant::now();
        self.unacked.push((hash, now));
        self.ready = false;
        if let Ok(mut t) = shared.tracker.lock() {
            t.written(self.spec.list, self.spec.index, hash, now);
        }
    }

    /// A `race_start`: this session and a sibling of the same agent each start a
    /// different pending task of the agent, from replicas that agree (every session of
    /// the agent on the list connected, in sync, at one version) that nothing of the
    /// agent's is in progress. This session writes its start and, before syncing it,
    /// has the sibling write the other (`answer_race`): both changes are concurrent,
    /// and their merge at the hub is a single-active violation to be reported once.
    /// Claiming the race marks this session out of sync under the status lock, so no
    /// sibling starts a race of its own until this one has played out.
    async fn race(&mut self, shared: &Shared, connected: bool) -> bool {
        if !(connected && self.ready) || self.spec.siblings.is_empty() {
            return false;
        }
        let me = self.spec.name.clone();
        let held = held(shared, self.spec.list);
        let Some((mine, theirs)) = behave::race_tasks(&mut self.rng, &me, &self.replica, &held)
        else {
            return false;
        };
        let sibling = self.spec.siblings[self.rng.index(self.spec.siblings.len())];
        let heads = self.replica.heads();
        {
            let Ok(mut all) = shared.status.lock() else {
                return false;
            };
            let agrees = |s: &Status| s.connected && s.in_sync && s.heads == heads;
            if !self
                .spec
                .siblings
                .iter()
                .all(|&s| all.get(s).is_some_and(agrees))
            {
                return false;
            }
            if let Some(s) = all.get_mut(self.spec.index) {
                s.in_sync = false;
            }
        }
        let Some(first) = self.write(shared, &behave::start_request(&mine)) else {
            return false;
        };
        // Held from now on (the start is not synced before the sibling has answered).
        if let Ok(mut holds) = shared.holds.lock() {
            holds.push(RaceHold {
                list: self.spec.list,
                tasks: [mine, theirs.clone()],
                unacked: [first].into(),
            });
        }
        let (reply, mut answer) = oneshot::channel();
        match shared.orders.lock() {
            Ok(mut orders) => match orders.get_mut(sibling) {
                Some(slot) => {
                    *slot = Some(RaceOrder {
                        task: theirs,
                        first,
                        reply,
                    })
                }
                None => return true,
            },
            Err(_) => return true,
        }
        let second = match tokio::time::timeout(RACE_ANSWER_TIMEOUT, &mut answer).await {
            Ok(Ok(h)) => h,
            Ok(Err(_)) => None,
            Err(_) => {
                // Withdrawn, unless the sibling took the order meanwhile: it writes and
                // answers under the lock, so then its answer is in.
                let withdrawn = shared
                    .orders
                    .lock()
                    .ok()
                    .and_then(|mut o| o.get_mut(sibling).and_then(Option::take))
                    .is_some();
                if withdrawn {
                    None
                } else {
                    answer.try_recv().ok().flatten()
                }
            }
        };
        if let Some(second) = second {
            self.injected.push(Injection {
                rule: Rule::SingleActive,
                list: self.spec.list,
                agent: me,
                change: first.to_string(),
                also: vec![second.to_string()],
                action: Action::RaceStart,
                at_ms: shared.elapsed_ms(),
            });
        }
        true
    }

    /// Answers a sibling's race order, if one waits: starts its task when this replica
    /// agrees that nothing of the agent's is in progress and the task is a pending one
    /// of the agent's (the model refuses the start otherwise). Taken, written and
    /// answered under the orders' lock. True when an order was answered.
    fn answer_race(&mut self, shared: &Shared) -> bool {
        let Ok(mut orders) = shared.orders.lock() else {
            return false;
        };
        let Some(order) = orders.get_mut(self.spec.index).and_then(Option::take) else {
            return false;
        };
        let snap = self.replica.read();
        let pending_mine = snap.tasks.iter().any(|t| {
            t.id == order.task
                && t.status == TaskStatus::Pending
                && t.owner.as_deref() == Some(self.spec.name.as_str())
        });
        let change = if pending_mine && !order.reply.is_closed() {
            self.write(shared, &behave::start_request(&order.task))
        } else {
            None
        };
        if let (Some(c), Ok(mut holds)) = (change, shared.holds.lock()) {
            for r in holds
                .iter_mut()
                .filter(|r| r.unacked.contains(&order.first))
            {
                r.unacked.insert(c);
            }
        }
        let _ = order.reply.send(change);
        true
    }

    async fn rogue(&mut self, shared: &Shared, url: &str, action: Action) -> bool {
        if matches!(
            action,
            Action::GarbageFrame | Action::InvalidSync | Action::Oversize
        ) {
            self.bad_frame(shared, url, action).await;
            return true;
        }
        // Only in sync, so that each injection is a merge of its own and its report can
        // be told apart.
        if !self.ready {
            return false;
        }
        let me = self.spec.name.clone();
        let (rule, change) = match behave::rogue_move(&mut self.rng, &me, &self.replica, action) {
            RogueMove::Setup(req) => {
                self.write(shared, &req);
                return true;
            }
            RogueMove::Idle => return false,
            RogueMove::Foreign(req) => (Rule::Ownership, self.write(shared, &req)),
            RogueMove::Raw { rule, ids, edit } => {
                let change = behave::raw_change(
                    &self.replica,
                    &self.spec.raw_actor,
                    &me,
                    wall_ms(),
                    &ids,
                    &edit,
                );
                let hash = match change {
                    Some(c) => {
                        let h = c.hash();
                        if self.replica.apply_changes(vec![c]).is_ok() {
                            self.stats.writes += 1;
                            self.written(shared, h);
                            Some(h)
                        } else {
                            self.stats.agent_errors += 1;
                            None
                        }
                    }
                    None => None,
                };
                (rule, hash)
            }
        };
        let Some(change) = change else {
            return false;
        };
        self.injected.push(Injection {
            rule,
            list: self.spec.list,
            agent: me,
            change: change.to_string(),
            also: Vec::new(),
            action,
            at_ms: shared.elapsed_ms(),
        });
        true
    }

    /// One bad frame on a connection of its own; the hub must close it with its code.
    async fn bad_frame(&mut self, shared: &Shared, url: &str, action: Action) {
        self.stats.bad_frames += 1;
        let n = self.rng.range(1, 64);
        let noise: Vec<u8> = (0..n).map(|_| self.rng.below(256) as u8).collect();
        let kills = shared.kills.load(Ordering::SeqCst);
        let peer = self.peer_id();
        let got = raw::bad_frame(url, &peer, self.spec.doc, action, noise).await;
        // A hub killed meanwhile answered nothing: nothing to expect.
        if shared.kills.load(Ordering::SeqCst) != kills || !shared.hub_up.load(Ordering::SeqCst) {
            return;
        }
        self.sides.push(SideOutcome {
            conn: u64::try_from(self.sides.len()).unwrap_or(u64::MAX),
            what: action,
            expect: raw::expected_codes(action).to_vec(),
            got,
        });
    }
}
