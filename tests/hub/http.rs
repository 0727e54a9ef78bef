//! The JSON API over HTTP against a real `swarmtodo serve` process, spoken as a foreign
//! program would (plain HTTP/1.1 over a socket): create, read, `todo_write` with
//! compare-and-set and stale bases, claims decided one at a time, tokens, and every bad
//! input with its status and stable code.

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::model::TodoList;

/// One HTTP/1.1 request on a fresh connection; the status and the body.
async fn http_text(
    hub: &HubProc,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let addr = hub.url.trim_start_matches("ws://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_owned())
}

/// One HTTP/1.1 request on a fresh connection; the status and the body as JSON.
pub(crate) async fn http(
    hub: &HubProc,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let (status, body) = http_text(hub, method, path, headers, body).await;
    let json = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"))
    };
    (status, json)
}

/// How long a stream may take to bring what a test waits for.
const WAIT: std::time::Duration = std::time::Duration::from_secs(20);

const AS_LEAD: &[(&str, &str)] = &[("X-Swarmtodo-Agent", "lead")];

/// A write to `list` as the lead on a hub without tokens, which must succeed; its answer.
async fn lead_write(hub: &HubProc, list: &str, body: &str) -> Value {
    let path = format!("/v1/lists/{list}/todo_write");
    let (s, answer) = http(hub, "POST", &path, AS_LEAD, body).await;
    assert_eq!(s, 200, "{answer}");
    answer
}

fn patch_body(tasks: Value) -> String {
    let ops: Vec<Value> = tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|t| json!({"op": "upsert", "task": t}))
        .collect();
    json!({"mode": "patch", "ops": ops}).to_string()
}

fn ids(snapshot: &Value) -> Vec<String> {
    snapshot["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_list_is_created_read_and_written_over_http_and_sync_peers_share_it() {
    let dir = scratch("http-basic");
    let hub = HubProc::start(&dir.join("hub.db"));
    let (s, health) = http(&hub, "GET", "/healthz", &[], "").await;
    assert_eq!((s, health["status"].as_str()), (200, Some("ok")));

    let (s, created) = http(&hub, "PUT", "/v1/lists/sprint%201", AS_LEAD, "").await;
    assert_eq!(s, 200, "{created}");
    assert_eq!(created["tasks"], json!([]));
    // Idempotent.
    let (s, again) = http(&hub, "PUT", "/v1/lists/sprint%201", AS_LEAD, "").await;
    assert_eq!((s, &again["version"]), (200, &created["version"]));

    let body = patch_body(
        json!([{"id": "t1", "content": "Write the parser"}, {"id": "t2", "content": "Test it"}]),
    );
    let (s, written) = http(
        &hub,
        "POST",
        "/v1/lists/sprint%201/todo_write",
        AS_LEAD,
        &body,
    )
    .await;
    assert_eq!(s, 200, "{written}");
    assert_eq!(written["result"]["created"], json!(["t1", "t2"]));
    assert_eq!(ids(&written["snapshot"]), ["t1", "t2"]);
    let v1 = written["snapshot"]["version"].as_str().unwrap().to_owned();

    let (s, read) = http(&hub, "GET", "/v1/lists/sprint%201", &[], "").await;
    assert_eq!(
        (s, ids(&read)),
        (200, vec!["t1".to_owned(), "t2".to_owned()])
    );
    assert_eq!(read["version"].as_str(), Some(v1.as_str()));

    // A Rust sync client gets the same document for the name, with the write in it.
    let mut replica = TodoList::create(actor(9));
    let mut conn = Connection::connect(&hub.url, "reader").await.unwrap();
    conn.sync(list_document_id("sprint 1"), &mut replica)
        .await
        .unwrap();
    let synced: Vec<String> = replica.read().tasks.iter().map(|t| t.id.clone()).collect();
    assert_eq!(synced, ["t1", "t2"]);

    // The list as it was at v1, after another write.
    let body = patch_body(json!([{"id": "t3", "content": "Ship it"}]));
    let (s, _) = http(
        &hub,
        "POST",
        "/v1/lists/sprint%201/todo_write",
        AS_LEAD,
        &body,
    )
    .await;
    assert_eq!(s, 200);
    let (s, old) = http(
        &hub,
        "GET",
        &format!("/v1/lists/sprint%201?version={v1}"),
        &[],
        "",
    )
    .await;
    assert_eq!(
        (s, ids(&old)),
        (200, vec!["t1".to_owned(), "t2".to_owned()])
    );
    drop(hub);
}

#[tokio::test]
async fn every_list_is_listed_with_its_tasks_by_status_and_its_version() {
    let dir = scratch("http-lists");
    let db = dir.join("hub.db");
    let hub = HubProc::start(&db);
    let (s, _) = http(&hub, "PUT", "/v1/lists/alpha", AS_LEAD, "").await;
    assert_eq!(s, 200);
    let statuses = json!([
        {"id": "t1", "content": "Pending"},
        {"id": "t2", "content": "Working", "status": "in_progress", "owner": "w1"},
        {"id": "t3", "content": "Done", "status": "completed"},
        {"id": "t4", "content": "Dropped", "status": "cancelled"},
        {"id": "t5", "content": "Stuck", "status": "blocked"},
        {"id": "t6", "content": "Next"},
    ]);
    let written = lead_write(&hub, "beta", &patch_body(statuses)).await;
    // A Rust sync peer makes a list by its name's document id: the hub learns the name
    // at the first API call that uses it.
    let mut replica = TodoList::create(actor(9));
    replica
        .write(
            &patch(vec![upsert(task("g1", "Synced"))]),
            &swarmtodo::model::WriteContext::new("peer", 1, 1),
        )
        .unwrap();
    let mut conn = Connection::connect(&hub.url, "peer").await.unwrap();
    conn.sync(list_document_id("gamma"), &mut replica)
        .await
        .unwrap();

    let listed = |page: &Value, key: &str| -> Value {
        page["lists"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == json!(key) || l["document"] == json!(key))
            .cloned()
            .unwrap_or_else(|| panic!("{key} is not in {page}"))
    };
    let counts = |l: &Value| -> Vec<u64> {
        [
            "pending",
            "in_progress",
            "completed",
            "cancelled",
            "blocked",
        ]
        .iter()
        .map(|k| l["tasks"][k].as_u64().unwrap())
        .collect()
    };
    // The index is at most LIST_SUMMARY_INTERVAL_MS behind: read it until it shows `v`
    // for list `key`.
    let listing = |key: &'static str, v: Value| {
        let hub = &hub;
        async move {
            let deadline = std::time::Instant::now() + WAIT;
            loop {
                let (s, page) = http(hub, "GET", "/v1/lists", &[], "").await;
                assert_eq!(s, 200, "{page}");
                let at = page["lists"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|l| l["name"] == json!(key) && l["version"] == v);
                if at {
                    return page;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{key} not at {v}: {page}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };
    let page = listing("beta", written["snapshot"]["version"].clone()).await;
    assert_eq!(page["next"], Value::Null);
    assert_eq!(page["lists"].as_array().unwrap().len(), 3, "{page}");
    assert_eq!(counts(&listed(&page, "alpha")), [0, 0, 0, 0, 0]);
    let beta = listed(&page, "beta");
    assert_eq!(counts(&beta), [2, 1, 1, 1, 1]);
    assert_eq!(beta["version"], written["snapshot"]["version"]);
    assert_eq!(
        beta["document"].as_str(),
        Some(list_document_id("beta").to_string().as_str())
    );
    let gamma = listed(&page, &list_document_id("gamma").to_string());
    assert_eq!(
        (&gamma["name"], counts(&gamma)),
        (&Value::Null, vec![1, 0, 0, 0, 0])
    );

    // A claim moves the counts; a write through the API names gamma.
    let (s, claimed) = http(
        &hub,
        "POST",
        "/v1/lists/beta/claim",
        &[],
        r#"{"agent": "w2"}"#,
    )
    .await;
    assert_eq!(
        (s, &claimed["task"]["id"]),
        (200, &json!("t1")),
        "{claimed}"
    );
    lead_write(
        &hub,
        "gamma",
        &patch_body(json!([{"id": "g2", "content": "Named"}])),
    )
    .await;
    let gamma_version = http(&hub, "GET", "/v1/lists/gamma", &[], "").await.1["version"].clone();
    listing("gamma", gamma_version).await;
    let page = listing("beta", claimed["version"].clone()).await;
    assert_eq!(counts(&listed(&page, "beta")), [1, 2, 1, 1, 1]);
    assert_eq!(counts(&listed(&page, "gamma")), [2, 0, 0, 0, 0]);
    assert_eq!(
        listed(&page, "beta")["version"],
        claimed["version"],
        "the version a claim answered"
    );

    // The index is stored: a restarted hub lists the same, without loading a list.
    drop(conn);
    drop(hub);
    let hub = HubProc::start(&db);
    let (_, again) = http(&hub, "GET", "/v1/lists", &[], "").await;
    assert_eq!(again, page);
    let (s, refused) = http(&hub, "POST", "/v1/lists", AS_LEAD, "{}").await;
    assert_eq!((s, &refused["code"]), (405, &json!("method_not_allowed")));
    drop(hub);
}

#[tokio::test]
async fn a_tasks_history_names_who_changed_what_over_http() {
    let dir = scratch("http-history");
    let hub = HubProc::start(&dir.join("hub.db"));
    lead_write(
        &hub,
        "hist",
        &patch_body(json!([{"id": "t1", "content": "Parse", "active_form": "Parsing"}])),
    )
    .await;
    let (s, _) = http(
        &hub,
        "POST",
        "/v1/lists/hist/claim",
        &[],
        r#"{"agent": "w1"}"#,
    )
    .await;
    assert_eq!(s, 200);
    let done = json!({"mode": "patch", "ops": [{"op": "upsert", "task": {"id": "t1", "status": "completed"}}], "explanation": "parsed"});
    let (s, _) = http(
        &hub,
        "POST",
        "/v1/lists/hist/todo_write",
        &[("X-Swarmtodo-Agent", "w1")],
        &done.to_string(),
    )
    .await;
    assert_eq!(s, 200);

    let (s, h) = http(&hub, "GET", "/v1/lists/hist/tasks/t1/history", &[], "").await;
    assert_eq!(s, 200, "{h}");
    assert_eq!(h["total"], 3);
    let agents: Vec<&str> = h["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["agent"].as_str().unwrap())
        .collect();
    assert_eq!(agents, ["lead", "w1", "w1"]);
    assert_eq!(
        h["entries"][1]["fields"],
        json!([
            {"field": "status", "before": "pending", "after": "in_progress"},
            {"field": "owner", "before": null, "after": "w1"},
        ])
    );
    assert_eq!(h["entries"][1]["explanation"], "w1 claims t1");
    assert_eq!(h["entries"][2]["explanation"], "parsed");
    let (s, last) = http(
        &hub,
        "GET",
        "/v1/lists/hist/tasks/t1/history?limit=1",
        &[],
        "",
    )
    .await;
    assert_eq!(
        (s, &last["entries"][0], &last["total"]),
        (200, &h["entries"][2], &json!(3))
    );

    for (path, status, code) in [
        ("/v1/lists/hist/tasks/t9/history", 404, "unknown_task"),
        ("/v1/lists/nope/tasks/t1/history", 404, "unknown_list"),
        (
            "/v1/lists/hist/tasks/t1/history?limit=0",
            400,
            "invalid_value",
        ),
        (
            "/v1/lists/hist/tasks/t1/history?limit=501",
            400,
            "invalid_value",
        ),
        ("/v1/lists/hist/tasks/t1", 404, "not_found"),
    ] {
        let (s, e) = http(&hub, "GET", path, &[], "").await;
        assert_eq!((s, e["code"].as_str()), (status, Some(code)), "{path}: {e}");
    }
    let (s, e) = http(&hub, "POST", "/v1/lists/hist/tasks/t1/history", AS_LEAD, "").await;
    assert_eq!((s, e["code"].as_str()), (405, Some("method_not_allowed")));
    drop(hub);
}

#[tokio::test]
async fn compare_and_set_refuses_a_moved_list_and_a_stale_replace_keeps_what_others_added() {
    let dir = scratch("http-cas");
    let hub = HubProc::start(&dir.join("hub.db"));
    let body = patch_body(json!([{"id": "a", "content": "First"}]));
    let w = lead_write(&hub, "cas", &body).await;
    let base = w["snapshot"]["version"].as_str().unwrap().to_owned();
    // Another agent adds a task.
    let body = patch_body(json!([{"id": "b", "content": "Added by wendy"}]));
    let (s, _) = http(
        &hub,
        "POST",
        "/v1/lists/cas/todo_write",
        &[("X-Swarmtodo-Agent", "wendy")],
        &body,
    )
    .await;
    assert_eq!(s, 200);

    // expected_version on the moved list: refused, nothing changes, the current list attached.
    let body = json!({"mode": "patch", "ops": [{"op": "upsert", "task": {"id": "c", "content": "Late"}}], "expected_version": base}).to_string();
    let (s, e) = http(&hub, "POST", "/v1/lists/cas/todo_write", AS_LEAD, &body).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("stale_version")), "{e}");
    assert_eq!(ids(&e["current"]), ["a", "b"]);

    // A replace from the stale base diffs against it: wendy's task stays.
    let body = json!({"mode": "replace", "base_version": base, "tasks": [{"id": "a", "content": "First, renamed", "status": "pending"}]}).to_string();
    let (s, w) = http(&hub, "POST", "/v1/lists/cas/todo_write", AS_LEAD, &body).await;
    assert_eq!(s, 200, "{w}");
    assert_eq!(ids(&w["snapshot"]), ["a", "b"]);
    assert_eq!(w["snapshot"]["tasks"][0]["content"], "First, renamed");
    drop(hub);
}

#[tokio::test]
async fn fifty_concurrent_claimers_of_twenty_ready_tasks_never_share_one() {
    let dir = scratch("http-claims");
    let hub = HubProc::start(&dir.join("hub.db"));
    let mut tasks: Vec<Value> = (0..20)
        .map(|i| json!({"id": format!("t{i:02}"), "content": format!("Task {i}")}))
        .collect();
    // One more task that waits for another: not ready, never claimed.
    tasks.push(json!({"id": "later", "content": "After t00", "blocked_by": ["t00"]}));
    lead_write(&hub, "claims", &patch_body(Value::Array(tasks))).await;

    let hub = std::sync::Arc::new(hub);
    let claimers: Vec<_> = (0..50)
        .map(|i| {
            let hub = hub.clone();
            tokio::spawn(async move {
                let body = json!({"agent": format!("agent-{i}")}).to_string();
                http(&hub, "POST", "/v1/lists/claims/claim", &[], &body).await
            })
        })
        .collect();
    let mut got = Vec::new();
    let mut nothing = 0;
    for c in claimers {
        let (s, answer) = c.await.unwrap();
        match s {
            200 => {
                assert_eq!(answer["task"]["status"], "in_progress");
                got.push((
                    answer["task"]["id"].as_str().unwrap().to_owned(),
                    answer["task"]["owner"].as_str().unwrap().to_owned(),
                ));
            }
            409 => {
                assert_eq!(answer["code"], "nothing_ready", "{answer}");
                nothing += 1;
            }
            other => panic!("claim answered {other}: {answer}"),
        }
    }
    assert_eq!((got.len(), nothing), (20, 30));
    let mut claimed: Vec<&String> = got.iter().map(|(t, _)| t).collect();
    claimed.sort();
    claimed.dedup();
    assert_eq!(claimed.len(), 20, "a task was claimed twice: {got:?}");
    assert!(!claimed.iter().any(|t| *t == "later"));
    // The list agrees: each task one owner, the one its claim named.
    let (_, list) = http(&hub, "GET", "/v1/lists/claims", &[], "").await;
    for (task, owner) in &got {
        let t = list["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == task.as_str())
            .unwrap();
        assert_eq!(t["owner"].as_str(), Some(owner.as_str()));
    }

    // Naming a task someone holds is a conflict; the holder claiming it again gets it.
    let (task, owner) = &got[0];
    let body = json!({"agent": "late-comer", "task": task}).to_string();
    let (s, e) = http(&hub, "POST", "/v1/lists/claims/claim", &[], &body).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("conflict")), "{e}");
    let body = json!({"agent": owner, "task": task}).to_string();
    let (s, again) = http(&hub, "POST", "/v1/lists/claims/claim", &[], &body).await;
    assert_eq!(
        (s, again["task"]["id"].as_str()),
        (200, Some(task.as_str()))
    );
    // A task whose dependency is not completed is not ready.
    let body = json!({"agent": "late-comer", "task": "later"}).to_string();
    let (s, e) = http(&hub, "POST", "/v1/lists/claims/claim", &[], &body).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("nothing_ready")), "{e}");
    // The metrics counted them: 20 claims granted (and one repeated), 32 refused.
    let (s, metrics) = http_text(&hub, "GET", "/metrics", &[], "").await;
    assert_eq!(s, 200);
    for line in [
        "swarmtodo_calls_total{kind=\"claim\",outcome=\"ok\"} 21",
        "swarmtodo_calls_total{kind=\"claim\",outcome=\"refused\"} 32",
        "swarmtodo_lists_stored 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }
    assert!(
        metrics.contains("swarmtodo_api_write_seconds_count 54"),
        "{metrics}"
    );
    drop(hub);
}

#[tokio::test]
async fn tokens_and_roles_hold_on_every_path() {
    let (hub, _dir) = hub_with_config("http-tokens", TOKENS_CONFIG);
    let lead = format!("Bearer {LEAD_TOKEN}");
    let worker = format!("Bearer {WORKER_TOKEN}");
    let observer = format!("Bearer {OBSERVER_TOKEN}");
    let body = patch_body(
        json!([{"id": "t1", "content": "Plan", "owner": "lead"}, {"id": "t2", "content": "Build"}]),
    );
    let (s, e) = http(&hub, "POST", "/v1/lists/team/todo_write", &[], &body).await;
    assert_eq!((s, e["code"].as_str()), (401, Some("unauthorized")));
    let (s, e) = http(
        &hub,
        "GET",
        "/v1/lists/team",
        &[("Authorization", "Bearer nope")],
        "",
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (401, Some("unauthorized")));
    let (s, _) = http(
        &hub,
        "POST",
        "/v1/lists/team/todo_write",
        &[("Authorization", &lead)],
        &body,
    )
    .await;
    assert_eq!(s, 200);
    let (s, e) = http(
        &hub,
        "POST",
        "/v1/lists/team/todo_write",
        &[("Authorization", &observer)],
        &body,
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (403, Some("forbidden")));
    let (s, read) = http(
        &hub,
        "GET",
        "/v1/lists/team",
        &[("Authorization", &observer)],
        "",
    )
    .await;
    assert_eq!(
        (s, ids(&read)),
        (200, vec!["t1".to_owned(), "t2".to_owned()])
    );
    // A worker claims for itself only.
    let (s, e) = http(
        &hub,
        "POST",
        "/v1/lists/team/claim",
        &[("Authorization", &worker)],
        r#"{"agent": "lead"}"#,
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (403, Some("forbidden")));
    // A worker's write to the lead's task is refused, and the list keeps the lead's.
    let edit = patch_body(json!([{"id": "t1", "content": "Plan, as wendy wants it"}]));
    let (s, e) = http(
        &hub,
        "POST",
        "/v1/lists/team/todo_write",
        &[("Authorization", &worker)],
        &edit,
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (403, Some("forbidden")), "{e}");
    let (_, read) = http(
        &hub,
        "GET",
        "/v1/lists/team",
        &[("Authorization", &observer)],
        "",
    )
    .await;
    assert_eq!(read["tasks"][0]["content"], "Plan");
    let (s, c) = http(
        &hub,
        "POST",
        "/v1/lists/team/claim",
        &[("Authorization", &worker)],
        "",
    )
    .await;
    assert_eq!(
        (s, c["task"]["owner"].as_str()),
        (200, Some("wendy")),
        "{c}"
    );
    drop(hub);
}

#[tokio::test]
async fn bad_input_gets_its_status_and_code_and_changes_nothing() {
    let dir = scratch("http-bad");
    let hub = HubProc::start(&dir.join("hub.db"));
    let w = lead_write(
        &hub,
        "bad",
        &patch_body(json!([{"id": "t1", "content": "Keep"}])),
    )
    .await;
    let version = w["snapshot"]["version"].clone();
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        (
            "POST",
            "/v1/lists/bad/todo_write",
            r#"{"mode": "patch", "ops": [], "colour": 1}"#.into(),
            400,
            "invalid_value",
        ),
        (
            "POST",
            "/v1/lists/bad/todo_write",
            r#"{"mode": "patch", "ops": ["#.into(),
            400,
            "invalid_value",
        ),
        (
            "POST",
            "/v1/lists/bad/todo_write",
            patch_body(json!([{"id": "t1", "status": "done"}])),
            400,
            "invalid_value",
        ),
        (
            "POST",
            "/v1/lists/bad/todo_write",
            "x".repeat(9 * 1024 * 1024),
            413,
            "limit_exceeded",
        ),
        (
            "GET",
            "/v1/lists/nowhere",
            String::new(),
            404,
            "unknown_list",
        ),
        (
            "DELETE",
            "/v1/lists/bad",
            String::new(),
            405,
            "method_not_allowed",
        ),
        (
            "GET",
            "/v1/lists/bad/todo_write",
            String::new(),
            405,
            "method_not_allowed",
        ),
        ("GET", "/v1/nothing", String::new(), 404, "not_found"),
        (
            "GET",
            "/v1/lists/bad?version=zzz",
            String::new(),
            400,
            "invalid_value",
        ),
    ];
    for (method, path, body, status, code) in cases {
        let (s, e) = http(&hub, method, path, AS_LEAD, &body).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (status, Some(code)),
            "{method} {path}: {e}"
        );
        assert!(!e["message"].as_str().unwrap_or("").is_empty(), "{e}");
    }
    // Without an agent, a write is refused on a hub without tokens.
    let (s, e) = http(
        &hub,
        "POST",
        "/v1/lists/bad/todo_write",
        &[],
        &patch_body(json!([{"id": "t2", "content": "x"}])),
    )
    .await;
    assert_eq!(
        (s, e["code"].as_str(), e["field"].as_str()),
        (400, Some("missing_field"), Some("agent"))
    );
    let (_, after) = http(&hub, "GET", "/v1/lists/bad", &[], "").await;
    assert_eq!(after["version"], version, "a refused call changed the list");
    drop(hub);
}

/// Reads an event stream until `until` says stop (given the seqs so far), or for at most
/// `WAIT`; the seqs of the events received, in order, and the kinds of the first
/// messages (the snapshot's among them).
async fn follow(
    hub: &HubProc,
    path: &str,
    last_event_id: Option<u64>,
    until: impl Fn(&[u64]) -> bool,
) -> (Vec<u64>, Vec<String>) {
    let addr = hub.url.trim_start_matches("ws://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
    if let Some(id) = last_event_id {
        req.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut pending = String::new();
    let mut seqs = Vec::new();
    let mut kinds = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = tokio::time::Instant::now() + WAIT;
    while !until(&seqs) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("events arrive in time")
            .unwrap();
        assert!(n > 0, "the stream ended; received {seqs:?}");
        pending.push_str(&String::from_utf8_lossy(&buf[..n]));
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            if let Some(id) = line.strip_prefix("id: ") {
                seqs.push(id.trim().parse().unwrap());
            } else if let Some(kind) = line.strip_prefix("event: ") {
                kinds.push(kind.trim().to_owned());
            }
        }
    }
    (seqs, kinds)
}

#[tokio::test]
async fn an_event_stream_resumed_with_last_event_id_has_every_event_once() {
    let dir = scratch("http-sse");
    let hub = std::sync::Arc::new(HubProc::start(&dir.join("hub.db")));
    let (s, _) = http(&hub, "PUT", "/v1/lists/stream", AS_LEAD, "").await;
    assert_eq!(s, 200);
    const WRITES: usize = 30;
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let hub = hub.clone();
            tokio::spawn(async move {
                for i in 0..WRITES {
                    let body = patch_body(json!([{"id": format!("w{w}-{i}"), "content": format!("Step {i} of writer {w}")}]));
                    let agent = format!("writer-{w}");
                    let (s, e) = http(&hub, "POST", "/v1/lists/stream/todo_write", &[("X-Swarmtodo-Agent", &agent)], &body).await;
                    assert_eq!(s, 200, "{e}");
                }
            })
        })
        .collect();
    // A reader takes a few events, leaves mid-stream, and comes back from its last one,
    // again and again, while the writers write.
    let mut seen: Vec<u64> = Vec::new();
    let mut first_kinds = Vec::new();
    for round in 0..4 {
        let last = seen.last().copied();
        let (seqs, kinds) = follow(&hub, "/v1/lists/stream/events", last, |s| s.len() >= 5).await;
        if round == 0 {
            first_kinds = kinds;
        }
        seen.extend(seqs);
    }
    for w in writers {
        w.await.unwrap();
    }
    // Everything the writers caused: 3 × WRITES writes, one tasks_changed each at least.
    let total = 3 * WRITES as u64;
    let last = seen.last().copied();
    let (rest, _) = follow(&hub, "/v1/lists/stream/events", last, |s| {
        s.last().is_some_and(|l| *l >= total)
    })
    .await;
    seen.extend(rest);
    assert_eq!(first_kinds.first().map(String::as_str), Some("snapshot"));
    let expected: Vec<u64> = (1..=*seen.last().unwrap()).collect();
    assert_eq!(
        seen, expected,
        "every event once, in seq order, across reconnects"
    );
    // `?from=` resumes too.
    let (from_query, _) = follow(&hub, "/v1/lists/stream/events?from=7", None, |s| {
        !s.is_empty()
    })
    .await;
    assert_eq!(from_query[0], 8);
    // `?tail=` starts that many events back from the last one stored.
    let last = *seen.last().unwrap();
    let (tail, _) = follow(&hub, "/v1/lists/stream/events?tail=3", None, |s| {
        s.len() >= 3
    })
    .await;
    assert_eq!(tail, vec![tail[0], tail[0] + 1, tail[0] + 2]);
    assert!(tail[0] + 2 >= last, "{tail:?} after {last}");
    let (s, e) = http(&hub, "GET", "/v1/lists/stream/events?tail=x", &[], "").await;
    assert_eq!((s, e["field"].as_str()), (400, Some("tail")));
    let (s, e) = http(&hub, "GET", "/v1/lists/nowhere/events", &[], "").await;
    assert_eq!((s, e["code"].as_str()), (404, Some("unknown_list")));
    drop(hub);
}

/// A reader that stops reading while more than `STREAM_BUFFERED_MAX` events are
/// committed (large ones: its socket fills long before) falls off the live stream and
/// is served from the store: once it reads again it gets every event once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_past_the_stream_buffer_gets_every_event_from_the_store() {
    use swarmtodo::hub::limits::STREAM_BUFFERED_MAX;
    let dir = scratch("http-sse-behind");
    let (hub, log) = HubProc::start_logging(&dir.join("hub.db"), &[], "info");
    let hub = std::sync::Arc::new(hub);
    let (s, _) = http(&hub, "PUT", "/v1/lists/flood", AS_LEAD, "").await;
    assert_eq!(s, 200);
    // The reader takes the snapshot, then reads nothing (the kernel grows a socket's
    // buffers only as its reader reads).
    let addr = hub.url.trim_start_matches("ws://").to_owned();
    let mut reader = tokio::net::TcpStream::connect(&addr).await.unwrap();
    reader
        .write_all(
            format!("GET /v1/lists/flood/events HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut first = vec![0u8; 1024];
    let n = reader.read(&mut first).await.unwrap();
    // What came with the head is the stream's beginning: the snapshot, and on a busy
    // machine already the first event (the lead's `agent_joined`, from its PUT).
    let mut pending = String::from_utf8_lossy(&first[..n]).into_owned();
    assert!(pending.contains("200 OK"));
    // Four writers, each write one event of about 16 KiB (two texts of 4 KiB, before and
    // after).
    const WRITERS: usize = 4;
    // Twice the buffer: the sockets and the stream's queue take about 500 of them before
    // the stream stops taking live events (measured: it fell behind after 513).
    let per_writer = (2 * STREAM_BUFFERED_MAX).div_ceil(WRITERS);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let hub = hub.clone();
            tokio::spawn(async move {
                let agent = format!("writer-{w}");
                for i in 0..per_writer {
                    let text = format!("{i:04}{}", "x".repeat(4_000));
                    let body = patch_body(
                        json!([{"id": format!("w{w}"), "content": text, "active_form": text}]),
                    );
                    let (s, e) = http(
                        &hub,
                        "POST",
                        "/v1/lists/flood/todo_write",
                        &[("X-Swarmtodo-Agent", &agent)],
                        &body,
                    )
                    .await;
                    assert_eq!(s, 200, "{e}");
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    // Now it reads: every event, once, in order, up to the last one stored.
    let (_, list) = http(&hub, "GET", "/v1/lists/flood", &[], "").await;
    assert_eq!(list["tasks"].as_array().unwrap().len(), WRITERS);
    let mut seqs: Vec<u64> = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    // At least one event per write; then whatever else there is, until it goes quiet.
    // About 32 MiB: the stream must not stall for WAIT, however long the whole takes on
    // a busy machine.
    let writes = WRITERS * per_writer;
    loop {
        let wait = if seqs.len() >= writes {
            tokio::time::Instant::now() + std::time::Duration::from_secs(1)
        } else {
            tokio::time::Instant::now() + WAIT
        };
        let n = match tokio::time::timeout_at(wait, reader.read(&mut buf)).await {
            Ok(read) => read.unwrap(),
            Err(_) if seqs.len() >= writes => break,
            Err(_) => panic!(
                "the stream stalled for {WAIT:?} after {} events, of at least {writes}",
                seqs.len()
            ),
        };
        assert!(n > 0, "the stream ended after {} events", seqs.len());
        pending.push_str(&String::from_utf8_lossy(&buf[..n]));
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            if let Some(id) = line.strip_prefix("id: ") {
                seqs.push(id.trim().parse().unwrap());
            }
        }
    }
    let expected: Vec<u64> = (1..=*seqs.last().unwrap()).collect();
    assert_eq!(seqs, expected, "every event once, in seq order");
    let behind = log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("an event stream fell behind the live events"));
    assert!(
        behind,
        "the reader fell past the live buffer ({} events): {:?}",
        seqs.len(),
        log.lock().unwrap().iter().rev().take(5).collect::<Vec<_>>()
    );
    drop(hub);
}

#[tokio::test]
async fn completing_the_last_dependency_unblocks_a_task_with_an_event_and_it_can_be_claimed() {
    let dir = scratch("http-unblocked");
    let hub = HubProc::start(&dir.join("hub.db"));
    let tasks = json!([
        {"id": "a", "content": "First"},
        {"id": "b", "content": "Second"},
        {"id": "c", "content": "After both", "blocked_by": ["a", "b"]},
    ]);
    lead_write(&hub, "deps", &patch_body(tasks)).await;
    let done = |id: &str| {
        json!({"mode": "patch", "ops": [{"op": "upsert", "task": {"id": id, "status": "completed"}}]}).to_string()
    };
    // One dependency completed: not yet.
    lead_write(&hub, "deps", &done("a")).await;
    let claim = json!({"agent": "w", "task": "c"}).to_string();
    let (s, e) = http(&hub, "POST", "/v1/lists/deps/claim", &[], &claim).await;
    assert_eq!((s, e["code"].as_str()), (409, Some("nothing_ready")));
    // The last one: `unblocked`, and the claim succeeds.
    lead_write(&hub, "deps", &done("b")).await;
    let (_, kinds) = follow(&hub, "/v1/lists/deps/events", None, |s| s.len() >= 4).await;
    let unblocked: Vec<&String> = kinds.iter().filter(|k| *k == "unblocked").collect();
    assert_eq!(unblocked.len(), 1, "{kinds:?}");
    let (s, c) = http(&hub, "POST", "/v1/lists/deps/claim", &[], &claim).await;
    assert_eq!((s, c["task"]["id"].as_str()), (200, Some("c")), "{c}");
    drop(hub);
}

/// A request whose head or body never arrives whole does not hold its connection past
/// `HANDSHAKE_TIMEOUT` (head) or `HTTP_BODY_TIMEOUT` (body); a head over
/// `HTTP_HEAD_BYTES_MAX` is refused; the hub serves others meanwhile and after.
#[tokio::test]
async fn slow_or_oversize_requests_are_cut_off_and_the_hub_serves_the_others() {
    use swarmtodo::hub::limits::{HANDSHAKE_TIMEOUT, HTTP_BODY_TIMEOUT, HTTP_HEAD_BYTES_MAX};
    let dir = scratch("http-slow");
    let hub = HubProc::start(&dir.join("hub.db"));
    let addr = hub.url.trim_start_matches("ws://").to_owned();
    let started = std::time::Instant::now();
    // A head that stops half-way.
    let mut head_only = tokio::net::TcpStream::connect(&addr).await.unwrap();
    head_only
        .write_all(b"POST /v1/lists/slow/todo_write HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // A body that stops half-way.
    let mut half_body = tokio::net::TcpStream::connect(&addr).await.unwrap();
    half_body
        .write_all(b"POST /v1/lists/slow/todo_write HTTP/1.1\r\nHost: x\r\nX-Swarmtodo-Agent: s\r\nContent-Length: 100\r\n\r\n{\"mode\":")
        .await
        .unwrap();
    // Meanwhile the hub answers others.
    let (s, _) = http(&hub, "GET", "/healthz", &[], "").await;
    assert_eq!(s, 200);
    let limit = HANDSHAKE_TIMEOUT.max(HTTP_BODY_TIMEOUT) + std::time::Duration::from_secs(10);
    let mut answer = String::new();
    tokio::time::timeout(limit, half_body.read_to_string(&mut answer))
        .await
        .expect("the slow body is cut off")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("invalid_value") && answer.contains("did not arrive"),
        "{answer}"
    );
    let mut rest = Vec::new();
    tokio::time::timeout(limit, head_only.read_to_end(&mut rest))
        .await
        .expect("the slow head is cut off")
        .unwrap();
    assert!(started.elapsed() >= HTTP_BODY_TIMEOUT.min(HANDSHAKE_TIMEOUT));
    // A head over the bound.
    let big = "x".repeat(2 * HTTP_HEAD_BYTES_MAX);
    let (s, _) = http_text(&hub, "GET", "/v1/lists/slow", &[("X-Padding", &big)], "").await;
    assert_eq!(s, 431, "an oversize head is refused");
    let (s, _) = http(&hub, "GET", "/healthz", &[], "").await;
    assert_eq!(s, 200);
    drop(hub);
}

/// List `list` with a task, a sync peer in step with it, then a second write that peer
/// has not synced: the peer's connection and replica, and the version it lacks.
async fn a_version_one_peer_lacks(hub: &HubProc, list: &str) -> (Connection, TodoList, String) {
    let first = patch_body(json!([{"id": "t1", "content": "Start"}]));
    lead_write(hub, list, &first).await;
    let mut replica = TodoList::create(actor(7));
    let mut conn = Connection::connect(&hub.url, "reader").await.unwrap();
    conn.sync(list_document_id(list), &mut replica)
        .await
        .unwrap();
    let second = patch_body(json!([{"id": "t2", "content": "Next"}]));
    let w = lead_write(hub, list, &second).await;
    let v = w["snapshot"]["version"].as_str().unwrap().to_owned();
    (conn, replica, v)
}

/// The barrier: a wait answers once every agent syncing the list holds the version, and
/// at its timeout names those that do not.
#[tokio::test]
async fn a_wait_answers_when_every_connected_agent_holds_the_version() {
    let dir = scratch("http-wait");
    let hub = HubProc::start(&dir.join("hub.db"));
    let (mut conn, mut replica, v) = a_version_one_peer_lacks(&hub, "barrier").await;
    let (s, waited) = http(
        &hub,
        "GET",
        &format!("/v1/lists/barrier/wait?version={v}&timeout_ms=300"),
        &[],
        "",
    )
    .await;
    assert_eq!(s, 200, "{waited}");
    assert_eq!(waited["acknowledged"], false, "{waited}");
    assert_eq!(waited["pending"].as_array().unwrap().len(), 1, "{waited}");
    // Once it syncs, the barrier passes.
    conn.sync(list_document_id("barrier"), &mut replica)
        .await
        .unwrap();
    let (s, waited) = http(
        &hub,
        "GET",
        &format!("/v1/lists/barrier/wait?version={v}&timeout_ms=5000"),
        &[],
        "",
    )
    .await;
    assert_eq!(
        (s, &waited["acknowledged"]),
        (200, &json!(true)),
        "{waited}"
    );
    assert_eq!(waited["pending"], json!([]));
    let (s, e) = http(&hub, "GET", "/v1/lists/barrier/wait", &[], "").await;
    assert_eq!((s, e["code"].as_str()), (400, Some("missing_field")));
    drop(hub);
}

/// `WAITS_MAX` waits may be open at once; one more is refused with `limit_exceeded`,
/// and the open ones still answer.
#[tokio::test]
async fn waits_past_the_bound_are_refused_and_the_open_ones_still_answer() {
    use swarmtodo::hub::core::WAITS_MAX;
    let dir = scratch("http-waits-max");
    let hub = std::sync::Arc::new(HubProc::start(&dir.join("hub.db")));
    let (conn, _replica, v) = a_version_one_peer_lacks(&hub, "many-waits").await;
    let path = format!("/v1/lists/many-waits/wait?version={v}&timeout_ms=10000");
    let open: Vec<_> = (0..WAITS_MAX)
        .map(|_| {
            let (hub, path) = (hub.clone(), path.clone());
            tokio::spawn(async move { http(&hub, "GET", &path, &[], "").await })
        })
        .collect();
    // Every one of them is open (well within their timeout) before the next is asked.
    tokio::time::sleep(std::time::Duration::from_millis(2_000)).await;
    let (s, e) = http(&hub, "GET", &path, &[], "").await;
    assert_eq!(
        (s, e["code"].as_str()),
        (413, Some("limit_exceeded")),
        "{e}"
    );
    for o in open {
        let (s, a) = o.await.unwrap();
        assert_eq!((s, &a["acknowledged"]), (200, &json!(false)), "{a}");
    }
    drop(conn);
}

/// A stream with nothing more to say (the snapshot and the list's creation sent) sends
/// a comment line every `STREAM_KEEPALIVE` (no event, no `id:`): what keeps it open
/// through proxies that close quiet connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_event_stream_sends_keep_alive_comments() {
    use swarmtodo::hub::limits::STREAM_KEEPALIVE;
    let dir = scratch("http-sse-keepalive");
    let hub = HubProc::start(&dir.join("hub.db"));
    let (s, _) = http(&hub, "PUT", "/v1/lists/quiet", AS_LEAD, "").await;
    assert_eq!(s, 200);
    let addr = hub.url.trim_start_matches("ws://").to_owned();
    let mut reader = tokio::net::TcpStream::connect(&addr).await.unwrap();
    reader
        .write_all(
            format!("GET /v1/lists/quiet/events HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut got = String::new();
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = started + STREAM_KEEPALIVE + std::time::Duration::from_secs(10);
    while !got.contains(": keep-alive\n\n") {
        let n = tokio::time::timeout_at(deadline, reader.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no keep-alive in {got:?}"))
            .unwrap();
        assert!(n > 0, "the stream ended: {got:?}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(started.elapsed() >= STREAM_KEEPALIVE);
    let body = &got[got.find("\r\n\r\n").unwrap() + 4..];
    assert!(body.starts_with("event: snapshot\n"), "{body}");
    assert!(body.ends_with("\n\n: keep-alive\n\n"), "{body}");
}

/// The head of the answer to a raw request (up to its blank line).
async fn raw_head(hub: &HubProc, request: &str) -> String {
    let addr = hub.url.trim_start_matches("ws://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, s.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).to_lowercase()
}

/// The board is served at `/` with its two files, under a policy that lets the page
/// load only its own files and talk only to this hub; `/` with an `Upgrade` header is
/// still the WebSocket handshake (where peers connect), and the head that decides may
/// come in pieces.
#[tokio::test]
async fn the_board_is_served_at_the_root_and_sync_peers_still_connect_there() {
    let dir = scratch("http-board");
    let hub = HubProc::start(&dir.join("hub.db"));
    let (s, page) = http_text(&hub, "GET", "/", &[], "").await;
    assert_eq!(s, 200);
    assert!(page.contains(r#"<script src="/board.js""#), "{page}");
    for asset in ["/board.js", "/board.css"] {
        let (s, body) = http_text(&hub, "GET", asset, &[], "").await;
        assert_eq!(s, 200, "{asset}");
        assert!(body.len() > 1_000, "{asset}: {body}");
    }
    let head = raw_head(&hub, "HEAD /?x=1 HTTP/1.1\r\nHost: h\r\n\r\n").await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'none'; script-src 'self'"),
        "{head}"
    );
    let (s, e) = http(&hub, "POST", "/", &[], "").await;
    assert_eq!((s, e["code"].as_str()), (405, Some("method_not_allowed")));
    let (s, _) = http(&hub, "GET", "/board.nothing", &[], "").await;
    assert_eq!(s, 404);
    // The WebSocket handshake on `/`, its head in two pieces.
    let addr = hub.url.trim_start_matches("ws://");
    let mut ws = tokio::net::TcpStream::connect(addr).await.unwrap();
    ws.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    ws.write_all(
        b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = [0u8; 256];
    let n = tokio::time::timeout(WAIT, ws.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    drop(hub);
}
