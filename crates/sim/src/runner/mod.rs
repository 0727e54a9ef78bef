//! The deterministic runner: the real [`HubCore`], [`TodoList`] replicas, authority and
//! SQLite [`Db`] in one thread, on the simulated network of [`super::net`], all driven
//! by one seed.
//!
//! Nothing here reads a clock or the OS's randomness: time is the event queue's
//! simulated milliseconds (stamped on changes as [`SIM_EPOCH_MS`] plus that), every
//! actor id and choice comes from the seed's [`Rng`], and every map iterated is a
//! `BTreeMap`. The hub core is sans-I/O, so there is no `select!` to be unfair. Running a
//! seed twice gives the same trace, byte for byte.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;

use automerge::sync;
use automerge::{ActorId, ChangeHash};

use super::behave::{self, RawEdit, RogueMove};
pub use super::behave::{GUARD_TASKS, LIST_TASKS_SIM_MAX, ROGUE_TASKS, SEEN_VERSIONS_MAX};
use super::check::{self, Delivery, FinalState, Replica, SideOutcome};
use super::net::{Dir, Event, Net, Queue};
use super::outcome::SimError;
pub use super::outcome::{Fault, Injection, RunConfig, RunOutcome, Stats, SAMPLE_MS};
use super::rng::Rng;
use super::scenario::{Action, RoleSpec, Scenario};
use swarmtodo_client::session::{FromHub, Session};
use swarmtodo_core::authority::{Policy, Role, Roles};
use swarmtodo_core::hub::{
    Close, Commit, Compaction, ConnId, HubConfig, HubCore, Input, Stored, StoredList,
};
use swarmtodo_core::model::{TodoList, WriteContext};
use swarmtodo_core::syncmsg;
use swarmtodo_proto::wire::list_document_id;
use swarmtodo_proto::wire::{self, DocumentId, PeerId, WireMessage};
use swarmtodo_proto::{EventBody, Rule, Version, WriteRequest};
use swarmtodo_store::drive::{self, Io};
use swarmtodo_store::persist;
use swarmtodo_store::{Db, StoreError};

/// A frame for the hub due within this of a batch counts as input waiting behind it (a
/// busy hub): the core may then defer a list's news and hold it from peers behind
/// (`HubCore::handle_batch_deferring`).
pub const HUB_BUSY_MS: u64 = 1;

/// Simulated time 0, as the Unix milliseconds stamped on changes and events.
pub const SIM_EPOCH_MS: i64 = 1_767_225_600_000;
/// How often an agent checks for a stalled sync, simulated milliseconds.
pub const STALL_CHECK_MS: u64 = 500;
/// An agent out of sync that has heard nothing and sent nothing for this long drops
/// the connection and reconnects (what a real client's timeout does).
pub const STALL_MS: u64 = 2_000;
/// An agent that has heard nothing for this long sends its sync state again (a
/// keepalive): a hub whose answer was lost waits for a reply that never comes
/// (automerge's `in_flight`) and would never tell the agent what is new.
pub const KEEPALIVE_MS: u64 = 1_500;
/// Longest wait before an agent connects again, simulated milliseconds.
pub const RECONNECT_MS_MAX: u64 = 300;
/// Agents' lists a run that never settled reports as not settled (the first ones).
pub const UNSETTLED_SHOWN_MAX: usize = 8;
/// Most trace lines kept (the digest covers all of them).
pub const TRACE_LINES_MAX: usize = 2_000_000;

const _: () = assert!(STALL_CHECK_MS < STALL_MS);
const _: () = assert!(STALL_CHECK_MS < KEEPALIVE_MS);

/// One list as one agent holds it.
#[derive(Debug)]
struct AgentList {
    list: usize,
    doc: DocumentId,
    replica: TodoList,
    /// Own changes the hub has not acknowledged: `(hash, written at)`.
    unacked: Vec<(ChangeHash, u64)>,
    /// Versions seen lately (oldest first), for stale replaces.
    seen: VecDeque<Version>,
}

#[derive(Debug)]
struct Agent {
    name: String,
    /// Which session of agent `name` this is (0 for an agent of one session).
    session: usize,
    group: usize,
    role: RoleSpec,
    lists: Vec<AgentList>,
    /// The actor of the rogue's raw (unvalidated) writes.
    raw_actor: ActorId,
    conn: Option<ConnId>,
    /// The hub answered `join`.
    ready: bool,
    /// Not cut off by a partition.
    online: bool,
    /// A `Connect` is scheduled.
    connecting: bool,
    last_io: u64,
    /// Last frame received or keepalive sent.
    last_rx: u64,
    /// Fingerprint of the agent's sync progress (its heads and the hub's, per list)
    /// and when it last changed: a session that exchanges frames without progress is
    /// as stuck as a silent one.
    progress: (u64, u64),
    next_task: u64,
    /// The real client's protocol state for this agent's current connection (a new
    /// one per connection): join, handshake, sync states, events.
    client: Session,
}

/// A race between two sessions of one agent whose starts the hub may not both have yet:
/// its tasks are held (no behaviour touches them) until it has.
#[derive(Debug)]
struct Race {
    list: usize,
    tasks: [String; 2],
    changes: [ChangeHash; 2],
}

/// Who a connection belongs to.
#[derive(Debug, Clone, Copy)]
struct ConnInfo {
    agent: usize,
    /// A rogue's side connection for one bad frame.
    side: bool,
}

/// A rogue's side connection and what the hub must answer.
#[derive(Debug, Clone)]
struct Side {
    expect: &'static [u16],
    what: Action,
    got: Option<u16>,
    /// The hub crashed before answering: nothing to expect.
    void: bool,
}

struct Sim<'a> {
    scenario: &'a Scenario,
    cfg: &'a RunConfig,
    rng: Rng,
    now: u64,
    queue: Queue,
    net: Net,
    hub: Option<HubCore>,
    hub_conns: BTreeSet<ConnId>,
    incarnation: u64,
    policy: Policy,
    roles: Roles,
    db: Db,
    known: BTreeSet<DocumentId>,
    docs: Vec<DocumentId>,
    conns: BTreeMap<ConnId, ConnInfo>,
    next_conn: u64,
    agents: Vec<Agent>,
    /// The workers of each list (fixed for the run).
    workers: Vec<Vec<String>>,
    storm: bool,
    storm_end: u64,
    converged_at: Option<u64>,
    stats: Stats,
    /// Frames sent while set are keepalives (`Queue::push_keepalive`).
    keepalive: bool,
    injected: Vec<Injection>,
    /// Races not yet decided by the hub.
    races: Vec<Race>,
    acked: BTreeMap<DocumentId, BTreeSet<ChangeHash>>,
    latencies: Vec<u64>,
    divergence: Vec<(u64, u64)>,
    sides: BTreeMap<ConnId, Side>,
    trace: Vec<String>,
    digest: u64,
    /// Fault hooks' state.
    planted: bool,
    held: Vec<Commit>,
    dropped_change: Option<ChangeHash>,
    /// The event streams: what the store made durable for each connection, and what
    /// each received.
    delivery: Delivery,
    /// A tick for the hub is scheduled (it deferred news or events).
    tick_due: bool,
    /// What the hub's I/O failed with while the driver ran (the driver's `Io` cannot
    /// return the simulator's errors).
    io_error: Option<SimError>,
}

/// Runs one seed of `scenario`.
pub fn run(scenario: &Scenario, cfg: &RunConfig) -> Result<RunOutcome, SimError> {
    let started = std::time::Instant::now();
    let dir = run_dir(&cfg.work_dir, &scenario.name, cfg.seed);
    std::fs::create_dir_all(&dir).map_err(|e| SimError::Io(dir.display().to_string(), e))?;
    let result = {
        let span = tracing::info_span!("sim", scenario = %scenario.name, seed = cfg.seed);
        let _enter = span.enter();
        let db = Db::open(dir.join("hub.sqlite3"))?;
        let mut sim = Sim::new(scenario, cfg, db)?;
        sim.run()?;
        sim.finish(started)
    };
    // Best effort: a leftover folder only costs disk.
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A folder of its own for one run (parallel runs and repeated seeds never share one).
fn run_dir(base: &std::path::Path, scenario: &str, seed: u64) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    base.join(format!(
        "swarmtodo-sim-{}-{scenario}-{seed}-{n}",
        std::process::id()
    ))
}

impl<'a> Sim<'a> {
    fn new(scenario: &'a Scenario, cfg: &'a RunConfig, db: Db) -> Result<Sim<'a>, SimError> {
        let mut rng = Rng::new(cfg.seed);
        let docs: Vec<DocumentId> = (0..scenario.lists.count)
            .map(|i| list_document_id(&format!("list-{i}")))
            .collect();
        let mut roles = Roles::default();
        let mut agents: Vec<Agent> = Vec::new();
        for (group, name, lists) in scenario.agents() {
            let session = agents.iter().filter(|a| a.name == name).count();
            let role = scenario.agents[group].role;
            match role {
                RoleSpec::Lead => {}
                RoleSpec::Worker | RoleSpec::Rogue => {
                    roles.by_agent.insert(name.clone(), Role::Worker);
                }
                RoleSpec::Observer => {
                    roles.by_agent.insert(name.clone(), Role::Observer);
                }
            }
            let actor = ActorId::from(rng.bytes16());
            let raw_actor = ActorId::from(rng.bytes16());
            let client = Session::new(agent_peer_id(&name, session)?);
            agents.push(Agent {
                name,
                session,
                group,
                role,
                lists: lists
                    .into_iter()
                    .map(|l| AgentList {
                        list: l,
                        doc: docs[l],
                        replica: TodoList::create(actor.clone()),
                        unacked: Vec::new(),
                        seen: VecDeque::new(),
                    })
                    .collect(),
                raw_actor,
                conn: None,
                ready: false,
                online: true,
                connecting: false,
                last_io: 0,
                last_rx: 0,
                progress: (0, 0),
                next_task: 0,
                client,
            });
        }
        let workers = (0..docs.len())
            .map(|list| workers_of(&agents, list))
            .collect();
        let policy = Policy::default();
        let net = Net::new(scenario.network.clone());
        let mut sim = Sim {
            scenario,
            cfg,
            rng,
            now: 0,
            queue: Queue::default(),
            net,
            hub: None,
            hub_conns: BTreeSet::new(),
            incarnation: 0,
            policy,
            roles,
            db,
            known: BTreeSet::new(),
            docs,
            conns: BTreeMap::new(),
            next_conn: 0,
            agents,
            workers,
            storm: true,
            storm_end: scenario.duration_ms,
            converged_at: None,
            stats: Stats::default(),
            keepalive: false,
            injected: Vec::new(),
            races: Vec::new(),
            acked: BTreeMap::new(),
            latencies: Vec::new(),
            divergence: Vec::new(),
            sides: BTreeMap::new(),
            trace: Vec::new(),
            digest: 0xcbf2_9ce4_8422_2325,
            planted: false,
            held: Vec::new(),
            delivery: Delivery::default(),
            tick_due: false,
            io_error: None,
            dropped_change: None,
        };
        sim.start_hub()?;
        sim.initial_plans();
        sim.schedule_start()?;
        Ok(sim)
    }

    fn note(&mut self, line: String) {
        let line = format!("{:>8} {line}", self.now);
        for b in line.as_bytes().iter().chain(b"\n") {
            self.digest ^= u64::from(*b);
            self.digest = self.digest.wrapping_mul(0x0100_0000_01b3);
        }
        if self.cfg.trace && self.trace.len() < TRACE_LINES_MAX {
            self.trace.push(line);
        }
    }

    fn epoch_ms(&self) -> i64 {
        SIM_EPOCH_MS + i64::try_from(self.now).unwrap_or(i64::MAX - SIM_EPOCH_MS)
    }

    fn hub_config(&mut self) -> HubConfig {
        // A new actor per process start, as `Hub::open` does: a restarted hub must never
        // reuse a sequence number its crashed predecessor may have used.
        let mut c = HubConfig::new(ActorId::from(self.rng.bytes16()));
        c.policy = self.policy.clone();
        c.roles = self.roles.clone();
        c
    }

    fn start_hub(&mut self) -> Result<(), SimError> {
        let mut core = HubCore::new(self.hub_config());
        self.known = persist::stored_sync(&self.db, &mut core)?;
        self.hub = Some(core);
        self.incarnation += 1;
        Ok(())
    }

    /// The first writer of each list writes its plan before anyone connects.
    fn initial_plans(&mut self) {
        let rogue_lists: BTreeSet<usize> = self
            .agents
            .iter()
            .filter(|a| a.role == RoleSpec::Rogue)
            .flat_map(|a| a.lists.iter().map(|l| l.list))
            .collect();
        for list in 0..self.docs.len() {
            let writer = self
                .agents
                .iter()
                .position(|a| a.role == RoleSpec::Lead && a.lists.iter().any(|l| l.list == list));
            let Some(a) = writer else { continue };
            let Some(li) = self.agents[a].lists.iter().position(|l| l.list == list) else {
                continue;
            };
            let lead = self.agents[a].name.clone();
            let guards = if rogue_lists.contains(&list) {
                GUARD_TASKS
            } else {
                0
            };
            let req = behave::initial_plan(
                &mut self.rng,
                self.scenario.lists.initial_tasks,
                &lead,
                &self.workers[list],
                guards,
            );
            self.write(a, li, &req, Action::Plan);
        }
    }

    fn schedule_start(&mut self) -> Result<(), SimError> {
        for a in 0..self.agents.len() {
            let at = self.rng.range(0, 50);
            self.agents[a].connecting = true;
            self.queue.push(at, Event::Connect(a))?;
            self.queue.push(
                STALL_CHECK_MS + self.rng.below(STALL_CHECK_MS),
                Event::Timer(a),
            )?;
            if let Some(at) = self.next_act(a) {
                // The first action anywhere in the first interval: a swarm does not
                // start in lockstep.
                let at = self.rng.range(1, at.max(1));
                self.queue.push(at, Event::Act(a))?;
            }
        }
        let faults = &self.scenario.faults;
        for (t, down) in behave::hub_crashes(&mut self.rng, self.storm_end, faults) {
            self.queue.push(t, Event::Crash)?;
            self.queue.push(t + down, Event::Restart)?;
        }
        let n = self.agents.len();
        for (at, len, cut) in behave::partitions(&mut self.rng, self.storm_end, faults, n) {
            self.queue.push(at, Event::PartitionStart(cut.clone()))?;
            self.queue.push(at + len, Event::PartitionEnd(cut))?;
        }
        self.queue.push(self.storm_end, Event::StormEnd)?;
        self.queue.push(0, Event::Sample)?;
        Ok(())
    }

    fn next_act(&mut self, a: usize) -> Option<u64> {
        let group = &self.scenario.agents[self.agents[a].group];
        if group.mix.total() == 0 {
            return None;
        }
        Some(self.now + behave::interval_ms(&mut self.rng, group.rate_per_s))
    }

    fn run(&mut self) -> Result<(), SimError> {
        let deadline = self.storm_end + self.scenario.settle_ms_max;
        while let Some((at, event)) = self.queue.pop() {
            self.now = at;
            if at > deadline {
                break;
            }
            let line = event.describe();
            self.note(line);
            if self.cfg.trace {
                if let Event::Frame(_, _, bytes) = &event {
                    // Detail for people only: not part of the digest.
                    self.trace
                        .push(format!("{:>8}   {}", self.now, frame_detail(bytes)));
                }
            }
            match event {
                Event::Act(a) => self.act(a)?,
                Event::Timer(a) => self.timer(a)?,
                Event::Connect(a) => self.connect(a)?,
                Event::Frame(c, Dir::ToHub, bytes) => {
                    // Like the server, the hub takes every frame that is waiting (here:
                    // that arrived in the same millisecond) as one batch.
                    let mut batch = vec![(c, bytes)];
                    while batch.len() < swarmtodo_hub::server::BATCH_FRAMES_MAX {
                        let Some(next) = self
                            .queue
                            .pop_if(at, |e| matches!(e, Event::Frame(_, Dir::ToHub, _)))
                        else {
                            break;
                        };
                        self.note(next.describe());
                        if let Event::Frame(c, _, bytes) = next {
                            if self.cfg.trace {
                                self.trace.push(format!(
                                    "{:>8}   {}",
                                    self.now,
                                    frame_detail(&bytes)
                                ));
                            }
                            batch.push((c, bytes));
                        }
                    }
                    if batch.len() > 1 {
                        self.stats.batched += batch.len() as u64;
                    }
                    let inputs: Vec<Input> = batch
                        .into_iter()
                        .filter(|(c, _)| self.hub_conns.contains(c))
                        .map(|(c, bytes)| Input::Frame(c, bytes))
                        .collect();
                    if !inputs.is_empty() {
                        // A frame due within HUB_BUSY_MS is input waiting behind this
                        // batch, as a busy server would have it queued: the core may
                        // defer and hold news (`HubCore::handle_batch_deferring`), and
                        // the next batch sends it.
                        let more_waiting = self.queue.next_is(at + HUB_BUSY_MS, |e| {
                            matches!(e, Event::Frame(_, Dir::ToHub, _))
                        });
                        self.hub_batch(inputs, more_waiting)?;
                    }
                }
                Event::Frame(c, Dir::ToAgent, bytes) => self.agent_frame(c, &bytes)?,
                Event::Closed(c, close) => self.closed(c, close)?,
                Event::Gone(c) => {
                    if self.hub_conns.remove(&c) {
                        self.hub_input(Input::Disconnected(c))?;
                    }
                    self.net.forget(c);
                }
                Event::Crash => self.crash()?,
                Event::Restart => {
                    if self.hub.is_none() {
                        self.start_hub()?;
                    }
                }
                Event::PartitionStart(cut) => {
                    if self.storm {
                        self.stats.partitions += 1;
                        for a in cut {
                            self.agents[a].online = false;
                            self.drop_conn(a)?;
                        }
                    }
                }
                Event::PartitionEnd(cut) => {
                    for a in cut {
                        self.heal(a)?;
                    }
                }
                Event::StormEnd => self.storm_end()?,
                Event::Tick => {
                    self.tick_due = false;
                    self.hub_input(Input::Tick)?;
                }
                Event::Sample => {
                    self.sample();
                    if !self.storm && self.quiescent() {
                        self.converged_at = Some(self.now);
                        break;
                    }
                    self.queue.push(self.now + SAMPLE_MS, Event::Sample)?;
                }
            }
        }
        // A buggy store's unflushed last write is gone.
        if self.cfg.fault == Some(Fault::StoreLosesLastWrite) {
            self.held.clear();
        }
        Ok(())
    }

    fn storm_end(&mut self) -> Result<(), SimError> {
        self.storm = false;
        self.net.faulty = false;
        if self.hub.is_none() {
            self.start_hub()?;
        }
        for a in 0..self.agents.len() {
            self.heal(a)?;
        }
        Ok(())
    }

    fn heal(&mut self, a: usize) -> Result<(), SimError> {
        if self.agents[a].online {
            return Ok(());
        }
        self.agents[a].online = true;
        self.schedule_connect(a)
    }

    fn schedule_connect(&mut self, a: usize) -> Result<(), SimError> {
        if self.agents[a].connecting {
            return Ok(());
        }
        self.agents[a].connecting = true;
        let at = self.now + self.rng.range(1, RECONNECT_MS_MAX);
        self.queue.push(at, Event::Connect(a))
    }

    fn connect(&mut self, a: usize) -> Result<(), SimError> {
        self.agents[a].connecting = false;
        if !self.agents[a].online || self.agents[a].conn.is_some() {
            return Ok(());
        }
        if self.hub.is_none() {
            return self.schedule_connect(a);
        }
        let c = self.open_conn(a, false)?;
        self.stats.connects += 1;
        let agent = &mut self.agents[a];
        agent.conn = Some(c);
        agent.ready = false;
        agent.last_io = self.now;
        agent.last_rx = self.now;
        agent.progress = (0, self.now);
        // A new connection starts a new session (new sync states).
        let peer = agent_peer_id(&agent.name, agent.session)?;
        agent.client = Session::new(peer);
        let join = wire::encode(&agent.client.join());
        // The handshake is never lost, doubled or overtaken: a doubled or late `join`
        // is a protocol error the hub rightly closes for, not a fault under test.
        self.send(c, Dir::ToHub, join, true)
    }

    /// A `join` as the agent's client sends it (for a side connection).
    fn join_frame(&self, a: usize) -> Result<Vec<u8>, SimError> {
        Ok(wire::encode(&Session::new(self.peer_id(a)?).join()))
    }

    fn peer_id(&self, a: usize) -> Result<PeerId, SimError> {
        agent_peer_id(&self.agents[a].name, self.agents[a].session)
    }

    fn open_conn(&mut self, a: usize, side: bool) -> Result<ConnId, SimError> {
        self.next_conn += 1;
        let c = ConnId(self.next_conn);
        self.conns.insert(c, ConnInfo { agent: a, side });
        self.hub_conns.insert(c);
        self.hub_input(Input::Connected(c))?;
        Ok(c)
    }

    /// The agent drops its connection (partition, stall); the hub learns it later.
    fn drop_conn(&mut self, a: usize) -> Result<(), SimError> {
        let agent = &mut self.agents[a];
        agent.ready = false;
        if let Some(c) = agent.conn.take() {
            let at = self.now + self.net.latency(&mut self.rng);
            self.queue.push(at, Event::Gone(c))?;
        }
        Ok(())
    }

    fn send(
        &mut self,
        c: ConnId,
        dir: Dir,
        bytes: Vec<u8>,
        reliable: bool,
    ) -> Result<(), SimError> {
        self.stats.frames += 1;
        let faulty = self.net.faulty;
        if reliable {
            self.net.faulty = false;
        }
        let fate = self.net.fate(&mut self.rng, self.now, c, dir);
        self.net.faulty = faulty;
        self.stats.dropped += u64::from(fate.dropped);
        self.stats.duplicated += u64::from(fate.duplicated);
        self.stats.reordered += u64::from(fate.reordered);
        let mut deliveries = fate.deliveries;
        let keepalive = self.keepalive;
        let mut push = |at, frame| {
            if keepalive {
                self.queue.push_keepalive(at, frame)
            } else {
                self.queue.push(at, frame)
            }
        };
        if let Some(last) = deliveries.pop() {
            for at in deliveries {
                push(at, Event::Frame(c, dir, bytes.clone()))?;
            }
            push(last, Event::Frame(c, dir, bytes))?;
        }
        Ok(())
    }

    fn hub_input(&mut self, input: Input) -> Result<(), SimError> {
        self.hub_inputs(vec![input])
    }

    fn hub_inputs(&mut self, inputs: Vec<Input>) -> Result<(), SimError> {
        self.hub_batch(inputs, false)
    }

    /// The hub handles `inputs` and the one driver performs its effects, with this
    /// simulation as its I/O (as the server does with its own). When the hub deferred
    /// news or events, a tick follows once nothing else is due (as a server's queue
    /// runs dry).
    fn hub_batch(&mut self, inputs: Vec<Input>, more_waiting: bool) -> Result<(), SimError> {
        let now_ms = self.epoch_ms();
        let Some(mut hub) = self.hub.take() else {
            return Ok(());
        };
        let fx = hub.handle_batch_deferring(now_ms, inputs, more_waiting);
        let done = drive::run_sync(drive::perform(&mut hub, self, fx));
        let deferred = hub.deferred();
        self.hub = Some(hub);
        if let Some(e) = self.io_error.take() {
            return Err(e);
        }
        done?;
        if deferred && !self.tick_due {
            self.tick_due = true;
            self.queue.push(self.now + HUB_BUSY_MS, Event::Tick)?;
        }
        Ok(())
    }

    /// The planted faults of the store, then the store: one transaction per batch.
    fn store_commits(&mut self, commits: &[Commit], at_ms: i64) -> Result<Vec<Stored>, StoreError> {
        self.stats.commits += commits.len() as u64;
        let mut commits = commits.to_vec();
        if self.cfg.fault == Some(Fault::DoubleReport) && !self.planted {
            for commit in &mut commits {
                let first = commit
                    .events
                    .iter()
                    .find(|e| matches!(e, EventBody::Violation(_)))
                    .cloned();
                if let Some(v) = first {
                    commit.events.push(v);
                    self.planted = true;
                    break;
                }
            }
        }
        if self.cfg.fault == Some(Fault::StoreLosesLastWrite) {
            // Acknowledged now, written only when the next batch comes (its events'
            // seqs unknown: they are not pushed).
            let prev = std::mem::replace(&mut self.held, commits);
            persist::commit_all_sync(&mut self.db, &mut self.known, &prev, at_ms)?;
            return Ok(vec![Stored::Durable(Vec::new()); self.held.len()]);
        }
        let results = persist::commit_all_sync(&mut self.db, &mut self.known, &commits, at_ms)?;
        Ok(commits
            .iter()
            .zip(results)
            .map(|(commit, r)| match r {
                Ok(seqs) => {
                    self.delivery.durable(commit, &seqs);
                    Stored::Durable(seqs)
                }
                Err(e) => Stored::Refused(e.to_string()),
            })
            .collect())
    }

    fn crash(&mut self) -> Result<(), SimError> {
        if !self.storm || self.hub.is_none() {
            return Ok(());
        }
        self.stats.hub_crashes += 1;
        self.hub = None;
        if self.cfg.fault == Some(Fault::StoreLosesLastWrite) {
            self.held.clear();
        }
        let dead: BTreeSet<ConnId> = std::mem::take(&mut self.hub_conns);
        self.queue.drop_frames(|c| dead.contains(&c));
        for c in dead {
            if let Some(side) = self.sides.get_mut(&c) {
                side.void = side.got.is_none();
            }
            let at = self.now + self.net.latency(&mut self.rng);
            let close = Close {
                code: 1006,
                reason: "hub_crashed".to_owned(),
                message: None,
            };
            self.queue.push(at, Event::Closed(c, close))?;
        }
        Ok(())
    }

    fn closed(&mut self, c: ConnId, close: Close) -> Result<(), SimError> {
        self.net.forget(c);
        let Some(info) = self.conns.remove(&c) else {
            return Ok(());
        };
        if info.side {
            if let Some(side) = self.sides.get_mut(&c) {
                if side.got.is_none() && !side.void {
                    side.got = Some(close.code);
                }
            }
            return Ok(());
        }
        let a = info.agent;
        if self.agents[a].conn != Some(c) {
            return Ok(());
        }
        if close.code != 1006 {
            *self
                .stats
                .closes
                .entry(format!("{} {}", close.code, close.reason))
                .or_default() += 1;
        }
        self.agents[a].conn = None;
        self.agents[a].ready = false;
        self.schedule_connect(a)
    }

    fn timer(&mut self, a: usize) -> Result<(), SimError> {
        self.queue
            .push(self.now + STALL_CHECK_MS, Event::Timer(a))?;
        let agent = &self.agents[a];
        if !agent.online || agent.conn.is_none() {
            return Ok(());
        }
        let synced = agent.ready && agent.lists.iter().all(|l| in_sync(&agent.client, l));
        let mark = progress_mark(agent);
        if mark != agent.progress.0 {
            self.agents[a].progress = (mark, self.now);
        }
        let agent = &self.agents[a];
        let quiet = self.now.saturating_sub(agent.last_io);
        let stuck = self.now.saturating_sub(agent.progress.1);
        // Silent for long, or talking without progress for long (automerge's sync
        // never resends a change it believes sent: a lost frame inside a session is
        // only recovered by a new session).
        if !synced && (quiet >= STALL_MS || stuck >= STALL_MS) {
            self.stats.stall_resets += 1;
            self.drop_conn(a)?;
            self.schedule_connect(a)?;
        } else if agent.ready && self.now.saturating_sub(agent.last_rx) >= KEEPALIVE_MS {
            self.stats.keepalives += 1;
            self.agents[a].last_rx = self.now;
            self.keepalive = true;
            for l in 0..self.agents[a].lists.len() {
                // Forget what was sent so that a message goes out, with our heads.
                let doc = self.agents[a].lists[l].doc;
                self.agents[a].client.resend(doc);
                if let Err(e) = self.flush(a, l) {
                    self.keepalive = false;
                    return Err(e);
                }
            }
            self.keepalive = false;
        }
        Ok(())
    }

    fn agent_frame(&mut self, c: ConnId, bytes: &[u8]) -> Result<(), SimError> {
        let Some(info) = self.conns.get(&c).copied() else {
            return Ok(());
        };
        let a = info.agent;
        if info.side || self.agents[a].conn != Some(c) {
            return Ok(());
        }
        self.agents[a].last_io = self.now;
        self.agents[a].last_rx = self.now;
        let msg = match wire::decode(bytes) {
            Ok(m) => m,
            Err(_) => {
                self.stats.agent_errors += 1;
                return Ok(());
            }
        };
        let doc = match &msg {
            WireMessage::Peer { .. } => {
                if self.agents[a].client.handshake(msg).is_err() {
                    self.stats.agent_errors += 1;
                    return Ok(());
                }
                self.agents[a].ready = true;
                for l in 0..self.agents[a].lists.len() {
                    self.flush(a, l)?;
                }
                return Ok(());
            }
            WireMessage::Sync { document_id, .. } | WireMessage::Ephemeral { document_id, .. } => {
                *document_id
            }
            _ => return Ok(()),
        };
        let Some(l) = self.agents[a].lists.iter().position(|x| x.doc == doc) else {
            return Ok(());
        };
        let msg = match msg {
            WireMessage::Sync {
                document_id,
                sender_id,
                target_id,
                data,
            } if self.cfg.fault == Some(Fault::ReplicaDropsChange) && a == self.victim() => {
                let Ok(m) = syncmsg::validate(&data, &syncmsg::Limits::default()) else {
                    self.stats.agent_errors += 1;
                    return self.flush(a, l);
                };
                let data = self.drop_one_change(a, l, m.into_message()).encode();
                WireMessage::Sync {
                    document_id,
                    sender_id,
                    target_id,
                    data,
                }
            }
            other => other,
        };
        let agent = &mut self.agents[a];
        let al = &mut agent.lists[l];
        let before = al.replica.heads();
        match agent.client.receive(doc, &mut al.replica, msg) {
            Ok(FromHub::Merged(_)) => {}
            Ok(FromHub::Events(events)) => {
                self.delivery.received(c, doc, events.iter().map(|e| e.seq));
                return Ok(());
            }
            Ok(_) => return Ok(()),
            Err(_) => {
                self.stats.agent_errors += 1;
                return self.flush(a, l);
            }
        }
        if al.replica.heads() != before {
            if al.seen.len() >= SEEN_VERSIONS_MAX {
                al.seen.pop_front();
            }
            al.seen.push_back(al.replica.version());
        }
        if in_sync(&agent.client, al) {
            let acked = self.acked.entry(al.doc).or_default();
            for (h, t) in al.unacked.drain(..) {
                acked.insert(h);
                self.latencies.push(self.now - t);
            }
        }
        self.flush(a, l)
    }

    /// The replica of [`Fault::ReplicaDropsChange`]: the last agent.
    fn victim(&self) -> usize {
        self.agents.len().saturating_sub(1)
    }

    fn drop_one_change(&mut self, a: usize, l: usize, mut message: sync::Message) -> sync::Message {
        let own = self.agents[a].lists[l].replica.doc().get_actor().clone();
        let mut kept: Vec<Vec<u8>> = Vec::new();
        for chunk in message.changes.iter() {
            // A chunk is one change, or (a V2 message) a whole saved document: either
            // way it is taken apart into changes so that the one can be left out.
            let changes = match automerge::Change::from_bytes(chunk.to_vec()) {
                Ok(c) => vec![c],
                Err(_) => match automerge::Automerge::load(chunk) {
                    Ok(doc) => doc.get_changes(&[]),
                    Err(_) => {
                        kept.push(chunk.to_vec());
                        continue;
                    }
                },
            };
            for mut change in changes {
                let foreign = *change.actor_id() != own && !change.deps().is_empty();
                if self.dropped_change.is_none() && foreign {
                    self.dropped_change = Some(change.hash());
                }
                if Some(change.hash()) != self.dropped_change {
                    kept.push(change.bytes().into_owned());
                }
            }
        }
        message.changes = sync::ChunkList::from(kept);
        message
    }

    fn flush(&mut self, a: usize, l: usize) -> Result<(), SimError> {
        let agent = &mut self.agents[a];
        let (Some(c), true, true) = (agent.conn, agent.ready, agent.online) else {
            return Ok(());
        };
        let al = &agent.lists[l];
        let Some(m) = agent.client.sync_message(al.doc, &al.replica, false) else {
            return Ok(());
        };
        agent.last_io = self.now;
        self.send(c, Dir::ToHub, wire::encode(&m), false)
    }

    /// The hub's peer id as the agent heard it (before the answer: a placeholder).
    fn hub_peer(&self, a: usize) -> Result<PeerId, SimError> {
        match self.agents[a].client.hub() {
            Some(p) => Ok(p.clone()),
            None => PeerId::new("swarmtodo-hub").map_err(|e| SimError::Setup(e.to_string())),
        }
    }

    fn sample(&mut self) {
        let Some(hub) = &self.hub else {
            return;
        };
        let mut off = 0u64;
        for agent in &self.agents {
            for l in &agent.lists {
                let hub_heads = hub.doc(&l.doc).map(|d| d.list().heads());
                if hub_heads.as_ref() != Some(&l.replica.heads()) {
                    off += 1;
                }
            }
        }
        self.divergence.push((self.now, off));
    }

    fn quiescent(&self) -> bool {
        let Some(hub) = &self.hub else {
            return false;
        };
        self.queue.frames_in_flight() == 0
            && !hub.deferred()
            && self.agents.iter().all(|a| {
                a.ready
                    && a.conn.is_some()
                    && a.lists.iter().all(|l| {
                        in_sync(&a.client, l)
                            && hub.doc(&l.doc).map(|d| d.list().heads()) == Some(l.replica.heads())
                    })
            })
    }

    /// Why the run is not quiescent, for the report of a run that never was: the
    /// frames in flight, and each agent's list that is not settled (at most
    /// `UNSETTLED_SHOWN_MAX`).
    fn unsettled(&self) -> Vec<String> {
        let mut out = Vec::new();
        let Some(hub) = &self.hub else {
            return vec!["the hub is down".into()];
        };
        let frames = self.queue.frames_in_flight();
        if frames > 0 {
            out.push(format!("{frames} frames in flight"));
        }
        let short = |heads: &[ChangeHash]| -> String {
            let mut h: Vec<String> = heads
                .iter()
                .map(|h| h.to_string()[..8].to_owned())
                .collect();
            h.sort();
            h.join(",")
        };
        for a in &self.agents {
            if !a.ready || a.conn.is_none() {
                out.push(format!(
                    "{}: not connected (ready {}, online {}, connecting {})",
                    a.name, a.ready, a.online, a.connecting
                ));
                continue;
            }
            for l in &a.lists {
                let hub_heads = hub.doc(&l.doc).map(|d| d.list().heads());
                if in_sync(&a.client, l) && hub_heads.as_ref() == Some(&l.replica.heads()) {
                    continue;
                }
                let fresh = sync::State::new();
                let s = a.client.state(l.doc).unwrap_or(&fresh);
                out.push(format!(
                    "{} list {}: heads [{}], hub [{}], the hub said [{}], last sent [{}], \
                     pending {}, in flight {}, unacked {}",
                    a.name,
                    l.list,
                    short(&l.replica.heads()),
                    hub_heads.as_deref().map(short).unwrap_or_default(),
                    s.their_heads.as_deref().map(short).unwrap_or_default(),
                    short(&s.last_sent_heads),
                    l.replica.pending_changes(),
                    s.in_flight,
                    l.unacked.len()
                ));
            }
            if out.len() >= UNSETTLED_SHOWN_MAX {
                out.push("…".into());
                break;
            }
        }
        out
    }

    // ----- agents' actions -----

    fn act(&mut self, a: usize) -> Result<(), SimError> {
        if !self.storm {
            return Ok(());
        }
        if let Some(at) = self.next_act(a) {
            self.queue.push(at, Event::Act(a))?;
        }
        if self.agents[a].lists.is_empty() {
            return Ok(());
        }
        let group = &self.scenario.agents[self.agents[a].group];
        let action = behave::pick_action(&mut self.rng, &group.mix);
        let l = self.rng.index(self.agents[a].lists.len());
        self.stats.ops += 1;
        let done = if action.is_rogue() {
            self.rogue(a, l, action)?
        } else if action == Action::RaceStart {
            self.race(a, l)?
        } else {
            match self.request(a, l, action) {
                Some(req) => {
                    self.write(a, l, &req, action);
                    true
                }
                None => false,
            }
        };
        if !done {
            self.stats.idle += 1;
        }
        self.flush(a, l)
    }

    /// The tasks of list `list` held for races the hub has not seen both starts of.
    fn held(&mut self, list: usize) -> Vec<String> {
        let (docs, acked) = (&self.docs, &self.acked);
        self.races.retain(|r| {
            let hub_has = acked.get(&docs[r.list]);
            !r.changes
                .iter()
                .all(|c| hub_has.is_some_and(|h| h.contains(c)))
        });
        self.races
            .iter()
            .filter(|r| r.list == list)
            .flat_map(|r| r.tasks.iter().cloned())
            .collect()
    }

    /// The write request for an ordinary action, if one applies.
    fn request(&mut self, a: usize, l: usize, action: Action) -> Option<WriteRequest> {
        let held = self.held(self.agents[a].lists[l].list);
        let agent = &mut self.agents[a];
        let al = &agent.lists[l];
        let writer = behave::Writer {
            name: &agent.name,
            lead: agent.role == RoleSpec::Lead,
            replica: &al.replica,
            seen: &al.seen,
            workers: &self.workers[al.list],
            next_task: &mut agent.next_task,
            session: agent.session,
            held: &held,
        };
        behave::request(&mut self.rng, writer, action)
    }

    /// A validated write through the model, as a real agent makes it. Returns the new
    /// change, if the write made one.
    fn write(
        &mut self,
        a: usize,
        l: usize,
        req: &WriteRequest,
        action: Action,
    ) -> Option<ChangeHash> {
        let ctx = WriteContext::new(
            self.agents[a].name.clone(),
            self.epoch_ms(),
            self.rng.next_u64(),
        );
        let now = self.now;
        let al = &mut self.agents[a].lists[l];
        let outcome = match al.replica.write(req, &ctx) {
            Ok((result, _)) if result.changed => {
                self.stats.writes += 1;
                let hash = al.replica.doc().get_last_local_change().map(|c| c.hash());
                if let Some(h) = hash {
                    al.unacked.push((h, now));
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
        };
        let line = format!(
            "a{a} {action:?} l{l} -> {}",
            outcome.map_or("-".to_owned(), |h| h.to_string())
        );
        self.note(line);
        outcome
    }

    // ----- races between sessions of one agent -----

    /// A `race_start` by session `a` on its list `l`: `a` and a sibling session of the
    /// same agent each start a different pending task of the agent, at the same
    /// instant, from replicas that agree (every session of the agent on the list in
    /// sync with the hub, at one version) that nothing of the agent's is in progress.
    /// Both writes are valid; their merge holds two tasks in progress for one owner, a
    /// single-active violation the hub must report exactly once. Nothing else of the
    /// agent's is in flight meanwhile, and both tasks are held (no behaviour touches
    /// them) until the hub has acknowledged both starts: nothing else decides the race.
    fn race(&mut self, a: usize, l: usize) -> Result<bool, SimError> {
        let list = self.agents[a].lists[l].list;
        let name = self.agents[a].name.clone();
        let heads = self.agents[a].lists[l].replica.heads();
        let mut siblings = Vec::new();
        for (b, other) in self.agents.iter().enumerate() {
            if other.name != name {
                continue;
            }
            let Some(ol) = other.lists.iter().position(|x| x.list == list) else {
                continue;
            };
            if !self.rogue_ready(b, ol) || other.lists[ol].replica.heads() != heads {
                return Ok(false);
            }
            if b != a {
                siblings.push((b, ol));
            }
        }
        if siblings.is_empty() {
            return Ok(false);
        }
        let held = self.held(list);
        let replica = &self.agents[a].lists[l].replica;
        let Some((mine, theirs)) = behave::race_tasks(&mut self.rng, &name, replica, &held) else {
            return Ok(false);
        };
        let (b, bl) = siblings[self.rng.index(siblings.len())];
        let Some(first) = self.write(a, l, &behave::start_request(&mine), Action::RaceStart) else {
            return Ok(false);
        };
        let second = self.write(b, bl, &behave::start_request(&theirs), Action::RaceStart);
        self.flush(b, bl)?;
        let Some(second) = second else {
            return Ok(true);
        };
        self.races.push(Race {
            list,
            tasks: [mine, theirs],
            changes: [first, second],
        });
        self.injected.push(Injection {
            rule: Rule::SingleActive,
            list,
            agent: name,
            change: first.to_string(),
            also: vec![second.to_string()],
            action: Action::RaceStart,
            at_ms: self.now,
        });
        Ok(true)
    }

    // ----- the rogue -----

    /// Ready for an injection whose report can be counted: connected, in sync (every
    /// earlier injection acknowledged and its repair received).
    fn rogue_ready(&self, a: usize, l: usize) -> bool {
        let agent = &self.agents[a];
        agent.online
            && agent.ready
            && agent.conn.is_some()
            && in_sync(&agent.client, &agent.lists[l])
    }

    fn rogue(&mut self, a: usize, l: usize, action: Action) -> Result<bool, SimError> {
        match action {
            Action::GarbageFrame | Action::InvalidSync | Action::Oversize => {
                self.bad_frame(a, l, action)?;
                return Ok(true);
            }
            _ => {}
        }
        if !self.rogue_ready(a, l) {
            return Ok(false);
        }
        let me = self.agents[a].name.clone();
        let replica = &self.agents[a].lists[l].replica;
        let (rule, change) = match behave::rogue_move(&mut self.rng, &me, replica, action) {
            RogueMove::Setup(req) => {
                self.write(a, l, &req, Action::Plan);
                return Ok(true);
            }
            RogueMove::Idle => return Ok(false),
            RogueMove::Foreign(req) => (Rule::Ownership, self.write(a, l, &req, action)),
            RogueMove::Raw { rule, ids, edit } => (rule, self.raw_write(a, l, &ids, &edit)),
        };
        let Some(change) = change else {
            return Ok(false);
        };
        let list = self.agents[a].lists[l].list;
        self.injected.push(Injection {
            rule,
            list,
            agent: me,
            change: change.to_string(),
            also: Vec::new(),
            action,
            at_ms: self.now,
        });
        Ok(true)
    }

    /// A write that bypasses the model's validation ([`behave::raw_change`]), stamped
    /// with simulated time, taken in by the rogue's replica.
    fn raw_write(
        &mut self,
        a: usize,
        l: usize,
        ids: &[String],
        edit: &RawEdit,
    ) -> Option<ChangeHash> {
        let now_ms = self.epoch_ms();
        let now = self.now;
        let agent = &mut self.agents[a];
        let al = &mut agent.lists[l];
        let change = behave::raw_change(
            &al.replica,
            &agent.raw_actor,
            &agent.name,
            now_ms,
            ids,
            edit,
        )?;
        let hash = change.hash();
        if al.replica.apply_changes(vec![change]).is_err() {
            self.stats.agent_errors += 1;
            return None;
        }
        al.unacked.push((hash, now));
        self.stats.writes += 1;
        self.note(format!("a{a} raw l{l} -> {hash}"));
        Some(hash)
    }

    /// Opens a side connection and sends one bad frame on it (reliably, so the hub's
    /// answer can be expected).
    fn bad_frame(&mut self, a: usize, l: usize, action: Action) -> Result<(), SimError> {
        if self.hub.is_none() {
            return Ok(());
        }
        self.stats.bad_frames += 1;
        let c = self.open_conn(a, true)?;
        let (frames, expect): (Vec<Vec<u8>>, &'static [u16]) = match action {
            Action::GarbageFrame => {
                let n = self.rng.range(1, 64) as usize;
                // 0xFF opens no CBOR item: never a message, whatever follows.
                let mut b = vec![0xFF];
                b.extend((0..n).map(|_| self.rng.below(256) as u8));
                (vec![b], &[1002])
            }
            Action::InvalidSync => {
                let mut data = vec![0x00];
                data.extend((0..self.rng.range(1, 64)).map(|_| self.rng.below(256) as u8));
                let sync = wire::encode(&WireMessage::Sync {
                    document_id: self.agents[a].lists[l].doc,
                    sender_id: self.peer_id(a)?,
                    target_id: self.hub_peer(a)?,
                    data,
                });
                (vec![self.join_frame(a)?, sync], &[1008])
            }
            _ => (vec![vec![0u8; wire::MESSAGE_BYTES_MAX + 1]], &[1009]),
        };
        self.sides.insert(
            c,
            Side {
                expect,
                what: action,
                got: None,
                void: false,
            },
        );
        for f in frames {
            self.send(c, Dir::ToHub, f, true)?;
        }
        Ok(())
    }

    // ----- the end -----

    fn finish(mut self, started: std::time::Instant) -> Result<RunOutcome, SimError> {
        let unsettled = if self.converged_at.is_some() {
            Vec::new()
        } else {
            self.unsettled()
        };
        // The connections still open at both ends: their event streams must be whole.
        let open: Vec<ConnId> = self
            .agents
            .iter()
            .filter_map(|a| a.conn)
            .filter(|c| self.hub_conns.contains(c))
            .collect();
        for c in open {
            self.delivery.open_at_end(c);
        }
        let hub = self.hub.take();
        let empty = BTreeMap::new();
        let hub_lists: Vec<(DocumentId, Option<&TodoList>)> = self
            .docs
            .iter()
            .map(|d| (*d, hub.as_ref().and_then(|h| h.doc(d)).map(|s| s.list())))
            .collect();
        let replicas: Vec<Replica<'_>> = self
            .agents
            .iter()
            .flat_map(|a| {
                a.lists.iter().map(|l| Replica {
                    name: a.name.clone(),
                    doc: l.doc,
                    list: &l.replica,
                })
            })
            .collect();
        let sides: Vec<SideOutcome> = self
            .sides
            .iter()
            .filter(|(_, s)| !s.void)
            .map(|(c, s)| SideOutcome {
                conn: c.0,
                what: s.what,
                expect: s.expect.to_vec(),
                got: s.got,
            })
            .collect();
        let state = FinalState {
            converged: self.converged_at.is_some(),
            unsettled,
            hub: hub_lists,
            replicas,
            db: &self.db,
            acked: if self.acked.is_empty() {
                &empty
            } else {
                &self.acked
            },
            injected: &self.injected,
            policy: self.policy.clone(),
            roles: self.roles.clone(),
            sides,
            closes: self.stats.closes.clone(),
            events: Some(&self.delivery),
        };
        let verdict = check::check(&state)?;
        let versions = state.hub_versions();
        drop(state);
        let end = self.now;
        self.note(format!("end versions {versions:?}"));
        Ok(RunOutcome {
            scenario: self.scenario.name.clone(),
            seed: self.cfg.seed,
            fault: self.cfg.fault,
            convergence_ms: self.converged_at.map(|t| t.saturating_sub(self.storm_end)),
            end_ms: end,
            latencies_ms: self.latencies,
            divergence: self.divergence,
            stats: self.stats,
            injected: self.injected,
            rules: verdict.rules,
            checks: verdict.checks,
            versions,
            trace_digest: self.digest,
            trace: self.trace,
            wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            live: None,
        })
    }
}

/// The simulation as the driver's I/O: its SQLite file, its network, its fault hooks.
impl Io for Sim<'_> {
    fn now_ms(&self) -> i64 {
        self.epoch_ms()
    }

    async fn commit(&mut self, commits: &[Commit], at_ms: i64) -> Result<Vec<Stored>, StoreError> {
        self.store_commits(commits, at_ms)
    }

    async fn compact(&mut self, c: Compaction) {
        self.stats.compactions += 1;
        if let Err(e) = self
            .db
            .compact(persist::doc_id(&c.doc), &c.snapshot, &c.heads)
        {
            self.io_error.get_or_insert(e.into());
        }
    }

    async fn load(
        &mut self,
        doc: DocumentId,
        actor: ActorId,
    ) -> Result<Option<Option<StoredList>>, StoreError> {
        persist::load_sync(&self.db, doc, actor).map(Some)
    }

    fn send(&mut self, c: ConnId, frame: Vec<u8>) -> bool {
        if let Err(e) = self.send(c, Dir::ToAgent, frame, false) {
            self.io_error.get_or_insert(e);
        }
        true
    }

    /// Events travel as a WebSocket frame does: never lost, doubled or overtaken within
    /// their connection (a lost frame ends the connection), but for the planted faults.
    fn send_events(&mut self, c: ConnId, frame: Vec<u8>) -> bool {
        let fault = self.cfg.fault;
        let times = match fault {
            Some(Fault::DropEvent) if !self.planted => 0,
            Some(Fault::DuplicateEvent) if !self.planted => 2,
            _ => 1,
        };
        if times != 1 {
            self.planted = true;
        }
        for _ in 0..times {
            if let Err(e) = self.send(c, Dir::ToAgent, frame.clone(), true) {
                self.io_error.get_or_insert(e);
            }
        }
        true
    }

    fn relay(&mut self, c: ConnId, frame: Vec<u8>) {
        if let Err(e) = self.send(c, Dir::ToAgent, frame, false) {
            self.io_error.get_or_insert(e);
        }
    }

    fn close(&mut self, c: ConnId, close: Close) {
        self.hub_conns.remove(&c);
        let at = self.now + self.net.latency(&mut self.rng);
        let at = self.net.after_last(c, Dir::ToAgent, at);
        if let Err(e) = self.queue.push(at, Event::Closed(c, close)) {
            self.io_error.get_or_insert(e);
        }
    }
}

/// What a frame says, for the trace: message type, and for sync messages their heads,
/// needs, haves and changes.
fn frame_detail(bytes: &[u8]) -> String {
    let Ok(msg) = wire::decode(bytes) else {
        return "undecodable".to_owned();
    };
    let data = match &msg {
        WireMessage::Sync { data, .. } | WireMessage::Request { data, .. } => data,
        other => return other.type_name().to_owned(),
    };
    match syncmsg::validate(data, &syncmsg::Limits::default()) {
        Ok(m) => {
            let m = m.into_message();
            let short = |hs: &[ChangeHash]| {
                hs.iter()
                    .map(|h| h.to_string()[..8].to_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            format!(
                "{} heads [{}] need [{}] have {} (last_sync [{}]) changes {}",
                msg.type_name(),
                short(&m.heads),
                short(&m.need),
                m.have.len(),
                m.have
                    .iter()
                    .map(|h| short(&h.last_sync))
                    .collect::<Vec<_>>()
                    .join("|"),
                m.changes.len()
            )
        }
        Err(e) => format!("{} invalid: {e}", msg.type_name()),
    }
}

/// The agents with a worker role on `list` (each once, however many sessions it has).
fn workers_of(agents: &[Agent], list: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for a in agents {
        let on = a.role == RoleSpec::Worker && a.lists.iter().any(|l| l.list == list);
        if on && !out.contains(&a.name) {
            out.push(a.name.clone());
        }
    }
    out
}

/// A fingerprint of where an agent's sync stands.
fn progress_mark(agent: &Agent) -> u64 {
    let mut bytes = Vec::new();
    bytes.push(u8::from(agent.ready));
    for l in &agent.lists {
        for h in l.replica.heads() {
            bytes.extend_from_slice(&h.0);
        }
        bytes.push(0);
        let theirs = agent
            .client
            .state(l.doc)
            .and_then(|s| s.their_heads.as_ref());
        for h in theirs.into_iter().flatten() {
            bytes.extend_from_slice(&h.0);
        }
        bytes.push(1);
    }
    super::net::fingerprint(&bytes)
}

/// The hub has acknowledged everything this replica has (and nothing waits).
fn in_sync(client: &Session, l: &AgentList) -> bool {
    client.in_sync(l.doc, &l.replica) && l.replica.pending_changes() == 0
}

/// The peer id of session `session` of agent `name`.
fn agent_peer_id(name: &str, session: usize) -> Result<PeerId, SimError> {
    let id = match session {
        0 => name.to_owned(),
        s => format!("{name}-s{s}"),
    };
    PeerId::new(id).map_err(|e| SimError::Setup(format!("agent name as a peer id: {e}")))
}
