//! Hostile peers against a real hub: a real `swarmtodo serve` process on loopback, a
//! real JS automerge-repo peer (`tests/js/hostile.mjs`) writing what no honest client
//! would, and swarmtodo's Rust client as the honest lead who must keep its list.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::hub::wire::DocumentId;
use swarmtodo::model::TodoList;
use swarmtodo::proto::{Event, EventBody, Rule, Status, Violation};

/// Runs `tests/js/hostile.mjs MODE N` against `url` on list `doc` and returns what the
/// attacker read at the end (`{"tasks", "agents"}`), or `None` when it failed (the hub
/// closed it, say).
async fn hostile(url: &str, doc: DocumentId, mode: &str, n: usize) -> Option<serde_json::Value> {
    let js = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js");
    assert!(
        js.join("node_modules/@automerge/automerge-repo").exists(),
        "the JS peer is not installed: run `npm install --prefix tests/js` (.ci/run does)"
    );
    let (url, mode) = (url.to_owned(), mode.to_owned());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(js.join("hostile.mjs"))
            .args([url, doc.to_string(), mode, n.to_string()])
            .output()
            .expect("node must be installed")
    })
    .await
    .unwrap();
    if !out.status.success() {
        eprintln!(
            "hostile peer exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    match serde_json::from_slice(&out.stdout) {
        Ok(v) => Some(v),
        Err(e) => panic!(
            "the hostile peer printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        ),
    }
}

/// A hub, the lead's list `name` (t1..t3) synced to it, and the lead's connection.
async fn hub_with_plan(test: &str, name: &str) -> (HubProc, DocumentId, TodoList, Connection) {
    let dir = scratch(test);
    let hub = HubProc::start(&dir.join("hub.db"));
    let doc = list_document_id(name);
    let mut lead = planned();
    let mut c = Connection::connect(&hub.url, "lead").await.unwrap();
    c.sync(doc, &mut lead).await.unwrap();
    (hub, doc, lead, c)
}

fn violations(events: &[Event]) -> Vec<&Violation> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::Violation(v) => Some(v),
            _ => None,
        })
        .collect()
}

/// A fresh peer can still create a list and read it back: the hub serves everyone.
async fn hub_serves_others(hub: &mut HubProc, when: &str) {
    hub.assert_alive(when);
    let other = list_document_id(&format!("unrelated-{when}"));
    let mut mine = planned();
    let mut c = Connection::connect(&hub.url, "bystander").await.unwrap();
    c.sync(other, &mut mine).await.unwrap();
    let mut fresh = TodoList::create(actor(77));
    let mut c2 = Connection::connect(&hub.url, "reader").await.unwrap();
    c2.sync(other, &mut fresh).await.unwrap();
    assert_eq!(
        fresh.read().tasks.len(),
        3,
        "{when}: a bystander's list round trip"
    );
}

/// One owner with a thousand tasks in progress (ids of 30 characters): the violation
/// names them all, which made a key of 30 KB that the store refused, and the hub
/// stopped. Keys are digests and events list a bounded number of tasks and the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_violation_over_a_thousand_tasks_keeps_the_hub_serving() {
    let (mut hub, doc, mut lead, mut c) = hub_with_plan("wide", "wide").await;
    hostile(&hub.url, doc, "wide", 1_000).await;
    hub_serves_others(&mut hub, "after a wide violation").await;

    c.sync(doc, &mut lead).await.unwrap();
    let active = lead
        .read()
        .tasks
        .iter()
        .filter(|t| t.status == Status::InProgress && t.owner.as_deref() == Some("bob"))
        .count();
    assert_eq!(active, 1, "the repair reached the lead");
    let events = c.take_events();
    let found = violations(&events);
    let wide = found
        .iter()
        .find(|v| v.rule == Rule::SingleActive)
        .unwrap_or_else(|| panic!("no single_active violation in {events:?}"));
    assert_eq!(wide.tasks_total, 1_000);
    assert!(wide.tasks.len() <= swarmtodo::proto::VIOLATION_TASKS_MAX);
    assert!(wide.values.len() <= swarmtodo::proto::VIOLATION_TASKS_MAX);
    assert!(wide.key.len() <= 128, "key of {} bytes", wide.key.len());
    assert!(
        wide.message.len() <= 4_096,
        "message of {} bytes",
        wide.message.len()
    );
    assert!(wide.message.contains("1000 tasks"), "{}", wide.message);
}

/// One peer uploads 2,000 tasks, each blocked by the one before: every list's round
/// trip waited for a dependency check whose cost grew as the cube of the chain (over a
/// minute at 2,000). Now a bystander's round trip is as quick as beside any list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_chain_does_not_stall_other_lists() {
    let (mut hub, doc, mut lead, mut c) = hub_with_plan("chain", "chain").await;
    let url = hub.url.clone();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (seen, slowest) = tokio::join!(
        async {
            let seen = hostile(&url, doc, "chain", 2_000).await;
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            seen
        },
        async {
            // Bystanders come and go while the chain arrives and is checked.
            let mut slowest = std::time::Duration::ZERO;
            let mut n = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let t = std::time::Instant::now();
                hub_serves_others(&mut hub, &format!("beside a chain {n}")).await;
                slowest = slowest.max(t.elapsed());
                n += 1;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            slowest
        }
    );
    eprintln!("slowest bystander round trip beside a 2,000-task chain: {slowest:?}");
    let seen = seen.expect("the attacker's chain is a valid list");
    assert_eq!(seen["tasks"].as_object().unwrap().len(), 2_003);
    c.sync(doc, &mut lead).await.unwrap();
    assert_eq!(lead.read().tasks.len(), 2_003);
}
