//! The servers under test, each a child process on loopback pinned to its own core, and
//! the two that live in this binary (`--serve samod|raw PORT`): a relay built on samod
//! and the raw tokio-tungstenite broadcast.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// `swarmtodo serve`, authority on.
    Hub,
    /// A samod `Repo` accepting WebSockets.
    Samod,
    /// The JS automerge-repo sync server (`NodeWSServerAdapter`).
    Js,
    /// A bare broadcast of every frame to every other connection.
    Raw,
}

impl Kind {
    pub(crate) const ALL: [Kind; 4] = [Kind::Hub, Kind::Samod, Kind::Js, Kind::Raw];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Hub => "swarmtodo hub",
            Kind::Samod => "samod relay",
            Kind::Js => "JS sync server",
            Kind::Raw => "raw broadcast",
        }
    }

    pub(crate) fn key(self) -> &'static str {
        match self {
            Kind::Hub => "hub",
            Kind::Samod => "samod",
            Kind::Js => "js",
            Kind::Raw => "raw",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.key() == s)
    }

    /// True when the server speaks automerge-repo (everything but the ceiling).
    pub(crate) fn speaks_protocol(self) -> bool {
        self != Kind::Raw
    }
}

/// The core servers run on; the generator takes the other one.
pub(crate) const SERVER_CPU: &str = "1";
/// The core the generator runs on.
pub(crate) const GENERATOR_CPU: usize = 0;
/// How long a server may take to say it listens.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest frame the in-binary servers accept (a 60,000-change list in one message).
const FRAME_BYTES_MAX: usize = 64 * 1024 * 1024;

/// A running server.
pub(crate) struct Server {
    pub(crate) kind: Kind,
    pub(crate) url: String,
    child: Child,
    /// The hub's scratch store (removed when the server is dropped).
    dir: Option<PathBuf>,
}

impl Server {
    /// Starts `kind` on a free loopback port. `work` is a scratch folder.
    pub(crate) fn start(kind: Kind, work: &Path) -> anyhow::Result<Server> {
        Server::start_in(kind, work, None)
    }

    /// Starts a hub on the store file `db` (kept when the server stops).
    pub(crate) fn hub_on(db: &Path, work: &Path) -> anyhow::Result<Server> {
        Server::start_in(Kind::Hub, work, Some(db))
    }

    fn start_in(kind: Kind, work: &Path, db: Option<&Path>) -> anyhow::Result<Server> {
        let port = free_port()?;
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", SERVER_CPU]);
        let mut dir = None;
        match kind {
            Kind::Hub => {
                // SIDE_BY_SIDE_HUB_DATA puts the store elsewhere (e.g. /dev/shm, to
                // see what the disk's fsync costs).
                let base = std::env::var_os("SIDE_BY_SIDE_HUB_DATA")
                    .map_or_else(|| work.to_path_buf(), PathBuf::from);
                // A fresh store for every start: a folder named by the port alone was
                // reused when the port came round again, and the hub then opened an
                // earlier run's list, whose changes by the same bench actors clashed
                // with the new ones ("duplicate seq 1 found for actor"): every write
                // refused, the run failed with "no answer to join".
                let d = base.join(format!("hub-{}-{port}", std::process::id()));
                if d.exists() {
                    std::fs::remove_dir_all(&d)?;
                }
                std::fs::create_dir_all(&d)?;
                let config = d.join("hub.toml");
                // Everyone is a worker on their own tasks; the lead built the list: the
                // ownership rule runs on every write.
                std::fs::write(
                    &config,
                    "[roles]\ndefault = \"worker\"\nagents = { \"lead\" = \"lead\" }\n",
                )?;
                cmd.arg(env!("CARGO_BIN_EXE_swarmtodo")).args([
                    "serve",
                    "--listen",
                    &listen,
                    "--data",
                    &db.map_or_else(|| d.join("hub.db"), Path::to_path_buf)
                        .to_string_lossy(),
                    "--config",
                    &config.to_string_lossy(),
                ]);
                // SIDE_BY_SIDE_HUB_NATS=nats://… makes the hub one of a cluster on that
                // NATS (every commit through the list's log first): what the log costs.
                if let Ok(nats) = std::env::var("SIDE_BY_SIDE_HUB_NATS") {
                    cmd.args(["--nats", &nats, "--hub-id", &format!("bench-{port}")]);
                }
                cmd.env(
                    "SWARMTODO_LOG",
                    std::env::var("SIDE_BY_SIDE_HUB_LOG").unwrap_or_else(|_| "warn".to_owned()),
                );
                dir = Some(d);
            }
            Kind::Samod | Kind::Raw => {
                cmd.arg(std::env::current_exe()?)
                    .args(["--serve", kind.key(), &port.to_string()]);
            }
            Kind::Js => {
                let js = js_dir();
                cmd.arg("node")
                    .arg(js.join("sync-server.mjs"))
                    .arg(port.to_string());
            }
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", kind.name()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            // Keep draining so the child never blocks on a full pipe.
            for _ in lines {}
        });
        let line = rx
            .recv_timeout(START_TIMEOUT)
            .map_err(|_| anyhow::anyhow!("{} did not say it listens", kind.name()))?;
        anyhow::ensure!(
            line.contains("listening"),
            "{}: unexpected first line {line:?}",
            kind.name()
        );
        Ok(Server {
            kind,
            url: format!("ws://{listen}"),
            child,
            dir,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory (bytes) and CPU time used so far.
    pub(crate) fn usage(&self) -> Usage {
        Usage::of(self.pid())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The hub's store is scratch: SIDE_BY_SIDE_KEEP_DATA keeps it to look at.
        if let Some(d) = &self.dir {
            if std::env::var_os("SIDE_BY_SIDE_KEEP_DATA").is_none() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
}

/// The folder of the JS server (npm installs its packages there).
pub(crate) fn js_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/js")
}

/// Installs the JS server's packages if they are not there.
pub(crate) fn npm_install() -> anyhow::Result<()> {
    let dir = js_dir();
    if dir.join("node_modules/@automerge/automerge-repo").exists() {
        return Ok(());
    }
    eprintln!("npm install in {dir:?} …");
    let ok = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--prefix"])
        .arg(&dir)
        .status()?
        .success();
    anyhow::ensure!(ok, "npm install failed");
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A process's resident memory and CPU time, from /proc.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    pub(crate) rss_bytes: u64,
    pub(crate) cpu: Duration,
    pub(crate) at: Option<Instant>,
}

impl Usage {
    /// Seconds from `before` to this reading (1 when either has no time).
    pub(crate) fn wall_since(&self, before: &Usage) -> f64 {
        self.at
            .zip(before.at)
            .map_or(1.0, |(a, b)| a.duration_since(b).as_secs_f64())
    }

    /// The share of one core the process used from `before` to this reading.
    pub(crate) fn cpu_share_since(&self, before: &Usage) -> f64 {
        self.cpu.saturating_sub(before.cpu).as_secs_f64() / self.wall_since(before)
    }

    pub(crate) fn of(pid: u32) -> Usage {
        let rss_bytes = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024);
        // schedstat: nanoseconds on a CPU, summed over the process's threads.
        let cpu_ns: u64 = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
                    .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                    .sum()
            })
            .unwrap_or(0);
        Usage {
            rss_bytes,
            cpu: Duration::from_nanos(cpu_ns),
            at: Some(Instant::now()),
        }
    }
}

/// `--serve samod|raw PORT`: runs that server until killed.
pub(crate) fn serve(kind: &str, port: &str) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(format!("127.0.0.1:{port}")).await?;
        println!("{kind} listening on ws://127.0.0.1:{port}");
        match kind {
            "samod" => serve_samod(listener).await,
            "raw" => serve_raw(listener).await,
            other => anyhow::bail!("no server called {other:?}"),
        }
    })
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(FRAME_BYTES_MAX))
        .max_frame_size(Some(FRAME_BYTES_MAX))
}

async fn serve_samod(listener: TcpListener) -> anyhow::Result<()> {
    let repo = samod::Repo::build_tokio()
        .with_peer_id(samod::PeerId::from("samod-relay"))
        .load()
        .await;
    let acceptor = repo
        .make_acceptor(samod::Url::parse("ws://127.0.0.1/")?)
        .map_err(|_| anyhow::anyhow!("samod stopped"))?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            if let Ok(ws) =
                tokio_tungstenite::accept_async_with_config(tcp, Some(ws_config())).await
            {
                let _ = acceptor.accept_tungstenite(ws);
            }
        });
    }
}

async fn serve_raw(listener: TcpListener) -> anyhow::Result<()> {
    type Peers = std::sync::Arc<std::sync::Mutex<Vec<(u64, mpsc::UnboundedSender<WsMessage>)>>>;
    let peers: Peers = Default::default();
    let mut next = 0u64;
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        next += 1;
        let id = next;
        let peers = peers.clone();
        tokio::spawn(async move {
            let Ok(ws) = tokio_tungstenite::accept_async_with_config(tcp, Some(ws_config())).await
            else {
                return;
            };
            let (mut sink, mut stream) = ws.split();
            let (tx, mut rx) = mpsc::unbounded_channel::<WsMessage>();
            peers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((id, tx));
            let writer = tokio::spawn(async move {
                while let Some(m) = rx.recv().await {
                    if sink.send(m).await.is_err() {
                        break;
                    }
                }
            });
            while let Some(Ok(m)) = stream.next().await {
                if let WsMessage::Binary(bytes) = m {
                    let all = peers.lock().unwrap_or_else(|e| e.into_inner());
                    for (other, tx) in all.iter() {
                        if *other != id {
                            let _ = tx.send(WsMessage::Binary(bytes.clone()));
                        }
                    }
                }
            }
            peers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(p, _)| *p != id);
            writer.abort();
        });
    }
}
