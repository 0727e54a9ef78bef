//! What a live run's sessions and its controller share: the hub's URL, the storm and
//! hub flags, each session's standing ([`Status`]), what the controller tells each
//! session ([`Control`]), the races between sessions ([`RaceOrder`], [`RaceHold`]) and
//! the write → everywhere latencies ([`Tracker`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use automerge::ChangeHash;
use tokio::sync::oneshot;

use super::access::Access;
use swarmtodo_core::model::TodoList;

/// What sessions and the controller share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(super) started: Instant,
    /// Each hub's current URL (`ws://127.0.0.1:PORT`): one, or those of a cluster.
    pub(super) urls: Mutex<Vec<String>>,
    /// Agents act only during the storm.
    pub(crate) storm: AtomicBool,
    /// Every hub process is running (none killed, paused or cut from NATS).
    pub(crate) hub_up: AtomicBool,
    /// Kills so far, with a cluster's pauses and cuts from NATS (a raw peer whose life
    /// saw one may have been answered by nothing).
    pub(crate) kills: AtomicU64,
    /// Write → everywhere latencies.
    pub(crate) tracker: Mutex<Tracker>,
    /// Each session's standing.
    pub(crate) status: Mutex<Vec<Status>>,
    /// Per session, the start a sibling session asked of it in a race (taken, written
    /// and answered under the lock: see `Session::race`).
    pub(crate) orders: Mutex<Vec<Option<RaceOrder>>>,
    /// Races whose starts the hub has not all acknowledged: their tasks are left alone.
    pub(crate) holds: Mutex<Vec<RaceHold>>,
    /// The tokens.
    pub(crate) access: Access,
}

impl Shared {
    /// The (first) hub's URL now.
    pub(crate) fn url(&self) -> String {
        self.url_of(0)
    }

    /// The URL of the hub a session of index `session` connects to: the sessions are
    /// spread over a cluster's hubs.
    pub(crate) fn url_of(&self, session: usize) -> String {
        self.urls
            .lock()
            .ok()
            .and_then(|u| (!u.is_empty()).then(|| u[session % u.len()].clone()))
            .unwrap_or_default()
    }

    pub(super) fn set_url(&self, hub: usize, url: String) {
        if let Ok(mut u) = self.urls.lock() {
            if u.len() <= hub {
                u.resize(hub + 1, String::new());
            }
            u[hub] = url;
        }
    }

    /// Milliseconds since the run started.
    pub(crate) fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// What the controller tells a session; it reacts when the value changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Control {
    /// Not cut off by a partition.
    pub(crate) online: bool,
    /// Incremented to cut the connection once (the session reconnects).
    pub(crate) cuts: u64,
    /// Leave now.
    pub(crate) stop: bool,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            online: true,
            cuts: 0,
            stop: false,
        }
    }
}

/// Where a session stands, for the controller's quiescence test and samples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Status {
    /// Connected to the hub.
    pub(crate) connected: bool,
    /// Its last sync ended with the hub's heads equal to its own, nothing pending.
    pub(crate) in_sync: bool,
    /// Its replica's heads.
    pub(crate) heads: Vec<ChangeHash>,
}

/// A race's second start, asked of a sibling session: start `task` if your replica
/// agrees that nothing of ours is in progress; answer with the change (None: refused).
#[derive(Debug)]
pub(crate) struct RaceOrder {
    /// The task to start.
    pub(super) task: String,
    /// The asking session's start (its race's hold takes the answer's change too).
    pub(super) first: ChangeHash,
    /// The answer.
    pub(super) reply: oneshot::Sender<Option<ChangeHash>>,
}

/// The tasks of a race that the hub has not acknowledged every start of: no session's
/// behaviour touches them meanwhile, so that the race is the hub's to decide.
#[derive(Debug)]
pub(crate) struct RaceHold {
    /// The list (index).
    pub(super) list: usize,
    /// The raced tasks.
    pub(super) tasks: [String; 2],
    /// Starts not acknowledged yet; the hold ends when none is left.
    pub(super) unacked: BTreeSet<ChangeHash>,
}

/// A write on its way to the other agents.
#[derive(Debug)]
struct Pending {
    at: Instant,
    writer: usize,
    /// Sessions that have it.
    have: BTreeSet<usize>,
}

/// Write → every other agent of the list has it: pending writes and the latencies of
/// the ones that arrived everywhere.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    /// Sessions of each list.
    sessions_of: Vec<Vec<usize>>,
    /// Per list: the writes not yet everywhere.
    pending: Vec<BTreeMap<ChangeHash, Pending>>,
    /// Milliseconds, in arrival order.
    pub(crate) latencies_ms: Vec<u64>,
}

impl Tracker {
    /// A tracker for lists whose sessions are `sessions_of`.
    pub(crate) fn new(sessions_of: Vec<Vec<usize>>) -> Tracker {
        let pending = sessions_of.iter().map(|_| BTreeMap::new()).collect();
        Tracker {
            sessions_of,
            pending,
            latencies_ms: Vec::new(),
        }
    }

    /// `writer` wrote `hash` on `list` at `at`.
    pub(crate) fn written(&mut self, list: usize, writer: usize, hash: ChangeHash, at: Instant) {
        if self.sessions_of.get(list).is_some_and(|s| s.len() > 1) {
            if let Some(p) = self.pending.get_mut(list) {
                p.insert(
                    hash,
                    Pending {
                        at,
                        writer,
                        have: BTreeSet::new(),
                    },
                );
            }
        }
    }

    /// `session` of `list` holds `replica` now.
    pub(crate) fn observe(&mut self, list: usize, session: usize, replica: &TodoList) {
        let others = self
            .sessions_of
            .get(list)
            .map_or(0, |s| s.len().saturating_sub(1));
        let Some(pending) = self.pending.get_mut(list) else {
            return;
        };
        let now = Instant::now();
        let mut done = Vec::new();
        for (h, p) in pending.iter_mut() {
            if p.writer == session || p.have.contains(&session) {
                continue;
            }
            if replica.doc().get_change_meta_by_hash(h).is_some() {
                p.have.insert(session);
                if p.have.len() >= others {
                    done.push((*h, ms(now - p.at)));
                }
            }
        }
        for (h, l) in done {
            pending.remove(&h);
            self.latencies_ms.push(l);
        }
    }

    /// Writes not yet everywhere.
    pub(crate) fn pending(&self) -> usize {
        self.pending.iter().map(BTreeMap::len).sum()
    }
}

/// Whole milliseconds of `d`.
pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
