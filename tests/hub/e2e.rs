//! End to end: a real `swarmtodo serve` process on a loopback port, real clients
//! (swarmtodo's Rust client and the JS `@automerge/automerge-repo` client), a real SQLite
//! file, `kill -9`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::process::Command;

use crate::common::*;
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::model::TodoList;
use swarmtodo::proto::{EventBody, Rule, Status, TaskPatch};

/// How many tasks `owner` has in progress in `list`.
pub(crate) fn in_progress_for(list: &TodoList, owner: &str) -> usize {
    list.read()
        .tasks
        .iter()
        .filter(|t| t.status == Status::InProgress && t.owner.as_deref() == Some(owner))
        .count()
}

/// A write starting task `id` for owner bob.
pub(crate) fn start_for_bob(id: &str) -> swarmtodo::proto::WriteRequest {
    patch(vec![upsert(TaskPatch {
        owner: Some(Some("bob".into())),
        ..status(id, Status::InProgress)
    })])
}

/// `events` tell writer `who` of one `single_active` violation and of its repair
/// (`shown` in the failure message).
pub(crate) fn told_of_one_second_in_progress_and_its_repair(
    who: &str,
    events: &[swarmtodo::proto::Event],
    shown: &dyn std::fmt::Debug,
) {
    let violations: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::Violation(v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(violations.len(), 1, "{who}: {shown:?}");
    assert_eq!(violations[0].rule, Rule::SingleActive, "{who}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e.body, EventBody::Repaired { .. })),
        "{who}: {shown:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_clients_sync_through_the_hub_and_the_repair_reaches_everyone() {
    let dir = scratch("repair");
    let hub = HubProc::start(&dir.join("hub.db"));
    let doc = list_document_id("swarm-42");

    // The lead creates the list and plans.
    let mut lead = planned();
    let mut c_lead = Connection::connect(&hub.url, "lead").await.unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();
    assert!(c_lead.in_sync(doc, &lead), "the hub acknowledged the plan");

    // Two subagents pull the list and start different tasks for the same owner.
    let mut a = TodoList::create(actor(2));
    let mut b = TodoList::create(actor(3));
    let mut c_a = Connection::connect(&hub.url, "sub-a").await.unwrap();
    let mut c_b = Connection::connect(&hub.url, "sub-b").await.unwrap();
    c_a.sync(doc, &mut a).await.unwrap();
    c_b.sync(doc, &mut b).await.unwrap();
    assert_eq!(a.read().tasks.len(), 3);
    write(&mut a, "sub-a", start_for_bob("t2"));
    write(&mut b, "sub-b", start_for_bob("t3"));
    let (ra, rb) = tokio::join!(c_a.sync(doc, &mut a), c_b.sync(doc, &mut b));
    ra.unwrap();
    rb.unwrap();
    // Settle everyone on the hub's final state.
    c_a.sync(doc, &mut a).await.unwrap();
    c_b.sync(doc, &mut b).await.unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();

    // Both writers were told of the violation and of its repair, with the store's
    // sequence numbers (increasing, no repeats).
    for (who, c) in [("a", &mut c_a), ("b", &mut c_b)] {
        let events = c.take_events();
        let kinds: Vec<String> = events
            .iter()
            .map(|e| {
                serde_json::to_value(e).unwrap()["kind"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect();
        told_of_one_second_in_progress_and_its_repair(who, &events, &kinds);
        assert!(
            events.windows(2).all(|w| w[0].seq < w[1].seq),
            "{who}: {events:?}"
        );
        assert!(events.iter().all(|e| e.list == doc.to_string()));
    }

    // An observer joining now sees one task in progress, never two.
    let mut obs = TodoList::create(actor(4));
    let mut c_obs = Connection::connect(&hub.url, "observer").await.unwrap();
    c_obs.sync(doc, &mut obs).await.unwrap();
    for (who, list) in [("lead", &lead), ("a", &a), ("b", &b), ("observer", &obs)] {
        assert_eq!(in_progress_for(list, "bob"), 1, "{who}: {:?}", list.read());
        assert_eq!(list.version(), obs.version(), "{who} converged");
    }
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let dir = scratch("kill9");
    let db = dir.join("hub.db");
    let doc = list_document_id("durable");
    let hub = HubProc::start(&db);
    let mut w = TodoList::create(actor(1));
    let mut conn = Connection::connect(&hub.url, "writer").await.unwrap();
    for i in 0..20 {
        write(
            &mut w,
            "writer",
            patch(vec![upsert(task(&format!("t{i}"), &format!("Task {i}")))]),
        );
        conn.sync(doc, &mut w).await.unwrap();
        assert!(
            conn.in_sync(doc, &w),
            "write {i} acknowledged: {:?}",
            conn.debug_state(doc, &w)
        );
    }
    // A burst past the compaction threshold: the hub stores a snapshot in its place.
    for i in 0..swarmtodo::hub::core::COMPACT_AFTER_CHANGES + 10 {
        let s = if i % 2 == 0 {
            Status::Blocked
        } else {
            Status::Pending
        };
        write(&mut w, "writer", patch(vec![upsert(status("t0", s))]));
    }
    conn.sync(doc, &mut w).await.unwrap();
    assert!(conn.in_sync(doc, &w), "the burst acknowledged");
    let acked = w.read();
    hub.kill9();
    let info = swarmtodo::store::Db::open(&db)
        .unwrap()
        .list_by_doc(swarmtodo::store::DocId(*doc.as_bytes()))
        .unwrap()
        .unwrap();
    assert!(info.snapshot_bytes > 0, "compacted: {info:?}");
    assert!(info.changes < 100, "covered changes dropped: {info:?}");

    let hub = HubProc::start(&db);
    let mut r = TodoList::create(actor(2));
    let mut conn = Connection::connect(&hub.url, "reader").await.unwrap();
    conn.sync(doc, &mut r).await.unwrap();
    assert_eq!(
        r.read(),
        acked,
        "everything acknowledged is back after kill -9"
    );
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_automerge_repo_client_shares_the_list_and_its_violation_is_repaired() {
    let dir = scratch("js");
    let hub = HubProc::start(&dir.join("hub.db"));
    let doc = list_document_id("js-list");
    let mut lead = planned();
    let mut conn = Connection::connect(&hub.url, "lead").await.unwrap();
    conn.sync(doc, &mut lead).await.unwrap();

    let report = run_js_repo_client(&hub.url, doc).await;
    let before: Vec<&str> = report["before"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        before,
        vec!["Read the issue", "Write the parser", "Write the tests"],
        "JS reads what Rust wrote, in order"
    );
    // The Rust lead sees the JS write, repaired: one task in progress for bob.
    conn.sync(doc, &mut lead).await.unwrap();
    assert_eq!(in_progress_for(&lead, "bob"), 1, "{:?}", lead.read());
    let owners: Vec<Option<String>> = lead.read().tasks.iter().map(|t| t.owner.clone()).collect();
    assert_eq!(owners[1].as_deref(), Some("bob"), "JS's write arrived");
    assert_eq!(
        lead.agent_of(&js_actor_of(&lead, "t2")).as_deref(),
        Some("js-agent")
    );
    drop(hub);
}

/// The actor that wrote `id`'s owner field.
fn js_actor_of(list: &TodoList, id: &str) -> automerge::ActorId {
    use automerge::ReadDoc;
    let doc = list.doc();
    let tasks = doc.get(automerge::ROOT, "tasks").unwrap().unwrap().1;
    let t = doc.get(&tasks, id).unwrap().unwrap().1;
    match doc.get(&t, "owner").unwrap().unwrap().1 {
        automerge::ObjId::Id(_, actor, _) => actor,
        automerge::ObjId::Root => panic!("owner has no op id"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_creating_one_list_at_once_end_with_one_list() {
    let dir = scratch("create");
    let hub = HubProc::start(&dir.join("hub.db"));
    let doc = list_document_id("swarm-42");
    let mut a = TodoList::create(actor(1));
    let mut b = TodoList::create(actor(2));
    write(
        &mut a,
        "alice",
        patch(vec![upsert(task("a1", "From alice"))]),
    );
    write(&mut b, "bob", patch(vec![upsert(task("b1", "From bob"))]));
    let mut ca = Connection::connect(&hub.url, "alice").await.unwrap();
    let mut cb = Connection::connect(&hub.url, "bob").await.unwrap();
    let (ra, rb) = tokio::join!(ca.sync(doc, &mut a), cb.sync(doc, &mut b));
    ra.unwrap();
    rb.unwrap();
    ca.sync(doc, &mut a).await.unwrap();
    cb.sync(doc, &mut b).await.unwrap();
    let ids: Vec<String> = a.read().tasks.into_iter().map(|t| t.id).collect();
    assert_eq!(
        ids,
        vec!["a1", "b1"],
        "one list with both tasks, not two roots"
    );
    assert_eq!(a.read(), b.read());
    drop(hub);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_hub_gracefully_and_keeps_the_data() {
    let dir = scratch("term");
    let db = dir.join("hub.db");
    let doc = list_document_id("graceful");
    let mut hub = HubProc::start(&db);
    let mut w = TodoList::create(actor(1));
    write(&mut w, "w", patch(vec![upsert(task("t1", "Keep me"))]));
    let mut conn = Connection::connect(&hub.url, "w").await.unwrap();
    conn.sync(doc, &mut w).await.unwrap();
    let pid = hub.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = tokio::task::spawn_blocking(move || {
        let s = hub.child.wait().unwrap();
        (s, hub)
    })
    .await
    .unwrap()
    .0;
    assert!(status.success(), "exit status after SIGTERM: {status:?}");
    let hub = HubProc::start(&db);
    let mut r = TodoList::create(actor(2));
    let mut conn = Connection::connect(&hub.url, "r").await.unwrap();
    conn.sync(doc, &mut r).await.unwrap();
    assert_eq!(r.read().tasks[0].content, "Keep me");
    drop(hub);
}

/// Waits (bounded) until `rx`'s snapshot satisfies `ok`.
async fn wait_for(
    rx: &mut tokio::sync::watch::Receiver<swarmtodo::proto::Snapshot>,
    what: &str,
    ok: impl Fn(&swarmtodo::proto::Snapshot) -> bool,
) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if ok(&rx.borrow_and_update()) {
            return;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if tokio::time::timeout(left, rx.changed()).await.is_err() {
            panic!("timed out waiting for {what}: {:?}", rx.borrow().tasks);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synced_lists_follow_each_other_and_writes_made_offline_arrive_after_a_restart() {
    use swarmtodo::client::SyncedList;
    let dir = scratch("live");
    let db = dir.join("hub.db");
    let hub = HubProc::start(&db);
    let listen = hub.url.trim_start_matches("ws://").to_owned();
    let a = SyncedList::open(&hub.url, "alice", "live");
    // Bob asks for every event (by default a replica is not pushed `tasks_changed`).
    let b = SyncedList::open(
        &swarmtodo::client::with_events(&hub.url, "all"),
        "bob",
        "live",
    );
    let mut b_rx = b.subscribe();
    let mut b_events = b.events();
    // Events are pushed to the peers syncing the list when they happen: make sure both
    // are (bob writes, alice sees it).
    b.write(&patch(vec![upsert(task("t0", "Bob's first"))]), 1)
        .unwrap();
    let mut a_rx = a.subscribe();
    wait_for(&mut a_rx, "alice to see t0", |s| {
        s.tasks.iter().any(|t| t.id == "t0")
    })
    .await;
    a.write(&patch(vec![upsert(task("t1", "Online write"))]), 1)
        .unwrap();
    assert!(
        a.read().tasks.iter().any(|t| t.id == "t1"),
        "a reads its own write at once"
    );
    wait_for(&mut b_rx, "bob to see t1", |s| {
        s.tasks.iter().any(|t| t.id == "t1")
    })
    .await;
    // Bob is told, as an event, who changed what.
    let told = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let e = b_events.recv().await.unwrap();
            if let swarmtodo::proto::EventBody::TasksChanged { agents, tasks, .. } = &e.body {
                if tasks.iter().any(|t| t.task == "t1") {
                    return (e.seq, agents.clone());
                }
            }
        }
    })
    .await
    .expect("bob got the tasks_changed event of t1");
    assert!(told.0 >= 1);
    assert_eq!(told.1, vec!["alice".to_owned()]);

    hub.kill9();
    // The hub is gone: writes still land locally and wait.
    a.write(&patch(vec![upsert(task("t2", "Offline write"))]), 2)
        .unwrap();
    let hub = HubProc::start_at(&db, &listen);
    wait_for(&mut b_rx, "bob to see the offline write", |s| {
        s.tasks.iter().any(|t| t.id == "t2")
    })
    .await;
    assert_eq!(b.read().tasks.len(), 3);
    a.close();
    b.close();
    drop(hub);
}

/// A peer that was away while more changes landed than one message can carry
/// (MESSAGE_BYTES_MAX, and twice the outbox bound OUTBOX_BYTES_MAX), and that wrote
/// more than a frame (FRAME_BYTES_MAX) itself meanwhile, syncs both ways when it comes
/// back: each side sends its changes over several messages, oldest first
/// (SYNC_CHANGES_BYTES_MAX), each answered before the next. Before, the hub sent the
/// whole catch-up in one message its write buffer could not take (the connection
/// closed), and the hub refused the peer's one message as over the frame size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_back_after_more_than_a_message_of_changes_syncs_both_ways() {
    use swarmtodo::hub::server::{FRAME_BYTES_MAX, OUTBOX_BYTES_MAX};
    use swarmtodo::hub::wire::MESSAGE_BYTES_MAX;
    use swarmtodo::proto::TASK_TEXT_BYTES_MAX;
    const TASKS_PER_WRITE: usize = 32;
    let dir = scratch("catch-up");
    let hub = HubProc::start(&dir.join("hub.db"));
    let doc = list_document_id("catch-up");
    // A history long enough that the away peer lacks less than a third of it: the hub
    // answers with the changes it lacks, not with the whole document (which it would
    // save again for every part; slow in a debug build).
    let mut lead = list_with_history(10, 400);
    let mut c_lead = Connection::connect(&hub.url, "lead").await.unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();
    let mut away = TodoList::create(actor(2));
    {
        let mut c = Connection::connect(&hub.url, "away").await.unwrap();
        c.sync(doc, &mut away).await.unwrap();
        assert!(c.in_sync(doc, &away));
        c.close().await.unwrap();
    }
    // Random text (it does not compress much).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut text = || -> String {
        (0..TASK_TEXT_BYTES_MAX)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect()
    };
    // Writes of TASKS_PER_WRITE tasks of random text, `bytes` of text in all, the same
    // tasks rewritten each time (the list stays small, the history grows).
    let mut big_writes = |list: &mut TodoList, who: &str, bytes: usize| -> usize {
        let mut written = 0;
        let mut w = 0;
        while written <= bytes {
            let ops = (0..TASKS_PER_WRITE)
                .map(|i| upsert(task(&format!("{who}-{i}"), &text())))
                .collect();
            write(list, who, patch(ops));
            written += TASKS_PER_WRITE * TASK_TEXT_BYTES_MAX;
            w += 1;
        }
        w
    };
    // (Deflate takes random letters to ~60 %: twice a bound is sure to be over it.)
    let catch_up = 2 * MESSAGE_BYTES_MAX.max(OUTBOX_BYTES_MAX);
    let mut lead_writes = 0;
    while lead_writes * TASKS_PER_WRITE * TASK_TEXT_BYTES_MAX <= catch_up {
        lead_writes += big_writes(&mut lead, "lead", 0);
        c_lead.sync(doc, &mut lead).await.unwrap();
    }
    assert!(c_lead.in_sync(doc, &lead), "the hub has every big write");
    let away_writes = big_writes(&mut away, "away", 2 * FRAME_BYTES_MAX);

    let mut c = Connection::connect(&hub.url, "away").await.unwrap();
    let back = c.sync(doc, &mut away).await;
    assert!(
        back.is_ok(),
        "the peer back after {lead_writes} writes of the lead, with {away_writes} of its own, could not sync: {back:?}"
    );
    assert!(c.in_sync(doc, &away), "the hub has the away peer's writes");
    c_lead.sync(doc, &mut lead).await.unwrap();
    assert_eq!(away.read(), lead.read());
    let (mut a, mut l) = (away.heads(), lead.heads());
    a.sort();
    l.sort();
    assert_eq!(a, l, "both replicas at the same heads");
    c.close().await.unwrap();
    drop(hub);
}

/// A sync peer is pushed the kinds of event it asked for on its URL (`?events=`): by
/// default what its replica cannot see for itself (a claim, not the `tasks_changed` of
/// the change it receives anyway); with `all`, every kind. Unknown kinds are refused at
/// the upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_peer_is_pushed_the_kinds_of_event_it_asked_for() {
    use swarmtodo::client::http::Api;
    use swarmtodo::client::with_events;
    let dir = scratch("subscribe");
    let hub = HubProc::start(&dir.join("hub.db"));
    let lead = Api::new(&hub.url).unwrap().agent("lead");
    let plan =
        r#"{"mode": "patch", "ops": [{"op": "upsert", "task": {"id": "t1", "content": "Parse"}}]}"#;
    lead.write("subs", plan).await.unwrap();
    let doc = list_document_id("subs");
    let mut peers = Vec::new();
    for (name, url) in [
        ("default", hub.url.clone()),
        ("all", with_events(&hub.url, "all")),
        ("none", with_events(&hub.url, "none")),
    ] {
        let mut replica = TodoList::create(actor(peers.len() as u8 + 1));
        let mut conn = Connection::connect(&url, name).await.unwrap();
        conn.sync(doc, &mut replica).await.unwrap();
        conn.take_events();
        peers.push((name, conn, replica, Vec::<String>::new()));
    }
    Api::new(&hub.url)
        .unwrap()
        .agent("w1")
        .claim("subs", Some("t1"))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    for (name, conn, replica, kinds) in &mut peers {
        // Each holds the claim; the first two hear of it.
        while replica.read().tasks[0].owner.as_deref() != Some("w1")
            || (*name != "none" && !kinds.iter().any(|k| k == "claimed"))
        {
            assert!(std::time::Instant::now() < deadline, "{name}: {kinds:?}");
            conn.sync(doc, replica).await.unwrap();
            kinds.extend(conn.take_events().iter().map(|e| e.body.kind().to_owned()));
        }
    }
    let kinds = |n: &str| peers.iter().find(|p| p.0 == n).unwrap().3.clone();
    assert_eq!(kinds("default"), ["claimed"]);
    assert!(
        kinds("all").contains(&"tasks_changed".to_owned()),
        "{:?}",
        kinds("all")
    );
    assert!(kinds("all").contains(&"claimed".to_owned()));
    assert_eq!(kinds("none"), Vec::<String>::new());

    let refused = Connection::connect(&with_events(&hub.url, "violation,bogus"), "x")
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("400"), "{refused}");
    drop(hub);
}

/// A list the hub's store holds damaged (here: its first change gone, so every later one
/// waits for a dependency) is refused — a sync peer closed with 1011 `list_unreadable`,
/// a call answered `internal` — and the hub goes on serving its other lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_damaged_in_the_store_is_refused_and_the_others_are_served() {
    use swarmtodo::client::http::{Api, HttpError};
    use swarmtodo::client::ClientError;
    use swarmtodo::proto::ErrorCode;

    let dir = scratch("damaged-list");
    let db = dir.join("hub.db");
    let upsert = |id: &str| {
        format!(
            r#"{{"mode":"patch","ops":[{{"op":"upsert","task":{{"id":"{id}","content":"Do {id}"}}}}]}}"#
        )
    };
    let hub = HubProc::start(&db);
    let api = Api::new(&hub.url).unwrap().agent("lead");
    for list in ["broken", "fine"] {
        api.create(list).await.unwrap();
        api.write(list, &upsert("t1")).await.unwrap();
        api.write(list, &upsert("t2")).await.unwrap();
    }
    hub.kill9();
    let store = rusqlite::Connection::open(&db).unwrap();
    let gone = store
        .execute(
            "DELETE FROM changes WHERE id = (SELECT min(c.id) FROM changes c \
             JOIN lists l ON l.id = c.list_id WHERE l.name = 'broken')",
            [],
        )
        .unwrap();
    assert_eq!(gone, 1);
    drop(store);

    let hub = HubProc::start(&db);
    let api = Api::new(&hub.url).unwrap().agent("lead");
    let e = api.read("broken", None).await.unwrap_err();
    match &e {
        HttpError::Api(e) => {
            assert_eq!(e.code, ErrorCode::Internal, "{e:?}");
            assert!(e.message.contains("damaged"), "{e:?}");
        }
        other => panic!("{other}"),
    }
    let mut peer = Connection::connect(&hub.url, "lead").await.unwrap();
    let mut list = TodoList::create(actor(1));
    match peer.sync(list_document_id("broken"), &mut list).await {
        Err(ClientError::Closed(why)) => assert!(why.starts_with("1011 list_unreadable"), "{why}"),
        other => panic!("{other:?}"),
    }
    // The other list is served, by the same hub.
    let fine = api.read("fine", None).await.unwrap();
    let mut ids: Vec<_> = fine.tasks.iter().map(|t| t.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["t1", "t2"]);
}
