//! The deterministic runner: the real [`HubCore`], [`TodoList`] replicas, authority and
//! SQLite [`Db`] in one thread, on the simulated network of [`super::net`], all driven
//! by one seed.
//!
//! Nothing here reads a clock or the OS's randomness: time is the event queue's
//! simulated milliseconds (stamped on changes as [`SIM_EPOCH_MS`] plus that), every
//! actor id and choice comes from the seed's [`Rng`], and every map iterated is a
//! `BTreeMap`. The hub core is sans-I/O, so there is no `select!` to be unfair. Running a
//! seed twice gives the same trace, byte for byte.
//!
//! Here: the simulation's state (`Sim`), [`run`], its setup and its event loop. The hub
//! side (start, crash, restart, batches, the driver's I/O) is in `hub`, the agents'
//! connections, frames, flushes and timers in `agents`, their actions (writes, races,
//! the rogue's moves and bad frames) in `acts`, and the samples, quiescence and the
//! final verdict in `end`.

mod acts;
mod agents;
mod end;
mod hub;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;

use automerge::{ActorId, ChangeHash};

use super::behave;
pub use super::behave::{GUARD_TASKS, LIST_TASKS_SIM_MAX, ROGUE_TASKS, SEEN_VERSIONS_MAX};
use super::check::Delivery;
use super::net::{Dir, Event, Net, Queue};
use super::outcome::SimError;
pub use super::outcome::{Fault, Injection, RunConfig, RunOutcome, Stats, SAMPLE_MS};
use super::rng::Rng;
use super::scenario::{Action, RoleSpec, Scenario};
use swarmtodo_client::session::Session;
use swarmtodo_core::authority::{Policy, Role, Roles};
use swarmtodo_core::hub::{Commit, ConnId, HubCore, Input};
use swarmtodo_core::model::TodoList;
use swarmtodo_core::syncmsg;
use swarmtodo_proto::wire::list_document_id;
use swarmtodo_proto::wire::{self, DocumentId, PeerId, WireMessage};
use swarmtodo_proto::Version;
use swarmtodo_store::Db;

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

/// The peer id of session `session` of agent `name`.
fn agent_peer_id(name: &str, session: usize) -> Result<PeerId, SimError> {
    let id = match session {
        0 => name.to_owned(),
        s => format!("{name}-s{s}"),
    };
    PeerId::new(id).map_err(|e| SimError::Setup(format!("agent name as a peer id: {e}")))
}
