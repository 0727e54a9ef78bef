//! Hostile peers against a real hub: a real `swarmtodo serve` process on loopback, a
//! real JS automerge-repo peer (`tests/js/hostile.mjs`) writing what no honest client
//! would, and swarmtodo's Rust client as the honest lead who must keep its list.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use crate::common::*;
use std::time::Duration;
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::hub::wire::DocumentId;
use swarmtodo::model::TodoList;
use swarmtodo::proto::{Event, EventBody, Rule, Status, Violation};

/// Runs `tests/js/hostile.mjs MODE N` against `url` on list `doc` and returns what the
/// attacker read at the end (`{"tasks", "agents"}`), or `None` when it failed (the hub
/// closed it, say).
async fn hostile(url: &str, doc: DocumentId, mode: &str, n: usize) -> Option<serde_json::Value> {
    hostile_as("mallory", url, doc, mode, n).await
}

/// [`hostile`] registered as `agent` (the agent its token names).
async fn hostile_as(
    agent: &str,
    url: &str,
    doc: DocumentId,
    mode: &str,
    n: usize,
) -> Option<serde_json::Value> {
    let args = [
        url.to_owned(),
        doc.to_string(),
        mode.to_owned(),
        n.to_string(),
    ];
    let out = node("hostile.mjs", &args, &[("HOSTILE_AGENT", agent)]).await;
    if !out.status.success() {
        eprintln!(
            "hostile peer exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    Some(printed_json(&out))
}

/// A hub, its scratch folder, the lead's list `name` (t1..t3) synced to it, and the
/// lead's connection.
async fn hub_with_plan(
    test: &str,
    name: &str,
) -> (HubProc, Scratch, DocumentId, TodoList, Connection) {
    let dir = scratch(test);
    let hub = HubProc::start(&dir.join("hub.db"));
    let doc = list_document_id(name);
    let mut lead = planned();
    let mut c = Connection::connect(&hub.url, "lead").await.unwrap();
    c.sync(doc, &mut lead).await.unwrap();
    (hub, dir, doc, lead, c)
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
    let (mut hub, _dir, doc, mut lead, mut c) = hub_with_plan("wide", "wide").await;
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
    let (mut hub, _dir, doc, mut lead, mut c) = hub_with_plan("chain", "chain").await;
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

/// A hub that needs tokens (`TOKENS_CONFIG`): the lead's and a worker's URLs.
fn hub_with_tokens(test: &str) -> (HubProc, Scratch, String, String) {
    let (hub, dir) = hub_with_config(test, TOKENS_CONFIG);
    let lead = with_token(&hub.url, LEAD_TOKEN);
    let worker = with_token(&hub.url, WORKER_TOKEN);
    (hub, dir, lead, worker)
}

/// The lead's plan with every task owned by the lead.
fn leads_plan() -> TodoList {
    let mut lead = planned();
    let ops = ["t1", "t2", "t3"]
        .iter()
        .map(|id| {
            upsert(swarmtodo::proto::TaskPatch {
                owner: Some(Some("lead".into())),
                id: Some((*id).into()),
                ..swarmtodo::proto::TaskPatch::default()
            })
        })
        .collect();
    write(&mut lead, "lead", patch(ops));
    lead
}

/// A worker deletes or replaces the root's `tasks` or `agents` map, or registers
/// itself as the lead: every one of these is reverted and reported, and the lead, the
/// attacker and a fresh reader all end with the lead's tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_wipe_the_list_or_rename_itself() {
    let (mut hub, _dir, lead_url, worker_url) = hub_with_tokens("wipe");
    for mode in [
        "wipe-delete",
        "wipe-map",
        "wipe-list",
        "wipe-string",
        "agents-delete",
        "agents-lead",
    ] {
        let doc = list_document_id(&format!("wipe-{mode}"));
        let mut lead = leads_plan();
        let mut c = Connection::connect(&lead_url, "lead").await.unwrap();
        c.sync(doc, &mut lead).await.unwrap();
        let want = lead.read().tasks;

        let seen = hostile_as("wendy", &worker_url, doc, mode, 0).await;
        hub.assert_alive(mode);
        let seen = seen.unwrap_or_else(|| panic!("{mode}: the attacker was cut off"));
        let tasks = seen["tasks"].as_object();
        assert_eq!(
            tasks.map(|t| t.len()),
            Some(3),
            "{mode}: the attacker's replica was not repaired: {seen}"
        );
        assert_eq!(
            seen["tasks"]["t1"]["content"], "Read the issue",
            "{mode}: {seen}"
        );

        c.sync(doc, &mut lead).await.unwrap();
        assert_eq!(lead.read().tasks, want, "{mode}: the lead's list");
        let events = c.take_events();
        let found = violations(&events);
        assert!(
            found.iter().any(|v| v.rule == Rule::Ownership),
            "{mode}: no ownership violation in {found:#?}"
        );
        let mut fresh = TodoList::create(actor(90));
        let mut reader = Connection::connect(&lead_url, "reader").await.unwrap();
        reader.sync(doc, &mut fresh).await.unwrap();
        assert_eq!(fresh.read().tasks, want, "{mode}: a fresh reader");
        if mode.starts_with("agents") {
            assert_eq!(
                fresh.agent_of(&actor(1)).as_deref(),
                Some("lead"),
                "{mode}: the lead's registration"
            );
        }
    }
}

/// Shapes the schema must see: a `blocked_by` that is a string (it hid the dependency
/// from the cycle check) and a task entry that is a plain string reached every peer as
/// written, with no violation. Both are reported and repaired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misshapen_tasks_are_reported_and_repaired() {
    let (mut hub, _dir, doc, mut lead, mut c) = hub_with_plan("shapes", "shapes").await;
    let seen = hostile(&hub.url, doc, "shapes", 0).await.unwrap();
    hub.assert_alive("after misshapen tasks");
    assert_eq!(
        seen["tasks"]["t2"]["blocked_by"],
        serde_json::json!(["t1"]),
        "{seen}"
    );
    assert!(seen["tasks"].get("t0").is_none(), "{seen}");
    c.sync(doc, &mut lead).await.unwrap();
    assert_eq!(lead.raw_task("t2").unwrap().blocked_by, ["t1"]);
    assert!(lead.raw_task("t2").unwrap().misshapen.is_empty());
    let events = c.take_events();
    let schema: Vec<_> = violations(&events)
        .into_iter()
        .filter(|v| v.rule == Rule::Schema)
        .collect();
    assert_eq!(schema.len(), 2, "{schema:#?}");
}

/// `todo_write`'s limits hold for sync peers: 100 KB of content is cut to
/// `TASK_TEXT_BYTES_MAX`, a task with a 1,000-byte id is removed, an owner of 1,000
/// bytes is removed, and a list past `LIST_TASKS_MAX` loses its newest tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_peers_are_held_to_the_model_limits() {
    use swarmtodo::proto::{LIST_TASKS_MAX, TASK_TEXT_BYTES_MAX};
    let (mut hub, _dir, doc, mut lead, mut c) = hub_with_plan("oversize", "oversize").await;
    hostile(&hub.url, doc, "oversize", 0).await.unwrap();
    hub.assert_alive("after oversized tasks");
    c.sync(doc, &mut lead).await.unwrap();
    let big = lead.raw_task("big").unwrap();
    assert_eq!(
        big.content.as_deref().map(str::len),
        Some(TASK_TEXT_BYTES_MAX)
    );
    assert_eq!(
        lead.read().tasks.len(),
        4,
        "the long id is gone: {:?}",
        lead.read()
    );
    assert_eq!(lead.raw_task("t3").unwrap().owner, None);
    let events = c.take_events();
    let schema = violations(&events)
        .into_iter()
        .filter(|v| v.rule == Rule::Schema)
        .count();
    assert_eq!(schema, 3, "{events:#?}");

    let many = list_document_id("too-many");
    let mut list = planned();
    c.sync(many, &mut list).await.unwrap();
    hostile(&hub.url, many, "many", LIST_TASKS_MAX)
        .await
        .unwrap();
    hub.assert_alive("after a list past LIST_TASKS_MAX");
    // The peer stops once the hub has been quiet for a while; on a busy machine the hub
    // may still be merging its 10,000 tasks then, and a sync meanwhile is answered with
    // the list as it was. The change arrives whole, so the list goes from 3 tasks to
    // its final count at once.
    let started = std::time::Instant::now();
    loop {
        c.sync(many, &mut list).await.unwrap();
        if list.read().tasks.len() > 3 || started.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(list.read().tasks.len(), LIST_TASKS_MAX);
    for id in ["t1", "t2", "t3"] {
        assert!(list.raw_task(id).is_some(), "the oldest tasks stay: {id}");
    }
}
