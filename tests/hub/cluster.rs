//! Hubs of one cluster (`serve --nats`) on a real nats-server: one authority per list,
//! the others answering `list_elsewhere`; the list moves to another hub when its hub is
//! killed, with every acknowledged write; a hub paused past its lease keeps nothing it
//! is asked to write when it wakes up.

use std::path::Path;
use std::time::{Duration, Instant};

use swarmtodo::client::http::{Api, HttpError};
use swarmtodo::proto::{ErrorCode, Snapshot};

use crate::common::{scratch, HubProc, NatsServer};

/// Hub `id` of the cluster on `nats`, its store in `dir`, leases of one second.
fn hub_in(nats: &NatsServer, dir: &Path, id: &str) -> HubProc {
    hub_with_lease(nats, dir, id, 1000)
}

/// Hub `id` of the cluster on `nats`, its store in `dir`, leases of `lease_ms`.
fn hub_with_lease(nats: &NatsServer, dir: &Path, id: &str, lease_ms: u64) -> HubProc {
    let config = dir.join(format!("{id}.toml"));
    std::fs::write(&config, format!("[cluster]\nlease_ms = {lease_ms}\n")).unwrap();
    HubProc::start_with(
        &dir.join(format!("{id}.db")),
        "127.0.0.1:0",
        &[
            "--nats",
            &nats.url,
            "--hub-id",
            id,
            "--config",
            config.to_str().unwrap(),
        ],
    )
}

fn lead(hub: &HubProc) -> Api {
    Api::new(&hub.url).unwrap().agent("lead")
}

fn upsert(id: &str) -> String {
    format!(
        r#"{{"mode":"patch","ops":[{{"op":"upsert","task":{{"id":"{id}","content":"Do {id}"}}}}]}}"#
    )
}

fn ids(s: &Snapshot) -> Vec<String> {
    let mut ids: Vec<String> = s.tasks.iter().map(|t| t.id.clone()).collect();
    ids.sort();
    ids
}

/// `list_elsewhere`, naming `holder`.
fn assert_elsewhere(r: Result<Snapshot, HttpError>, holder: &str) {
    match r {
        Err(HttpError::Api(e)) => {
            assert_eq!(e.code, ErrorCode::ListElsewhere, "{e:?}");
            assert!(e.message.contains(holder), "{}", e.message);
        }
        other => panic!("wanted list_elsewhere naming {holder}, got {other:?}"),
    }
}

/// Reads `list` on `api` until the hub serves it (another's lease ends first).
async fn read_when_served(api: &Api, list: &str) -> (Snapshot, Duration) {
    let started = Instant::now();
    loop {
        match api.read(list, None).await {
            Ok(s) => return (s, started.elapsed()),
            Err(HttpError::Api(e)) if e.code == ErrorCode::ListElsewhere => {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "never served: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_has_one_authority_and_moves_with_every_acknowledged_write_when_its_hub_dies() {
    let nats = NatsServer::start("hubs-failover");
    let dir = scratch("cluster-failover");
    let a = hub_in(&nats, &dir, "hub-a");
    let b = hub_in(&nats, &dir, "hub-b");
    lead(&a).create("plan").await.unwrap();
    let mut acked = Vec::new();
    for i in 0..5 {
        let id = format!("t{i}");
        lead(&a).write("plan", &upsert(&id)).await.unwrap();
        acked.push(id);
    }
    // One authority: hub-b sends callers to hub-a.
    assert_elsewhere(lead(&b).read("plan", None).await, "hub-a");
    assert_eq!(ids(&lead(&a).read("plan", None).await.unwrap()), acked);

    // hub-a dies; hub-b takes the list once the lease ends, with every write.
    a.kill9();
    let (snapshot, waited) = read_when_served(&lead(&b), "plan").await;
    assert_eq!(ids(&snapshot), acked, "served by hub-b after {waited:?}");
    lead(&b).write("plan", &upsert("t5")).await.unwrap();
    acked.push("t5".to_owned());

    // hub-a comes back on its own store: the list is hub-b's now.
    let a = hub_in(&nats, &dir, "hub-a");
    assert_elsewhere(lead(&a).read("plan", None).await, "hub-b");
    // hub-b stops cleanly: it gives the list back, and hub-a takes it at once with
    // hub-b's write replayed into its store.
    drop(b);
    let (snapshot, _) = read_when_served(&lead(&a), "plan").await;
    assert_eq!(ids(&snapshot), acked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_paused_past_its_lease_keeps_nothing_it_is_asked_when_it_wakes_up() {
    let nats = NatsServer::start("hubs-zombie");
    let dir = scratch("cluster-zombie");
    let a = hub_in(&nats, &dir, "hub-a");
    let b = hub_in(&nats, &dir, "hub-b");
    lead(&a).create("plan").await.unwrap();
    for id in ["t0", "t1"] {
        lead(&a).write("plan", &upsert(id)).await.unwrap();
    }
    a.signal(libc::SIGSTOP);
    let (snapshot, _) = read_when_served(&lead(&b), "plan").await;
    assert_eq!(ids(&snapshot), ["t0", "t1"]);
    lead(&b).write("plan", &upsert("t2")).await.unwrap();

    // A write reaches the paused hub, which holds the list in memory still.
    let late = tokio::spawn({
        let api = lead(&a);
        async move { api.write("plan", &upsert("zombie")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.signal(libc::SIGCONT);
    let answer = tokio::time::timeout(Duration::from_secs(20), late)
        .await
        .expect("the woken hub answers")
        .unwrap();
    assert!(answer.is_err(), "the woken hub acknowledged {answer:?}");
    eprintln!("the woken hub answered {answer:?}");

    let after = lead(&b).read("plan", None).await.unwrap();
    assert_eq!(ids(&after), ["t0", "t1", "t2"], "the late write is nowhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_peers_reach_a_list_at_its_authority_and_follow_it_when_its_hub_dies() {
    use swarmtodo::client::{list_document_id, Connection};
    use swarmtodo::model::TodoList;

    let nats = NatsServer::start("hubs-sync");
    let dir = scratch("cluster-sync");
    let a = hub_in(&nats, &dir, "hub-a");
    let b = hub_in(&nats, &dir, "hub-b");
    let doc = list_document_id("swarm");
    let mut lead = crate::common::planned();
    let mut c_lead = Connection::connect(&a.url, "lead").await.unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();
    assert!(c_lead.in_sync(doc, &lead), "hub-a acknowledged the plan");

    // At hub-b a peer of the list is closed, told where the list is.
    let mut sub = TodoList::create(crate::common::actor(2));
    let mut c_sub = Connection::connect(&b.url, "sub").await.unwrap();
    let e = c_sub.sync(doc, &mut sub).await.unwrap_err();
    assert!(e.to_string().contains("hub-a"), "{e}");

    // hub-a dies: the peer reconnects to hub-b, which takes the list with the plan.
    a.kill9();
    let started = Instant::now();
    loop {
        let mut c = Connection::connect(&b.url, "sub").await.unwrap();
        match c.sync(doc, &mut sub).await {
            Ok(_) => break,
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(20), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(sub.read().tasks.len(), lead.read().tasks.len());
    assert_eq!(sub.read().tasks.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegated_task_s_new_list_is_taken_by_the_hub_that_makes_it() {
    let nats = NatsServer::start("hubs-delegate");
    let dir = scratch("cluster-delegate");
    let a = hub_in(&nats, &dir, "hub-a");
    let b = hub_in(&nats, &dir, "hub-b");
    lead(&a).create("plan").await.unwrap();
    lead(&a).write("plan", &upsert("t1")).await.unwrap();
    lead(&a)
        .delegate("plan", "t1", "sub", Some("plan-t1"))
        .await
        .unwrap();
    lead(&a).write("plan-t1", &upsert("s1")).await.unwrap();
    assert_eq!(ids(&lead(&a).read("plan-t1", None).await.unwrap()), ["s1"]);
    // hub-a holds the new list too.
    assert_elsewhere(lead(&b).read("plan-t1", None).await, "hub-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_leaves_memory_is_given_back_at_once() {
    use swarmtodo::client::{list_document_id, Connection};

    let nats = NatsServer::start("hubs-give-back");
    let dir = scratch("cluster-give-back");
    // Leases of 30 s: only a list given back moves before that.
    let long = |id: &str| hub_with_lease(&nats, &dir, id, 30_000);
    let a = long("hub-a");
    let b = long("hub-b");
    let doc = list_document_id("synced");
    let mut plan = crate::common::planned();
    let mut c = Connection::connect(&a.url, "lead").await.unwrap();
    c.sync(doc, &mut plan).await.unwrap();
    assert_elsewhere(lead_read(&b, "synced").await, "hub-a");
    // The only peer leaves: the list leaves hub-a's memory, and its lease goes back.
    c.close().await.unwrap();
    let (snapshot, waited) = read_when_served(&lead(&b), "synced").await;
    assert!(waited < Duration::from_secs(10), "waited {waited:?}");
    assert_eq!(snapshot.tasks.len(), 3);
    drop(a);
}

async fn lead_read(hub: &HubProc, list: &str) -> Result<Snapshot, HttpError> {
    lead(hub).read(list, None).await
}
