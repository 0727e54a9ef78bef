//! The hub's sans-I/O core: automerge-repo messages in, effects out.
//!
//! [`HubCore::handle`] takes one input (a connection opened, a frame received, a
//! connection closed, a tick when the runtime is idle) and the current time, and
//! returns [`Effects`]: what to make durable, then what to send and whom to close. One
//! driver (`swarmtodo_store::persist::perform`, used by the server and the simulator)
//! performs them in that order and tells the core what became durable
//! ([`HubCore::committed`]), which then releases the events of those commits — so no
//! peer receives a change or an event before it is durable, and no peer sees a state the
//! authority's repair would change: the repair is made inside the same `handle` call,
//! before any sync message is generated.
//!
//! Every peer byte is validated before Automerge sees it (`wire::decode`,
//! `syncmsg::validate`), and a bad frame affects only its connection.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use automerge::{sync, ActorId, Automerge, ChangeHash};

use crate::authority::{Authority, Policy, Roles};
use crate::model::sync::SentIndex;
use crate::model::{normalize, ChangeInfo, Merge, TodoList};
use crate::proto::wire::{self, DocumentId, PeerId, PeerMetadata, WireMessage};
use crate::proto::{EventBody, TaskChange};
use crate::syncmsg;

/// The agent id the hub's repairs are recorded under.
pub const HUB_AGENT: &str = "swarmtodo-hub";

/// The automerge-repo protocol version the hub speaks (the wire codec's).
pub use crate::proto::wire::PROTOCOL_VERSION;
/// Most documents one connection may sync at once.
pub const DOCS_PER_CONN_MAX: usize = 1_024;
/// Most lists one hub has, stored or being created: a creation past it is refused with
/// `docs_limit` (the store and the hub's set of list ids grow with it).
pub const DOCS_MAX: usize = 100_000;
/// Lists one identity (a token's agent; without a token, a remote address) may create
/// at once, before [`LIST_CREATIONS_PER_MINUTE`] paces it: a list in memory costs the
/// hub tens of KiB even empty, and the per-connection bound ([`DOCS_PER_CONN_MAX`])
/// starts over with each connection. A creation past it is refused with
/// `list_creation_rate`. A swarm creates a few lists per task, not hundreds a minute.
pub const LIST_CREATIONS_BURST: u32 = 100;
/// Lists one identity may create per minute once its burst is spent (see
/// [`LIST_CREATIONS_BURST`]).
pub const LIST_CREATIONS_PER_MINUTE: u32 = 60;
/// Identities whose creation budget the hub remembers; past it, those whose budget is
/// full again are forgotten (a full budget is what a new identity gets).
const CREATORS_KEPT_MAX: usize = 10_000;
/// Bytes of frames that may wait for one list to be loaded from the store (its peers'
/// first requests, and what they send meanwhile): a load of a long list takes a while,
/// and what waits is held in memory. A frame past it closes its connection with 1013
/// `list_loading` (reconnect in a moment). Requests are small: hundreds of peers
/// coming back at once fit.
pub const LOAD_WAITING_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Incremental changes stored for a list before the hub compacts it into a snapshot
/// (loading then costs one snapshot plus at most this many changes), or
/// [`COMPACT_AFTER_GROWTH_PERCENT`] of its changes if that is more.
pub const COMPACT_AFTER_CHANGES: usize = 1_000;
/// Growth, in percent of its changes, after which a long list is compacted (see
/// [`COMPACT_AFTER_CHANGES`]): a snapshot is a save of the whole list, so with a fixed
/// count a longer history made every write dearer — at 60,000 changes and 2,000
/// writes/s, two whole-list saves a second on the hub task. Loading a list then costs
/// its snapshot plus at most a tenth more.
pub const COMPACT_AFTER_GROWTH_PERCENT: usize = 10;
/// Growth, in percent of its changes, after which a list's document in memory is rebuilt
/// from the snapshot the hub is storing anyway (`TodoList::save_and_compact`). A
/// document grown change by change holds several times the memory of the same document
/// loaded (a 1,000-task list grown from 50,000 to 60,000 changes: 24 MiB more, 21.5 of
/// them given back by the rebuild; `examples/list_memory.rs`). The rebuild costs a load,
/// about 3.4 µs per change of history on the hub task (200 ms at 60,000 changes), so it
/// runs only after growth by this share: about 14 µs per change, amortised.
pub const REBUILD_AFTER_GROWTH_PERCENT: usize = 25;

/// History work one connection may make the hub do before it must wait, in units: a
/// sync step the recent-changes window cannot answer (a fresh peer that needs the
/// whole list, a peer far behind, a sync that lost a message and starts over) walks the
/// list's history and costs [`CHANGE_WORK_UNITS`] per change plus one per op of the
/// list. A step is allowed while the budget is positive (so any peer can make its first
/// full sync of even the largest list) and may leave it in debt, which time repays.
/// One unit is about 10 ns of hub time (release build, this 2-core machine: a
/// whole-history step costs ≈1 µs per change), so the burst is ≈0.5 s of hub time.
pub const SYNC_WORK_BURST: i64 = 50_000_000;
/// Work units a connection earns back per second: ≈5 % of one core.
pub const SYNC_WORK_PER_SECOND: i64 = 5_000_000;
/// Work units one change of the history costs a stock sync step (automerge rebuilds
/// each change it sends from its op columns: ~100× the cost of an op).
pub const CHANGE_WORK_UNITS: i64 = 100;

/// Bytes of `ephemeral` messages one connection may have relayed per second, on
/// average: presence and cursors are a few small messages a second, and each relayed byte
/// costs the hub a copy per peer of the list (at 100 peers, 6.4 MB/s of output for one
/// sender at this rate). Over it, the messages are dropped, not relayed.
pub const EPHEMERAL_BYTES_PER_SECOND: i64 = 64 * 1024;
/// … in bursts up to this many bytes.
pub const EPHEMERAL_BURST_BYTES: i64 = 256 * 1024;
/// `ephemeral` messages one connection may have relayed per second, on average (each
/// costs a frame per peer of the list whatever its size).
pub const EPHEMERAL_MESSAGES_PER_SECOND: i64 = 50;
/// … in bursts up to this many messages.
pub const EPHEMERAL_BURST_MESSAGES: i64 = 100;

/// A connection, as the runtime numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

/// Why a connection is closed (a WebSocket close code and a stable reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    /// WebSocket close code: 1002 protocol error, 1008 policy, 1009 too big, 1011 internal.
    pub code: u16,
    /// Stable reason code (e.g. `malformed`, `sync_invalid`, `handshake`).
    pub reason: String,
    /// An `error` message to send just before the close frame, saying what to do.
    pub message: Option<String>,
}

/// Who a connection is, from the token it presented (docs/DESIGN.md §7).
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Nothing else waits: what a busy moment deferred (news, events) goes out now. The
    /// runtime sends it when its queue runs dry while [`HubCore::deferred`] holds.
    Tick,
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
    /// What it may still have relayed (see [`EPHEMERAL_BYTES_PER_SECOND`]).
    relay: RelayBudget,
    /// Where it comes from, when the runtime said.
    address: Option<std::net::IpAddr>,
}

/// What [`RelayBudget::take`] decides for one `ephemeral` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Within the budget: relay it.
    Pass,
    /// Over it: drop it.
    Drop,
    /// Over it by a whole burst more (in bytes or messages): the sender keeps flooding
    /// after its messages were dropped; close it (`ephemeral_rate`).
    Close,
}

/// Token buckets of relayed `ephemeral` bytes and messages, in thousandths (so that a
/// millisecond's refill is not rounded away).
#[derive(Debug)]
struct RelayBudget {
    milli_bytes: i64,
    milli_messages: i64,
    at_ms: i64,
}

impl RelayBudget {
    fn new(now_ms: i64) -> RelayBudget {
        RelayBudget {
            milli_bytes: EPHEMERAL_BURST_BYTES * 1_000,
            milli_messages: EPHEMERAL_BURST_MESSAGES * 1_000,
            at_ms: now_ms,
        }
    }

    /// Refills for the time since the last call, then takes a message of `bytes`: it is
    /// relayed while both buckets hold enough; a dropped message is charged too (a
    /// debt time repays), and a debt past a whole burst closes the sender.
    fn take(&mut self, now_ms: i64, bytes: usize) -> Verdict {
        let elapsed = now_ms.saturating_sub(self.at_ms).max(0);
        self.at_ms = self.at_ms.max(now_ms);
        self.milli_bytes = self
            .milli_bytes
            .saturating_add(elapsed.saturating_mul(EPHEMERAL_BYTES_PER_SECOND))
            .min(EPHEMERAL_BURST_BYTES * 1_000);
        self.milli_messages = self
            .milli_messages
            .saturating_add(elapsed.saturating_mul(EPHEMERAL_MESSAGES_PER_SECOND))
            .min(EPHEMERAL_BURST_MESSAGES * 1_000);
        let cost = i64::try_from(bytes)
            .unwrap_or(i64::MAX)
            .saturating_mul(1_000);
        let fits = self.milli_bytes >= cost && self.milli_messages >= 1_000;
        self.milli_bytes = self.milli_bytes.saturating_sub(cost);
        self.milli_messages = self.milli_messages.saturating_sub(1_000);
        if fits {
            Verdict::Pass
        } else if self.milli_bytes < -EPHEMERAL_BURST_BYTES * 1_000
            || self.milli_messages < -EPHEMERAL_BURST_MESSAGES * 1_000
        {
            Verdict::Close
        } else {
            Verdict::Drop
        }
    }
}

/// A change refused because its actor belongs to someone else (see `HubCore::actors`).
#[derive(Debug)]
struct Forged {
    change: ChangeHash,
    actor: ActorId,
    /// Whose it is, for the message ("agent \"lead\"", "the hub").
    owner: String,
}

/// Whom a list creation is counted against (see [`LIST_CREATIONS_BURST`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Creator {
    /// A token's agent.
    Agent(String),
    /// A connection without a token, by its remote address.
    Address(std::net::IpAddr),
    /// A connection the runtime said nothing about (the simulation).
    Unknown,
}

/// A token bucket of list creations (see [`LIST_CREATIONS_BURST`]), in 1/60,000ths
/// of a creation so that a refill per millisecond is exact.
#[derive(Debug)]
struct CreationBudget {
    scaled: u64,
    at_ms: i64,
}

impl CreationBudget {
    const SCALE: u64 = 60_000;

    fn full((burst, _): (u32, u32), now_ms: i64) -> CreationBudget {
        CreationBudget {
            scaled: u64::from(burst) * Self::SCALE,
            at_ms: now_ms,
        }
    }

    fn refill(&mut self, now_ms: i64, (burst, per_minute): (u32, u32)) -> bool {
        let elapsed = u64::try_from(now_ms.saturating_sub(self.at_ms)).unwrap_or(0);
        let cap = u64::from(burst) * Self::SCALE;
        self.scaled = self
            .scaled
            .saturating_add(elapsed.saturating_mul(u64::from(per_minute)))
            .min(cap);
        self.at_ms = self.at_ms.max(now_ms);
        self.scaled >= cap
    }

    /// Takes one creation; false when none is left.
    fn take(&mut self, now_ms: i64, limits: (u32, u32)) -> bool {
        self.refill(now_ms, limits);
        if self.scaled < Self::SCALE {
            return false;
        }
        self.scaled -= Self::SCALE;
        true
    }
}

/// A token bucket of history work (see [`SYNC_WORK_BURST`]).
#[derive(Debug)]
struct WorkBudget {
    units: i64,
    at_ms: i64,
}

impl WorkBudget {
    fn new(now_ms: i64, (burst, _): (i64, i64)) -> WorkBudget {
        WorkBudget {
            units: burst,
            at_ms: now_ms,
        }
    }

    /// Refills for the time since the last call, then takes `cost` units if the budget
    /// is positive (it may go into debt); false when it is not.
    fn take(&mut self, now_ms: i64, cost: i64, (burst, per_second): (i64, i64)) -> bool {
        let elapsed = now_ms.saturating_sub(self.at_ms).max(0);
        self.units = self
            .units
            .saturating_add(elapsed.saturating_mul(per_second) / 1_000)
            .min(burst);
        self.at_ms = self.at_ms.max(now_ms);
        if self.units <= 0 {
            return false;
        }
        self.units = self.units.saturating_sub(cost);
        true
    }
}

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
}

/// Frames waiting for a list to load (connection, bytes), and their bytes in all.
type Waiting = (Vec<(ConnId, Vec<u8>)>, usize);

/// How long a busy hub may hold a list's news for its other peers to send it with a
/// later batch's (see [`HubCore::handle_batch_deferring`]).
pub const FANOUT_DEFER_MAX_MS: i64 = 20;

/// Writes (frames that changed a list) a batch must hold, with more input waiting, for
/// the hub to count as behind and defer news: a batch of one write is what a hub that
/// keeps up sees (one agent at a time), and deferring there only adds latency.
pub const FANOUT_DEFER_WRITERS_MIN: usize = 2;

/// Sync messages a busy hub sends a peer that has not shown it has the first of them
/// yet (its heads do not cover the list as it was when that one left); news for it waits
/// beyond that, and goes in one message when its heads catch up, when it writes (a
/// writer is answered at once), or when the hub's queue runs dry (see
/// [`HubCore::handle_batch_deferring`]). Under overload a lagging peer otherwise gets a
/// message per fan-out, each costing the hub what the peer lags by, and answers each.
pub const FANOUT_UNACKED_MAX: usize = 4;

/// A peer is held back by [`FANOUT_UNACKED_MAX`] only while it spoke this recently: a
/// peer behind a busy hub keeps sending (its answers, its writes), while one that has
/// everything may have nothing to answer a message that only named heads it had.
pub const FANOUT_HOLD_HEARD_MAX_MS: i64 = 1_000;

/// Window positions remembered per peer for [`FANOUT_UNACKED_MAX`] (the oldest go
/// beyond this: a peer past the limit is held anyway).
const UNACKED_KEPT_MAX: usize = 64;

/// What the last peers of a list got in one round of answers, for the next.
#[derive(Debug, Default)]
struct FanOut {
    /// The last generation for a peer that only hears the news.
    generated: Option<Generated>,
    /// The last sync message made, and its frame for any peer.
    encoded: Option<(sync::Message, wire::ToEach)>,
}

/// One generation of a sync message: the peer's state before and after, and the frame
/// it made (if any), for any peer.
#[derive(Debug)]
struct Generated {
    before: sync::State,
    heard_at: u64,
    after: sync::State,
    after_sent: SentIndex,
    frame: Option<wire::ToEach>,
    /// The message was cut (see `Peer::catching_up`).
    cut: bool,
}

/// Who is owed a sync message about one list after a batch of inputs.
#[derive(Debug, Default)]
struct Owed {
    /// The connections that sent sync messages, in the order they first did.
    senders: Vec<ConnId>,
    /// What each sender's messages did.
    sent: BTreeMap<ConnId, Sent>,
    /// The list changed: every peer is owed the news.
    moved: bool,
}

/// What one peer's sync messages of a batch did.
#[derive(Debug, Default)]
struct Sent {
    /// Stock sync steps they cost (charged with the answer's to its work budget).
    steps: u64,
    /// They changed the list.
    brought: bool,
    /// The peer was catching up (`Peer::catching_up`): they answer a message the hub
    /// cut, and the history work of this round trip is the hub's own doing (a peer
    /// far behind the window costs stock steps on every part), not charged.
    continues: bool,
}

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
            waiting: BTreeMap::new(),
            creators: BTreeMap::new(),
            durable: Vec::new(),
        }
    }

    /// Tells the core which lists the store holds (at start: they are loaded when a
    /// peer asks for them).
    pub fn set_stored(&mut self, ids: impl IntoIterator<Item = DocumentId>) {
        self.stored.extend(ids);
    }

    /// Lists in the store (or committed by effects handed out).
    pub fn stored_count(&self) -> usize {
        self.stored.len()
    }

    /// Lists in memory (those some peer syncs).
    pub fn doc_count(&self) -> usize {
        self.docs.len()
    }

    /// A list the runtime loaded for [`Effects::loads`] (`None`: the store has nothing
    /// for it), with the authority's reported keys; handles the frames that waited for
    /// it and returns what they cause.
    pub fn loaded(&mut self, now_ms: i64, id: DocumentId, loaded: Option<StoredList>) -> Effects {
        match loaded {
            Some(l) if !self.docs.contains_key(&id) => {
                self.insert_list(id, l.list, l.reported);
                if let Some(d) = self.docs.get_mut(&id) {
                    d.since_compaction = l.since_compaction;
                }
            }
            Some(_) => {}
            None => {
                self.stored.remove(&id);
            }
        }
        let mut fx = Effects::default();
        for (c, bytes) in self.waiting.remove(&id).unwrap_or_default().0 {
            self.frame(now_ms, c, &bytes, &mut fx);
        }
        self.answer(now_ms, false, &mut fx);
        // The peers that asked for it may have left while it loaded: then nobody syncs
        // it, and it leaves memory again.
        if self.docs.get(&id).is_some_and(|d| d.peers.is_empty()) {
            self.docs.remove(&id);
            self.news.remove(&id);
        }
        fx
    }

    /// Puts a list in memory before any peer asked for it, with the authority's reported
    /// keys, as a load would (tests and benchmarks start from a list this way; a runtime
    /// loads through [`Effects::loads`] and [`HubCore::loaded`]).
    pub fn load_doc(&mut self, id: DocumentId, doc: Automerge, reported: Vec<String>) {
        let list = TodoList::from_doc(doc.with_actor(self.config.actor.clone()));
        self.insert_list(id, list, reported);
    }

    /// The actor of the hub's own changes (a list loaded for it writes as this).
    pub fn actor(&self) -> &ActorId {
        &self.config.actor
    }

    fn insert_list(&mut self, id: DocumentId, list: TodoList, reported: Vec<String>) {
        self.stored.insert(id);
        let authority = self.authority().with_reported(reported);
        let changes_at_rebuild = change_count(&list);
        self.docs.insert(
            id,
            DocState {
                list,
                authority,
                peers: BTreeMap::new(),
                since_compaction: 0,
                changes_at_rebuild,
                notify: Arc::from([]),
            },
        );
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
        for input in inputs {
            self.input(now_ms, input, &mut fx);
        }
        // One write in the batch is a hub keeping up with its writers (what waits is the
        // acknowledgements of its last fan-out): its news goes out at once.
        let writers: usize = self
            .owed
            .values()
            .map(|o| o.sent.values().filter(|s| s.brought).count())
            .sum();
        let defer = more_waiting && writers >= FANOUT_DEFER_WRITERS_MIN;
        self.answer(now_ms, defer, &mut fx);
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
    /// (1011 `list_refused`; they reconnect, and the list is loaded as stored), and
    /// every other list is served as usual. A commit without an answer counts as
    /// refused.
    pub fn committed(&mut self, at_ms: i64, fx: &mut Effects, stored: Vec<Stored>) {
        let mut stored = stored.into_iter();
        for commit in std::mem::take(&mut fx.commits) {
            match stored.next() {
                Some(Stored::Durable(seqs)) => {
                    if !commit.events.is_empty() {
                        self.durable.push((commit, seqs, at_ms));
                    }
                }
                refused => {
                    let why = match refused {
                        Some(Stored::Refused(why)) => why,
                        _ => "the store gave no answer for it".to_owned(),
                    };
                    let closed = self.isolate(commit.doc, &why, fx);
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
                .extend(event_frames(&self.config.peer_id, &durable));
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
            Input::Identified(c, who) => {
                if let Some(conn) = self.conns.get_mut(&c) {
                    tracing::debug!(conn = c.0, agent = %who.agent, role = ?who.role, "identified");
                    conn.identity = Some(who);
                }
            }
            Input::Disconnected(c) => self.drop_conn(c),
            Input::Frame(c, bytes) => self.frame(now_ms, c, &bytes, fx),
            Input::Tick => {}
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
                    if doc.peers.is_empty() {
                        self.docs.remove(&d);
                        self.news.remove(&d);
                        tracing::debug!(doc = %d, in_memory = self.docs.len(), "list out of memory: no peer syncs it");
                    }
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

    fn frame(&mut self, now_ms: i64, c: ConnId, bytes: &[u8], fx: &mut Effects) {
        let Some(conn) = self.conns.get(&c) else {
            return;
        };
        let msg = match wire::decode(bytes) {
            Ok(m) => m,
            Err(e) => {
                let code = if e.code() == "message_too_large" {
                    1009
                } else {
                    1002
                };
                return self.fail(c, code, e.code(), format!("bad message: {e}"), fx);
            }
        };
        let remote = match (&conn.state, msg) {
            (
                ConnState::Handshake,
                WireMessage::Join {
                    sender_id,
                    supported_protocol_versions,
                    ..
                },
            ) => {
                // Absent: an old client, which speaks "1".
                let speaks = supported_protocol_versions
                    .as_ref()
                    .is_none_or(|vs| vs.iter().any(|v| v == PROTOCOL_VERSION));
                if !speaks {
                    return self.fail(
                        c,
                        1002,
                        "protocol_version",
                        format!(
                            "no supported protocol version in {supported_protocol_versions:?}; this hub speaks {PROTOCOL_VERSION:?}"
                        ),
                        fx,
                    );
                }
                let reply = WireMessage::Peer {
                    sender_id: self.config.peer_id.clone(),
                    selected_protocol_version: PROTOCOL_VERSION.to_owned(),
                    target_id: sender_id.clone(),
                    peer_metadata: Some(PeerMetadata {
                        storage_id: None,
                        is_ephemeral: false,
                    }),
                };
                fx.sends.push((c, wire::encode(&reply)));
                if let Some(conn) = self.conns.get_mut(&c) {
                    conn.state = ConnState::Ready(sender_id);
                }
                return;
            }
            (ConnState::Handshake, _) => {
                return self.fail(c, 1002, "handshake", "send join first".to_owned(), fx)
            }
            (ConnState::Ready(remote), msg) => (remote.clone(), msg),
        };
        let (remote, msg) = remote;
        // A peer speaks only as itself: a relay carries the connection's own peer id,
        // and a frame that names another sender (the hub's, another peer's) is refused.
        if let Some(claimed) = msg.sender_id().filter(|s| **s != remote) {
            return self.fail(
                c,
                1008,
                "sender_mismatch",
                format!(
                    "this connection joined as {remote:?} but sent a message as {claimed:?}: send every message with your own peer id"
                ),
                fx,
            );
        }
        // A frame for a stored list not in memory waits for it to load (a sync or
        // request starts the load; an ephemeral message is only relayed to the list's
        // peers, so it waits only behind a load under way, to keep its order).
        let target = match &msg {
            WireMessage::Request { document_id, .. } | WireMessage::Sync { document_id, .. } => {
                Some((*document_id, true))
            }
            WireMessage::Ephemeral { document_id, .. } => Some((*document_id, false)),
            _ => None,
        };
        if let Some((doc, syncs)) = target {
            let loading = self.waiting.contains_key(&doc);
            if !self.docs.contains_key(&doc) && (loading || syncs && self.stored.contains(&doc)) {
                let waiting = self.waiting.entry(doc).or_default();
                if waiting.0.is_empty() {
                    fx.loads.push(doc);
                }
                if waiting.1 + bytes.len() > LOAD_WAITING_BYTES_MAX {
                    return self.fail(
                        c,
                        1013,
                        "list_loading",
                        "the list is being loaded and too much waits for it already: reconnect in a moment".to_owned(),
                        fx,
                    );
                }
                waiting.1 += bytes.len();
                waiting.0.push((c, bytes.to_vec()));
                return;
            }
        }
        match msg {
            WireMessage::Request {
                document_id, data, ..
            } => self.sync(now_ms, c, &remote, document_id, &data, true, fx),
            WireMessage::Sync {
                document_id, data, ..
            } => self.sync(now_ms, c, &remote, document_id, &data, false, fx),
            WireMessage::Leave { .. } => fx.closes.push((
                c,
                Close {
                    code: 1000,
                    reason: "leave".to_owned(),
                    message: None,
                },
            )),
            WireMessage::Ephemeral {
                document_id,
                count,
                session_id,
                data,
                ..
            } => {
                // Only the hub speaks in its event session: a peer's message there would
                // pass for the hub's events.
                if session_id == EVENTS_SESSION {
                    return self.fail(
                        c,
                        1008,
                        "events_session",
                        format!(
                            "only the hub sends in the {EVENTS_SESSION:?} session: use a session id of your own"
                        ),
                        fx,
                    );
                }
                // Relayed only from a peer that syncs the list and may write it.
                let Some(conn) = self.conns.get(&c) else {
                    return;
                };
                if !conn.docs.contains(&document_id) {
                    fx.sends.push((
                        c,
                        wire::encode(&WireMessage::Error {
                            sender_id: Some(self.config.peer_id.clone()),
                            target_id: Some(remote),
                            message: format!(
                                "ephemeral_not_syncing: your ephemeral message for {document_id} was not relayed: sync the list (request or sync it) before sending to its peers"
                            ),
                        }),
                    ));
                    return;
                }
                let observer = conn.identity.as_ref().is_some_and(|who| {
                    who.role_in(&document_id) == crate::authority::Role::Observer
                });
                if observer {
                    return self.fail(
                        c,
                        1008,
                        "read_only",
                        "this token is an observer's: it may read lists, not send to their peers"
                            .to_owned(),
                        fx,
                    );
                }
                // Each sender's relays are rate-limited before the fan-out.
                let verdict = match self.conns.get_mut(&c) {
                    Some(conn) => conn.relay.take(now_ms, data.len()),
                    None => return,
                };
                match verdict {
                    Verdict::Pass => {}
                    Verdict::Drop => {
                        tracing::debug!(conn = c.0, "ephemeral message over the rate: dropped");
                        return;
                    }
                    Verdict::Close => {
                        return self.fail(
                            c,
                            1008,
                            "ephemeral_rate",
                            format!(
                                "more ephemeral messages than the hub relays ({EPHEMERAL_MESSAGES_PER_SECOND}/s, {} KiB/s on average, bursts of {EPHEMERAL_BURST_MESSAGES} or {} KiB): send fewer or smaller ones, and reconnect later",
                                EPHEMERAL_BYTES_PER_SECOND / 1024,
                                EPHEMERAL_BURST_BYTES / 1024
                            ),
                            fx,
                        );
                    }
                }
                // Relayed as is to the others syncing the list; never stored.
                if let Some(doc) = self.docs.get(&document_id) {
                    // Encoded once for every other peer (the target id is cut out).
                    let m = WireMessage::Ephemeral {
                        target_id: remote.clone(),
                        sender_id: remote,
                        count,
                        session_id,
                        document_id,
                        data,
                    };
                    let Some(each) = wire::ToEach::new(&m) else {
                        return;
                    };
                    for (&other, _) in doc.peers.iter().filter(|(o, _)| **o != c) {
                        if let Some(Conn {
                            state: ConnState::Ready(target),
                            ..
                        }) = self.conns.get(&other)
                        {
                            fx.relays.push((other, each.to(target)));
                        }
                    }
                }
            }
            WireMessage::Join { .. } | WireMessage::Peer { .. } => {
                self.fail(c, 1002, "handshake", "the handshake is over".to_owned(), fx)
            }
            WireMessage::Error { message, .. } => {
                tracing::warn!(conn = c.0, %message, "peer reported an error");
            }
            WireMessage::DocUnavailable { .. }
            | WireMessage::RemoteSubscriptionChange { .. }
            | WireMessage::RemoteHeadsChanged { .. } => {}
        }
    }

    #[allow(clippy::too_many_arguments)] // One message's fields; a struct would only rename them.
    fn sync(
        &mut self,
        now_ms: i64,
        c: ConnId,
        remote: &PeerId,
        doc_id: DocumentId,
        data: &[u8],
        is_request: bool,
        fx: &mut Effects,
    ) {
        let message = match syncmsg::validate(data, &self.config.sync_limits) {
            Ok(checked) => checked.into_message(),
            Err(e) => {
                return self.fail(c, 1008, e.code(), format!("bad sync message: {e}"), fx);
            }
        };
        let identity = self
            .conns
            .get(&c)
            .and_then(|conn| conn.identity.clone())
            .map(Arc::new);
        let observer = identity
            .as_ref()
            .is_some_and(|who| who.role_in(&doc_id) == crate::authority::Role::Observer);
        if observer && !message.changes.is_empty() {
            return self.fail(
                c,
                1008,
                "read_only",
                "this token is an observer's: it may read lists, not change them".to_owned(),
                fx,
            );
        }
        let known = self.docs.contains_key(&doc_id);
        if !known && message.heads.is_empty() && message.changes.is_empty() {
            // Nothing here and nothing offered: automerge-repo's "not found". A peer
            // that has the document (heads) gets an empty one to sync into: the
            // hub's answer asks for the changes.
            if is_request {
                fx.sends.push((
                    c,
                    wire::encode(&WireMessage::DocUnavailable {
                        sender_id: self.config.peer_id.clone(),
                        target_id: remote.clone(),
                        document_id: doc_id,
                    }),
                ));
            }
            return;
        }
        // A list this connection does not sync yet counts against its bound, whether
        // the list is new (checked before it is made) or held already.
        if self.conns.get(&c).is_some_and(|conn| {
            !conn.docs.contains(&doc_id) && conn.docs.len() >= DOCS_PER_CONN_MAX
        }) {
            return self.fail(
                c,
                1008,
                "docs_per_conn_limit",
                format!("one connection may sync {DOCS_PER_CONN_MAX} lists at most"),
                fx,
            );
        }
        if !known {
            let fresh = self
                .docs
                .keys()
                .filter(|d| !self.stored.contains(d))
                .count();
            if self.stored.len() + fresh >= DOCS_MAX {
                return self.fail(
                    c,
                    1008,
                    "docs_limit",
                    format!("the hub has {DOCS_MAX} lists already: sync an existing list, or ask the hub's operator for room"),
                    fx,
                );
            }
            if !self.take_creation(now_ms, c) {
                let (burst, per_minute) = self.config.list_creations;
                return self.fail(
                    c,
                    1008,
                    "list_creation_rate",
                    format!("too many new lists: {burst} at once, then {per_minute} a minute per token (or address without one); wait before creating more, or sync lists that exist"),
                    fx,
                );
            }
            let list = TodoList::from_doc(Automerge::new().with_actor(self.config.actor.clone()));
            let authority = self.authority();
            self.docs.insert(
                doc_id,
                DocState {
                    list,
                    authority,
                    peers: BTreeMap::new(),
                    since_compaction: 0,
                    changes_at_rebuild: 0,
                    notify: Arc::from([]),
                },
            );
        }
        if let Some(conn) = self.conns.get_mut(&c) {
            conn.docs.insert(doc_id);
        }
        let brought_earlier = self
            .owed
            .get(&doc_id)
            .and_then(|o| o.sent.get(&c))
            .is_some_and(|s| s.brought);
        let Some(doc) = self.docs.get_mut(&doc_id) else {
            return;
        };
        let actors = &mut self.actors;
        let hub_actor = &self.config.actor;
        let before = doc.list.heads();
        let stock_before = doc.list.sync_counters().stock;
        // Automerge can still panic on a crafted change that passed validation (an op
        // on an object that does not exist). Contain it to this list: drop the list from
        // memory and close its peers; the next peer that asks has it loaded from the
        // store (which holds everything committed; the bad change never was).
        let merged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let peer = doc.peers.entry(c).or_insert_with(|| Peer {
                state: sync::State::new(),
                sent: SentIndex::default(),
                heard_at: 0,
                heard_ms: now_ms,
                unacked: VecDeque::new(),
                catching_up: false,
            });
            let state = &mut peer.state;
            let last_sent = state.last_sent_heads.clone();
            let took_as_known = (brought_earlier && message.changes.is_empty())
                .then(|| message.heads.clone())
                .filter(|heads| !heads.is_empty());
            // A change by an actor that belongs to another agent (or to the hub) is
            // refused before Automerge sees any of the message: once merged it could not
            // be taken out, and the owner's own next change with that sequence number
            // would be refused instead (locking the owner out).
            let mut to_bind: Vec<(ActorId, ChangeHash)> = Vec::new();
            let admitted = doc.list.receive_sync_message_admitting(
                state,
                &mut peer.sent,
                message,
                |fresh| {
                    for change in fresh {
                        let actor = change.actor_id();
                        // The list's first change is the same bytes in every list (see
                        // `TodoList::create`): its actor is nobody's, and never writes
                        // again.
                        let root = actor.to_bytes() == crate::model::ROOT_ACTOR;
                        let owner = if actor == hub_actor {
                            Some("the hub".to_owned())
                        } else if root {
                            (change.seq() > 1)
                                .then(|| "the list's creation (it never writes again)".to_owned())
                        } else {
                            actors
                                .get(actor)
                                .filter(|o| {
                                    identity.as_ref().is_none_or(|who| who.agent != o.agent)
                                })
                                .map(|o| format!("agent {:?}", o.agent))
                        };
                        if let Some(owner) = owner {
                            return Err(Forged {
                                change: change.hash(),
                                actor: actor.clone(),
                                owner,
                            });
                        }
                        if identity.is_some() && !root && !actors.contains_key(actor) {
                            to_bind.push((actor.clone(), change.hash()));
                        }
                    }
                    Ok(())
                },
            )?;
            let mut merge = match admitted {
                Ok(merge) => merge,
                Err(forged) => return Ok(Err(forged)),
            };
            if let Some(who) = &identity {
                for (actor, hash) in to_bind {
                    if doc.list.holds(&hash) {
                        actors.entry(actor).or_insert_with(|| Arc::clone(who));
                    }
                }
            }
            doc.list.settle_their_have(state);
            peer.heard_at = doc.list.window_end();
            peer.heard_ms = now_ms;
            let continues = std::mem::replace(&mut peer.catching_up, false);
            let covered = state
                .their_heads
                .as_deref()
                .and_then(|heads| doc.list.window_covered_by(heads));
            let sent = &mut peer.unacked;
            while sent
                .front()
                .is_some_and(|&at| covered.is_some_and(|c| at <= c))
            {
                sent.pop_front();
            }
            // Positions past the window's end are from before it started over.
            let end = doc.list.window_end();
            sent.retain(|&at| at <= end);
            // Stock sync takes a message without changes whose heads are ours as "the
            // peer knows our heads" and will not name them to it. When an earlier frame
            // of this batch from the same peer brought those heads' changes, the peer
            // has not heard that the hub has them: one answer for both frames must
            // still say so (a client waiting for it would wait forever).
            if took_as_known.is_some_and(|heads| state.last_sent_heads == heads) {
                state.last_sent_heads = last_sent;
            }
            let rejected = std::mem::take(&mut merge.rejected);
            // A token vouches for the writer: the changes of an actor a token brought are
            // its agent's, in its role, whatever agent id the actor registered in the
            // document (changes that waited for dependencies land with another peer's
            // message: each is bound to the identity that brought it).
            for change in &merge.changes {
                if let Some(owner) = actors.get(change.actor()) {
                    if !doc
                        .authority
                        .bind(change.actor(), &owner.agent, owner.role_in(&doc_id))
                    {
                        tracing::warn!(conn = c.0, actor = %change.actor(), agent = %owner.agent, "an actor bound to another role");
                    }
                }
            }
            let commit =
                (!merge.is_empty()).then(|| Self::check_and_repair(doc, doc_id, merge, now_ms));
            Ok::<_, crate::model::ModelError>(Ok((rejected, commit, continues)))
        }));
        let (rejected, commit, continues) = match merged {
            Ok(Ok(Ok(m))) => m,
            Ok(Ok(Err(forged))) => {
                tracing::warn!(conn = c.0, doc = %doc_id, change = %forged.change, actor = %forged.actor, owner = %forged.owner, "a change by another's actor refused");
                return self.fail(
                    c,
                    1008,
                    "actor_forged",
                    format!(
                        "change {} is by actor {}, which belongs to {}: nothing of this message was applied; write with an actor id of your own (a fresh random one per replica) and drop that change",
                        forged.change, forged.actor, forged.owner
                    ),
                    fx,
                );
            }
            Ok(Err(e)) => {
                return self.fail(c, 1008, "sync_refused", format!("sync refused: {e}"), fx);
            }
            Err(_) => {
                tracing::error!(conn = c.0, doc = %doc_id, "automerge panicked on a peer's change; the list leaves memory");
                return self.crashed(c, doc_id, fx);
            }
        };
        if !rejected.is_empty() {
            tracing::warn!(conn = c.0, doc = %doc_id, ?rejected, "changes refused");
        }
        let Some(doc) = self.docs.get_mut(&doc_id) else {
            return;
        };
        if let Some(mut commit) = commit {
            if !commit.events.is_empty() {
                let ready = doc.peers.keys().filter_map(|p| match self.conns.get(p) {
                    Some(Conn {
                        state: ConnState::Ready(id),
                        ..
                    }) => Some((*p, id)),
                    _ => None,
                });
                if !ready.clone().eq(doc.notify.iter().map(|(c, id)| (*c, id))) {
                    doc.notify = ready.map(|(c, id)| (c, id.clone())).collect();
                }
                commit.notify = Arc::clone(&doc.notify);
            }
            tracing::debug!(doc = %doc_id, changes = commit.changes.len(), events = commit.events.len(), "merged");
            doc.since_compaction += commit.changes.len();
            self.stored.insert(doc_id);
            fx.commits.push(commit);
            let compact_after = COMPACT_AFTER_CHANGES
                .max(change_count(&doc.list) * COMPACT_AFTER_GROWTH_PERCENT / 100);
            if doc.since_compaction >= compact_after {
                doc.since_compaction = 0;
                let changes = change_count(&doc.list);
                let grown = changes.saturating_sub(doc.changes_at_rebuild);
                let snapshot =
                    if grown * 100 >= doc.changes_at_rebuild * REBUILD_AFTER_GROWTH_PERCENT {
                        tracing::debug!(doc = %doc_id, changes, "rebuilding the list in memory");
                        doc.changes_at_rebuild = changes;
                        doc.list.save_and_compact()
                    } else {
                        doc.list.save()
                    };
                fx.compactions.push(Compaction {
                    doc: doc_id,
                    snapshot,
                    heads: doc.list.heads(),
                });
            }
        }
        let moved = doc.list.heads() != before;
        let steps = doc.list.sync_counters().stock.saturating_sub(stock_before);
        let owed = self.owed.entry(doc_id).or_default();
        if !owed.sent.contains_key(&c) {
            owed.senders.push(c);
        }
        let sent = owed.sent.entry(c).or_default();
        sent.steps += steps;
        sent.brought |= moved;
        sent.continues |= continues;
        owed.moved |= moved;
    }

    /// Sends what the inputs just handled owe: for each list, the senders first, then
    /// (if it changed) every other peer. Peers that were in step get the same message:
    /// it is encoded once.
    fn answer(&mut self, now_ms: i64, defer: bool, fx: &mut Effects) {
        let mut over_budget = Vec::new();
        let mut owed = std::mem::take(&mut self.owed);
        for (doc_id, o) in &owed {
            if o.moved {
                self.news.entry(*doc_id).or_insert(now_ms);
            }
        }
        // Lists whose news goes out now: all of them, unless deferring (then those
        // whose news has waited long enough).
        let due: Vec<DocumentId> = self
            .news
            .iter()
            .filter(|(_, since)| !defer || now_ms - **since >= FANOUT_DEFER_MAX_MS)
            .map(|(d, _)| *d)
            .collect();
        for d in due {
            self.news.remove(&d);
            owed.entry(d).or_default().moved = true;
        }
        for (doc_id, owed) in owed {
            let Some(doc) = self.docs.get(&doc_id) else {
                self.news.remove(&doc_id);
                continue;
            };
            let mut targets = owed.senders;
            // News owed since this batch or an earlier one; a peer answered as a sender
            // meanwhile gets nothing more unless the list moved since (its state says so).
            // A busy hub holds it from peers FANOUT_UNACKED_MAX messages behind that
            // spoke lately (FANOUT_HOLD_HEARD_MAX_MS). A peer catching up over several
            // messages gets it with the next part, when it answers the last.
            let mut held = false;
            if owed.moved && !self.news.contains_key(&doc_id) {
                for (t, peer) in &doc.peers {
                    if owed.sent.contains_key(t) || peer.catching_up {
                        continue;
                    }
                    if defer
                        && peer.unacked.len() >= FANOUT_UNACKED_MAX
                        && now_ms - peer.heard_ms < FANOUT_HOLD_HEARD_MAX_MS
                    {
                        held = true;
                    } else {
                        targets.push(*t);
                    }
                }
            }
            let mut fan_out = FanOut::default();
            for t in targets {
                let sent = owed.sent.get(&t).map(|s| (s.steps, s.continues));
                if !self.reply(now_ms, doc_id, t, sent, &mut fan_out, fx) {
                    over_budget.push((t, doc_id));
                }
            }
            if held {
                self.news.entry(doc_id).or_insert(now_ms);
            }
            // What the peers still need from the window is looked at when the list
            // moved (the window is consulted when it records a change) or while the
            // window holds more than its size for lagging peers (so that it shrinks
            // once they caught up). Not after every acknowledgement: at 1,000 peers that
            // was a look at every peer for each of the 999 acknowledgements of a write.
            // A floor left from an earlier batch only keeps more than needed, as peers'
            // acknowledgements only move their sets forward.
            if let Some(doc) = self.docs.get_mut(&doc_id) {
                if owed.moved || doc.list.window_len() > crate::model::sync::SYNC_WINDOW_CHANGES {
                    doc.list
                        .keep_window_for(doc.peers.values().map(|p| &p.state));
                }
            }
        }
        for (c, doc_id) in over_budget {
            self.over_budget(c, doc_id, fx);
        }
    }

    /// Generates and queues the sync message for peer `t` of list `doc_id`, if there is
    /// anything to say. `sent`: the stock sync steps the peer's own messages cost, when
    /// this answers them (charged, with this message's, to its work budget, unless they
    /// continue a catch-up: `Sent::continues`); false when that budget is exhausted
    /// (nothing is sent). `fan_out` is what the list's last
    /// peer got, reused when this one is in the same state.
    fn reply(
        &mut self,
        now_ms: i64,
        doc_id: DocumentId,
        t: ConnId,
        sent: Option<(u64, bool)>,
        fan_out: &mut FanOut,
        fx: &mut Effects,
    ) -> bool {
        let Some(doc) = self.docs.get_mut(&doc_id) else {
            return true;
        };
        let Some(Conn {
            state: ConnState::Ready(target_id),
            ..
        }) = self.conns.get(&t)
        else {
            return true;
        };
        let Some(peer) = doc.peers.get_mut(&t) else {
            return true;
        };
        let target_id = target_id.clone();
        let heard_at = peer.heard_at;
        // A peer that only hears the news, in the state the last one was in, gets what
        // it got: generating is a function of the list and the state (the peers of a
        // list in step are all in one state, so one generation serves them all).
        if sent.is_none() {
            if let Some(same) = &fan_out.generated {
                if same.heard_at == heard_at && same.before == peer.state {
                    peer.state.clone_from(&same.after);
                    peer.sent.clone_from(&same.after_sent);
                    if let Some(each) = &same.frame {
                        fx.sends.push((t, each.to(&target_id)));
                        peer.catching_up = same.cut;
                        Self::note_sent(&doc.list, peer);
                    }
                    return true;
                }
            }
        }
        let before = sent.is_none().then(|| peer.state.clone());
        let counted = doc.list.sync_counters();
        let m = doc
            .list
            .generate_sync_message_after(&mut peer.state, &mut peer.sent, heard_at);
        let states = before.map(|before| (before, peer.state.clone(), peer.sent.clone()));
        let made = m.is_some();
        let cut = doc.list.sync_counters().cut > counted.cut;
        if let Some((sent, false)) = sent {
            let steps = sent + doc.list.sync_counters().stock.saturating_sub(counted.stock);
            let limits = self.config.sync_work;
            if !Self::charge(&mut self.conns, doc, t, now_ms, steps, limits) {
                return false;
            }
        }
        if let Some(m) = m {
            if fan_out.encoded.as_ref().is_none_or(|(last, _)| *last != m) {
                let out = WireMessage::Sync {
                    document_id: doc_id,
                    sender_id: self.config.peer_id.clone(),
                    target_id: target_id.clone(),
                    data: m.clone().encode(),
                };
                fan_out.encoded = wire::ToEach::new(&out).map(|each| (m, each));
            }
        }
        let each = if made {
            fan_out.encoded.as_ref().map(|(_, each)| each)
        } else {
            None
        };
        if let Some((before, after, after_sent)) = states {
            fan_out.generated = Some(Generated {
                before,
                heard_at,
                after,
                after_sent,
                frame: each.cloned(),
                cut,
            });
        }
        if let Some(each) = each {
            fx.sends.push((t, each.to(&target_id)));
            if let Some(peer) = doc.peers.get_mut(&t) {
                peer.catching_up = cut;
                Self::note_sent(&doc.list, peer);
            }
        }
        true
    }

    /// Remembers that `peer` was sent the list as it stands (see [`FANOUT_UNACKED_MAX`]),
    /// unless the peer's heads cover it already: such a message (the last of a
    /// handshake, say) only names heads the peer has, and it will not answer it.
    fn note_sent(list: &TodoList, peer: &mut Peer) {
        let end = list.window_end();
        let covered = peer
            .state
            .their_heads
            .as_deref()
            .and_then(|heads| list.window_covered_by(heads))
            .is_some_and(|low| low >= end);
        if covered {
            return;
        }
        let sent = &mut peer.unacked;
        if sent.len() >= UNACKED_KEPT_MAX {
            sent.pop_front();
        }
        sent.push_back(end);
    }

    /// Charges connection `c` for the history work its message and our answer caused
    /// (`steps` stock sync steps, each costing the list's size). False when its budget
    /// is exhausted.
    fn charge(
        conns: &mut BTreeMap<ConnId, Conn>,
        doc: &DocState,
        c: ConnId,
        now_ms: i64,
        steps: u64,
        limits: (i64, i64),
    ) -> bool {
        if steps == 0 {
            return true;
        }
        let stats = automerge::ReadDoc::stats(doc.list.doc());
        let size = i64::try_from(stats.num_changes)
            .unwrap_or(i64::MAX)
            .saturating_mul(CHANGE_WORK_UNITS)
            .saturating_add(i64::try_from(stats.num_ops).unwrap_or(i64::MAX));
        let cost = i64::try_from(steps)
            .unwrap_or(i64::MAX)
            .saturating_mul(size);
        conns
            .get_mut(&c)
            .is_none_or(|conn| conn.work.take(now_ms, cost, limits))
    }

    fn over_budget(&mut self, c: ConnId, doc_id: DocumentId, fx: &mut Effects) {
        tracing::warn!(conn = c.0, doc = %doc_id, "sync work budget exhausted");
        self.fail(
            c,
            1008,
            "sync_budget",
            format!(
                "this connection made the hub walk the whole list history too often (budget {} units, {}/s): keep your sync state between messages instead of starting over, or reconnect later",
                self.config.sync_work.0, self.config.sync_work.1
            ),
            fx,
        );
    }

    /// A list whose merge panicked: forget it, close the offender and the list's other
    /// peers (they reconnect and resync; the list is loaded from the store again).
    fn crashed(&mut self, offender: ConnId, doc_id: DocumentId, fx: &mut Effects) {
        let reloading = Close {
            code: 1012,
            reason: "list_reloading".to_owned(),
            message: Some("the list is being reloaded: reconnect".to_owned()),
        };
        self.drop_list(doc_id, Some(offender), &reloading, fx);
        self.fail(
            offender,
            1008,
            "change_crashed_automerge",
            "a change of yours made Automerge fail; it was not applied".to_owned(),
            fx,
        );
    }

    /// Drops a list from memory and closes its peers (but `spare`) with `close`; the
    /// next peer that asks for it has it loaded from the store.
    fn drop_list(
        &mut self,
        doc_id: DocumentId,
        spare: Option<ConnId>,
        close: &Close,
        fx: &mut Effects,
    ) {
        let peers: Vec<ConnId> = self
            .docs
            .remove(&doc_id)
            .map(|d| d.peers.into_keys().collect())
            .unwrap_or_default();
        self.owed.remove(&doc_id);
        self.news.remove(&doc_id);
        for p in peers.into_iter().filter(|p| Some(*p) != spare) {
            if let Some(conn) = self.conns.get_mut(&p) {
                conn.docs.remove(&doc_id);
            }
            fx.closes.push((p, close.clone()));
            self.drop_conn(p);
        }
    }

    /// The store refused a commit of list `doc_id` for the list's own reasons (a record
    /// over a store limit): nothing of it is durable, so nothing of it may be relayed.
    /// The list is dropped from memory (loaded from the store, as it was before the
    /// refused merge, when a peer asks for it again); its peers are closed with 1011
    /// `list_refused` and reconnect. Returns the peers closed.
    fn isolate(&mut self, doc_id: DocumentId, why: &str, fx: &mut Effects) -> Vec<ConnId> {
        let peers: Vec<ConnId> = self
            .docs
            .get(&doc_id)
            .map(|d| d.peers.keys().copied().collect())
            .unwrap_or_default();
        tracing::error!(doc = %doc_id, why, "the store refused a merge of this list; dropping it from memory");
        let refused = Close {
            code: 1011,
            reason: "list_refused".to_owned(),
            message: Some(format!(
                "the hub could not store the last merge of this list ({why}); it was undone: reconnect and sync again"
            )),
        };
        self.drop_list(doc_id, None, &refused, fx);
        peers
    }

    /// Takes one list creation from the budget of connection `c`'s identity (see
    /// [`LIST_CREATIONS_BURST`]); false when it is spent.
    fn take_creation(&mut self, now_ms: i64, c: ConnId) -> bool {
        let creator = match self.conns.get(&c) {
            Some(Conn {
                identity: Some(who),
                ..
            }) => Creator::Agent(who.agent.clone()),
            Some(Conn {
                address: Some(a), ..
            }) => Creator::Address(*a),
            _ => Creator::Unknown,
        };
        let limits = self.config.list_creations;
        if self.creators.len() >= CREATORS_KEPT_MAX && !self.creators.contains_key(&creator) {
            self.creators.retain(|_, b| !b.refill(now_ms, limits));
        }
        self.creators
            .entry(creator)
            .or_insert_with(|| CreationBudget::full(limits, now_ms))
            .take(now_ms, limits)
    }

    /// Runs the authority on a merge, applies its repair, and gathers what to persist.
    fn check_and_repair(
        doc: &mut DocState,
        doc_id: DocumentId,
        merge: Merge,
        now_ms: i64,
    ) -> Commit {
        let mut commit = Commit {
            doc: doc_id,
            notify: Arc::from([]),
            changes: Vec::new(),
            events: Vec::new(),
            reported: Vec::new(),
        };
        let report = match doc.authority.process(&mut doc.list, merge.clone(), now_ms) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(doc = %doc_id, error = %e, "repair failed; the merge stands as is");
                Default::default()
            }
        };
        for m in std::iter::once(&merge).chain(&report.repairs) {
            commit
                .changes
                .extend(m.changes.iter().map(|c| c.change.clone()));
            commit.events.extend(tasks_changed(&doc.list, m));
        }
        for v in &report.violations {
            commit.reported.push(v.key.clone());
        }
        for cf in &report.conflicts {
            commit.reported.push(cf.key.clone());
        }
        commit
            .events
            .extend(report.conflicts.into_iter().map(EventBody::Conflict));
        commit
            .events
            .extend(report.violations.into_iter().map(EventBody::Violation));
        for r in &report.repairs {
            if let Some(c) = r.changes.first() {
                commit.events.push(EventBody::Repaired {
                    change: c.hash(),
                    notes: c.change.message().map(str::to_owned).into_iter().collect(),
                });
            }
        }
        commit
    }
}

/// The frames that push the events of durable commits (each with its events' sequence
/// numbers in the store and the time it was committed) to the peers each names: one
/// `ephemeral` frame per peer and list for all of them (session [`EVENTS_SESSION`],
/// `count` = the last seq), its data the CBOR text of the event's JSON — or of a JSON
/// array of events when there are several. Under load a batch of merges costs each
/// peer one frame, not one per write.
fn event_frames(hub: &PeerId, commits: &[(Commit, Vec<u64>, i64)]) -> Vec<(ConnId, Vec<u8>)> {
    // Every event once; then (list, peer) → the indexes of its events, in order.
    let mut events: Vec<crate::proto::Event> = Vec::new();
    let mut per_peer: BTreeMap<(DocumentId, ConnId), (PeerId, Vec<usize>)> = BTreeMap::new();
    for (commit, seqs, at_ms) in commits {
        let at_ms = *at_ms;
        for (body, &seq) in commit.events.iter().zip(seqs.iter()) {
            events.push(crate::proto::Event {
                seq,
                list: commit.doc.to_string(),
                at_ms,
                body: body.clone(),
            });
            for (conn, peer) in commit.notify.iter() {
                per_peer
                    .entry((commit.doc, *conn))
                    .or_insert_with(|| (peer.clone(), Vec::new()))
                    .1
                    .push(events.len() - 1);
            }
        }
    }
    // Peers of one list usually get the same events: encode each set once, for any
    // target.
    let mut encoded: BTreeMap<(DocumentId, Vec<usize>), Option<wire::ToEach>> = BTreeMap::new();
    let mut frames = Vec::new();
    for ((doc, conn), (peer, mine)) in per_peer {
        let each = encoded
            .entry((doc, mine))
            .or_insert_with_key(|(doc, mine)| {
                let json = match mine.as_slice() {
                    [one] => serde_json::to_string(&events[*one]),
                    many => {
                        serde_json::to_string(&many.iter().map(|i| &events[*i]).collect::<Vec<_>>())
                    }
                };
                let m = WireMessage::Ephemeral {
                    sender_id: hub.clone(),
                    target_id: peer.clone(),
                    document_id: *doc,
                    count: mine.last().map_or(0, |i| events[*i].seq),
                    session_id: EVENTS_SESSION.to_owned(),
                    data: minicbor::to_vec(json.ok()?.as_str()).ok()?,
                };
                wire::ToEach::new(&m)
            });
        if let Some(each) = each {
            frames.push((conn, each.to(&peer)));
        }
    }
    frames
}

/// The events an `ephemeral` message carries when it is the hub's: sent by `hub` (the
/// peer id the hub gave in the handshake) in [`EVENTS_SESSION`]; none otherwise (a
/// message relayed from another peer is never the hub's events).
pub fn events_of(
    hub: &PeerId,
    sender_id: &PeerId,
    session_id: &str,
    data: &[u8],
) -> Vec<crate::proto::Event> {
    if sender_id != hub || session_id != EVENTS_SESSION {
        return Vec::new();
    }
    let Ok(json) = minicbor::decode::<&str>(data) else {
        return Vec::new();
    };
    if let Ok(one) = serde_json::from_str::<crate::proto::Event>(json) {
        return vec![one];
    }
    serde_json::from_str(json).unwrap_or_default()
}

/// Bytes of task changes one `tasks_changed` event carries before the next event
/// takes the rest: well under the store's `EVENT_BYTES_MAX`, which a write of many long
/// tasks (or a list's first sync) would otherwise exceed — and a commit the store
/// refuses stops the hub.
const TASKS_CHANGED_BYTES_SPLIT: usize = 256 * 1024;

/// The number of changes in a list's history.
fn change_count(list: &TodoList) -> usize {
    usize::try_from(automerge::ReadDoc::stats(list.doc()).num_changes).unwrap_or(usize::MAX)
}

/// The `tasks_changed` events of one merge: one, or several when its task changes are
/// too large for one (each names the merge's agents and changes, and some of the tasks).
fn tasks_changed(list: &TodoList, m: &Merge) -> Vec<EventBody> {
    if m.tasks.is_empty() {
        return Vec::new();
    }
    let agents: Vec<String> = m
        .changes
        .iter()
        .filter_map(|c| list.agent_of(c.actor()))
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect();
    let changes: Vec<String> = m
        .changes
        .iter()
        .skip(
            m.changes
                .len()
                .saturating_sub(crate::proto::TASKS_CHANGED_HASHES_MAX),
        )
        .map(ChangeInfo::hash)
        .collect();
    let mut events = Vec::new();
    let mut tasks: Vec<TaskChange> = Vec::new();
    let mut bytes = 0usize;
    for (id, d) in &m.tasks {
        let change = TaskChange {
            task: id.clone(),
            fields: d
                .fields
                .iter()
                .map(|f| {
                    if f.is_empty() {
                        "task".to_owned()
                    } else {
                        f.clone()
                    }
                })
                .collect(),
            before: d.before.as_ref().map(|r| normalize(id, r)),
            after: d.after.as_ref().map(|r| normalize(id, r)),
        };
        let size = serde_json::to_vec(&change).map_or(0, |v| v.len());
        if !tasks.is_empty() && bytes + size > TASKS_CHANGED_BYTES_SPLIT {
            events.push(EventBody::TasksChanged {
                agents: agents.clone(),
                changes: changes.clone(),
                tasks: std::mem::take(&mut tasks),
            });
            bytes = 0;
        }
        bytes += size;
        tasks.push(change);
    }
    events.push(EventBody::TasksChanged {
        agents,
        changes,
        tasks,
    });
    events
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
        }
    }
}

#[allow(clippy::expect_used)] // "swarmtodo-hub" is a valid peer id: non-empty, short, no control characters.
fn unreachable_peer_id() -> PeerId {
    PeerId::new("swarmtodo-hub").expect("a constant, valid peer id")
}
