//! Interop with `samod`, an independent Rust automerge-repo implementation: a real
//! `swarmtodo serve` process, swarmtodo's Rust client, a samod `Repo` dialing the hub over
//! WebSocket (and, for the three-peer test, the JS `@automerge/automerge-repo` client).
//!
//! The samod peer reads and writes the document with plain automerge, as any foreign
//! automerge-repo peer would: it knows nothing of swarmtodo's model or invariants.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::str::FromStr;
use std::time::Duration;

use crate::common::*;
use automerge::transaction::Transactable;
use automerge::{ActorId, Automerge, AutomergeError, ChangeHash, ObjType, ReadDoc, Value, ROOT};
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::hub::wire::DocumentId;
use swarmtodo::model::TodoList;
use swarmtodo::proto::Status;

/// How long any wait for the network may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(10);
/// Pause between two polls of a replica's state.
const POLL: Duration = Duration::from_millis(50);

/// A samod repo dialing the hub, connected and handshaken.
struct SamodPeer {
    repo: samod::Repo,
    dialer: samod::DialerHandle<Infallible>,
}

impl SamodPeer {
    async fn connect(url: &str, peer_id: &str) -> SamodPeer {
        let repo = samod::Repo::build_tokio()
            .with_peer_id(samod::PeerId::from(peer_id))
            .load()
            .await;
        let dialer = repo
            .dial_websocket(
                samod::Url::parse(url).unwrap(),
                samod::BackoffConfig::default(),
            )
            .unwrap();
        let hub = tokio::time::timeout(DEADLINE, dialer.established())
            .await
            .expect("samod: the handshake with the hub timed out")
            .expect("samod: dialing the hub failed");
        assert!(!hub.peer_id.to_string().is_empty(), "the hub named itself");
        SamodPeer { repo, dialer }
    }

    /// Finds `doc` on the hub.
    async fn find(&self, doc: DocumentId) -> samod::DocHandle {
        let id = samod::DocumentId::from_str(&doc.to_string()).unwrap();
        assert_eq!(id.to_string(), doc.to_string(), "one id, two crates");
        tokio::time::timeout(DEADLINE, self.repo.find(id))
            .await
            .expect("samod: find timed out")
            .expect("samod: the repo stopped")
            .expect("samod: the hub says it has no such document")
    }

    /// Waits until the hub has acknowledged everything `handle` holds.
    async fn pushed(&self, handle: &samod::DocHandle) {
        let conn = self.dialer.connection_id().expect("samod is connected");
        tokio::time::timeout(DEADLINE, handle.they_have_our_changes(conn))
            .await
            .expect("samod: the hub never acknowledged our changes");
    }

    async fn stop(self) {
        self.dialer.close();
        tokio::time::timeout(DEADLINE, self.repo.stop())
            .await
            .expect("samod: stop timed out");
    }
}

/// A string register as automerge stores it: a scalar string or a Text object.
fn string_at(doc: &Automerge, obj: &automerge::ObjId, key: &str) -> Option<String> {
    match doc.get(obj, key).unwrap()? {
        (Value::Scalar(s), _) => match s.as_ref() {
            automerge::ScalarValue::Str(s) => Some(s.to_string()),
            _ => None,
        },
        (Value::Object(ObjType::Text), id) => Some(doc.text(&id).unwrap()),
        (Value::Object(_), _) => None,
    }
}

/// Every task's string fields, read with plain automerge: task id → field → value.
fn raw_tasks(doc: &Automerge) -> BTreeMap<String, BTreeMap<String, String>> {
    let Some((Value::Object(ObjType::Map), tasks)) = doc.get(ROOT, "tasks").unwrap() else {
        panic!("root key \"tasks\" is not a map");
    };
    doc.keys(&tasks)
        .map(|id| {
            let (_, task) = doc.get(&tasks, &id).unwrap().unwrap();
            let fields = doc
                .keys(&task)
                .filter_map(|f| string_at(doc, &task, &f).map(|v| (f, v)))
                .collect();
            (id, fields)
        })
        .collect()
}

/// Tasks `in_progress` held by `owner`, read with plain automerge.
fn raw_in_progress_for(doc: &Automerge, owner: &str) -> usize {
    raw_tasks(doc)
        .values()
        .filter(|t| {
            t.get("status").map(String::as_str) == Some("in_progress")
                && t.get("owner").map(String::as_str) == Some(owner)
        })
        .count()
}

fn in_progress_for(list: &TodoList, owner: &str) -> usize {
    list.read()
        .tasks
        .iter()
        .filter(|t| t.status == Status::InProgress && t.owner.as_deref() == Some(owner))
        .count()
}

fn sorted(mut heads: Vec<ChangeHash>) -> Vec<ChangeHash> {
    heads.sort();
    heads
}

/// A copy of the samod replica's document.
async fn samod_doc(handle: &samod::DocHandle) -> Automerge {
    handle
        .with_document_async(|d| d.fork())
        .await
        .expect("samod: the repo stopped")
}

/// Syncs `list` through `conn` until it and the samod replica hold the same heads.
async fn converge(
    conn: &mut Connection,
    doc: DocumentId,
    list: &mut TodoList,
    samod: &samod::DocHandle,
) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        conn.sync(doc, list).await.unwrap();
        let theirs = sorted(samod_doc(samod).await.get_heads());
        if sorted(list.heads()) == theirs {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no convergence in {DEADLINE:?}: rust {:?}, samod {theirs:?}\nrust tasks {:?}\nsamod tasks {:?}",
            sorted(list.heads()),
            raw_tasks(list.doc()),
            raw_tasks(&samod_doc(samod).await),
        );
        tokio::time::sleep(POLL).await;
    }
}

/// One samod change: registers the samod actor as `agent` and puts `(task, field, value)`.
/// Returns the actor and the heads right after the change.
async fn samod_write(
    handle: &samod::DocHandle,
    agent: &'static str,
    puts: Vec<(&'static str, &'static str, &'static str)>,
) -> (ActorId, Vec<ChangeHash>) {
    handle
        .with_document_async(move |doc| {
            let me = doc.get_actor().clone();
            doc.transact::<_, _, AutomergeError>(|tx| {
                let agents = tx.get(ROOT, "agents")?.expect("root map \"agents\"").1;
                tx.put(&agents, me.to_hex_string(), agent)?;
                let tasks = tx.get(ROOT, "tasks")?.expect("root map \"tasks\"").1;
                for (id, field, value) in &puts {
                    let t = tx.get(&tasks, *id)?.expect("the task exists").1;
                    tx.put(&t, *field, *value)?;
                }
                Ok(())
            })
            .expect("samod's change");
            (me, doc.get_heads())
        })
        .await
        .expect("samod: the repo stopped")
}

/// The actor that wrote `field` of task `id` (the winning value).
fn writer_of(list: &TodoList, id: &str, field: &str) -> ActorId {
    let doc = list.doc();
    let tasks = doc.get(ROOT, "tasks").unwrap().unwrap().1;
    let t = doc.get(&tasks, id).unwrap().unwrap().1;
    match doc.get(&t, field).unwrap().unwrap().1 {
        automerge::ObjId::Id(_, actor, _) => actor,
        automerge::ObjId::Root => panic!("{id}.{field} has no op id"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samod_reads_what_rust_wrote_and_rust_reads_what_samod_wrote() {
    let dir = scratch("rw");
    let hub = HubProc::start(&dir.join("hub.db"));
    let doc = list_document_id("samod-rw");

    let mut lead = planned();
    let mut conn = Connection::connect(&hub.url, "lead").await.unwrap();
    conn.sync(doc, &mut lead).await.unwrap();
    assert!(conn.in_sync(doc, &lead), "the hub acknowledged the plan");

    let peer = SamodPeer::connect(&hub.url, "samod-peer").await;
    let handle = peer.find(doc).await;
    assert_eq!(handle.document_id().to_string(), doc.to_string());
    let seen = samod_doc(&handle).await;
    assert_eq!(
        sorted(seen.get_heads()),
        sorted(lead.heads()),
        "samod holds exactly what the lead wrote"
    );
    let tasks = raw_tasks(&seen);
    assert_eq!(
        tasks,
        raw_tasks(lead.doc()),
        "samod reads the same fields as the lead"
    );
    let contents: Vec<(&str, &str, &str)> = tasks
        .iter()
        .map(|(id, t)| (id.as_str(), t["content"].as_str(), t["status"].as_str()))
        .collect();
    assert_eq!(
        contents,
        vec![
            ("t1", "Read the issue", "pending"),
            ("t2", "Write the parser", "pending"),
            ("t3", "Write the tests", "pending"),
        ]
    );
    for (id, t) in &tasks {
        assert_eq!(
            t.get("position"),
            Some(&lead.raw_task(id).unwrap().position.to_string()),
            "{id}'s position"
        );
    }

    // samod writes through plain automerge; the hub relays it to the lead.
    let (samod_actor, after_write) = samod_write(
        &handle,
        "samod-agent",
        vec![("t1", "content", "Read the issue twice")],
    )
    .await;
    peer.pushed(&handle).await;
    conn.sync(doc, &mut lead).await.unwrap();
    let snapshot = lead.read();
    let t1 = snapshot.tasks.iter().find(|t| t.id == "t1").unwrap();
    assert_eq!(t1.content, "Read the issue twice", "{snapshot:?}");
    assert_eq!(
        lead.agent_of(&samod_actor).as_deref(),
        Some("samod-agent"),
        "samod's actor is registered"
    );
    assert_eq!(
        lead.agent_of(&writer_of(&lead, "t1", "content")).as_deref(),
        Some("samod-agent"),
        "the content is attributed to samod"
    );
    assert_eq!(
        sorted(lead.heads()),
        sorted(after_write),
        "a valid write is not repaired"
    );
    assert!(conn.in_sync(doc, &lead));

    peer.stop().await;
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samods_invariant_violation_is_repaired_for_every_replica() {
    let dir = scratch("repair");
    let hub = HubProc::start(&dir.join("hub.db"));
    let doc = list_document_id("samod-repair");

    let mut lead = planned();
    let mut conn = Connection::connect(&hub.url, "lead").await.unwrap();
    conn.sync(doc, &mut lead).await.unwrap();

    let peer = SamodPeer::connect(&hub.url, "samod-peer").await;
    let handle = peer.find(doc).await;
    // One change: two tasks in progress for bob.
    let (_, after_write) = samod_write(
        &handle,
        "samod-agent",
        vec![
            ("t2", "status", "in_progress"),
            ("t2", "owner", "bob"),
            ("t3", "status", "in_progress"),
            ("t3", "owner", "bob"),
        ],
    )
    .await;
    assert_eq!(
        raw_in_progress_for(&samod_doc(&handle).await, "bob"),
        2,
        "the violation is written"
    );

    // The hub's repair reaches samod without samod doing anything more.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while raw_in_progress_for(&samod_doc(&handle).await, "bob") > 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the repair never reached samod: {:?}",
            raw_tasks(&samod_doc(&handle).await)
        );
        tokio::time::sleep(POLL).await;
    }

    // A fresh Rust client and the lead converge with samod on the repaired state.
    let mut fresh = TodoList::create(actor(9));
    let mut c_fresh = Connection::connect(&hub.url, "observer").await.unwrap();
    converge(&mut c_fresh, doc, &mut fresh, &handle).await;
    converge(&mut conn, doc, &mut lead, &handle).await;
    let at_samod = samod_doc(&handle).await;
    assert_ne!(
        sorted(at_samod.get_heads()),
        sorted(after_write),
        "samod holds the hub's repair on top of its write"
    );
    assert_eq!(sorted(fresh.heads()), sorted(lead.heads()));
    assert_eq!(
        raw_in_progress_for(&at_samod, "bob"),
        1,
        "{:?}",
        raw_tasks(&at_samod)
    );
    assert_eq!(
        in_progress_for(&TodoList::from_doc(at_samod.fork()), "bob"),
        1
    );
    assert_eq!(in_progress_for(&fresh, "bob"), 1, "{:?}", fresh.read());
    assert_eq!(in_progress_for(&lead, "bob"), 1, "{:?}", lead.read());
    assert_eq!(raw_tasks(&at_samod), raw_tasks(fresh.doc()));
    assert_eq!(fresh.read(), lead.read());

    peer.stop().await;
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_samod_and_js_share_one_list() {
    let dir = scratch("three");
    let hub = HubProc::start(&dir.join("hub.db"));
    let doc = list_document_id("samod-three");

    // Rust plans.
    let mut lead = planned();
    let mut conn = Connection::connect(&hub.url, "lead").await.unwrap();
    conn.sync(doc, &mut lead).await.unwrap();

    // samod edits t1.
    let peer = SamodPeer::connect(&hub.url, "samod-peer").await;
    let handle = peer.find(doc).await;
    let (samod_actor, _) = samod_write(
        &handle,
        "samod-agent",
        vec![("t1", "content", "Read the issue (samod)")],
    )
    .await;
    peer.pushed(&handle).await;

    // Rust reads it and completes t1; samod receives that live from the hub.
    conn.sync(doc, &mut lead).await.unwrap();
    assert_eq!(lead.read().tasks[0].content, "Read the issue (samod)");
    write(
        &mut lead,
        "lead",
        patch(vec![upsert(status("t1", Status::Completed))]),
    );
    conn.sync(doc, &mut lead).await.unwrap();
    assert!(conn.in_sync(doc, &lead));
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while raw_tasks(&samod_doc(&handle).await)["t1"]["status"] != "completed" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lead's write never reached samod"
        );
        tokio::time::sleep(POLL).await;
    }

    // JS reads both writes, then breaks the single-active rule and waits for the repair.
    let report = run_js_repo_client(&hub.url, doc).await;
    let row = |t: &serde_json::Value| {
        (
            t["id"].as_str().unwrap().to_owned(),
            t["content"].as_str().unwrap().to_owned(),
            t["status"].as_str().unwrap().to_owned(),
            t["owner"].as_str().map(str::to_owned),
        )
    };
    let before: Vec<_> = report["before"]
        .as_array()
        .unwrap()
        .iter()
        .map(row)
        .collect();
    assert_eq!(
        before[0],
        (
            "t1".to_owned(),
            "Read the issue (samod)".to_owned(),
            "completed".to_owned(),
            None
        ),
        "JS reads samod's and Rust's writes: {before:?}"
    );

    // Everyone ends on the repaired list, the same everywhere.
    converge(&mut conn, doc, &mut lead, &handle).await;
    let at_samod = samod_doc(&handle).await;
    assert_eq!(in_progress_for(&lead, "bob"), 1, "{:?}", lead.read());
    assert_eq!(
        raw_in_progress_for(&at_samod, "bob"),
        1,
        "{:?}",
        raw_tasks(&at_samod)
    );
    assert_eq!(
        lead.agent_of(&writer_of(&lead, "t2", "owner")).as_deref(),
        Some("js-agent"),
        "JS's write arrived"
    );
    assert_eq!(lead.agent_of(&samod_actor).as_deref(), Some("samod-agent"));
    let rust_rows: Vec<_> = lead
        .read()
        .tasks
        .iter()
        .map(|t| {
            (
                t.id.clone(),
                t.content.clone(),
                serde_json::to_value(t.status)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_owned(),
                t.owner.clone(),
            )
        })
        .collect();
    let js_after: Vec<_> = report["after"]
        .as_array()
        .unwrap()
        .iter()
        .map(row)
        .collect();
    assert_eq!(js_after, rust_rows, "JS ended where Rust did");
    assert_eq!(raw_tasks(&at_samod), raw_tasks(lead.doc()));

    peer.stop().await;
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samod_find_of_an_unknown_list_answers_not_found() {
    let dir = scratch("unknown");
    let hub = HubProc::start(&dir.join("hub.db"));
    let peer = SamodPeer::connect(&hub.url, "samod-peer").await;
    let id = samod::DocumentId::from_str(&list_document_id("nobody made me").to_string()).unwrap();
    let found = tokio::time::timeout(DEADLINE, peer.repo.find(id))
        .await
        .expect("samod: find of an unknown list never answered")
        .expect("samod: the repo stopped");
    assert!(found.is_none(), "the hub has no such list");
    peer.stop().await;
    drop(hub);
}
