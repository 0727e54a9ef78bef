//! The `swarmtodo` command.

mod cli;
mod watch;

use std::path::PathBuf;

use anyhow::{Context, Result};
use automerge::ActorId;
use clap::{Parser, Subcommand};
use swarmtodo::authority::{Authority, Policy, Roles};
use swarmtodo::model::{TodoList, WriteContext};
use swarmtodo::proto::{PatchOp, Status, TaskPatch, WriteMode, WriteRequest};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Shared, live, typed todo state for agent swarms",
    after_help = "Exit codes of lists, read, history, write, claim, wait, events and watch: 0 done (watch: quit); 1 the hub refused (its code and message on stderr), or a wait timed out; 3 the hub could not be reached, the input could not be read, or (watch) the terminal failed; 2 a usage error. watch keeps reconnecting while the hub cannot be reached."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a lead and two subagents on one list in-process: concurrent writes, a
    /// violation, the authority's repair, and the converged list.
    Demo,
    /// Run the hub: automerge-repo sync over WebSocket, the authority in every merge,
    /// SQLite storage.
    Serve {
        /// Address to listen on (port 0: any free port; the bound address is printed).
        /// Default 127.0.0.1:7700; the flag and the environment win over the config file.
        #[arg(long, env = "SWARMTODO_LISTEN")]
        listen: Option<std::net::SocketAddr>,
        /// SQLite file (created on first run). Default ./swarmtodo.db.
        #[arg(long, env = "SWARMTODO_DATA")]
        data: Option<PathBuf>,
        /// Configuration file (TOML: listen, data, log, policy, roles, tokens, limits; see
        /// `swarmtodo::config`).
        #[arg(long, env = "SWARMTODO_CONFIG")]
        config: Option<PathBuf>,
        /// Be one of many hubs on this NATS JetStream (`nats://host:port`, several
        /// comma-separated): the hub acts for a list while it holds the list's lease
        /// (see `[cluster]` in the config file).
        #[arg(long, env = "SWARMTODO_NATS")]
        nats: Option<String>,
        /// This hub's id in the cluster (default: random).
        #[arg(long, env = "SWARMTODO_HUB_ID")]
        hub_id: Option<String>,
    },
    /// Run a simulation scenario deterministically over one seed or a range of seeds
    /// (the real hub core, authority and SQLite store on a simulated network).
    Sim(SimArgs),
    #[command(flatten)]
    Api(cli::ApiCommand),
    /// Serve one agent's MCP tools on stdin/stdout (for Claude Code, Codex, OpenCode,
    /// Gemini CLI…): the list's own tools and the todo tools models know, over the hub's
    /// JSON API. Token from SWARMTODO_TOKEN.
    Mcp {
        /// The list this agent works on (created by the first write if it does not exist).
        #[arg(long, env = "SWARMTODO_LIST")]
        list: String,
        /// The hub (`http://HOST:PORT`).
        #[arg(long, env = "SWARMTODO_HUB", default_value = "http://127.0.0.1:7700")]
        hub: String,
        /// The agent to act as (on a hub with tokens, the token says who).
        #[arg(long, env = "SWARMTODO_AGENT", default_value = "agent")]
        agent: String,
    },
    /// Write the JSON Schemas of the wire types into a folder.
    Schema {
        /// Target folder.
        #[arg(long, default_value = "proto/schema")]
        out: PathBuf,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Demo => demo(),
        Command::Serve {
            listen,
            data,
            config,
            nats,
            hub_id,
        } => serve(listen, data, config, nats, hub_id),
        Command::Sim(args) => sim(args),
        Command::Api(cmd) => std::process::exit(cli::run(cmd)),
        Command::Mcp { list, hub, agent } => mcp(list, hub, agent),
        Command::Schema { out } => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            for (name, schema) in swarmtodo::proto::schemas() {
                let path = out.join(name);
                let text = swarmtodo::proto::schema_text(&schema);
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}

#[derive(Debug, clap::Args)]
struct SimArgs {
    /// The scenario file (`simulations/*.toml`).
    file: PathBuf,
    /// Run this one seed.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run the seeds A..B (B excluded).
    #[arg(long, value_parser = parse_seeds)]
    seeds: Option<std::ops::Range<u64>>,
    /// Folder of the report (summary.json, runs.json, report.svg).
    #[arg(long, default_value = "sim-report")]
    report: PathBuf,
    /// Folder for the runs' SQLite files (default: /dev/shm when present, else the
    /// temporary folder).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Threads running seeds (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Override the scenario's number of hub crashes per run.
    #[arg(long)]
    hub_crashes: Option<u32>,
    /// Print the trace of each run (use with one seed). Live: the controller's log
    /// (kills, restarts, cuts, partitions, slow readers).
    #[arg(long)]
    trace: bool,
    /// Run live: a real `swarmtodo serve` process on a loopback port, real clients over
    /// WebSockets, faults made for real (kill -9 and restart, cut connections, slow
    /// readers). Seeds run one after the other; timing is the machine's.
    #[arg(long)]
    live: bool,
    /// Override the scenario's storm length, milliseconds.
    #[arg(long)]
    duration_ms: Option<u64>,
    /// Override the scenario's number of connection cuts (live only).
    #[arg(long)]
    cuts: Option<u32>,
    /// Override the scenario's number of slow readers (live only).
    #[arg(long)]
    slow_readers: Option<u32>,
}

fn parse_seeds(s: &str) -> Result<std::ops::Range<u64>, String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("{s:?}: write the range as A..B"))?;
    let a: u64 = a.trim().parse().map_err(|e| format!("{a:?}: {e}"))?;
    let b: u64 = b.trim().parse().map_err(|e| format!("{b:?}: {e}"))?;
    if b <= a {
        return Err(format!("{s:?}: the range is empty"));
    }
    Ok(a..b)
}

fn sim(args: SimArgs) -> Result<()> {
    use swarmtodo::sim::{run_seeds, RunConfig, Scenario};
    let mut scenario = Scenario::load(&args.file)?;
    if let Some(n) = args.hub_crashes {
        scenario.faults.hub_crashes = n;
    }
    if let Some(ms) = args.duration_ms {
        anyhow::ensure!(ms > 0, "--duration-ms must be at least 1");
        scenario.duration_ms = ms;
    }
    if let Some(n) = args.cuts {
        scenario.faults.connection_cuts = n;
    }
    if let Some(n) = args.slow_readers {
        scenario.faults.slow_readers = n;
    }
    let seeds = match (args.seed, args.seeds.clone()) {
        (Some(s), _) => s..s + 1,
        (None, Some(r)) => r,
        (None, None) => 0..1,
    };
    let work_dir = args.work_dir.clone().unwrap_or_else(|| {
        let shm = PathBuf::from("/dev/shm");
        if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        }
    });
    if args.live {
        return sim_live(&args, &scenario, seeds, work_dir);
    }
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let base = RunConfig {
        seed: seeds.start,
        work_dir,
        fault: None,
        trace: args.trace,
    };
    let bar = indicatif::ProgressBar::new(seeds.end - seeds.start);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {msg} [{bar:40}] {pos}/{len} seeds, {per_sec}, eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(scenario.name.clone());
    let failed = std::sync::atomic::AtomicU64::new(0);
    let started = std::time::Instant::now();
    let runs = run_seeds(&scenario, seeds, &base, jobs, &|o| {
        if !o.passed() {
            failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            bar.suspend(|| {
                eprintln!(
                    "FAILED seed {} (replay: swarmtodo sim {} --seed {}): {}",
                    o.seed,
                    args.file.display(),
                    o.seed,
                    o.failures().join(" | ")
                );
            });
        }
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    let wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    if args.trace {
        for r in &runs {
            for line in &r.trace {
                println!("{line}");
            }
        }
    }
    report_and_verdict(&scenario.name, &runs, wall_ms, &args.report, "")
}

/// `sim --live`: the seeds one after the other against real hub processes.
fn sim_live(
    args: &SimArgs,
    scenario: &swarmtodo::sim::Scenario,
    seeds: std::ops::Range<u64>,
    work_dir: PathBuf,
) -> Result<()> {
    use swarmtodo::sim::{run_live, LiveConfig};
    let hub_bin = std::env::current_exe().context("finding this binary to run the hub")?;
    let started = std::time::Instant::now();
    let mut runs = Vec::new();
    for seed in seeds {
        let cfg = LiveConfig {
            seed,
            work_dir: work_dir.clone(),
            hub_bin: hub_bin.clone(),
            fault: None,
            trace: args.trace,
            nats_bin: None,
        };
        eprintln!("{} seed {seed}: live run ...", scenario.name);
        let o = run_live(scenario, &cfg).with_context(|| format!("live seed {seed}"))?;
        if args.trace {
            for line in &o.trace {
                println!("{line}");
            }
        }
        if !o.passed() {
            eprintln!(
                "FAILED live seed {seed} (rerun: swarmtodo sim {} --live --seed {seed}; kept: {}): {}",
                args.file.display(),
                o.live
                    .as_ref()
                    .and_then(|l| l.kept_dir.clone())
                    .unwrap_or_default(),
                o.failures().join(" | ")
            );
        }
        runs.push(o);
    }
    let wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    report_and_verdict(&scenario.name, &runs, wall_ms, &args.report, "live ")
}

/// Prints the summary table, writes the report folder, and fails when a seed failed.
fn report_and_verdict(
    name: &str,
    runs: &[swarmtodo::sim::runner::RunOutcome],
    wall_ms: u64,
    folder: &std::path::Path,
    kind: &str,
) -> Result<()> {
    use swarmtodo::sim::report;
    let summary = report::summarize(name, runs, wall_ms);
    print!("{}", report::table(&summary));
    report::write(folder, &summary, runs)
        .with_context(|| format!("writing the report to {}", folder.display()))?;
    println!("  report                       {}", folder.display());
    anyhow::ensure!(
        summary.passed == summary.runs,
        "{} of {} {kind}seeds failed: {:?}",
        summary.runs - summary.passed,
        summary.runs,
        summary.failed_seeds
    );
    Ok(())
}

/// Where the hub listens when nothing says otherwise.
const DEFAULT_LISTEN: &str = "127.0.0.1:7700";
/// The hub's SQLite file when nothing says otherwise.
const DEFAULT_DATA: &str = "swarmtodo.db";

fn serve(
    listen: Option<std::net::SocketAddr>,
    data: Option<PathBuf>,
    config: Option<PathBuf>,
    nats: Option<String>,
    hub_id: Option<String>,
) -> Result<()> {
    let config = match &config {
        Some(path) => swarmtodo::config::Config::load(path)?,
        None => swarmtodo::config::Config::default(),
    };
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("SWARMTODO_LOG").unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(config.log.as_deref().unwrap_or("info"))
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let listen = match listen.or(config.listen) {
        Some(l) => l,
        None => DEFAULT_LISTEN.parse().context("the default address")?,
    };
    let data = data
        .or_else(|| config.data.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA));
    let access = match config.tokens() {
        Some(tokens) => swarmtodo::hub::server::Access::Tokens(
            swarmtodo::hub::server::Tokens::new(tokens),
        ),
        None if listen.ip().is_loopback() => swarmtodo::hub::server::Access::Open,
        None => anyhow::bail!(
            "listening on {listen}, beyond loopback, needs tokens: add [[tokens]] to a config file (--config)"
        ),
    };
    let mut hub_config = swarmtodo::hub::core::HubConfig::new(automerge::ActorId::random());
    hub_config.policy = config.policy();
    hub_config.roles = config.roles();
    hub_config.list_creations = config.list_creations();
    let cluster = config.cluster.resolve(nats, hub_id);
    if cluster.is_some() {
        hub_config.every_list_stored = true;
        hub_config.peer_id =
            swarmtodo::proto::wire::PeerId::new(swarmtodo::cluster::CLUSTER_PEER_ID)
                .context("the cluster's peer id")?;
    }
    swarmtodo::memory::limit_heap_arenas();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // The cluster's own runtime (its NATS connection, lease renewals, forwarded calls):
    // a long merge on the hub's runtime cannot hold a renewal up past the lease.
    let cluster_runtime = match &cluster {
        Some(_) => Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("swarmtodo-cluster")
                .enable_all()
                .build()
                .context("starting the cluster's runtime")?,
        ),
        None => None,
    };
    let cluster_handle = cluster_runtime.as_ref().map(|r| r.handle().clone());
    let served = runtime.block_on(async move {
        let mut hub = swarmtodo::hub::Hub::open_with(&data, hub_config)
            .await
            .with_context(|| format!("opening {}", data.display()))?
            .with_access(access)
            .with_limits(config.conn_limits());
        if let (Some(c), Some(on)) = (cluster, cluster_handle) {
            let joined = on
                .spawn(async move {
                    let joined = swarmtodo::cluster::Cluster::connect(&c).await;
                    tracing::info!(hub = %c.hub, nats = %c.url, ok = joined.is_ok(), "one of a cluster");
                    joined.with_context(|| format!("joining the cluster at {} as {}", c.url, c.hub))
                })
                .await
                .context("joining the cluster")??;
            hub = hub.with_cluster(joined);
        }
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let addr = listener.local_addr()?;
        // Tests and scripts read this line to find the port.
        println!("swarmtodo listening on ws://{addr}");
        hub.serve(listener, shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(())
    });
    // Its leases were given back when the hub stopped.
    if let Some(r) = cluster_runtime {
        r.shutdown_background();
    }
    served
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

fn upsert(id: &str, content: &str, status: Status, owner: &str) -> WriteRequest {
    WriteRequest {
        mode: WriteMode::Patch {
            ops: vec![PatchOp::Upsert {
                task: TaskPatch {
                    id: Some(id.into()),
                    content: Some(content.into()),
                    status: Some(status),
                    owner: Some(Some(owner.into())),
                    ..TaskPatch::default()
                },
            }],
        },
        expected_version: None,
        explanation: None,
    }
}

fn demo() -> Result<()> {
    let mut hub = TodoList::create(ActorId::from([0xA0; 16]));
    let mut authority = Authority::new("hub", Policy::default(), Roles::default());
    let mut lead = hub.fork(ActorId::from([0x01; 16]));
    let plan = WriteRequest {
        mode: WriteMode::Replace {
            tasks: [
                "Read the issue",
                "Write the parser",
                "Write the tests",
                "Run the tests",
            ]
            .iter()
            .enumerate()
            .map(|(i, c)| TaskPatch {
                id: Some(format!("t{}", i + 1)),
                content: Some((*c).into()),
                owner: Some(Some("worker".into())),
                ..TaskPatch::default()
            })
            .collect(),
            base_version: None,
        },
        expected_version: None,
        explanation: Some("initial plan".into()),
    };
    lead.write(&plan, &WriteContext::new("lead", 1_000, 1))
        .map_err(anyhow::Error::new)?;
    let merge = hub.merge_from(&lead)?;
    authority.process(&mut hub, merge, 1_001)?;

    // Two subagents, both acting for "worker", start different tasks at the same time.
    let mut a = hub.fork(ActorId::from([0x02; 16]));
    let mut b = hub.fork(ActorId::from([0x03; 16]));
    a.write(
        &upsert("t2", "Write the parser", Status::InProgress, "worker"),
        &WriteContext::new("sub-a", 2_000, 2),
    )
    .map_err(anyhow::Error::new)?;
    b.write(
        &upsert("t3", "Write the tests", Status::InProgress, "worker"),
        &WriteContext::new("sub-b", 2_000, 3),
    )
    .map_err(anyhow::Error::new)?;
    for replica in [&a, &b] {
        let merge = hub.merge_from(replica)?;
        let report = authority.process(&mut hub, merge, 2_001)?;
        for v in &report.violations {
            println!("violation: {}", serde_json::to_string_pretty(v)?);
        }
    }
    for replica in [&mut lead, &mut a, &mut b] {
        replica.merge_from(&hub)?;
    }
    println!("converged list (version {}):", hub.version());
    for t in hub.read().tasks {
        println!(
            "  [{:<11}] {:<3} {} ({})",
            t.status.as_str(),
            t.id,
            t.content,
            t.owner.unwrap_or_default()
        );
    }
    anyhow::ensure!(a.version() == hub.version() && b.version() == hub.version());
    Ok(())
}

/// `swarmtodo mcp`: logs go to stderr (stdout is the protocol).
fn mcp(list: String, hub: String, agent: String) -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SWARMTODO_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let mut api = swarmtodo::client::http::Api::new(&hub)?;
    match std::env::var("SWARMTODO_TOKEN") {
        Ok(token) if !token.is_empty() => api = api.token(token),
        _ => api = api.agent(agent.clone()),
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(swarmtodo::mcp::serve(swarmtodo::mcp::McpOptions {
        api,
        list,
        agent,
    }))
}
