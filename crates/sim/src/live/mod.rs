//! The live runner (`swarmtodo sim FILE --live`): the scenario against a real
//! `swarmtodo serve` process, with real clients over loopback WebSockets and faults made
//! for real.
//!
//! - The hub is a child process on `127.0.0.1` with its SQLite file in the run's
//!   folder ([`hub`]). A hub crash is `kill -9`, then a restart on the same data file
//!   and, when the port is still free, the same port (else the agents are pointed at the
//!   new one).
//! - The hub runs with a configuration file written for the run ([`Access`]): a token
//!   per agent (its sessions share it) with the agent's role — workers and the rogue
//!   are workers, so ownership is enforced as in the deterministic runs — and tokens of
//!   their own for the checker's read-back and the slow readers. Every connection,
//!   raw ones included, carries its token (`?token=`).
//! - Each agent syncs each of its lists with the real client ([`Connection`]), acts at
//!   the scenario's rate with the behaviours the deterministic runner uses
//!   ([`super::behave`]), and reconnects with the client's backoff ([`session`]). An
//!   agent of several sessions has a session (replica and connection) per list per
//!   session; sessions race each other with `race_start`.
//! - Connection cuts drop an agent's connection without a close; partitions keep agents
//!   off the hub (they write on); slow readers are raw peers that never read ([`raw`]).
//! - "Acknowledged" is what the client sees: its sync ended with the hub's heads equal
//!   to its own, and the hub answers only after its commit is durable.
//!
//! After the storm the runner waits for quiescence (every agent connected and in sync,
//! every list's replicas at one version), reads the hub's state with a fresh client,
//! stops the hub with SIGTERM, opens its SQLite file and runs the checker of
//! [`super::check`]. What cannot be checked live is reported as skipped, with the reason.
//! Timing is wall-clock, so a live run is not reproducible from its seed; the seed fixes
//! the agents, their choices and the fault schedule.
//!
//! [`Connection`]: swarmtodo_client::Connection

mod hub;
mod raw;
mod session;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use automerge::{ActorId, ChangeHash};
use tokio::sync::watch;

use self::hub::{HubCommand, HubProcess};
pub use self::hub::{HUB_START_TIMEOUT, HUB_STOP_TIMEOUT};
pub use self::raw::{
    BAD_FRAME_TIMEOUT, SLOW_READER_CLOSE_WAIT, SLOW_READER_RCVBUF_BYTES, SLOW_READER_WRITES_MAX,
    SLOW_READER_WRITE_TASKS,
};
use self::session::{Control, RaceHold, RaceOrder, Session, Spec, Status, Tracker};
pub use self::session::{RACE_ANSWER_TIMEOUT, SYNC_STALL};
use super::behave;
use super::behave::GUARD_TASKS;
use super::check::{self, Check, FinalState, Replica, SideOutcome};
use super::outcome::SimError;
pub use super::outcome::{LiveConfig, LiveFault, LiveStats, SlowReaderOutcome};
use super::outcome::{RunOutcome, Stats, SAMPLE_MS};
use super::rng::Rng;
use super::scenario::{RoleSpec, Scenario};
use swarmtodo_client::{list_document_id, Connection};
use swarmtodo_core::authority::{Policy, Roles};
use swarmtodo_core::model::{TodoList, WriteContext};
use swarmtodo_hub::config::Config;
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_store::Db;

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
/// Most controller log lines kept.
pub const LOG_LINES_MAX: usize = 100_000;
/// Length of each token of the run's configuration: `sim-` and 16 random bytes in hex.
const TOKEN_BYTES: usize = "sim-".len() + 2 * 16;
const _: () = assert!(
    TOKEN_BYTES >= swarmtodo_hub::config::TOKEN_BYTES_MIN
        && TOKEN_BYTES <= swarmtodo_hub::config::TOKEN_BYTES_MAX,
    "tokens the hub accepts"
);
/// Mixed into the seed for the tokens' generator: the tokens draw nothing from the
/// run's own generator, so they leave the agents' choices as they were.
const TOKEN_STREAM: u64 = 0x746f_6b65_6e73_0001;
/// The checker's agent id (an observer: it only reads the lists back).
pub const CHECKER_AGENT: &str = "sim-checker";
/// The slow readers' writer's agent id: an observer, lead on the slow readers' lists.
pub const SLOW_WRITER_AGENT: &str = "slow-reader-writer";
/// The slow readers' agent id (an observer: a slow reader only asks).
pub const SLOW_READER_AGENT: &str = "slow-reader";

/// `url` with `token` as its `?token=` query.
pub(crate) fn authed(url: &str, token: &str) -> String {
    format!("{url}/?token={token}")
}

/// Who may connect to the run's hub, and as whom: the tokens of its configuration file.
#[derive(Debug, Clone)]
pub struct Access {
    /// Each agent's token, by agent id (an agent's sessions share it).
    agents: BTreeMap<String, String>,
    /// The checker's read-back.
    checker: String,
    /// The writer beside each slow reader.
    slow_writer: String,
    /// The slow readers.
    slow_reader: String,
    /// The configuration, as the hub reads it (policy and roles for the checker; with
    /// [`LiveFault::HubIgnoresRoles`], as the hub should have read it).
    config: Config,
    /// The configuration file's text.
    toml: String,
}

impl Access {
    /// Tokens for the agents of `scenario` (roles from their groups: a rogue is a
    /// worker), the checker and the slow readers, drawn from `seed`; checked by the
    /// hub's own configuration parser. With [`LiveFault::HubIgnoresRoles`] the file
    /// the hub gets makes every agent a lead, while the checker keeps the scenario's
    /// roles.
    pub fn new(
        scenario: &Scenario,
        seed: u64,
        fault: Option<LiveFault>,
    ) -> Result<Access, SimError> {
        let mut rng = Rng::new(seed ^ TOKEN_STREAM);
        let mut token = || {
            let hex: String = rng.bytes16().iter().map(|b| format!("{b:02x}")).collect();
            format!("sim-{hex}")
        };
        let mut roles: BTreeMap<String, &'static str> = BTreeMap::new();
        for (g, name, _) in scenario.agents() {
            let role = match scenario.agents[g].role {
                RoleSpec::Lead => "lead",
                RoleSpec::Worker | RoleSpec::Rogue => "worker",
                RoleSpec::Observer => "observer",
            };
            roles.insert(name, role);
        }
        for reserved in [CHECKER_AGENT, SLOW_WRITER_AGENT, SLOW_READER_AGENT] {
            if roles.contains_key(reserved) {
                return Err(SimError::Setup(format!(
                    "agent id {reserved:?} is the live runner's own: rename the group"
                )));
            }
        }
        let mut entries: Vec<TokenEntry> = Vec::new();
        let mut agents = BTreeMap::new();
        for (name, role) in &roles {
            let t = token();
            agents.insert(name.clone(), t.clone());
            entries.push(TokenEntry {
                scenario_agent: true,
                ..TokenEntry::new(t, name, role)
            });
        }
        let checker = token();
        entries.push(TokenEntry::new(checker.clone(), CHECKER_AGENT, "observer"));
        // The slow readers' writer writes only the slow readers' lists: a per-list role.
        let slow_writer = token();
        let mut writer = TokenEntry::new(slow_writer.clone(), SLOW_WRITER_AGENT, "observer");
        writer.lead_of = (0..scenario.faults.slow_readers)
            .map(|n| slow_reader_list(n as usize))
            .collect();
        entries.push(writer);
        let slow_reader = token();
        entries.push(TokenEntry::new(
            slow_reader.clone(),
            SLOW_READER_AGENT,
            "observer",
        ));
        let render = |leads: bool| -> Result<String, SimError> {
            let tokens = entries
                .iter()
                .map(|e| {
                    let mut t = toml::Table::new();
                    t.insert("token".into(), e.token.as_str().into());
                    t.insert("agent".into(), e.agent.as_str().into());
                    let role = if leads && e.scenario_agent {
                        "lead"
                    } else {
                        e.role
                    };
                    t.insert("role".into(), role.into());
                    if !e.lead_of.is_empty() {
                        let lists: toml::Table = e
                            .lead_of
                            .iter()
                            .map(|l| (l.clone(), toml::Value::from("lead")))
                            .collect();
                        t.insert("lists".into(), toml::Value::Table(lists));
                    }
                    toml::Value::Table(t)
                })
                .collect();
            let mut root = toml::Table::new();
            root.insert("tokens".into(), toml::Value::Array(tokens));
            let body = toml::to_string(&root)
                .map_err(|e| SimError::Setup(format!("the hub's configuration: {e}")))?;
            Ok(format!(
                "# Written by `swarmtodo sim --live` for scenario {:?}, seed {seed}: a token \
                 per agent,\n# with its role; the checker and the slow readers have their \
                 own.\n{body}",
                scenario.name
            ))
        };
        let parse = |text: &str| {
            Config::parse(text)
                .map_err(|e| SimError::Setup(format!("the hub's configuration: {e}")))
        };
        let honest = render(false)?;
        let config = parse(&honest)?;
        let toml = if fault == Some(LiveFault::HubIgnoresRoles) {
            let all_leads = render(true)?;
            parse(&all_leads)?;
            all_leads
        } else {
            honest
        };
        Ok(Access {
            agents,
            checker,
            slow_writer,
            slow_reader,
            config,
            toml,
        })
    }

    /// The token of agent `name` (empty for an agent the scenario does not have: the
    /// hub refuses it).
    pub(crate) fn token(&self, name: &str) -> &str {
        self.agents.get(name).map_or("", String::as_str)
    }

    /// The configuration file's text.
    pub fn toml(&self) -> &str {
        &self.toml
    }
}

/// One `[[tokens]]` entry of the run's configuration.
#[derive(Debug)]
struct TokenEntry {
    token: String,
    agent: String,
    role: &'static str,
    /// Lists on which it is a lead whatever its `role`.
    lead_of: Vec<String>,
    /// One of the scenario's agents (not the runner's own).
    scenario_agent: bool,
}

impl TokenEntry {
    fn new(token: String, agent: &str, role: &'static str) -> TokenEntry {
        TokenEntry {
            token,
            agent: agent.to_owned(),
            role,
            lead_of: Vec::new(),
            scenario_agent: false,
        }
    }
}

/// The list of slow reader `n`, which no agent syncs.
fn slow_reader_list(n: usize) -> String {
    format!("slow-reader-{n}")
}

/// What sessions and the controller share.
#[derive(Debug)]
pub(crate) struct Shared {
    started: Instant,
    /// The hub's current URL (`ws://127.0.0.1:PORT`).
    url: Mutex<String>,
    /// Agents act only during the storm.
    pub(crate) storm: AtomicBool,
    /// The hub process is running.
    pub(crate) hub_up: AtomicBool,
    /// Kills so far (a raw peer whose life saw one was answered by nothing).
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
    /// The hub's URL now.
    pub(crate) fn url(&self) -> String {
        self.url.lock().map(|u| u.clone()).unwrap_or_default()
    }

    fn set_url(&self, url: String) {
        if let Ok(mut u) = self.url.lock() {
            *u = url;
        }
    }

    /// Milliseconds since the run started.
    pub(crate) fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// What the controller does, and when (milliseconds into the storm).
#[derive(Debug, Clone)]
enum Ev {
    Kill,
    Restart,
    Cut(usize),
    PartitionStart(Vec<usize>),
    PartitionEnd(Vec<usize>),
    /// A slow reader, with the seed of its list's text.
    SlowReader(u64),
    StormEnd,
}

/// Runs one live seed of `scenario`.
pub fn run_live(scenario: &Scenario, cfg: &LiveConfig) -> Result<RunOutcome, SimError> {
    let started = Instant::now();
    let dir = cfg.work_dir.join(format!(
        "swarmtodo-live-{}-{}-{}",
        std::process::id(),
        scenario.name,
        cfg.seed
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| SimError::Io(dir.display().to_string(), e))?;
    let access = Access::new(scenario, cfg.seed, cfg.fault)?;
    let config = dir.join("hub.toml");
    std::fs::write(&config, access.toml())
        .map_err(|e| SimError::Io(config.display().to_string(), e))?;
    let cmd = HubCommand {
        bin: cfg.hub_bin.clone(),
        data: dir.join("hub.db"),
        config,
        log: dir.join("hub.log"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| SimError::Io("the async runtime".into(), e))?;
    let ended = runtime.block_on(drive(scenario, cfg, &cmd, &access));
    runtime.shutdown_timeout(Duration::from_secs(1));
    let mut outcome = judge(scenario, cfg, &cmd, &access, ended?, started)?;
    if outcome.passed() {
        // Best effort: a leftover folder only costs disk.
        let _ = std::fs::remove_dir_all(&dir);
    } else if let Some(live) = outcome.live.as_mut() {
        live.kept_dir = Some(dir.display().to_string());
    }
    Ok(outcome)
}

/// What the live part of a run leaves for the checker.
#[derive(Debug)]
struct Ended {
    sessions: Vec<Session>,
    docs: Vec<DocumentId>,
    /// The hub's lists as a fresh client read them (None: could not be read).
    hub_lists: Vec<Option<TodoList>>,
    converged: Option<u64>,
    storm_ms: u64,
    end_ms: u64,
    divergence: Vec<(u64, u64)>,
    latencies_ms: Vec<u64>,
    unpropagated: u64,
    stats: Stats,
    live: LiveStats,
    log: Vec<String>,
    /// Slow readers whose life saw no kill: `(outcome, judged)`.
    slow: Vec<(SlowReaderOutcome, bool)>,
}

struct Controller<'a> {
    cmd: &'a HubCommand,
    shared: Arc<Shared>,
    hub: Option<HubProcess>,
    addr: SocketAddr,
    controls: Vec<watch::Sender<Control>>,
    /// Sessions of each agent.
    sessions_of_agent: Vec<Vec<usize>>,
    live: LiveStats,
    stats: Stats,
    log: Vec<String>,
    divergence: Vec<(u64, u64)>,
    slow: Vec<tokio::task::JoinHandle<(SlowReaderOutcome, bool)>>,
}

impl Controller<'_> {
    fn note(&mut self, line: String) {
        if self.log.len() < LOG_LINES_MAX {
            self.log
                .push(format!("{:>8} {line}", self.shared.elapsed_ms()));
        }
    }

    fn sample_rss(&mut self) {
        if let Some(h) = &self.hub {
            self.live.hub_peak_rss_kib = self.live.hub_peak_rss_kib.max(h.peak_rss_kib());
        }
    }

    async fn start_hub(&mut self, listen: SocketAddr) -> Result<(), SimError> {
        let cmd = self.cmd.clone();
        let started = tokio::task::spawn_blocking(move || cmd.start(listen))
            .await
            .map_err(|e| SimError::Setup(format!("starting the hub: {e}")))?;
        let hub = match started {
            Ok(h) => h,
            // The old port was taken meanwhile: any free one, and the agents follow.
            Err(e) if listen.port() != 0 => {
                self.note(format!("restart on {listen} failed ({e}); any port"));
                self.live.restarts_on_new_port += 1;
                let cmd = self.cmd.clone();
                let any = SocketAddr::from(([127, 0, 0, 1], 0));
                tokio::task::spawn_blocking(move || cmd.start(any))
                    .await
                    .map_err(|e| SimError::Setup(format!("starting the hub: {e}")))??
            }
            Err(e) => return Err(e),
        };
        self.addr = hub.addr;
        self.shared.set_url(format!("ws://{}", hub.addr));
        self.note(format!("hub up on {} (pid {})", hub.addr, hub.pid()));
        self.hub = Some(hub);
        self.shared.hub_up.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn kill(&mut self) {
        let Some(hub) = self.hub.take() else { return };
        self.sample_rss();
        self.shared.hub_up.store(false, Ordering::SeqCst);
        self.shared.kills.fetch_add(1, Ordering::SeqCst);
        self.live.kills += 1;
        self.stats.hub_crashes += 1;
        let pid = hub.pid();
        let _ = tokio::task::spawn_blocking(move || hub.kill9()).await;
        self.note(format!("kill -9 hub (pid {pid})"));
    }

    /// A hub that ended by itself is a failure of the product: noted, and restarted so
    /// that the run can go on.
    async fn watch_hub(&mut self) -> Result<(), SimError> {
        let exited = self.hub.as_mut().and_then(HubProcess::exited);
        if let Some(status) = exited {
            self.hub = None;
            self.shared.hub_up.store(false, Ordering::SeqCst);
            let what = format!(
                "the hub exited by itself ({status}) at {} ms",
                self.shared.elapsed_ms()
            );
            self.note(what.clone());
            self.live.hub_exits.push(what);
            self.start_hub(self.addr).await?;
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
            Ev::Kill if !self.shared.storm.load(Ordering::SeqCst) => {}
            Ev::Kill => self.kill().await,
            Ev::Restart => {
                if self.hub.is_none() {
                    self.start_hub(self.addr).await?;
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
                if self.hub.is_none() {
                    self.start_hub(self.addr).await?;
                }
                let all: Vec<usize> = (0..self.controls.len()).collect();
                self.control(&all, |c| c.online = true);
                self.note("storm over".into());
            }
        }
        Ok(())
    }
}

/// The live part: hub, agents, faults, quiescence, read-back, stop.
async fn drive(
    scenario: &Scenario,
    cfg: &LiveConfig,
    cmd: &HubCommand,
    access: &Access,
) -> Result<Ended, SimError> {
    let mut rng = Rng::new(cfg.seed);
    let docs: Vec<DocumentId> = (0..scenario.lists.count)
        .map(|i| list_document_id(&format!("list-{i}")))
        .collect();
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
        url: Mutex::new(String::new()),
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
        cmd,
        shared: shared.clone(),
        hub: None,
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
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
    ctl.start_hub(ctl.addr).await?;

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
    for &(t, down) in &crashes {
        timeline.push((t, Ev::Kill));
        timeline.push((t + down, Ev::Restart));
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
        let mut list = TodoList::create(ActorId::from(rng.bytes16()));
        let read = async {
            let mut conn = Connection::connect(&url, &format!("{CHECKER_AGENT}-{i}")).await?;
            conn.sync(*doc, &mut list).await?;
            conn.close().await
        };
        let ok = matches!(
            tokio::time::timeout(READ_BACK_TIMEOUT, read).await,
            Ok(Ok(()))
        );
        hub_lists.push(ok.then_some(list));
    }

    // Stop the hub as an operator would.
    ctl.sample_rss();
    if let Some(hub) = ctl.hub.take() {
        let stopped = tokio::task::spawn_blocking(move || hub.terminate())
            .await
            .map_err(|e| SimError::Setup(format!("stopping the hub: {e}")))?;
        ctl.live.hub_stop = match stopped {
            Ok(s) if s.success() => "exit 0 after SIGTERM".into(),
            Ok(s) => format!("{s} after SIGTERM"),
            Err(e) => e,
        };
    }
    ctl.shared.hub_up.store(false, Ordering::SeqCst);

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
    })
}

fn ms_since(t: Instant) -> u64 {
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

/// Deletes the most recent acknowledged change still in the store's change table.
fn plant_lost_write(path: &std::path::Path, acked: &BTreeSet<ChangeHash>) -> Option<String> {
    let conn = rusqlite::Connection::open(path).ok()?;
    let hashes: Vec<Vec<u8>> = {
        let mut q = conn
            .prepare("SELECT hash FROM changes ORDER BY id DESC")
            .ok()?;
        let rows = q.query_map([], |r| r.get::<_, Vec<u8>>(0)).ok()?;
        rows.filter_map(Result::ok).collect()
    };
    let victim = hashes
        .into_iter()
        .find(|h| ChangeHash::try_from(h.as_slice()).is_ok_and(|h| acked.contains(&h)))?;
    conn.execute("DELETE FROM changes WHERE hash = ?1", [&victim])
        .ok()?;
    ChangeHash::try_from(victim.as_slice())
        .ok()
        .map(|h| h.to_string())
}

/// The checker on what the live run left, plus what only a live run can check.
fn judge(
    scenario: &Scenario,
    cfg: &LiveConfig,
    cmd: &HubCommand,
    access: &Access,
    mut ended: Ended,
    started: Instant,
) -> Result<RunOutcome, SimError> {
    let mut acked: BTreeMap<DocumentId, BTreeSet<ChangeHash>> = BTreeMap::new();
    for s in &ended.sessions {
        acked
            .entry(s.spec.doc)
            .or_default()
            .extend(s.acked.iter().copied());
    }
    if cfg.fault == Some(LiveFault::StoreLosesAckedWrite) {
        let all: BTreeSet<ChangeHash> = acked.values().flatten().copied().collect();
        let gone = plant_lost_write(&cmd.data, &all);
        ended.log.push(format!(
            "planted: acknowledged change {gone:?} deleted from the store"
        ));
    }
    let db = Db::open(&cmd.data)?;
    // The checker judges by what the hub enforces: the policy and roles of the
    // configuration file it was started with (as the deterministic runner's hub has
    // them: the default policy, workers and the rogue as workers).
    let policy: Policy = access.config.policy();
    let roles: Roles = access.config.roles();
    let injected: Vec<_> = ended
        .sessions
        .iter()
        .flat_map(|s| s.injected.iter().cloned())
        .collect();
    let mut sides: Vec<SideOutcome> = Vec::new();
    for s in &ended.sessions {
        for side in &s.sides {
            sides.push(SideOutcome {
                conn: u64::try_from(sides.len()).unwrap_or(u64::MAX),
                ..side.clone()
            });
        }
    }
    let hub: Vec<(DocumentId, Option<&TodoList>)> = ended
        .docs
        .iter()
        .zip(&ended.hub_lists)
        .map(|(d, l)| (*d, l.as_ref()))
        .collect();
    let replicas: Vec<Replica<'_>> = ended
        .sessions
        .iter()
        .map(|s| Replica {
            name: s.spec.name.clone(),
            doc: s.spec.doc,
            list: &s.replica,
        })
        .collect();
    let state = FinalState {
        converged: ended.converged.is_some(),
        unsettled: Vec::new(),
        hub,
        replicas,
        db: &db,
        acked: &acked,
        injected: &injected,
        policy,
        roles,
        sides,
        closes: ended.stats.closes.clone(),
        events: None,
    };
    let verdict = check::check(&state)?;
    let versions = state.hub_versions();
    drop(state);
    let mut checks = verdict.checks;
    for c in checks.iter_mut().filter(|c| c.name == "converged") {
        c.detail = if c.ok {
            format!(
                "every agent connected and in sync with the hub, one version per list, \
                 for {QUIET_SAMPLES} samples in a row"
            )
        } else {
            "no quiescence within settle_ms_max (wall clock)".into()
        };
    }
    let mut live = ended.live;
    live.acked_lost = u64::try_from(verdict.acked_lost).unwrap_or(u64::MAX);
    live.unpropagated = ended.unpropagated;

    // What only a live run has.
    let exits = &live.hub_exits;
    let stop_ok = live.hub_stop.starts_with("exit 0");
    checks.push(Check {
        name: "hub_alive",
        ok: exits.is_empty() && stop_ok,
        detail: if exits.is_empty() && stop_ok {
            format!(
                "the hub process ended only when killed ({} kills) and stopped cleanly on SIGTERM",
                live.kills
            )
        } else {
            format!("{}; stop: {}", exits.join("; "), live.hub_stop)
        },
        skipped: false,
    });
    let judged: Vec<&SlowReaderOutcome> = ended
        .slow
        .iter()
        .filter(|(_, j)| *j)
        .map(|(o, _)| o)
        .collect();
    let planned = scenario.faults.slow_readers as usize;
    checks.push(if planned == 0 {
        Check::skipped(
            "slow_readers_dropped",
            "the scenario has no slow reader".into(),
        )
    } else if judged.is_empty() {
        Check::skipped(
            "slow_readers_dropped",
            format!("{planned} slow readers, none lived without a hub kill"),
        )
    } else {
        let mut kept: Vec<String> = judged
            .iter()
            .filter(|o| !o.closed)
            .map(|o| {
                format!(
                    "a slow reader was never dropped ({} writes relayed to it)",
                    o.writes
                )
            })
            .collect();
        kept.extend(judged.iter().filter(|o| o.writer_failures > 0).map(|o| {
            format!(
                "the writer beside a slow reader had {} of {} writes unacknowledged",
                o.writer_failures, o.writes
            )
        }));
        Check {
            name: "slow_readers_dropped",
            ok: kept.is_empty(),
            detail: if kept.is_empty() {
                format!(
                    "{} slow readers dropped by the hub (after {:?} ms), the writer beside each \
                     acknowledged throughout; {} voided by kills",
                    judged.len(),
                    judged
                        .iter()
                        .filter_map(|o| o.closed_after_ms)
                        .collect::<Vec<_>>(),
                    ended.slow.len() - judged.len()
                )
            } else {
                kept.join("; ")
            },
            skipped: false,
        }
    });
    checks.push(Check::skipped(
        "frames_faults",
        "loopback TCP neither loses, doubles nor reorders frames; faults here are \
         cuts, partitions, kills and slow readers"
            .into(),
    ));

    let wall_ms = ms_since(started);
    Ok(RunOutcome {
        scenario: scenario.name.clone(),
        seed: cfg.seed,
        fault: None,
        convergence_ms: ended.converged,
        end_ms: ended.end_ms,
        latencies_ms: ended.latencies_ms,
        divergence: ended.divergence,
        stats: ended.stats,
        injected,
        rules: verdict.rules,
        checks,
        versions,
        trace_digest: 0,
        trace: if cfg.trace { ended.log } else { Vec::new() },
        wall_ms,
        live: Some(LiveStats {
            storm_ms: ended.storm_ms,
            ..live
        }),
    })
}
