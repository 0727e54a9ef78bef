//! The hub's sans-I/O core: automerge-repo messages in, effects out.
//!
//! [`HubCore::handle`] takes one input (a connection opened, a frame received, a
//! connection closed, a tick when the runtime is idle) and the current time, and
//! returns [`Effects`]: what to make durable, then what to send and whom to close. One
//! driver (`swarmtodo_store::drive::perform`, used by the server and the simulator)
//! performs them in that order and tells the core what became durable
//! ([`HubCore::committed`]), which then releases the events of those commits — so no
//! peer receives a change or an event before it is durable, and no peer sees a state the
//! authority's repair would change: the repair is made inside the same `handle` call,
//! before any sync message is generated.
//!
//! Every peer byte is validated before Automerge sees it (`wire::decode`,
//! `syncmsg::validate`), and a bad frame affects only its connection.
//!
//! Here the types and the batch loop; `frame` decodes a frame and dispatches it,
//! `merge` merges a sync message and runs the authority, `answer` sends each list's
//! peers what a batch owes them, `events` builds the event frames of durable commits,
//! `lists` moves lists in and out of memory, `presence` follows agents joining and
//! leaving and their leases, `budget` holds what a connection may still
//! cost, `limits` every bound of the hub core.

mod answer;
mod budget;
mod calls;
mod delegation;
mod events;
mod frame;
mod limits;
mod lists;
mod merge;
mod presence;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use automerge::{sync, ActorId, ChangeHash};

use self::answer::Owed;
use self::budget::{CreationBudget, Creator, RelayBudget, WorkBudget};
use self::calls::WaitingCall;
pub use self::calls::{api_actor, list_id, Answer, Call, CallId, Caller};
pub use self::delegation::{rolled_status, Link};
use self::events::event_frames;
pub use self::events::{events_of, EventKinds};
pub use self::limits::*;
pub use self::lists::Handover;
use crate::authority::{Authority, Policy, Roles};
use crate::model::sync::SentIndex;
use crate::model::TodoList;
use crate::proto::wire::{DocumentId, PeerId};
use crate::proto::{EventBody, TaskCounts};
use crate::syncmsg;

/// The agent id the hub's repairs are recorded under.
pub const HUB_AGENT: &str = "swarmtodo-hub";

/// The automerge-repo protocol version the hub speaks (the wire codec's).
pub use crate::proto::wire::PROTOCOL_VERSION;

/// A connection, as the runtime numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

/// Why a connection is closed (a WebSocket close code and a stable reason).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Close {
    /// WebSocket close code: 1002 protocol error, 1008 policy, 1009 too big, 1011 internal.
    pub code: u16,
    /// Stable reason code (e.g. `malformed`, `sync_invalid`, `handshake`).
    pub reason: String,
    /// An `error` message to send just before the close frame, saying what to do.
    pub message: Option<String>,
}

/// Who a connection is, from the token it presented (docs/DESIGN.md §7).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    /// The agent id the token stands for.
    pub agent: String,
    /// Its role in lists not named in `lists`.
    pub role: crate::authority::Role,
    /// Its role per list.
    pub lists: BTreeMap<DocumentId, crate::authority::Role>,
}

impl Identity {
    /// Its role in list `doc`.
    pub fn role_in(&self, doc: &DocumentId) -> crate::authority::Role {
        self.lists.get(doc).copied().unwrap_or(self.role)
    }
}

/// One input to the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A WebSocket connection was accepted.
    Connected(ConnId),
    /// The connection presented a token: it acts as this identity.
    Identified(ConnId, Identity),
    /// A binary frame arrived.
    Frame(ConnId, Vec<u8>),
    /// The connection is gone.
    Disconnected(ConnId),
    /// The connection comes from this remote address (the identity its list creations
    /// are counted under when it has no token).
    Address(ConnId, std::net::IpAddr),
    /// The kinds of event the connection asked to be pushed (else
    /// [`EventKinds::DEFAULT`]).
    Subscribed(ConnId, EventKinds),
    /// Nothing else waits: what a busy moment deferred (news, events) goes out now. The
    /// runtime sends it when its queue runs dry while [`HubCore::deferred`] holds.
    Tick,
    /// In a cluster: links of sub-lists other hubs made (the cluster's directory), so
    /// that this hub rolls them up when it holds them or their parents.
    Links(Vec<Link>),
    /// In a cluster: sub-list `.0`, wherever it is held, has these task counts now (the
    /// cluster's index of lists says): its task rolls up into its parent when this hub
    /// holds the parent. A list without a link is passed over.
    SubListCounts(DocumentId, TaskCounts),
    /// A call of the JSON API on the list called `list`.
    Call {
        /// The runtime's number for it (its answer carries it).
        id: CallId,
        /// Who calls.
        caller: Caller,
        /// The list's name.
        list: String,
        /// What it asks.
        call: Call,
    },
}

/// What the store did with one commit of [`Effects::commits`] (one per commit, in their
/// order), told to the core by [`HubCore::committed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Durable; its events got these sequence numbers.
    Durable(Vec<u64>),
    /// Refused for the list's own content (a record over a store limit): nothing of it
    /// is durable.
    Refused(String),
    /// Refused because the list is no longer this hub's to write (in a cluster, another
    /// hub holds it now): nothing of it is durable, and its calls are answered
    /// `list_elsewhere`.
    Elsewhere(String),
}

/// The `session_id` of the `ephemeral` messages that carry the hub's events (the data
/// is a CBOR text string holding one [`Event`](crate::proto::Event) as JSON, or a JSON
/// array of them).
pub const EVENTS_SESSION: &str = "swarmtodo-events";

/// What one merge makes durable: the new changes (including the repair), the events,
/// and the authority's new idempotency keys — one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    /// The list.
    pub doc: DocumentId,
    /// The peers syncing the list, told of its events once they are durable (shared by
    /// the commits of a list while its peers stay the same: with a hundred peers, a
    /// list of its own per commit was a hundred strings to copy and free per write).
    pub notify: Arc<[(ConnId, PeerId)]>,
    /// Every change new to the hub, as merged (no lookup in the document needed).
    pub changes: Vec<automerge::Change>,
    /// Events, in order (the store assigns their `seq`).
    pub events: Vec<EventBody>,
    /// Keys the authority reported with these events.
    pub reported: Vec<String>,
    /// The API calls this commit answers, released once it is durable (the store
    /// ignores them).
    pub answers: Vec<(CallId, Result<Answer, crate::proto::ApiError>)>,
    /// The list as the commit leaves it, for the store's index of lists (on a commit
    /// with changes at most every [`LIST_SUMMARY_INTERVAL_MS`] per list; the last one
    /// in a commit of its own).
    pub summary: Option<Summary>,
    /// The list is a delegated task's (its first commit): the store keeps the link.
    pub link: Option<Link>,
}

impl Commit {
    /// A commit of list `doc` with nothing in it yet.
    pub fn empty(doc: DocumentId) -> Commit {
        Commit {
            doc,
            notify: Arc::from([]),
            changes: Vec::new(),
            events: Vec::new(),
            reported: Vec::new(),
            answers: Vec::new(),
            summary: None,
            link: None,
        }
    }
}

/// A list as a commit leaves it: what `GET /v1/lists` shows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The name API calls reach it by, once one did.
    pub name: Option<String>,
    /// Its version.
    pub version: crate::proto::Version,
    /// Its tasks by status.
    pub tasks: crate::proto::TaskCounts,
}

/// A snapshot of a list to store in place of the changes it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    /// The list.
    pub doc: DocumentId,
    /// `Automerge::save()` of the list.
    pub snapshot: Vec<u8>,
    /// The heads the snapshot covers.
    pub heads: Vec<ChangeHash>,
    /// Whether the runtime should also load the snapshot into a fresh document, off the
    /// hub's task, and hand it to [`HubCore::rebuilt`] (see
    /// [`REBUILD_AFTER_GROWTH_PERCENT`]).
    pub rebuild: bool,
}

/// What the runtime must do, in this order: commit (and tell [`HubCore::committed`]),
/// compact, send, send the events, relay, close, then load.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Effects {
    /// Durable writes.
    pub commits: Vec<Commit>,
    /// Snapshots to store (after the commits they cover).
    pub compactions: Vec<Compaction>,
    /// Stored lists a peer asked for that are not in memory: the runtime loads each
    /// from the store (after this batch's commits) and hands it to
    /// [`HubCore::loaded`], which handles the frames that waited for it.
    pub loads: Vec<DocumentId>,
    /// Frames to send.
    pub sends: Vec<(ConnId, Vec<u8>)>,
    /// Frames pushing the events of durable commits, sent after `sends` (the state they
    /// speak of first). Filled by [`HubCore::committed`].
    pub events: Vec<(ConnId, Vec<u8>)>,
    /// Frames the runtime may drop instead of queueing them for a peer that is behind:
    /// relayed `ephemeral` messages, which carry no state (a peer that misses one misses
    /// nothing it needs). A flood of them must never cost its receivers their connection
    /// as slow readers.
    pub relays: Vec<(ConnId, Vec<u8>)>,
    /// Connections to close (after their pending sends).
    pub closes: Vec<(ConnId, Close)>,
    /// Answers to API calls: reads and refusals at once, writes once durable (filled
    /// by [`HubCore::committed`]).
    pub answers: Vec<(CallId, Result<Answer, crate::proto::ApiError>)>,
    /// Changes the sync windows of quiet lists gave back (see [`SYNC_WINDOW_QUIET_MS`]):
    /// memory freed in many small pieces, which the runtime may return to the system.
    pub window_changes_freed: usize,
}

/// A list as the runtime loaded it from the store for [`Effects::loads`].
#[derive(Debug)]
pub struct StoredList {
    /// The list, rebuilt and indexed (off the hub's task: a whole-list pass), writing
    /// as the hub's actor ([`HubCore::actor`]).
    pub list: TodoList,
    /// The authority's reported keys.
    pub reported: Vec<String>,
    /// Changes stored since its last snapshot (the count towards the next compaction
    /// goes on from there: a list loaded and dropped again and again is compacted all
    /// the same).
    pub since_compaction: usize,
}

/// Configuration of the core.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// The hub's automerge-repo peer id.
    pub peer_id: PeerId,
    /// The actor of the hub's own changes (repairs).
    pub actor: ActorId,
    /// The agent id repairs are recorded under.
    pub agent: String,
    /// The lists' policy.
    pub policy: Policy,
    /// Agents' roles.
    pub roles: Roles,
    /// Bounds on incoming sync messages.
    pub sync_limits: syncmsg::Limits,
    /// History work budget per connection: burst and units per second (see
    /// [`SYNC_WORK_BURST`]).
    pub sync_work: (i64, i64),
    /// List creations per identity: burst and per minute (see
    /// [`LIST_CREATIONS_BURST`]).
    pub list_creations: (u32, u32),
    /// In a cluster (docs/DESIGN.md §10) any list may be stored — in the cluster's log
    /// — whatever this hub's own store says: a list not in memory is always loaded
    /// first, and the runtime may answer that another hub holds it
    /// ([`HubCore::unavailable`]).
    pub every_list_stored: bool,
}

#[derive(Debug)]
enum ConnState {
    /// Waiting for `join`.
    Handshake,
    /// Joined as this peer.
    Ready(PeerId),
}

#[derive(Debug)]
struct Conn {
    state: ConnState,
    /// Documents this connection syncs.
    docs: BTreeSet<DocumentId>,
    /// History work this connection may still cause (see [`SYNC_WORK_BURST`]).
    work: WorkBudget,
    /// Who it is, when it presented a token.
    identity: Option<Identity>,
    /// The kinds of event it is pushed.
    events: EventKinds,
    /// What it may still have relayed (see [`EPHEMERAL_BYTES_PER_SECOND`]).
    relay: RelayBudget,
    /// Where it comes from, when the runtime said.
    address: Option<std::net::IpAddr>,
}

/// What [`RelayBudget::take`] decides for one `ephemeral` message.
/// One list held by the hub.
#[derive(Debug)]
pub struct DocState {
    list: TodoList,
    authority: Authority,
    /// Every connection that syncs this list.
    peers: BTreeMap<ConnId, Peer>,
    /// Changes committed since the last snapshot.
    since_compaction: usize,
    /// The list's number of changes when its document was last built in one piece
    /// (loaded, or rebuilt at a snapshot; 0 for a list that arrived by sync).
    changes_at_rebuild: usize,
    /// The last commit's `notify`, reused while the ready peers are the same.
    notify: Arc<[(ConnId, PeerId)]>,
    /// The name API calls reach it by (unknown for a list only synced by document id).
    name: Option<String>,
    /// Its agents (see `presence`).
    presence: presence::Presence,
    /// When its row in the store's index of lists was last written (the hub's clock).
    summary_written_ms: i64,
    /// A change since then is not in that row yet.
    summary_stale: bool,
    /// When a change was last committed to it (the hub's clock; `i64::MIN`: none since
    /// it came into memory).
    written_ms: i64,
    /// It has an entry in [`HubCore::windows_due`].
    window_due: bool,
}

impl DocState {
    fn new(list: TodoList, authority: Authority, changes_at_rebuild: usize) -> DocState {
        DocState {
            list,
            authority,
            peers: BTreeMap::new(),
            since_compaction: 0,
            changes_at_rebuild,
            notify: Arc::from([]),
            name: None,
            presence: presence::Presence::default(),
            summary_written_ms: i64::MIN,
            summary_stale: false,
            written_ms: i64::MIN,
            window_due: false,
        }
    }
}

/// What the hub keeps about one connection that syncs one list.
#[derive(Debug)]
struct Peer {
    /// Its sync state.
    state: sync::State,
    /// Its changes in flight by window position (see `SentIndex`).
    sent: SentIndex,
    /// The list's window position when its last message was received
    /// (`TodoList::window_end`): changes applied since are news to it, whatever its
    /// Bloom filter says (`TodoList::generate_sync_message_after`).
    heard_at: u64,
    /// When its last message was received (the hub's clock, ms).
    heard_ms: i64,
    /// The window ends ([`TodoList::window_end`]) of the messages sent to it that its
    /// heads did not cover yet, oldest first (see [`FANOUT_UNACKED_MAX`]).
    unacked: VecDeque<u64>,
    /// The last message sent to it was cut (`sync::SYNC_CHANGES_BYTES_MAX`) and it has
    /// not answered yet: news waits for its answer, which is answered with the next
    /// part and the news together (a message per fan-out would each carry another
    /// part, faster than the peer reads them, until its outbox overflows).
    catching_up: bool,
}

impl DocState {
    /// The list.
    pub fn list(&self) -> &TodoList {
        &self.list
    }
}

/// The hub's state: connections and lists.
#[derive(Debug)]
pub struct HubCore {
    config: HubConfig,
    conns: BTreeMap<ConnId, Conn>,
    docs: BTreeMap<DocumentId, DocState>,
    /// Lists whose peers are owed a sync message once the inputs at hand are handled.
    owed: BTreeMap<DocumentId, Owed>,
    /// Lists whose news waits for a later batch, since when (ms).
    news: BTreeMap<DocumentId, i64>,
    /// Every actor a token-identified connection brought a change of, in any list, and
    /// that connection's identity: the actor is that agent's, and a change by it from any
    /// other connection is refused (`actor_forged`). Actor ids are self-declared, so the
    /// first identity seen writing with one owns it. Grows with the changes the hub
    /// holds (an actor is bound only once a change of it is applied or waits for its
    /// dependencies).
    actors: BTreeMap<ActorId, Arc<Identity>>,
    /// Every list in the store (or committed in effects not performed yet). A list is
    /// in memory (`docs`) only while a peer syncs it: when its last peer leaves it is
    /// dropped, and loaded again (`Effects::loads`) when a peer asks for it.
    stored: BTreeSet<DocumentId>,
    /// The list whose load just found nothing, while the frames and calls that waited
    /// for it are handled (in a cluster, where every list may be stored, they make it
    /// rather than load it again).
    found_empty: Option<DocumentId>,
    /// Frames waiting for their stored list to be loaded, in the order they came, and
    /// their bytes (at most [`LOAD_WAITING_BYTES_MAX`]).
    waiting: BTreeMap<DocumentId, Waiting>,
    /// List creations left per identity.
    creators: BTreeMap<Creator, CreationBudget>,
    /// Durable commits whose events are not sent yet, their events' sequence numbers
    /// and when they were committed: while a list's news is deferred, its events wait
    /// with it, so that a peer hears of a change after it has it, and in one frame per
    /// peer for several batches.
    durable: Vec<(Commit, Vec<u64>, i64)>,
    /// API calls waiting for their list to load, in the order they came (at most
    /// [`CALLS_WAITING_MAX`] per list).
    calls: BTreeMap<DocumentId, Vec<WaitingCall>>,
    /// Lists in memory for API calls that no peer syncs, and their last call (ms).
    called: BTreeMap<DocumentId, i64>,
    /// Waits not answered yet (at most [`WAITS_MAX`]).
    waits: Vec<calls::PendingWait>,
    /// Lists whose presence has work at the end of the batch.
    presence_dirty: BTreeSet<DocumentId>,
    /// When a list's next agent gone reaches the end of its window (one entry per list
    /// at most live: `Presence::due_ms`; others are stale and harmless).
    presence_due: BTreeSet<(i64, DocumentId)>,
    /// The time of the batch being handled (ms).
    clock_ms: i64,
    /// Lists whose row in the index of lists waits for its interval
    /// ([`LIST_SUMMARY_INTERVAL_MS`]).
    summaries_due: BTreeSet<DocumentId>,
    /// Delegated tasks' lists and their links (see `delegation`).
    links: BTreeMap<DocumentId, Link>,
    /// Sub-lists to roll up at the end of the batch.
    rollups_due: BTreeSet<DocumentId>,
    /// In a cluster: the task counts of sub-lists as the cluster's index last said them
    /// ([`Input::SubListCounts`]; only of lists with a link), rolled up into a parent held
    /// here when the sub-list is held elsewhere.
    sub_counts: BTreeMap<DocumentId, TaskCounts>,
    /// Roll-up calls made so far (their ids).
    internal_calls: u64,
    /// When the sync window of a list written to lately may go: no change for
    /// [`SYNC_WINDOW_QUIET_MS`] by then (one entry per list at most, see
    /// `HubCore::forget_quiet_windows`).
    windows_due: BTreeSet<(i64, DocumentId)>,
}

/// Frames waiting for a list to load (connection, bytes), and their bytes in all.
type Waiting = (Vec<(ConnId, Vec<u8>)>, usize);

impl HubCore {
    /// An empty hub.
    pub fn new(config: HubConfig) -> Self {
        HubCore {
            config,
            conns: BTreeMap::new(),
            docs: BTreeMap::new(),
            owed: BTreeMap::new(),
            news: BTreeMap::new(),
            actors: BTreeMap::new(),
            stored: BTreeSet::new(),
            found_empty: None,
            waiting: BTreeMap::new(),
            creators: BTreeMap::new(),
            durable: Vec::new(),
            calls: BTreeMap::new(),
            called: BTreeMap::new(),
            waits: Vec::new(),
            presence_dirty: BTreeSet::new(),
            presence_due: BTreeSet::new(),
            windows_due: BTreeSet::new(),
            clock_ms: 0,
            summaries_due: BTreeSet::new(),
            links: BTreeMap::new(),
            rollups_due: BTreeSet::new(),
            sub_counts: BTreeMap::new(),
            internal_calls: 0,
        }
    }

    /// Tells the core which lists the store holds (at start: they are loaded when a
    /// peer asks for them).
    pub fn set_stored(&mut self, ids: impl IntoIterator<Item = DocumentId>) {
        self.stored.extend(ids);
    }

    /// True when list `doc` may be stored: it is in the store, or the hub is one of a
    /// cluster ([`HubConfig::every_list_stored`]).
    pub(super) fn maybe_stored(&self, doc: &DocumentId) -> bool {
        self.stored.contains(doc) || self.config.every_list_stored && self.found_empty != Some(*doc)
    }

    /// True when list `doc` is in memory.
    pub fn is_loaded(&self, doc: &DocumentId) -> bool {
        self.docs.contains_key(doc)
    }

    /// Lists in the store (or committed by effects handed out).
    pub fn stored_count(&self) -> usize {
        self.stored.len()
    }

    /// Lists in memory (those some peer syncs).
    pub fn doc_count(&self) -> usize {
        self.docs.len()
    }

    /// The actor of the hub's own changes (a list loaded for it writes as this).
    pub fn actor(&self) -> &ActorId {
        &self.config.actor
    }

    /// The lists held.
    pub fn docs(&self) -> impl Iterator<Item = (&DocumentId, &DocState)> + '_ {
        self.docs.iter()
    }

    /// One list.
    pub fn doc(&self, id: &DocumentId) -> Option<&DocState> {
        self.docs.get(id)
    }

    /// The hub's automerge-repo peer id.
    pub fn peer_id(&self) -> &PeerId {
        &self.config.peer_id
    }

    /// Connections open.
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    fn authority(&self) -> Authority {
        Authority::new(
            self.config.agent.clone(),
            self.config.policy.clone(),
            self.config.roles.clone(),
        )
    }

    /// Handles one input at `now_ms`.
    pub fn handle(&mut self, now_ms: i64, input: Input) -> Effects {
        self.handle_batch(now_ms, [input])
    }

    /// Handles inputs that arrived together, then answers: every sync message is merged
    /// (and committed) first, and each peer of a list gets one message with all of it —
    /// under load, one fan-out per batch instead of one per write. The senders are
    /// answered first, in order.
    pub fn handle_batch(
        &mut self,
        now_ms: i64,
        inputs: impl IntoIterator<Item = Input>,
    ) -> Effects {
        self.handle_batch_deferring(now_ms, inputs, false)
    }

    /// [`HubCore::handle_batch`] for a runtime that has `more_waiting` inputs queued
    /// behind these: then, if the batch holds [`FANOUT_DEFER_WRITERS_MIN`] writes or
    /// more, the news of a list that changed goes to its other peers with a later
    /// batch's (one fan-out for several batches), at most
    /// [`FANOUT_DEFER_MAX_MS`] after the first of them, and at the latest with the first
    /// batch after which nothing waits. The senders are answered at once (their writes'
    /// acknowledgements are not deferred). A hub that is keeping up never defers; one
    /// that is not fans out less often instead of falling further behind (each fan-out
    /// costs a message and an acknowledgement per peer).
    pub fn handle_batch_deferring(
        &mut self,
        now_ms: i64,
        inputs: impl IntoIterator<Item = Input>,
        more_waiting: bool,
    ) -> Effects {
        let mut fx = Effects::default();
        self.clock_ms = now_ms;
        for input in inputs {
            self.input(now_ms, input, &mut fx);
        }
        self.sweep_called(now_ms);
        self.check_presence(now_ms, &mut fx);
        self.roll_up_due(now_ms, &mut fx);
        self.flush_summaries(now_ms, false, &mut fx);
        fx.window_changes_freed += self.forget_quiet_windows(now_ms);
        // One write in the batch is a hub keeping up with its writers (what waits is the
        // acknowledgements of its last fan-out): its news goes out at once.
        let writers: usize = self
            .owed
            .values()
            .map(|o| o.sent.values().filter(|s| s.brought).count())
            .sum();
        let defer = more_waiting && writers >= FANOUT_DEFER_WRITERS_MIN;
        self.answer(now_ms, defer, &mut fx);
        self.check_waits(now_ms, &mut fx);
        fx
    }

    /// Whether some list's news or events wait for a later batch (see
    /// [`HubCore::handle_batch_deferring`]): a runtime whose queue runs dry sends
    /// [`Input::Tick`].
    pub fn deferred(&self) -> bool {
        !self.news.is_empty() || !self.durable.is_empty()
    }

    /// What the store did with `fx.commits` (taken out of `fx`), at `at_ms`: the events
    /// of durable commits go out — in `fx.events`, once no list's news waits or the
    /// oldest has waited [`FANOUT_DEFER_MAX_MS`]. A commit the store refused isolates its
    /// list: nothing of it is durable, so its peers get no more of `fx` but a close
    /// (1011 `list_refused`; they reconnect, and the list is loaded as stored; 1012
    /// `list_moved` when another hub of the cluster took the list), and every other
    /// list is served as usual. A commit without an answer counts as
    /// refused.
    pub fn committed(&mut self, at_ms: i64, fx: &mut Effects, stored: Vec<Stored>) {
        let mut stored = stored.into_iter();
        for mut commit in std::mem::take(&mut fx.commits) {
            let answers = std::mem::take(&mut commit.answers);
            match stored.next() {
                Some(Stored::Durable(seqs)) => {
                    fx.answers.extend(answers);
                    if !commit.events.is_empty() {
                        self.durable.push((commit, seqs, at_ms));
                    }
                }
                refused => {
                    let (code, why, message) = match refused {
                        Some(Stored::Elsewhere(why)) => (
                            crate::proto::ErrorCode::ListElsewhere,
                            why.clone(),
                            format!("this hub can no longer write the list ({why}); nothing of it is kept: try again"),
                        ),
                        other => {
                            let why = match other {
                                Some(Stored::Refused(why)) => why,
                                _ => "the store gave no answer for it".to_owned(),
                            };
                            let message = format!("the store refused this change ({why}); nothing of it is kept: try again");
                            (crate::proto::ErrorCode::Internal, why, message)
                        }
                    };
                    fx.answers.extend(answers.into_iter().map(|(id, _)| {
                        (
                            id,
                            Err(crate::proto::ApiError {
                                code,
                                field: None,
                                allowed: Vec::new(),
                                message: message.clone(),
                                current: None,
                            }),
                        )
                    }));
                    let moved = matches!(code, crate::proto::ErrorCode::ListElsewhere);
                    let closed = self.isolate(commit.doc, &why, moved, fx);
                    fx.sends.retain(|(c, _)| !closed.contains(c));
                    fx.relays.retain(|(c, _)| !closed.contains(c));
                    fx.compactions.retain(|c| c.doc != commit.doc);
                }
            }
        }
        let waited = self
            .durable
            .first()
            .is_some_and(|(_, _, at)| at_ms - at >= FANOUT_DEFER_MAX_MS);
        if !self.durable.is_empty() && (self.news.is_empty() || waited) {
            let durable = std::mem::take(&mut self.durable);
            fx.events
                .extend(event_frames(&self.config.peer_id, &durable, |c, body| {
                    self.conns
                        .get(&c)
                        .is_some_and(|conn| conn.events.wants(body))
                }));
        }
    }

    fn input(&mut self, now_ms: i64, input: Input, fx: &mut Effects) {
        match input {
            Input::Connected(c) => {
                self.conns.insert(
                    c,
                    Conn {
                        state: ConnState::Handshake,
                        docs: BTreeSet::new(),
                        work: WorkBudget::new(now_ms, self.config.sync_work),
                        identity: None,
                        events: EventKinds::DEFAULT,
                        relay: RelayBudget::new(now_ms),
                        address: None,
                    },
                );
            }
            Input::Address(c, address) => {
                if let Some(conn) = self.conns.get_mut(&c) {
                    conn.address = Some(address);
                }
            }
            Input::Subscribed(c, kinds) => {
                if let Some(conn) = self.conns.get_mut(&c) {
                    conn.events = kinds;
                }
            }
            Input::Identified(c, who) => {
                if let Some(conn) = self.conns.get_mut(&c) {
                    tracing::debug!(conn = c.0, agent = %who.agent, role = ?who.role, "identified");
                    conn.identity = Some(who);
                }
            }
            Input::Disconnected(c) => self.drop_conn(c),
            Input::Frame(c, bytes) => self.frame(now_ms, c, &bytes, fx),
            Input::Tick => {}
            Input::Links(links) => self.set_links(links),
            Input::SubListCounts(doc, counts) => self.sub_list_counted(doc, counts),
            Input::Call {
                id,
                caller,
                list,
                call,
            } => self.call(now_ms, id, caller, &list, call, fx),
        }
    }

    /// Forgets a connection; a list it was the last peer of leaves memory (what it
    /// holds is in the store, or in this batch's commits, performed before any load; an
    /// empty list a peer only named was never stored and is gone).
    fn drop_conn(&mut self, c: ConnId) {
        if let Some(conn) = self.conns.remove(&c) {
            for d in conn.docs {
                if let Some(doc) = self.docs.get_mut(&d) {
                    doc.peers.remove(&c);
                    if doc.presence.disconnect(c, self.clock_ms) {
                        self.presence_dirty.insert(d);
                    }
                    self.let_go(d);
                }
            }
        }
    }

    fn fail(&mut self, c: ConnId, code: u16, reason: &str, message: String, fx: &mut Effects) {
        tracing::info!(conn = c.0, reason, %message, "closing connection");
        fx.closes.push((
            c,
            Close {
                code,
                reason: reason.to_owned(),
                message: Some(message),
            },
        ));
        self.drop_conn(c);
    }
}

impl HubConfig {
    /// The default configuration for a hub writing repairs as `actor`.
    pub fn new(actor: ActorId) -> HubConfig {
        let peer_id = PeerId::new(format!("swarmtodo-hub-{}", actor.to_hex_string()))
            .unwrap_or_else(|_| unreachable_peer_id());
        HubConfig {
            peer_id,
            actor,
            agent: HUB_AGENT.to_owned(),
            policy: Policy::default(),
            roles: Roles::default(),
            sync_limits: syncmsg::Limits::default(),
            sync_work: (SYNC_WORK_BURST, SYNC_WORK_PER_SECOND),
            list_creations: (LIST_CREATIONS_BURST, LIST_CREATIONS_PER_MINUTE),
            every_list_stored: false,
        }
    }
}

#[allow(clippy::expect_used)] // "swarmtodo-hub" is a valid peer id: non-empty, short, no control characters.
fn unreachable_peer_id() -> PeerId {
    PeerId::new("swarmtodo-hub").expect("a constant, valid peer id")
}
