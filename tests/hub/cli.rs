//! The API commands of the `swarmtodo` binary against a real hub, as a shell script
//! would run them: `write`, `read`, `claim`, `wait`, `events`, `lists`, their exit codes
//! and output.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

use crate::common::*;

/// Runs `swarmtodo ARGS` against `hub` as agent `agent`, with `stdin`.
pub(crate) fn cli(hub: &HubProc, agent: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = dies_with_parent(&mut Command::new(env!("CARGO_BIN_EXE_swarmtodo")))
        .args(args)
        .env("SWARMTODO_HUB", &hub.url)
        .env("SWARMTODO_AGENT", agent)
        .env_remove("SWARMTODO_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_shell_script_writes_reads_claims_and_follows_a_list() {
    let dir = scratch("cli");
    let hub = HubProc::start(&dir.join("hub.db"));
    let ops = dir.join("ops.json");
    std::fs::write(
        &ops,
        json!([
            {"op": "upsert", "task": {"id": "t1", "content": "Read the issue", "priority": "low"}},
            {"op": "upsert", "task": {"id": "t2", "content": "Write the fix", "active_form": "Writing the fix", "priority": "high"}},
        ])
        .to_string(),
    )
    .unwrap();
    let o = cli(
        &hub,
        "lead",
        &["write", "board", "--patch", ops.to_str().unwrap(), "--json"],
        "",
    );
    assert!(o.status.success(), "{o:?}");
    let answer: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(answer["result"]["created"], json!(["t1", "t2"]));

    // No agent syncs the list: every one holds the version at once.
    let version = answer["snapshot"]["version"].as_str().unwrap().to_owned();
    let o = cli(
        &hub,
        "lead",
        &["wait", "board", &version, "--timeout-ms", "200"],
        "",
    );
    assert!(o.status.success(), "{o:?}");

    // A whole request on stdin.
    let request = json!({"mode": "patch", "ops": [{"op": "upsert", "task": {"id": "t3", "content": "Ship", "blocked_by": ["t2"]}}]});
    let o = cli(&hub, "lead", &["write", "board", "-"], &request.to_string());
    assert!(o.status.success(), "{o:?}");

    // The first ready task by priority is t2.
    let o = cli(&hub, "worker-1", &["claim", "board", "--json"], "");
    assert!(o.status.success(), "{o:?}");
    let claimed: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (
            claimed["task"]["id"].as_str(),
            claimed["task"]["owner"].as_str()
        ),
        (Some("t2"), Some("worker-1"))
    );

    let o = cli(&hub, "anyone", &["read", "board"], "");
    assert!(o.status.success(), "{o:?}");
    let text = stdout(&o);
    assert!(
        text.contains("[>] Writing the fix  (t2) @worker-1"),
        "{text}"
    );
    assert!(text.contains("[ ] Read the issue  (t1)"), "{text}");
    assert!(text.contains("[ ] Ship  (t3) after t2"), "{text}");

    // Refused: t2 is held. Exit 1, the stable code on stderr.
    let o = cli(&hub, "worker-2", &["claim", "board", "t2"], "");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("conflict"),
        "{o:?}"
    );

    // Events as JSON lines: the snapshot, then seq 1, 2, 3 … without a gap.
    let o = cli(&hub, "anyone", &["events", "board"], "");
    assert!(o.status.success(), "{o:?}");
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["kind"], "snapshot");
    let seqs: Vec<u64> = lines[1..]
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert!(seqs.len() >= 3, "{seqs:?}");
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    let o = cli(&hub, "anyone", &["events", "board", "--from", "2"], "");
    let first: Value = serde_json::from_str(stdout(&o).lines().nth(1).unwrap()).unwrap();
    assert_eq!(first["seq"], 3);

    // Who changed t2: the lead created it, worker-1 claimed it.
    let o = cli(&hub, "anyone", &["history", "board", "t2"], "");
    assert!(o.status.success(), "{o:?}");
    let text = stdout(&o);
    assert!(
        text.contains(" worker-1 status: \"pending\" → \"in_progress\"; owner: null → \"worker-1\"  (worker-1 claims t2)"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 2, "{text}");

    // Every list of the hub, as text and as JSON (the index is at most a second behind).
    let want = "board  2 pending, 1 in progress, 0 completed, 0 cancelled, 0 blocked\n";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let o = cli(&hub, "anyone", &["lists"], "");
        assert!(o.status.success(), "{o:?}");
        if stdout(&o) == want {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", stdout(&o));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let o = cli(&hub, "anyone", &["lists", "--json"], "");
    let lists: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(lists[0]["name"], "board");
    assert_eq!(lists[0]["tasks"]["in_progress"], 1);
    drop(hub);

    // No hub: exit 3.
    let o = Command::new(env!("CARGO_BIN_EXE_swarmtodo"))
        .args(["read", "board", "--hub", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{o:?}");
}

#[test]
fn read_and_events_print_the_markdown_acp_and_codex_projections() {
    let dir = scratch("cli-projections");
    let hub = HubProc::start(&dir.join("hub.db"));
    let request = json!({"mode": "patch", "ops": [
        {"op": "upsert", "task": {"id": "t1", "content": "Read the issue"}},
        {"op": "upsert", "task": {"id": "t2", "content": "Port it", "status": "cancelled"}},
    ]});
    let o = cli(&hub, "lead", &["write", "proj", "-"], &request.to_string());
    assert!(o.status.success(), "{o:?}");
    let o = cli(&hub, "lead", &["read", "proj", "--format", "markdown"], "");
    assert_eq!(
        stdout(&o),
        "- [ ] Read the issue\n- [ ] ~~Port it~~ (cancelled)\n"
    );
    let o = cli(&hub, "lead", &["read", "proj", "--format", "acp"], "");
    let acp: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(acp["method"], "session/update");
    let entries = &acp["params"]["update"]["entries"];
    assert_eq!(entries[1]["status"], "completed");
    assert_eq!(entries[1]["_meta"]["swarmtodo"]["status"], "cancelled");
    // A change after the start: the item starts, is updated once, and completes.
    let done = json!({"mode": "patch", "ops": [{"op": "upsert", "task": {"id": "t1", "status": "completed"}}]});
    let o = cli(&hub, "lead", &["write", "proj", "-"], &done.to_string());
    assert!(o.status.success(), "{o:?}");
    let o = cli(
        &hub,
        "lead",
        &["events", "proj", "--from", "1", "--format", "codex"],
        "",
    );
    assert!(o.status.success(), "{o:?}");
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["item.started", "item.completed"], "{lines:?}");
    assert_eq!(lines[1]["item"]["items"][0]["completed"], true);
    // A delegation from the shell: the task is the agent's, worked as a list of its own
    // (no token on a hub without tokens); a second one into the same list is refused.
    let o = cli(
        &hub,
        "lead",
        &["delegate", "proj", "t2", "--to", "sub-1", "--json"],
        "",
    );
    assert!(o.status.success(), "{o:?}");
    let d: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (d["list"].as_str(), d["task"]["owner"].as_str()),
        (Some("proj/t2"), Some("sub-1"))
    );
    assert!(d.get("token").is_none(), "{d}");
    let o = cli(
        &hub,
        "lead",
        &["delegate", "proj", "t1", "--to", "sub-2", "--as", "proj/t2"],
        "",
    );
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("conflict"),
        "{o:?}"
    );
    drop(hub);
}

/// A build without the `nats` feature (`cargo build --no-default-features`) refuses
/// `serve --nats` with a message that says what to do, and serves alone without it.
/// `.ci/run` runs it in such a build.
#[cfg(not(feature = "nats"))]
#[test]
fn a_hub_built_without_nats_refuses_to_join_a_cluster_and_serves_alone() {
    let dir = scratch("without-nats");
    let refused = dies_with_parent(&mut Command::new(env!("CARGO_BIN_EXE_swarmtodo")))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.join("cluster.db"))
        .args(["--nats", "nats://127.0.0.1:4222", "--hub-id", "hub-a"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(said.contains("built without NATS"), "{said}");
    assert!(
        !String::from_utf8_lossy(&refused.stdout).contains("listening"),
        "{refused:?}"
    );

    let hub = HubProc::start(&dir.join("hub.db"));
    let ops = dir.join("ops.json");
    std::fs::write(
        &ops,
        json!([{"op": "upsert", "task": {"id": "t1", "content": "Alone"}}]).to_string(),
    )
    .unwrap();
    let wrote = cli(
        &hub,
        "lead",
        &["write", "board", "--patch", ops.to_str().unwrap()],
        "",
    );
    assert!(wrote.status.success(), "{wrote:?}");
    let read = cli(&hub, "lead", &["read", "board", "--json"], "");
    assert!(read.status.success(), "{read:?}");
    assert!(stdout(&read).contains("\"Alone\""), "{}", stdout(&read));
}
