//! Delegation against a real hub with tokens: a lead hands a task to a subagent, who
//! gets a list of its own and a worker token for it; the task's status follows that
//! list, with events on both lists, across a restart of the hub in between.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;
use crate::http::http;

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn as_token(
    hub: &HubProc,
    token: &str,
    method: &str,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let auth = bearer(token);
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    http(hub, method, path, &[("Authorization", &auth)], &body).await
}

/// The status of task `task` of list `list` once it is `want` (polled: a roll-up is
/// the hub's own write after the sub-list's).
async fn status_becomes(hub: &HubProc, list: &str, task: &str, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, l) = as_token(
            hub,
            LEAD_TOKEN,
            "GET",
            &format!("/v1/lists/{list}"),
            Value::Null,
        )
        .await;
        let status = l["tasks"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["id"] == task))
            .map(|t| t["status"].clone());
        if status.as_ref().and_then(Value::as_str) == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{list}:{task} is {status:?}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The kinds of the events stored for `list`, with their bodies.
async fn events(hub: &HubProc, list: &str) -> Vec<Value> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_swarmtodo"))
        .args(["events", list, "--hub", &hub.url, "--token", LEAD_TOKEN])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn kinds<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["kind"] == kind).collect()
}

#[tokio::test]
async fn a_delegated_task_rolls_up_from_its_list_with_events_on_both_across_a_restart() {
    let (hub, dir) = hub_with_config("delegation", TOKENS_CONFIG);
    let config = dir.join("swarmtodo.toml");
    let plan = json!({"mode": "patch", "ops": [
        {"op": "upsert", "task": {"id": "t1", "content": "Design the API"}},
        {"op": "upsert", "task": {"id": "t2", "content": "Build the parser"}},
    ]});
    let (s, e) = as_token(&hub, LEAD_TOKEN, "POST", "/v1/lists/plan/todo_write", plan).await;
    assert_eq!(s, 200, "{e}");

    // Only a lead delegates; an unknown task and a bad body are refused.
    let d = json!({"task": "t2", "agent": "sub-1"});
    let (s, e) = as_token(
        &hub,
        WORKER_TOKEN,
        "POST",
        "/v1/lists/plan/delegate",
        d.clone(),
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (403, Some("forbidden")), "{e}");
    let (s, e) = as_token(
        &hub,
        LEAD_TOKEN,
        "POST",
        "/v1/lists/plan/delegate",
        json!({"task": "nope", "agent": "sub-1"}),
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (404, Some("unknown_task")), "{e}");
    let (s, e) = as_token(
        &hub,
        LEAD_TOKEN,
        "POST",
        "/v1/lists/plan/delegate",
        json!({"task": "t2"}),
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (400, Some("invalid_value")), "{e}");

    let (s, answer) = as_token(&hub, LEAD_TOKEN, "POST", "/v1/lists/plan/delegate", d).await;
    assert_eq!(s, 200, "{answer}");
    assert_eq!(answer["list"], "plan/t2");
    assert_eq!(answer["task"]["owner"], "sub-1");
    let token = answer["token"]
        .as_str()
        .expect("a token on a hub with tokens")
        .to_owned();
    // The list name is taken now: another delegation into it is refused.
    let (s, e) = as_token(
        &hub,
        LEAD_TOKEN,
        "POST",
        "/v1/lists/plan/delegate",
        json!({"task": "t1", "agent": "sub-2", "list": "plan/t2"}),
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (409, Some("conflict")), "{e}");

    // The subagent plans its list and starts: the parent task is in progress.
    let sub = json!({"mode": "patch", "ops": [
        {"op": "upsert", "task": {"id": "s1", "content": "Write the grammar"}},
        {"op": "upsert", "task": {"id": "s2", "content": "Write the tests"}},
    ]});
    let (s, e) = as_token(&hub, &token, "POST", "/v1/lists/plan%2Ft2/todo_write", sub).await;
    assert_eq!(s, 200, "{e}");
    status_becomes(&hub, "plan", "t2", "pending").await;
    let (s, e) = as_token(
        &hub,
        &token,
        "POST",
        "/v1/lists/plan%2Ft2/claim",
        json!({"task": "s1"}),
    )
    .await;
    assert_eq!(s, 200, "{e}");
    status_becomes(&hub, "plan", "t2", "in_progress").await;
    // Its token reads the parent list and writes nothing there.
    let (s, _) = as_token(&hub, &token, "GET", "/v1/lists/plan", Value::Null).await;
    assert_eq!(s, 200);
    let touch = json!({"mode": "patch", "ops": [{"op": "upsert", "task": {"id": "t1", "status": "completed"}}]});
    let (s, e) = as_token(&hub, &token, "POST", "/v1/lists/plan/todo_write", touch).await;
    assert_eq!((s, e["code"].as_str()), (403, Some("forbidden")), "{e}");

    // The hub restarts; the link and the token are kept.
    drop(hub);
    let hub = HubProc::start_with(
        &dir.join("hub.db"),
        "127.0.0.1:0",
        &["--config", config.to_str().unwrap()],
    );
    let done = |id: &str| json!({"mode": "patch", "ops": [{"op": "upsert", "task": {"id": id, "status": "completed"}}]});
    let (s, e) = as_token(
        &hub,
        &token,
        "POST",
        "/v1/lists/plan%2Ft2/todo_write",
        done("s1"),
    )
    .await;
    assert_eq!(s, 200, "{e}");
    status_becomes(&hub, "plan", "t2", "pending").await;
    let (s, e) = as_token(&hub, &token, "POST", "/v1/lists/plan%2Ft2/claim", json!({})).await;
    assert_eq!((s, e["task"]["id"].as_str()), (200, Some("s2")), "{e}");
    status_becomes(&hub, "plan", "t2", "in_progress").await;
    let (s, e) = as_token(
        &hub,
        &token,
        "POST",
        "/v1/lists/plan%2Ft2/todo_write",
        done("s2"),
    )
    .await;
    assert_eq!(s, 200, "{e}");
    // The last task of the sub-list completed: the parent task is completed.
    status_becomes(&hub, "plan", "t2", "completed").await;

    let parent = events(&hub, "plan").await;
    let delegated = kinds(&parent, "delegated");
    assert_eq!(delegated.len(), 1, "{parent:?}");
    assert_eq!(delegated[0]["sub_list"], "plan/t2");
    assert_eq!(delegated[0]["agent"], "sub-1");
    let rolled: Vec<&str> = kinds(&parent, "rolled_up")
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        rolled,
        ["in_progress", "pending", "in_progress", "completed"],
        "one roll-up per status the list took"
    );
    let sub = events(&hub, "plan/t2").await;
    assert_eq!(kinds(&sub, "delegated").len(), 1, "{sub:?}");
    assert_eq!(kinds(&sub, "delegated")[0]["parent"], "plan");
    drop(hub);
}
