//! Claims decided by one hub: a real `Hub` on a SQLite file in this process, on
//! loopback, and `CLAIMERS` agents calling the JSON API (`swarmtodo_client::http::Api`)
//! at once, each claiming a ready task, completing it, and claiming the next, until the
//! list of `TASKS` tasks is done. Every claim is checked: no task is given twice.
//!
//! Prints the claims decided per second (claim and completion round trips of all
//! agents, over the run's wall time) and the latency of one claim, p50 and p99.
//!
//! Run: `cargo bench --bench claims` (`-- --claimers N --tasks N` to change the load).
#![allow(clippy::unwrap_used, clippy::expect_used)] // A bench's setup failing is a bug to see at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use swarmtodo::client::http::{Api, HttpError};
use swarmtodo::hub::Hub;
use swarmtodo::proto::ErrorCode;

const CLAIMERS: usize = 100;
const TASKS: usize = 2_000;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let claimers = arg("--claimers", CLAIMERS);
    let tasks = arg("--tasks", TASKS);
    let dir = std::env::temp_dir().join(format!("swarmtodo-bench-claims-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let hub = Hub::open(&dir.join("hub.db")).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(hub.serve(listener, async {
            let _ = stopped.await;
        }));
        let url = format!("http://{addr}");
        let lead = Api::new(&url).unwrap().agent("lead");
        for chunk in (0..tasks).collect::<Vec<_>>().chunks(500) {
            let ops: Vec<_> = chunk
                .iter()
                .map(|i| json!({"op": "upsert", "task": {"id": format!("t{i:05}"), "content": format!("Task {i}")}}))
                .collect();
            lead.write("claims", &json!({"mode": "patch", "ops": ops}).to_string())
                .await
                .unwrap();
        }
        let latencies = Arc::new(Mutex::new(Vec::with_capacity(tasks)));
        let claimed = Arc::new(Mutex::new(BTreeSet::new()));
        let started = Instant::now();
        let agents: Vec<_> = (0..claimers)
            .map(|i| {
                let api = Api::new(&url).unwrap().agent(format!("agent-{i}"));
                let latencies = latencies.clone();
                let claimed = claimed.clone();
                tokio::spawn(async move {
                    loop {
                        let t = Instant::now();
                        let task = match api.claim("claims", None).await {
                            Ok(c) => c.task.id,
                            Err(HttpError::Api(e)) if e.code == ErrorCode::NothingReady => break,
                            Err(e) => panic!("claim failed: {e}"),
                        };
                        latencies.lock().unwrap().push(t.elapsed());
                        assert!(claimed.lock().unwrap().insert(task.clone()), "{task} claimed twice");
                        let done = json!({"mode": "patch", "ops": [{"op": "upsert", "task": {"id": task, "status": "completed"}}]});
                        api.write("claims", &done.to_string()).await.unwrap();
                    }
                })
            })
            .collect();
        for a in agents {
            a.await.unwrap();
        }
        let elapsed = started.elapsed();
        let mut l = latencies.lock().unwrap().clone();
        l.sort();
        assert_eq!(claimed.lock().unwrap().len(), tasks, "every task claimed once");
        println!(
            "claims: {tasks} tasks, {claimers} claimers: {:.0} claims/s (each followed by its completion), claim p50 {:.2} ms, p99 {:.2} ms, in {:.1} s",
            tasks as f64 / elapsed.as_secs_f64(),
            percentile(&l, 0.5).as_secs_f64() * 1e3,
            percentile(&l, 0.99).as_secs_f64() * 1e3,
            elapsed.as_secs_f64()
        );
        let _ = stop.send(());
        let _ = server.await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}
