//! `swarmtodo mcp` driven by a real MCP client this project did not write: the official
//! Python SDK (PyPI `mcp`, installed by `.ci/run` into `target/mcp-venv`), over stdio,
//! against a real hub (`tests/mcp/client.py` holds the client's side).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{dies_with_parent, scratch, HubProc};

/// The Python that has the MCP SDK: `SWARMTODO_MCP_PYTHON`, else `target/mcp-venv`.
fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SWARMTODO_MCP_PYTHON") {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mcp-venv/bin/python");
    assert!(
        venv.exists(),
        "the MCP client is not installed: run `python3 -m venv target/mcp-venv && target/mcp-venv/bin/pip install mcp==2.3.0` (.ci/run does)"
    );
    venv
}

/// Runs scenario `scenario` of the Python client against `hub` on `list`; what it
/// printed.
async fn client(scenario: &str, hub: &HubProc, list: &str) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py");
    let args = [
        script.to_string_lossy().into_owned(),
        scenario.to_owned(),
        env!("CARGO_BIN_EXE_swarmtodo").to_owned(),
        hub.url.clone(),
        list.to_owned(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        dies_with_parent(&mut Command::new(python()))
            .args(&args)
            .output()
            .expect("run the MCP client")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the MCP client failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the MCP client printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[tokio::test]
async fn a_real_mcp_client_uses_every_tool_with_its_own_payloads_and_is_notified() {
    let dir = scratch("mcp-every-tool");
    let hub = HubProc::start(&dir.join("hub.db"));
    let seen = client("every-tool", &hub, "mcp").await;
    assert_eq!(seen["protocol"], "2025-11-25");
    assert_eq!(seen["tools"].as_array().unwrap().len(), 12);
    assert_eq!(seen["notified"], "swarmtodo://lists/mcp");
    // Every bad payload got an error naming what is allowed.
    let errors = seen["errors"].as_object().unwrap();
    assert_eq!(errors.len(), 11);
    for (tool, e) in errors {
        assert!(!e.as_str().unwrap().is_empty(), "{tool}: an empty error");
    }
    assert!(
        errors["todo_write"].as_str().unwrap().contains("finished"),
        "{errors:?}"
    );
    drop(hub);
}

#[tokio::test]
async fn two_codex_agents_sending_stale_plans_concurrently_lose_nothing_and_revert_nothing() {
    let dir = scratch("mcp-codex-race");
    let hub = HubProc::start(&dir.join("hub.db"));
    for round in 0..3 {
        let list = format!("race-{round}");
        let seen = client("codex-race", &hub, &list).await;
        let final_ = seen["final"].as_object().unwrap();
        let expected = serde_json::json!({
            "Shared step 1": "completed",
            "Shared step 2": "completed",
            "A's step": "in_progress",
            "B's step": "in_progress",
        });
        assert_eq!(
            serde_json::Value::Object(final_.clone()),
            expected,
            "round {round}"
        );
    }
    drop(hub);
}

#[tokio::test]
async fn the_readme_example_one_lead_and_three_subagents_completes_every_task_once() {
    let dir = scratch("mcp-swarm-example");
    let hub = HubProc::start(&dir.join("hub.db"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mcp_swarm.py");
    let args = [
        script.to_string_lossy().into_owned(),
        env!("CARGO_BIN_EXE_swarmtodo").to_owned(),
        hub.url.replace("ws://", "http://"),
        "swarm".to_owned(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        dies_with_parent(&mut Command::new(python()))
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every task done, by exactly one of the three.
    let mut done: Vec<&str> = seen["done"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|v| v.as_array().unwrap().iter().map(|t| t.as_str().unwrap()))
        .collect();
    done.sort_unstable();
    let tasks = seen["list"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 6);
    let mut all: Vec<&str> = tasks
        .iter()
        .map(|t| t["content"].as_str().unwrap())
        .collect();
    all.sort_unstable();
    assert_eq!(done, all, "each task done once");
    assert!(tasks.iter().all(|t| t["status"] == "completed"));
    drop(hub);
}

#[tokio::test]
async fn a_task_delegated_over_mcp_rolls_up_when_the_subagent_finishes() {
    let dir = scratch("mcp-delegate");
    let hub = HubProc::start(&dir.join("hub.db"));
    let seen = client("delegate", &hub, "lead-list").await;
    assert!(seen["sub_list"].as_str().unwrap().starts_with("lead-list/"));
    assert_eq!(
        seen["statuses"],
        serde_json::json!(["in_progress", "completed"]),
        "the parent task follows the subagent's list"
    );
    drop(hub);
}
