//! The controller of a live run: the hub process (start, `kill -9`, restart, SIGTERM),
//! the agents' sessions, the fault schedule (kills, partitions, cuts, slow readers), the
//! wait for quiescence and the read-back of the hub's lists, leaving what the run ended
//! with ([`Ended`]) for the judge.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use automerge::{ActorId, ChangeHash};
use tokio::sync::watch;

use super::access::{authed, slow_reader_list, Access, CHECKER_AGENT};
use super::cluster::{terms_ended, ClusterRun};
use super::hub::{HubCommand, HubProcess};
use super::nats::Relay;
use super::raw;
use super::session::{Session, Spec};
use super::shared::{Control, Shared, Status, Tracker};
use crate::behave::{self, GUARD_TASKS};
use crate::outcome::{LiveConfig, LiveStats, SimError, SlowReaderOutcome, Stats, SAMPLE_MS};
use crate::rng::Rng;
use crate::scenario::{RoleSpec, Scenario};
use swarmtodo_client::{list_document_id, ClientError, Connection};
use swarmtodo_core::model::{TodoList, WriteContext};
use swarmtodo_proto::wire::DocumentId;

/// Consecutive quiet samples (every [`SAMPLE_MS`]) that make quiescence.
pub const QUIET_SAMPLES: u32 = 3;
/// A slow reader needs this long without a hub kill to be judged (filling the hub's
/// buffers, then the hub's close timeouts): it starts where the kill schedule leaves
/// such a window, else when the storm ends.
pub const SLOW_READER_WINDOW_MS: u64 = 12_000;
/// How long the first leads' plans may take to reach the hub before the run starts.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long reading a list from the hub for the checker may take.
pub const READ_BACK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the checker waits to read a list again after the hub closed its read with
/// 1012 or 1013 (the list changing hands).
pub const READ_BACK_RETRY: Duration = Duration::from_millis(200);
/// Most controller log lines kept.
pub const LOG_LINES_MAX: usize = 100_000;

/// What the controller does, and when (milliseconds into the storm). A cluster's
/// faults name a list: they strike the hub that holds it then.
#[derive(Debug, Clone)]
enum Ev {
    Kill(usize),
    Restart,
    Pause(usize),
    Resume,
    NatsCut(usize),
    NatsHeal,
    Cut(usize),
    PartitionStart(Vec<usize>),
    PartitionEnd(Vec<usize>),
    /// A slow reader, with the seed of its list's text.
    SlowReader(u64),
    StormEnd,
}

/// What the live part of a run leaves for the checker.
#[derive(Debug)]
pub(super) struct Ended {
    pub(super) sessions: Vec<Session>,
    pub(super) docs: Vec<DocumentId>,
    /// The hub's lists as a fresh client read them (None: could not be read).
    pub(super) hub_lists: Vec<Option<TodoList>>,
    pub(super) converged: Option<u64>,
    pub(super) storm_ms: u64,
    pub(super) end_ms: u64,
    pub(super) divergence: Vec<(u64, u64)>,
    pub(super) latencies_ms: Vec<u64>,
    pub(super) unpropagated: u64,
    pub(super) stats: Stats,
    pub(super) live: LiveStats,
    pub(super) log: Vec<String>,
    /// Slow readers whose life saw no kill: `(outcome, judged)`.
    pub(super) slow: Vec<(SlowReaderOutcome, bool)>,
    /// The SQLite file the checker reads: the hub's, or a cluster's logs replayed.
    pub(super) data: PathBuf,
}

/// One hub process of the run.
struct HubSlot {
    cmd: HubCommand,
    process: Option<HubProcess>,
    addr: SocketAddr,
    /// A cluster's hub: its way to NATS, cut and healed.
    relay: Option<Relay>,
    paused: bool,
    cut: bool,
}

struct Controller {
    hubs: Vec<HubSlot>,
    cluster: Option<ClusterRun>,
    docs: Vec<DocumentId>,
    /// Hubs killed, paused, cut from NATS: the next restart, resume or heal is the
    /// first's.
    down: VecDeque<usize>,
    paused: VecDeque<usize>,
    cut: VecDeque<usize>,
    rng: Rng,
    shared: Arc<Shared>,
    controls: Vec<watch::Sender<Control>>,
    /// Sessions of each agent.
    sessions_of_agent: Vec<Vec<usize>>,
    live: LiveStats,
    stats: Stats,
    log: Vec<String>,
    divergence: Vec<(u64, u64)>,
    slow: Vec<tokio::task::JoinHandle<(SlowReaderOutcome, bool)>>,
}

impl Controller {
    fn note(&mut self, line: String) {
        if self.log.len() < LOG_LINES_MAX {
            self.log
                .push(format!("{:>8} {line}", self.shared.elapsed_ms()));
        }
    }

    fn sample_rss(&mut self) {
        for h in self.hubs.iter().filter_map(|h| h.process.as_ref()) {
            self.live.hub_peak_rss_kib = self.live.hub_peak_rss_kib.max(h.peak_rss_kib());
        }
    }

    /// Tells the sessions whether every hub is up (none down, paused or cut).
    fn update_up(&self) {
        let up = self
            .hubs
            .iter()
            .all(|h| h.process.is_some() && !h.paused && !h.cut);
        self.shared.hub_up.store(up, Ordering::SeqCst);
    }

    async fn start_hub(&mut self, i: usize) -> Result<(), SimError> {
        // A hub that cannot reach NATS when it starts stops: it starts reconnected.
        if self.hubs[i].cut {
            self.cut.retain(|&h| h != i);
            self.cut_from_nats(i, false);
        }
        let listen = self.hubs[i].addr;
        let cmd = self.hubs[i].cmd.clone();
        let started = tokio::task::spawn_blocking(move || cmd.start(listen))
            .await
            .map_err(|e| SimError::Setup(format!("starting the hub: {e}")))?;
        let hub = match started {
            Ok(h) => h,
            // The old port was taken meanwhile: any free one, and the agents follow.
            Err(e) if listen.port() != 0 => {
                self.note(format!(
                    "restart of hub {i} on {listen} failed ({e}); any port"
                ));
                self.live.restarts_on_new_port += 1;
                let cmd = self.hubs[i].cmd.clone();
                let any = SocketAddr::from(([127, 0, 0, 1], 0));
                tokio::task::spawn_blocking(move || cmd.start(any))
                    .await
                    .map_err(|e| SimError::Setup(format!("starting the hub: {e}")))??
            }
            Err(e) => return Err(e),
        };
        self.shared.set_url(i, format!("ws://{}", hub.addr));
        self.note(format!("hub {i} up on {} (pid {})", hub.addr, hub.pid()));
        self.hubs[i].addr = hub.addr;
        self.hubs[i].process = Some(hub);
        self.update_up();
        Ok(())
    }

    /// The hub that holds list `list` now (a cluster's; else the one hub). A list no
    /// hub holds at the moment (given back, changing hands): one picked at random.
    async fn holder(&mut self, list: usize) -> usize {
        let Some(c) = &self.cluster else {
            return 0;
        };
        c.holder(&self.docs[list])
            .await
            .filter(|&i| i < self.hubs.len())
            .unwrap_or_else(|| self.rng.index(self.hubs.len()))
    }

    async fn kill(&mut self, list: usize) {
        let i = self.holder(list).await;
        let Some(hub) = self.hubs[i].process.take() else {
            return;
        };
        // SIGKILL ends a paused process too.
        self.hubs[i].paused = false;
        self.paused.retain(|&h| h != i);
        self.sample_rss();
        self.update_up();
        self.shared.kills.fetch_add(1, Ordering::SeqCst);
        self.live.kills += 1;
        self.stats.hub_crashes += 1;
        let pid = hub.pid();
        let _ = tokio::task::spawn_blocking(move || hub.kill9()).await;
        self.down.push_back(i);
        self.note(format!(
            "kill -9 hub {i} (pid {pid}), holder of list-{list}"
        ));
    }

    /// SIGSTOP of the hub holding `list` (`true`), or SIGCONT of the first paused.
    fn pause(&mut self, i: usize, pause: bool) {
        let slot = &mut self.hubs[i];
        let Some(p) = &slot.process else { return };
        if slot.paused == pause || !p.pause(pause) {
            return;
        }
        slot.paused = pause;
        if pause {
            self.paused.push_back(i);
            self.shared.kills.fetch_add(1, Ordering::SeqCst);
            self.live.pauses += 1;
        }
        self.update_up();
        self.note(format!(
            "{} hub {i}",
            if pause { "SIGSTOP" } else { "SIGCONT" }
        ));
    }

    /// Cuts hub `i` from NATS (`true`) or heals it.
    fn cut_from_nats(&mut self, i: usize, cut: bool) {
        let slot = &mut self.hubs[i];
        let Some(relay) = &slot.relay else { return };
        if slot.cut == cut {
            return;
        }
        if cut {
            relay.cut();
            self.cut.push_back(i);
            self.shared.kills.fetch_add(1, Ordering::SeqCst);
            self.live.nats_cuts += 1;
        } else {
            relay.heal();
        }
        slot.cut = cut;
        self.update_up();
        self.note(format!(
            "hub {i} {} NATS",
            if cut { "cut from" } else { "reconnected to" }
        ));
    }

    /// A hub that ended by itself is a failure of the product: noted, and restarted so
    /// that the run can go on.
    async fn watch_hub(&mut self) -> Result<(), SimError> {
        for i in 0..self.hubs.len() {
            let exited = self.hubs[i].process.as_mut().and_then(HubProcess::exited);
            if let Some(status) = exited {
                self.hubs[i].process = None;
                self.update_up();
                let what = format!(
                    "hub {i} exited by itself ({status}) at {} ms",
                    self.shared.elapsed_ms()
                );
                self.note(what.clone());
                self.live.hub_exits.push(what);
                self.start_hub(i).await?;
            }
        }
        Ok(())
    }

    /// Ends every fault at the storm's end: hubs restarted, woken, reconnected.
    async fn mend(&mut self) -> Result<(), SimError> {
        while let Some(i) = self.paused.pop_front() {
            self.pause(i, false);
        }
        while let Some(i) = self.cut.pop_front() {
            self.cut_from_nats(i, false);
        }
        self.down.clear();
        for i in 0..self.hubs.len() {
            if self.hubs[i].process.is_none() {
                self.start_hub(i).await?;
            }
        }
        Ok(())
    }

    fn sample(&mut self) {
        self.sample_rss();
        let off = self
            .shared
            .status
            .lock()
            .map(|all| all.iter().filter(|s| !(s.connected && s.in_sync)).count())
            .unwrap_or(0);
        self.divergence
            .push((self.shared.elapsed_ms(), u64::try_from(off).unwrap_or(0)));
    }

    /// Every session connected and in sync, every list's replicas at one version.
    fn quiet(&self, list_of: &[usize]) -> bool {
        let Ok(all) = self.shared.status.lock() else {
            return false;
        };
        let mut heads: BTreeMap<usize, &Vec<ChangeHash>> = BTreeMap::new();
        all.iter().zip(list_of).all(|(s, l)| {
            s.connected && s.in_sync && **heads.entry(*l).or_insert(&s.heads) == s.heads
        })
    }

    /// Changes what `sessions` are told. A session wakes only on a real change (a wake
    /// cancels its sync, and with it the connection).
    fn control(&mut self, sessions: &[usize], f: impl Fn(&mut Control)) {
        for &s in sessions {
            if let Some(c) = self.controls.get(s) {
                c.send_if_modified(|ctl| {
                    let before = *ctl;
                    f(ctl);
                    *ctl != before
                });
            }
        }
    }

    async fn event(&mut self, ev: Ev) -> Result<(), SimError> {
        match ev {
            // A kill pushed past the storm by its predecessors' downtime is dropped, as
            // in the deterministic runner.
            Ev::Kill(_) | Ev::Pause(_) | Ev::NatsCut(_)
                if !self.shared.storm.load(Ordering::SeqCst) => {}
            Ev::Kill(list) => self.kill(list).await,
            Ev::Restart => {
                if let Some(i) = self.down.pop_front() {
                    if self.hubs[i].process.is_none() {
                        self.start_hub(i).await?;
                    }
                }
            }
            Ev::Pause(list) => {
                let i = self.holder(list).await;
                self.pause(i, true);
            }
            Ev::Resume => {
                if let Some(i) = self.paused.pop_front() {
                    self.pause(i, false);
                }
            }
            Ev::NatsCut(list) => {
                let i = self.holder(list).await;
                self.cut_from_nats(i, true);
            }
            Ev::NatsHeal => {
                if let Some(i) = self.cut.pop_front() {
                    self.cut_from_nats(i, false);
                }
            }
            Ev::Cut(s) => {
                self.note(format!("cut session {s}"));
                self.control(&[s], |c| c.cuts += 1);
            }
            Ev::PartitionStart(agents) => {
                self.stats.partitions += 1;
                let sessions: Vec<usize> = agents
                    .iter()
                    .flat_map(|a| self.sessions_of_agent[*a].clone())
                    .collect();
                self.note(format!("partition cuts off agents {agents:?}"));
                self.control(&sessions, |c| c.online = false);
            }
            Ev::PartitionEnd(agents) => {
                let sessions: Vec<usize> = agents
                    .iter()
                    .flat_map(|a| self.sessions_of_agent[*a].clone())
                    .collect();
                self.note(format!("partition of agents {agents:?} heals"));
                self.control(&sessions, |c| c.online = true);
            }
            Ev::SlowReader(seed) => {
                let n = self.slow.len();
                let shared = self.shared.clone();
                let list = slow_reader_list(n);
                self.note(format!("slow reader {n} on list {list}"));
                self.slow.push(tokio::spawn(async move {
                    let kills = shared.kills.load(Ordering::SeqCst);
                    let url = shared.url();
                    let tokens = raw::SlowTokens {
                        writer: &shared.access.slow_writer,
                        reader: &shared.access.slow_reader,
                    };
                    let out = raw::slow_reader(&url, tokens, &list, seed).await;
                    let judged = !out.no_hub && shared.kills.load(Ordering::SeqCst) == kills;
                    (out, judged)
                }));
            }
            Ev::StormEnd => {
                self.shared.storm.store(false, Ordering::SeqCst);
                self.mend().await?;
                let all: Vec<usize> = (0..self.controls.len()).collect();
                self.control(&all, |c| c.online = true);
                self.note("storm over".into());
            }
        }
        Ok(())
    }
}

/// The live part: hub, agents, faults, quiescence, read-back, stop.
pub(super) async fn drive(
    scenario: &Scenario,
    cfg: &LiveConfig,
    mut cmds: Vec<HubCommand>,
    access: &Access,
    dir: &Path,
) -> Result<Ended, SimError> {
    let mut rng = Rng::new(cfg.seed);
    let docs: Vec<DocumentId> = (0..scenario.lists.count)
        .map(|i| list_document_id(&format!("list-{i}")))
        .collect();
    // A cluster: its nats-server, a relay per hub to it, and an observer.
    let (cluster, relays) = match &scenario.cluster {
        None => (None, vec![None]),
        Some(spec) => {
            let (run, relays) = ClusterRun::start(spec, cfg, &mut cmds, dir, &docs).await?;
            (Some(run), relays.into_iter().map(Some).collect())
        }
    };
    let agents = scenario.agents();
    let mut workers: Vec<Vec<String>> = vec![Vec::new(); docs.len()];
    for (g, name, lists) in &agents {
        if scenario.agents[*g].role == RoleSpec::Worker {
            for &l in lists {
                workers[l].push(name.clone());
            }
        }
    }
    for w in &mut workers {
        // An agent of several sessions is one owner.
        let mut seen = BTreeSet::new();
        w.retain(|name| seen.insert(name.clone()));
    }
    let mut sessions: Vec<Session> = Vec::new();
    let mut sessions_of_agent = Vec::new();
    let mut list_of = Vec::new();
    for (a, (g, name, lists)) in agents.iter().enumerate() {
        let group = &scenario.agents[*g];
        let actor = ActorId::from(rng.bytes16());
        let raw_actor = ActorId::from(rng.bytes16());
        let session = agents[..a].iter().filter(|(_, n, _)| n == name).count();
        let mut mine = Vec::new();
        for &l in lists {
            let spec = Spec {
                index: sessions.len(),
                name: name.clone(),
                session,
                token: access.token(name).to_owned(),
                role: group.role,
                list: l,
                doc: docs[l],
                rate_per_s: group.rate_per_s / lists.len().max(1) as f64,
                mix: group.mix.clone(),
                workers: workers[l].clone(),
                siblings: Vec::new(),
                raw_actor: raw_actor.clone(),
            };
            mine.push(spec.index);
            list_of.push(l);
            sessions.push(Session::new(
                spec,
                TodoList::create(actor.clone()),
                rng.fork(),
            ));
        }
        sessions_of_agent.push(mine);
    }
    let mut sessions_of_list: Vec<Vec<usize>> = vec![Vec::new(); docs.len()];
    for (s, &l) in list_of.iter().enumerate() {
        sessions_of_list[l].push(s);
    }
    // The other sessions of the same agent on the same list: whom a race may pick.
    let keys: Vec<(String, usize)> = sessions
        .iter()
        .map(|s| (s.spec.name.clone(), s.spec.list))
        .collect();
    for (i, s) in sessions.iter_mut().enumerate() {
        s.spec.siblings = (0..keys.len())
            .filter(|&j| j != i && keys[j] == keys[i])
            .collect();
    }
    let shared = Arc::new(Shared {
        started: Instant::now(),
        urls: Mutex::new(vec![String::new(); cmds.len()]),
        storm: AtomicBool::new(true),
        hub_up: AtomicBool::new(false),
        kills: AtomicU64::new(0),
        tracker: Mutex::new(Tracker::new(sessions_of_list)),
        status: Mutex::new(vec![Status::default(); sessions.len()]),
        orders: Mutex::new((0..sessions.len()).map(|_| None).collect()),
        holds: Mutex::new(Vec::new()),
        access: access.clone(),
    });
    let mut ctl = Controller {
        hubs: cmds
            .into_iter()
            .zip(relays)
            .map(|(cmd, relay)| HubSlot {
                cmd,
                process: None,
                addr: SocketAddr::from(([127, 0, 0, 1], 0)),
                relay,
                paused: false,
                cut: false,
            })
            .collect(),
        cluster,
        docs: docs.clone(),
        down: VecDeque::new(),
        paused: VecDeque::new(),
        cut: VecDeque::new(),
        // A cluster's own draws (a hub picked when no hub holds a list): a single hub's
        // runs draw as they always did.
        rng: if scenario.cluster.is_some() {
            rng.fork()
        } else {
            Rng::new(cfg.seed)
        },
        shared: shared.clone(),
        controls: Vec::new(),
        sessions_of_agent,
        live: LiveStats {
            fault: cfg.fault,
            ..LiveStats::default()
        },
        stats: Stats::default(),
        log: Vec::new(),
        divergence: Vec::new(),
        slow: Vec::new(),
    };
    for i in 0..ctl.hubs.len() {
        ctl.start_hub(i).await?;
    }

    // The first lead of each list writes its plan and brings it to the hub before
    // anyone else connects (others would otherwise ask for a list the hub lacks).
    let rogue_lists: BTreeSet<usize> = sessions
        .iter()
        .filter(|s| s.spec.role == RoleSpec::Rogue)
        .map(|s| s.spec.list)
        .collect();
    for (list, doc_workers) in workers.iter().enumerate() {
        let Some(s) = sessions
            .iter_mut()
            .find(|s| s.spec.role == RoleSpec::Lead && s.spec.list == list)
        else {
            continue;
        };
        let guards = if rogue_lists.contains(&list) {
            GUARD_TASKS
        } else {
            0
        };
        let lead = s.spec.name.clone();
        let req = behave::initial_plan(
            &mut rng,
            scenario.lists.initial_tasks,
            &lead,
            doc_workers,
            guards,
        );
        let ctx = WriteContext::new(lead.clone(), wall_ms(), rng.next_u64());
        let at = Instant::now();
        if let Ok((r, _)) = s.replica.write(&req, &ctx) {
            if r.changed {
                if let Some(c) = s.replica.doc().get_last_local_change() {
                    s.note_written(c.hash(), at);
                    s.stats.writes += 1;
                }
            }
        }
        let url = authed(&shared.url(), access.token(&lead));
        let setup = async {
            let mut conn = Connection::connect(&url, &format!("{lead}-l{list}-setup")).await?;
            conn.sync(s.spec.doc, &mut s.replica).await?;
            conn.close().await
        };
        match tokio::time::timeout(SETUP_TIMEOUT, setup).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(SimError::Setup(format!("list-{list}'s first plan: {e}"))),
            Err(_) => {
                return Err(SimError::Setup(format!(
                    "list-{list}'s first plan: timed out"
                )))
            }
        }
    }
    let started = Instant::now();

    // The fault schedule, from the seed: kills as the deterministic runner spreads them,
    // partitions likewise, then cuts and slow readers.
    let storm_ms = scenario.duration_ms;
    let f = &scenario.faults;
    let mut timeline: Vec<(u64, Ev)> = Vec::new();
    let crashes = behave::hub_crashes(&mut rng, storm_ms, f);
    let clustered = scenario.cluster.is_some();
    for &(t, down) in &crashes {
        let list = if clustered { rng.index(docs.len()) } else { 0 };
        timeline.push((t, Ev::Kill(list)));
        timeline.push((t + down, Ev::Restart));
    }
    // A cluster's pauses and cuts from NATS, each of the hub holding a list picked now.
    for (n, [lo, hi], start, end) in [
        (
            f.hub_pauses,
            f.hub_pause_ms,
            Ev::Pause as fn(usize) -> Ev,
            Ev::Resume,
        ),
        (f.nats_cuts, f.nats_cut_ms, Ev::NatsCut, Ev::NatsHeal),
    ] {
        for _ in 0..n {
            let at = rng.range(1, storm_ms.max(2) - 1);
            let len = rng.range(lo, hi.max(lo + 1));
            timeline.push((at, start(rng.index(docs.len()))));
            timeline.push((at + len, end.clone()));
        }
    }
    for (at, len, cut) in behave::partitions(&mut rng, storm_ms, f, agents.len()) {
        timeline.push((at, Ev::PartitionStart(cut.clone())));
        timeline.push((at + len, Ev::PartitionEnd(cut)));
    }
    for _ in 0..f.connection_cuts {
        let at = rng.range(1, storm_ms.max(2) - 1);
        timeline.push((at, Ev::Cut(rng.index(sessions.len()))));
    }
    let mut after_storm = Vec::new();
    for _ in 0..f.slow_readers {
        let at = rng.range(1, storm_ms.max(2) - 1);
        let seed = rng.next_u64();
        let clear = crashes
            .iter()
            .all(|&(t, down)| t + down < at || t > at + SLOW_READER_WINDOW_MS);
        if clear {
            timeline.push((at, Ev::SlowReader(seed)));
        } else {
            after_storm.push((storm_ms, Ev::SlowReader(seed)));
        }
    }
    // The storm's end first (the hub is up again after it), then what was put off.
    timeline.push((storm_ms, Ev::StormEnd));
    timeline.extend(after_storm);
    // Stable: events of one instant keep their order (a kill before its restart).
    timeline.sort_by_key(|(t, _)| *t);

    let mut handles = Vec::new();
    for s in sessions {
        let (tx, rx) = watch::channel(Control::default());
        ctl.controls.push(tx);
        handles.push(tokio::spawn(s.run(shared.clone(), rx)));
    }

    // The storm.
    let at = |ms: u64| tokio::time::Instant::from_std(started + Duration::from_millis(ms));
    let mut next_sample = 0u64;
    let mut events = timeline.into_iter().peekable();
    while let Some((t, _)) = events.peek() {
        let t = *t;
        // The storm's end healed every partition and restarted the hub: what was
        // scheduled after it is moot.
        if t > storm_ms {
            break;
        }
        if next_sample < t {
            tokio::time::sleep_until(at(next_sample)).await;
            ctl.sample();
            ctl.watch_hub().await?;
            next_sample += SAMPLE_MS;
            continue;
        }
        tokio::time::sleep_until(at(t)).await;
        if let Some((_, ev)) = events.next() {
            ctl.event(ev).await?;
        }
    }

    // Quiescence.
    let storm_end = Instant::now();
    let deadline = storm_end + Duration::from_millis(scenario.settle_ms_max);
    // Converged: the agents quiet for QUIET_SAMPLES samples in a row; the run also waits
    // for its slow readers to be judged, and the agents must stay quiet meanwhile. The
    // time is that of the first sample of the last quiet streak.
    let mut streak = 0;
    let mut quiet_since = None;
    let mut converged = None;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(SAMPLE_MS)).await;
        ctl.sample();
        ctl.watch_hub().await?;
        if ctl.quiet(&list_of) {
            streak += 1;
            quiet_since.get_or_insert(ms_since(storm_end));
        } else {
            streak = 0;
            quiet_since = None;
        }
        let readers_done = ctl.slow.iter().all(tokio::task::JoinHandle::is_finished);
        if streak >= QUIET_SAMPLES && readers_done {
            converged = quiet_since;
            break;
        }
    }
    ctl.note(match converged {
        Some(ms) => format!("quiescent {ms} ms after the storm"),
        None => "no quiescence within settle_ms_max".into(),
    });
    let end_ms = ms_since(started);

    // Stop the agents and collect what they hold.
    let all: Vec<usize> = (0..ctl.controls.len()).collect();
    ctl.control(&all, |c| c.stop = true);
    let mut sessions = Vec::new();
    for h in handles {
        sessions.push(
            h.await
                .map_err(|e| SimError::Setup(format!("an agent task failed: {e}")))?,
        );
    }
    let mut slow = Vec::new();
    for h in std::mem::take(&mut ctl.slow) {
        h.abort();
        if let Ok(r) = h.await {
            slow.push(r);
        }
    }

    // The hub's state, as a fresh client reads it.
    let url = authed(&shared.url(), &access.checker);
    let mut hub_lists = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let actor = ActorId::from(rng.bytes16());
        let deadline = tokio::time::Instant::now() + READ_BACK_TIMEOUT;
        // A client closed with 1012 `list_moved` or 1013 `list_elsewhere` (the list
        // changing hands between hubs) reconnects, as an agent does.
        let read = loop {
            let mut list = TodoList::create(actor.clone());
            let read = async {
                let mut conn = Connection::connect(&url, &format!("{CHECKER_AGENT}-{i}")).await?;
                conn.sync(*doc, &mut list).await?;
                conn.close().await
            };
            match tokio::time::timeout_at(deadline, read).await {
                Ok(Ok(())) => break Ok(list),
                Ok(Err(ClientError::Closed(why)))
                    if why.starts_with("1012 ") || why.starts_with("1013 ") =>
                {
                    tracing::info!(%doc, why, "the checker's read of a list was closed: again");
                    tokio::time::sleep(READ_BACK_RETRY).await;
                }
                Ok(Err(e)) => break Err(e.to_string()),
                Err(_) => break Err(format!("no answer within {READ_BACK_TIMEOUT:?}")),
            }
        };
        hub_lists.push(
            read.map_err(|why| tracing::warn!(%doc, why, "the checker could not read a list"))
                .ok(),
        );
    }

    // Stop the hubs as an operator would.
    ctl.sample_rss();
    let mut stops = Vec::new();
    for (i, slot) in ctl.hubs.iter_mut().enumerate() {
        let Some(hub) = slot.process.take() else {
            continue;
        };
        let stopped = tokio::task::spawn_blocking(move || hub.terminate())
            .await
            .map_err(|e| SimError::Setup(format!("stopping hub {i}: {e}")))?;
        match stopped {
            Ok(s) if s.success() => {}
            Ok(s) => stops.push(format!("hub {i}: {s} after SIGTERM")),
            Err(e) => stops.push(format!("hub {i}: {e}")),
        }
    }
    ctl.live.hub_stop = if stops.is_empty() {
        "exit 0 after SIGTERM".to_owned()
    } else {
        stops.join("; ")
    };
    ctl.update_up();

    // A cluster's lists are in its logs: replayed into one SQLite file for the checker,
    // as a hub taking each list would.
    let data = match &ctl.cluster {
        None => ctl.hubs[0].cmd.data.clone(),
        Some(c) => c.replay_logs(&docs, &dir.join("cluster.db")).await?,
    };
    if let Some(c) = &ctl.cluster {
        let mut found = c.audit(&docs).await;
        let logs: Vec<&Path> = ctl.hubs.iter().map(|h| h.cmd.log.as_path()).collect();
        found.terms_ended = terms_ended(&logs);
        ctl.live.cluster = Some(found);
    }

    let (latencies_ms, unpropagated) = match shared.tracker.lock() {
        Ok(t) => (t.latencies_ms.clone(), t.pending()),
        Err(_) => (Vec::new(), 0),
    };
    let mut stats = ctl.stats.clone();
    for s in &sessions {
        add_stats(&mut stats, &s.stats);
        ctl.live.cuts += s.cuts;
        ctl.live.ack_latencies_ms.extend(&s.ack_latencies_ms);
        ctl.live.acked += u64::try_from(s.acked.len()).unwrap_or(0);
    }
    ctl.live.storm_ms = storm_ms;
    ctl.live.slow_readers = slow.iter().map(|(o, _)| *o).collect();
    Ok(Ended {
        sessions,
        docs,
        hub_lists,
        converged,
        storm_ms,
        end_ms,
        divergence: std::mem::take(&mut ctl.divergence),
        latencies_ms,
        unpropagated: u64::try_from(unpropagated).unwrap_or(u64::MAX),
        stats,
        live: std::mem::take(&mut ctl.live),
        log: std::mem::take(&mut ctl.log),
        slow,
        data,
    })
}

pub(super) fn ms_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn add_stats(total: &mut Stats, s: &Stats) {
    total.ops += s.ops;
    total.writes += s.writes;
    total.idle += s.idle;
    total.connects += s.connects;
    total.stall_resets += s.stall_resets;
    total.agent_errors += s.agent_errors;
    total.bad_frames += s.bad_frames;
    for (k, v) in &s.refused {
        *total.refused.entry(k.clone()).or_default() += v;
    }
    for (k, v) in &s.closes {
        *total.closes.entry(k.clone()).or_default() += v;
    }
}
