//! Agents' presence and leases against a real `swarmtodo serve` process: agents join
//! and leave a list (`agent_joined`, `agent_left`), and an agent gone longer than the
//! list's lease — no connection syncing the list, no API call — has its tasks in
//! progress released to `pending` (or only reported), while an agent still connected
//! keeps its task however long it is silent.

use std::time::Duration;

use serde_json::json;
use swarmtodo::client::http::{Api, StreamItem};
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::model::TodoList;
use swarmtodo::proto::{Event, EventBody, Status};

use crate::common::*;

/// The lease of the tests' hubs (the shortest a configuration accepts is 1 s).
const LEASE_MS: u64 = 1_500;

/// How long a test waits for what it expects before it fails.
const WAIT: Duration = Duration::from_secs(30);

fn hub_with_lease(name: &str, action: &str) -> (HubProc, Scratch) {
    hub_with_config(
        name,
        &format!("[policy]\nlease_ms = {LEASE_MS}\nlease = \"{action}\"\n"),
    )
}

fn api(hub: &HubProc, agent: &str) -> Api {
    Api::new(&hub.url).unwrap().agent(agent)
}

/// The list's events from the start until `done` holds of them (or the test fails).
async fn events_until(hub: &HubProc, list: &str, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let mut seen = Vec::new();
    let watcher = api(hub, "watcher");
    let follow = watcher.events(list, 0, None, |item| {
        if let StreamItem::Event(e) = item {
            seen.push(*e);
        }
        !done(&seen)
    });
    tokio::time::timeout(WAIT, follow)
        .await
        .unwrap_or_else(|_| panic!("the events did not come in time"))
        .unwrap();
    seen
}

fn expired(events: &[Event], agent: &str) -> Option<(Vec<String>, bool)> {
    events.iter().find_map(|e| match &e.body {
        EventBody::LeaseExpired {
            agent: a,
            tasks,
            released,
            ..
        } if a == agent => Some((tasks.clone(), *released)),
        _ => None,
    })
}

/// Where the first event matching `is` is in `events`.
fn position(events: &[Event], is: impl Fn(&EventBody) -> bool) -> Option<usize> {
    events.iter().position(|e| is(&e.body))
}

async fn plan(hub: &HubProc, list: &str) {
    let ops = json!({"mode": "patch", "ops": [
        {"op": "upsert", "task": {"id": "t1", "content": "Parse", "active_form": "Parsing"}},
        {"op": "upsert", "task": {"id": "t2", "content": "Test", "active_form": "Testing"}},
    ]});
    api(hub, "lead")
        .write(list, &ops.to_string())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_releases_the_task_of_an_agent_gone_and_spares_one_still_connected() {
    let (hub, _dir) = hub_with_lease("lease-release", "release");
    plan(&hub, "board").await;
    // w1 claims over HTTP and goes silent; w2 syncs the list and claims, and stays.
    let claimed = api(&hub, "w1").claim("board", Some("t1")).await.unwrap();
    assert_eq!(claimed.task.owner.as_deref(), Some("w1"));
    let mut replica = TodoList::create(actor(7));
    let mut w2 = Connection::connect(&hub.url, "w2").await.unwrap();
    w2.sync(list_document_id("board"), &mut replica)
        .await
        .unwrap();
    api(&hub, "w2").claim("board", Some("t2")).await.unwrap();

    let events = events_until(&hub, "board", |e| expired(e, "w1").is_some()).await;
    assert_eq!(expired(&events, "w1"), Some((vec!["t1".to_owned()], true)));
    for agent in ["lead", "w1", "w2"] {
        let joined = position(
            &events,
            |b| matches!(b, EventBody::AgentJoined { agent: a } if a == agent),
        );
        assert!(joined.is_some(), "{agent} joined: {events:?}");
    }
    let left = position(
        &events,
        |b| matches!(b, EventBody::AgentLeft { agent } if agent == "w1"),
    );
    let lease = position(&events, |b| matches!(b, EventBody::LeaseExpired { .. }));
    assert!(left < lease, "w1 left, then its lease expired: {events:?}");
    let list = api(&hub, "lead").read("board", None).await.unwrap();
    let task = |id: &str| list.tasks.iter().find(|t| t.id == id).unwrap().clone();
    assert_eq!(
        (task("t1").status, task("t1").owner),
        (Status::Pending, None)
    );
    // w2 has been silent as long, but its connection is open: t2 stays its.
    assert_eq!(
        (task("t2").status, task("t2").owner.as_deref()),
        (Status::InProgress, Some("w2"))
    );
    assert!(
        expired(&events, "w2").is_none(),
        "a connected agent keeps its lease: {events:?}"
    );
    // The released task can be claimed again at once.
    let again = api(&hub, "w3").claim("board", None).await.unwrap();
    assert_eq!(again.task.id, "t1");

    // w2's connection closes: its lease runs out after it.
    w2.close().await.unwrap();
    let events = events_until(&hub, "board", |e| expired(e, "w2").is_some()).await;
    assert_eq!(expired(&events, "w2"), Some((vec!["t2".to_owned()], true)));
    let list = api(&hub, "lead").read("board", None).await.unwrap();
    let t2 = list.tasks.iter().find(|t| t.id == "t2").unwrap();
    assert_eq!((t2.status, t2.owner.as_deref()), (Status::Pending, None));
    // w1's and w2's leases, and w3's if it has run out by now (w3 is silent too).
    let metrics = hub.metrics().await;
    let leases: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("swarmtodo_leases_expired_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no lease counter in {metrics}"));
    assert!((2..=3).contains(&leases), "{metrics}");
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_on_report_names_the_tasks_and_leaves_them_to_their_owner() {
    let (hub, _dir) = hub_with_lease("lease-report", "report");
    plan(&hub, "board").await;
    api(&hub, "w1").claim("board", Some("t1")).await.unwrap();
    let events = events_until(&hub, "board", |e| expired(e, "w1").is_some()).await;
    assert_eq!(expired(&events, "w1"), Some((vec!["t1".to_owned()], false)));
    let list = api(&hub, "lead").read("board", None).await.unwrap();
    let t1 = list.tasks.iter().find(|t| t.id == "t1").unwrap();
    assert_eq!(
        (t1.status, t1.owner.as_deref()),
        (Status::InProgress, Some("w1"))
    );
    drop(hub);
}
