//! The hub under test: a real `swarmtodo serve` child process on a loopback port, with
//! the run's configuration file (the scenario's agents, roles and tokens), killed with
//! SIGKILL and restarted on the same data file, stopped with SIGTERM.
//!
//! Blocking (process spawn, pipe reads, waits): the live runner calls these from
//! `spawn_blocking`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::outcome::SimError;

/// How long a starting hub may take to print its address.
pub const HUB_START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a hub may take to stop after SIGTERM (its own grace period is 10 s).
pub const HUB_STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// How often a stopping hub is polled.
const HUB_POLL: Duration = Duration::from_millis(10);
/// The line the hub prints once it listens; the address follows.
const LISTENING: &str = "swarmtodo listening on ws://";

/// One running hub process.
#[derive(Debug)]
pub(crate) struct HubProcess {
    child: Child,
    /// The address it listens on.
    pub(crate) addr: SocketAddr,
}

/// How to start a hub.
#[derive(Debug, Clone)]
pub(crate) struct HubCommand {
    /// The `swarmtodo` binary.
    pub(crate) bin: PathBuf,
    /// Its SQLite file.
    pub(crate) data: PathBuf,
    /// Its configuration file (`--config`): roles and tokens.
    pub(crate) config: PathBuf,
    /// Where its stderr goes (appended, one file for every incarnation).
    pub(crate) log: PathBuf,
    /// More arguments (a cluster's hub: `--nats`, `--hub-id`).
    pub(crate) extra: Vec<String>,
}

impl HubCommand {
    /// Starts a hub listening on `listen` (a loopback address; port 0 for any) and waits
    /// until it prints its address. Fails when it does not (the port is taken, say).
    pub(crate) fn start(&self, listen: SocketAddr) -> Result<HubProcess, SimError> {
        if !listen.ip().is_loopback() {
            return Err(SimError::Setup(format!(
                "the live hub listens on loopback only, not {listen}"
            )));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| SimError::Io(self.log.display().to_string(), e))?;
        let mut child = Command::new(&self.bin)
            .arg("serve")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--data")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.config)
            .args(&self.extra)
            .env(
                "SWARMTODO_LOG",
                std::env::var("SWARMTODO_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| SimError::Io(self.bin.display().to_string(), e))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SimError::Setup("the hub's stdout is not piped".into()));
        };
        // The first line carries the address; the rest is drained until the process
        // ends, so that the hub never writes into a closed pipe.
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            for _ in lines {}
        });
        let line = rx.recv_timeout(HUB_START_TIMEOUT);
        let addr = line
            .ok()
            .and_then(|l| l.trim().strip_prefix(LISTENING).map(str::to_owned))
            .and_then(|a| a.parse::<SocketAddr>().ok());
        match addr {
            Some(addr) => Ok(HubProcess { child, addr }),
            None => {
                let _ = child.kill();
                let status = child.wait().ok();
                Err(SimError::Setup(format!(
                    "the hub did not start on {listen} (exit {status:?}; see {})",
                    self.log.display()
                )))
            }
        }
    }
}

impl HubProcess {
    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident set size so far (`VmHWM`), KiB; 0 when unreadable.
    pub(crate) fn peak_rss_kib(&self) -> u64 {
        read_status_kib(self.child.id(), "VmHWM:")
    }

    /// The exit status, if the process has ended (by itself: it is not waited for
    /// elsewhere).
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// `kill -9`, then reaps it.
    pub(crate) fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP (`pause`: true) or SIGCONT: a process that stops and later goes on
    /// where it was, its sockets open. False when the signal could not be sent.
    pub(crate) fn pause(&self, pause: bool) -> bool {
        signal(self.child.id(), if pause { "-STOP" } else { "-CONT" })
    }

    /// SIGTERM (a graceful stop: queued work committed, peers closed with 1001), then
    /// waits up to [`HUB_STOP_TIMEOUT`]; past it, SIGKILL. Returns the exit status when
    /// the hub stopped by itself.
    pub(crate) fn terminate(mut self) -> Result<ExitStatus, String> {
        if !signal(self.child.id(), "-TERM") {
            self.kill9();
            return Err("SIGTERM could not be sent; killed".into());
        }
        let deadline = Instant::now() + HUB_STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Ok(status);
            }
            std::thread::sleep(HUB_POLL);
        }
        self.kill9();
        Err(format!(
            "the hub did not stop within {HUB_STOP_TIMEOUT:?} of SIGTERM; killed"
        ))
    }
}

impl Drop for HubProcess {
    fn drop(&mut self) {
        // A run that fails half-way leaves no hub behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends signal `sig` (`-TERM`, `-STOP`, `-CONT`) to process `pid`; false on failure.
fn signal(pid: u32, sig: &str) -> bool {
    // No libc binding in this crate: the `kill` command sends the signal.
    Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success())
}

/// A `kB` field of `/proc/PID/status`; 0 when unreadable.
fn read_status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
