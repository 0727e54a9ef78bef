//! Hubs of one cluster (`serve --nats`) on a real nats-server: one authority per list,
//! which decides the calls made at any hub (the others forward them); the list moves to
//! another hub when its hub is killed, with every acknowledged write; a hub paused past
//! its lease keeps nothing it is asked to write when it wakes up.

use std::path::Path;
use std::time::{Duration, Instant};

use swarmtodo::client::http::{Api, HttpError};
use swarmtodo::proto::{ErrorCode, Snapshot};

use crate::common::{scratch, HubProc, NatsServer, Scratch};

/// Hub `id` of the cluster on `nats`, its store in `dir`, leases of one second.
fn hub_in(nats: &NatsServer, dir: &Path, id: &str) -> HubProc {
    hub_with_lease(nats, dir, id, 1000)
}

/// Hub `id` of the cluster on `nats`, its store in `dir`, leases of `lease_ms`.
fn hub_with_lease(nats: &NatsServer, dir: &Path, id: &str, lease_ms: u64) -> HubProc {
    hub_on(&nats.url, dir, id, lease_ms)
}

/// A nats-server and a scratch folder for test `name`, and hub-a and hub-b of the
/// cluster on them (leases of one second).
fn two_hubs(name: &str) -> (NatsServer, Scratch, HubProc, HubProc) {
    let nats = NatsServer::start(&format!("hubs-{name}"));
    let dir = scratch(&format!("cluster-{name}"));
    let a = hub_in(&nats, &dir, "hub-a");
    let b = hub_in(&nats, &dir, "hub-b");
    (nats, dir, a, b)
}

/// Commits after which the hubs of these tests roll a list's log up (1,000 by default):
/// every test that writes a little goes through snapshots, and hubs that take a list
/// read one.
const ROLLUP_AFTER_COMMITS: u64 = 25;

/// Hub `id` of the cluster on the NATS at `url`, its store in `dir`, leases of `lease_ms`.
fn hub_on(url: &str, dir: &Path, id: &str, lease_ms: u64) -> HubProc {
    hub_configured(url, dir, id, lease_ms, "")
}

/// Hub `id` as [`hub_on`] makes it, with `config` (TOML) in its configuration too.
fn hub_configured(url: &str, dir: &Path, id: &str, lease_ms: u64, config: &str) -> HubProc {
    let path = dir.join(format!("{id}.toml"));
    std::fs::write(
        &path,
        format!(
            "{config}\n[cluster]\nlease_ms = {lease_ms}\nrollup_after_commits = {ROLLUP_AFTER_COMMITS}\n"
        ),
    )
    .unwrap();
    let config = path;
    HubProc::start_with(
        &dir.join(format!("{id}.db")),
        "127.0.0.1:0",
        &[
            "--nats",
            url,
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

/// How many calls `hub` forwarded to another hub so far.
async fn forwarded(hub: &HubProc) -> u64 {
    hub.metric("swarmtodo_calls_forwarded_total").await
}

/// Reads `list` at `hub` until `hub` itself serves it, forwarding the read nowhere (the
/// holder's lease ends first, or it gives the list back); how long that took.
async fn read_when_held(hub: &HubProc, list: &str) -> (Snapshot, Duration) {
    let started = Instant::now();
    loop {
        let before = forwarded(hub).await;
        match lead(hub).read(list, None).await {
            Ok(s) if forwarded(hub).await == before => return (s, started.elapsed()),
            Ok(_) => {}
            Err(HttpError::Api(e)) if e.code == ErrorCode::ListElsewhere => {}
            Err(e) => panic!("{e}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "never held by this hub"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_has_one_authority_and_moves_with_every_acknowledged_write_when_its_hub_dies() {
    let (nats, dir, a, b) = two_hubs("failover");
    lead(&a).create("plan").await.unwrap();
    let mut acked = Vec::new();
    for i in 0..5 {
        let id = format!("t{i}");
        lead(&a).write("plan", &upsert(&id)).await.unwrap();
        acked.push(id);
    }
    // One authority: hub-b forwards its callers' calls to hub-a.
    assert_eq!(ids(&lead(&b).read("plan", None).await.unwrap()), acked);
    assert_eq!(forwarded(&b).await, 1);
    assert_eq!(ids(&lead(&a).read("plan", None).await.unwrap()), acked);

    // hub-a dies; hub-b takes the list once the lease ends, with every write.
    a.kill9();
    let (snapshot, waited) = read_when_held(&b, "plan").await;
    assert_eq!(ids(&snapshot), acked, "served by hub-b after {waited:?}");
    lead(&b).write("plan", &upsert("t5")).await.unwrap();
    acked.push("t5".to_owned());

    // hub-a comes back on its own store: the list is hub-b's now.
    let a = hub_in(&nats, &dir, "hub-a");
    assert_eq!(ids(&lead(&a).read("plan", None).await.unwrap()), acked);
    assert_eq!(forwarded(&a).await, 1, "read at hub-b");
    // hub-b stops cleanly: it gives the list back, and hub-a takes it at once with
    // hub-b's write replayed into its store.
    drop(b);
    let (snapshot, _) = read_when_held(&a, "plan").await;
    assert_eq!(ids(&snapshot), acked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_paused_past_its_lease_decides_nothing_when_it_wakes_up() {
    let (_nats, _dir, a, b) = two_hubs("zombie");
    lead(&a).create("plan").await.unwrap();
    for id in ["t0", "t1"] {
        lead(&a).write("plan", &upsert(id)).await.unwrap();
    }
    a.signal(libc::SIGSTOP);
    // Forwarded to the paused hub until its lease ends, then held by hub-b.
    let (snapshot, _) = read_when_held(&b, "plan").await;
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
    eprintln!("the woken hub answered {answer:?}");
    // Its one term on the list ended, and its metrics say so, by the refusal that ended
    // it (its own clock, its renewal refused, or its append refused by the log).
    let started = Instant::now();
    let ended = loop {
        let mut n = 0;
        for code in [
            "cluster_fenced",
            "cluster_lease_expired",
            "cluster_lease_lost",
        ] {
            n += a
                .metric(&format!(
                    "swarmtodo_cluster_terms_ended_total{{code=\"{code}\"}}"
                ))
                .await;
        }
        if n > 0 || started.elapsed() > Duration::from_secs(10) {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(ended, 1, "{}", a.metrics().await);
    let after = lead(&b).read("plan", None).await.unwrap();
    match answer {
        // It tried the write itself: refused, and the write is nowhere.
        Err(e) => {
            assert!(
                matches!(&e, HttpError::Api(e) if e.code == ErrorCode::ListElsewhere),
                "{e:?}"
            );
            assert_eq!(ids(&after), ["t0", "t1", "t2"], "the late write is nowhere");
        }
        // It learned it lost the list first, and forwarded the write to hub-b, which
        // decided it on the list as it holds it (with hub-b's own write).
        Ok(w) => {
            assert_eq!(forwarded(&a).await, 1);
            assert_eq!(ids(&w.snapshot), ["t0", "t1", "t2", "zombie"]);
            assert_eq!(ids(&after), ["t0", "t1", "t2", "zombie"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_peers_at_any_hub_are_judged_by_the_authority_and_see_only_its_repaired_state() {
    use crate::common::{actor, planned, write};
    use crate::e2e::{
        in_progress_for, start_for_bob, told_of_one_second_in_progress_and_its_repair,
    };
    use swarmtodo::client::{list_document_id, Connection};
    use swarmtodo::model::TodoList;

    let nats = NatsServer::start("hubs-sync");
    let dir = scratch("cluster-sync");
    let [a, b, c] = ["hub-a", "hub-b", "hub-c"].map(|id| hub_in(&nats, &dir, id));
    let doc = list_document_id("swarm");
    let mut lead = planned();
    let mut c_lead = Connection::connect(&a.url, "lead").await.unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();
    assert!(c_lead.in_sync(doc, &lead), "hub-a acknowledged the plan");

    // Two subagents at hub-b and hub-c, carried to hub-a, start different tasks for
    // one owner at once: one in progress too many.
    let mut sa = TodoList::create(actor(2));
    let mut sb = TodoList::create(actor(3));
    let mut c_sa = Connection::connect(&b.url, "sub-a").await.unwrap();
    let mut c_sb = Connection::connect(&c.url, "sub-b").await.unwrap();
    c_sa.sync(doc, &mut sa).await.unwrap();
    c_sb.sync(doc, &mut sb).await.unwrap();
    assert_eq!(sa.read().tasks.len(), 3, "the plan, through hub-b");
    assert_eq!(sb.read().tasks.len(), 3, "the plan, through hub-c");
    write(&mut sa, "sub-a", start_for_bob("t2"));
    write(&mut sb, "sub-b", start_for_bob("t3"));
    let (ra, rb) = tokio::join!(c_sa.sync(doc, &mut sa), c_sb.sync(doc, &mut sb));
    ra.unwrap();
    rb.unwrap();
    c_sa.sync(doc, &mut sa).await.unwrap();
    c_sb.sync(doc, &mut sb).await.unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();

    // Each writer, at whichever hub, was told of the one violation and its repair.
    for (who, conn) in [("sub-a", &mut c_sa), ("sub-b", &mut c_sb)] {
        let events = conn.take_events();
        told_of_one_second_in_progress_and_its_repair(who, &events, &events);
    }
    // An observer joining at hub-b sees one task in progress, never two; all converge.
    let mut obs = TodoList::create(actor(4));
    let mut c_obs = Connection::connect(&b.url, "observer").await.unwrap();
    c_obs.sync(doc, &mut obs).await.unwrap();
    for (who, list) in [
        ("lead", &lead),
        ("sub-a", &sa),
        ("sub-b", &sb),
        ("observer", &obs),
    ] {
        assert_eq!(in_progress_for(list, "bob"), 1, "{who}: {:?}", list.read());
        assert_eq!(list.version(), obs.version(), "{who} converged");
    }
    let carried = b.metric("swarmtodo_sessions_carried_total").await;
    assert_eq!(carried, 2, "sub-a and the observer, carried to hub-a");

    // hub-a dies: its peers at hub-b are told the list moved, reconnect, and hub-b or
    // hub-c takes the list with everything.
    a.kill9();
    let started = Instant::now();
    loop {
        let mut conn = Connection::connect(&b.url, "sub-a").await.unwrap();
        let before = sa.version();
        match conn.sync(doc, &mut sa).await {
            Ok(_) if conn.in_sync(doc, &sa) => break,
            other => {
                assert!(started.elapsed() < Duration::from_secs(30), "{other:?}");
                assert_eq!(sa.version(), before);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert_eq!(sa.version(), lead.version(), "nothing lost with hub-a");
    drop((b, c));
}

/// At `hub`: list "plan" with task t1, delegated to "sub" as list "plan-t1", which has
/// task s1.
async fn delegated_plan(hub: &HubProc) {
    lead(hub).create("plan").await.unwrap();
    lead(hub).write("plan", &upsert("t1")).await.unwrap();
    lead(hub)
        .delegate("plan", "t1", "sub", Some("plan-t1"))
        .await
        .unwrap();
    lead(hub).write("plan-t1", &upsert("s1")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegated_task_s_new_list_is_taken_by_the_hub_that_makes_it() {
    let (_nats, _dir, a, b) = two_hubs("delegate");
    delegated_plan(&a).await;
    assert_eq!(ids(&lead(&a).read("plan-t1", None).await.unwrap()), ["s1"]);
    // hub-a holds the new list too: hub-b forwards a read of it.
    assert_eq!(ids(&lead(&b).read("plan-t1", None).await.unwrap()), ["s1"]);
    assert_eq!(forwarded(&b).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_leaves_memory_is_given_back_at_once() {
    use swarmtodo::client::{list_document_id, Connection};
    use swarmtodo::cluster::{Cluster, ClusterConfig};
    use swarmtodo::store::persist::doc_id;

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
    let mut observer = ClusterConfig::new(&nats.url, "observer");
    observer.lease_ttl = Duration::from_secs(30);
    let observer = Cluster::connect(&observer).await.unwrap();
    let id = doc_id(&doc);
    let holder = observer.holder(id).await.unwrap().map(|(h, _)| h);
    assert_eq!(holder.as_deref(), Some("hub-a"));
    // hub-b forwards a read to hub-a, and remembers hub-a holds the list (for a third
    // of a lease).
    assert_eq!(lead(&b).read("synced", None).await.unwrap().tasks.len(), 3);
    assert_eq!(forwarded(&b).await, 1);
    // The only peer leaves: the list leaves hub-a's memory, and its lease goes back.
    c.close().await.unwrap();
    let started = Instant::now();
    while observer.holder(id).await.unwrap().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let given_back = started.elapsed();
    // A read at hub-b goes to hub-a, which it still takes for the holder; hub-a holds
    // nothing and decides nothing, and hub-b decides the read itself, once, taking the
    // list.
    let snapshot = lead(&b).read("synced", None).await.unwrap();
    assert_eq!(snapshot.tasks.len(), 3, "given back after {given_back:?}");
    assert_eq!(forwarded(&b).await, 2, "sent to hub-a first");
    let holder = observer.holder(id).await.unwrap().map(|(h, _)| h);
    assert_eq!(holder.as_deref(), Some("hub-b"));
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_hub_takes_any_list_s_calls_and_its_authority_decides_them() {
    let nats = NatsServer::start("hubs-forward");
    let dir = scratch("cluster-forward");
    let hubs = ["hub-a", "hub-b", "hub-c"].map(|id| hub_in(&nats, &dir, id));
    lead(&hubs[0]).create("plan").await.unwrap();
    // Writes through the three hubs in turn: hub-a decides them all.
    let mut acked: Vec<String> = (0..9).map(|i| format!("t{i}")).collect();
    for (i, id) in acked.iter().enumerate() {
        lead(&hubs[i % 3]).write("plan", &upsert(id)).await.unwrap();
    }
    acked.sort();
    for h in &hubs {
        assert_eq!(ids(&lead(h).read("plan", None).await.unwrap()), acked);
    }
    // Nine claimers at hub-b and hub-c at once: each task goes to one of them.
    let claims = futures_util::future::join_all((0..9).map(|i| {
        let api = Api::new(&hubs[1 + i % 2].url)
            .unwrap()
            .agent(format!("w{i}"));
        async move { api.claim("plan", None).await.unwrap() }
    }))
    .await;
    let mut claimed: Vec<String> = claims.iter().map(|c| c.task.id.clone()).collect();
    claimed.sort();
    assert_eq!(claimed, acked, "every task claimed once");
    // A refusal comes back as the authority gave it.
    match lead(&hubs[2]).claim("plan", None).await {
        Err(HttpError::Api(e)) => assert_eq!(e.code, ErrorCode::NothingReady, "{e:?}"),
        other => panic!("wanted nothing_ready, got {other:?}"),
    }
    let (fa, fb, fc) = (
        forwarded(&hubs[0]).await,
        forwarded(&hubs[1]).await,
        forwarded(&hubs[2]).await,
    );
    assert_eq!(fa, 0);
    assert_eq!((fb, fc), (3 + 1 + 5, 3 + 1 + 4 + 1), "writes, read, claims");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_and_an_answer_larger_than_a_nats_message_go_through_a_hub_that_does_not_hold_the_list(
) {
    let (_nats, _dir, a, b) = two_hubs("forward-large");
    lead(&a).create("large").await.unwrap();
    // 1,000 tasks of 2,000 bytes in one write: a call of two NATS messages and more, an
    // answer of as many (the limit itself is reached in `tests/cluster`).
    let text = "x".repeat(2000);
    let ops: Vec<String> = (0..1000)
        .map(|i| format!(r#"{{"op":"upsert","task":{{"id":"t{i}","content":"{text}"}}}}"#))
        .collect();
    let request = format!(r#"{{"mode":"patch","ops":[{}]}}"#, ops.join(","));
    assert!(request.len() > 2_000_000, "{} bytes", request.len());
    lead(&b).write("large", &request).await.unwrap();
    let read = lead(&b).read("large", None).await.unwrap();
    assert_eq!(read.tasks.len(), 1000);
    assert_eq!(forwarded(&b).await, 2);
    assert_eq!(lead(&a).read("large", None).await.unwrap(), read);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_cut_from_nats_lets_its_lists_go_and_acknowledges_nothing_it_cannot_log() {
    let nats = NatsServer::start("hubs-cut");
    let dir = scratch("cluster-cut");
    let cut = crate::common::Cut::start(&nats.url).await.unwrap();
    let a = hub_on(&cut.url, &dir, "hub-a", 1000);
    let b = hub_in(&nats, &dir, "hub-b");
    lead(&a).create("plan").await.unwrap();
    lead(&a).write("plan", &upsert("t0")).await.unwrap();

    // hub-a loses NATS: its lease ends, and hub-b takes the list with its write.
    cut.cut();
    let (snapshot, waited) = read_when_held(&b, "plan").await;
    assert_eq!(ids(&snapshot), ["t0"], "held by hub-b after {waited:?}");
    lead(&b).write("plan", &upsert("t1")).await.unwrap();
    // hub-a, cut off, acknowledges nothing: it can neither log nor forward.
    match lead(&a).write("plan", &upsert("cut-off")).await {
        Err(HttpError::Api(e)) => assert_eq!(e.code, ErrorCode::ListElsewhere, "{e:?}"),
        other => panic!("the cut hub answered {other:?}"),
    }

    // Healed, hub-a sends its callers' calls to hub-b, which holds the list now.
    cut.heal();
    let started = Instant::now();
    let snapshot = loop {
        match lead(&a).read("plan", None).await {
            Ok(s) => break s,
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(30), "{e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(
        ids(&snapshot),
        ["t0", "t1"],
        "the cut hub's write is nowhere"
    );
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authority_killed_again_and_again_loses_no_write_acknowledged_at_the_other_hubs() {
    use std::sync::{Arc, Mutex};
    use swarmtodo::cluster::{Cluster, ClusterConfig};
    use swarmtodo::store::persist::doc_id;

    // SWARMTODO_FAILOVER_CYCLES=100 for the full run; CI runs a few.
    let cycles: usize = std::env::var("SWARMTODO_FAILOVER_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let nats = NatsServer::start("hubs-kill");
    let dir = scratch("cluster-kill");
    let ids3 = ["hub-a", "hub-b", "hub-c"];
    let mut hubs: Vec<Option<HubProc>> = ids3
        .iter()
        .map(|id| Some(hub_in(&nats, &dir, id)))
        .collect();
    let mut observer = ClusterConfig::new(&nats.url, "observer");
    observer.lease_ttl = Duration::from_secs(1);
    let observer = Cluster::connect(&observer).await.unwrap();
    let doc = doc_id(&swarmtodo::client::list_document_id("plan"));
    lead(hubs[0].as_ref().unwrap())
        .create("plan")
        .await
        .unwrap();

    // A reader of the list's event stream at one hub after another: when its hub dies
    // it resumes at the next from the last event it got (`?from=`).
    let urls: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(
        hubs.iter().flatten().map(|h| h.url.clone()).collect(),
    ));
    let streamed: Arc<Mutex<Vec<swarmtodo::proto::Event>>> = Arc::default();
    let reading = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reader = {
        let (urls, streamed, reading) = (urls.clone(), streamed.clone(), reading.clone());
        tokio::spawn(async move {
            use swarmtodo::client::http::StreamItem;
            let mut next = 0;
            let mut resumed = 0usize;
            while reading.load(std::sync::atomic::Ordering::SeqCst) {
                let url = {
                    let urls = urls.lock().unwrap();
                    urls[next % urls.len()].clone()
                };
                next += 1;
                let from = streamed.lock().unwrap().last().map_or(0, |e| e.seq);
                let Ok(api) = Api::new(&url) else { continue };
                let _ = api
                    .events("plan", from, Some(Duration::from_secs(2)), |item| {
                        if let StreamItem::Event(e) = item {
                            streamed.lock().unwrap().push(*e);
                        }
                        reading.load(std::sync::atomic::Ordering::SeqCst)
                    })
                    .await;
                resumed += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            resumed
        })
    };
    // Each acknowledged write and when it was sent.
    let acked: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let mut takeovers = Vec::new();
    // The log read as it grows, every 20 ms: a rollup drops the records before it.
    let auditing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let auditor = {
        let (observer, auditing) = (observer.clone(), auditing.clone());
        tokio::spawn(async move {
            let mut audit = LogAudit::default();
            while auditing.load(std::sync::atomic::Ordering::SeqCst) {
                audit = audit.read_on(&observer, doc).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            audit.read_on(&observer, doc).await
        })
    };
    for cycle in 0..cycles {
        // A list nobody wrote for a while was given back: a read takes it again.
        let holder = loop {
            if let Some((holder, _)) = observer.holder(doc).await.unwrap() {
                break holder;
            }
            let any = hubs.iter().flatten().next().unwrap();
            lead(any).read("plan", None).await.unwrap();
        };
        let h = ids3.iter().position(|id| *id == holder).unwrap();
        // A writer at each other hub, writing on through the failover.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..3)
            .filter(|&i| i != h)
            .map(|i| {
                let api = lead(hubs[i].as_ref().unwrap());
                let (acked, stop) = (acked.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let id = format!("c{cycle}-h{i}-{n}");
                        n += 1;
                        let sent = Instant::now();
                        if api.write("plan", &upsert(&id)).await.is_ok() {
                            acked.lock().unwrap().push((id, sent));
                        } else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        hubs[h].take().unwrap().kill9();
        let killed = Instant::now();
        // Taken over once a write sent after the kill is acknowledged, by another hub.
        while !acked.lock().unwrap().iter().any(|(_, sent)| *sent > killed) {
            assert!(
                killed.elapsed() < Duration::from_secs(30),
                "cycle {cycle}: no takeover"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        takeovers.push(killed.elapsed());
        let (now, _) = observer.holder(doc).await.unwrap().expect("a holder");
        assert_ne!(now, holder, "cycle {cycle}: taken over by another hub");
        let restarted = hub_in(&nats, &dir, ids3[h]);
        urls.lock().unwrap()[h] = restarted.url.clone();
        hubs[h] = Some(restarted);
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for w in writers {
            w.await.unwrap();
        }
    }
    // Every acknowledged write is there, read through each hub alike.
    let mut want: Vec<String> = acked
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    want.sort();
    want.dedup();
    for h in hubs.iter().flatten() {
        let s = lead(h).read("plan", None).await.unwrap();
        let got = ids(&s);
        let missing: Vec<&String> = want.iter().filter(|id| !got.contains(id)).collect();
        assert!(missing.is_empty(), "lost: {missing:?}");
    }
    auditing.store(false, std::sync::atomic::Ordering::SeqCst);
    let audit = auditor.await.unwrap();
    // The reader got every event of the list once, in order, as the log numbers them,
    // resuming at whichever hub was up.
    let logged = observer.events(doc).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while streamed.lock().unwrap().last().map_or(0, |e| e.seq) < logged.len() as u64 {
        assert!(Instant::now() < deadline, "the reader never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reading.store(false, std::sync::atomic::Ordering::SeqCst);
    let resumed = reader.await.unwrap();
    let streamed = std::mem::take(&mut *streamed.lock().unwrap());
    let got: Vec<(u64, &str)> = streamed
        .iter()
        .take(logged.len())
        .map(|e| (e.seq, swarmtodo::store::persist::kind(&e.body)))
        .collect();
    let want_events: Vec<(u64, &str)> = logged.iter().map(|e| (e.seq, e.kind.as_str())).collect();
    assert_eq!(got, want_events, "every event once, in order, as logged");
    let tenth = (cycles / 10).max(1);
    let (first, last) = (
        takeovers[..tenth].to_vec(),
        takeovers[cycles - tenth..].to_vec(),
    );
    let p50 = |mut t: Vec<Duration>| {
        t.sort();
        t[t.len() / 2]
    };
    eprintln!(
        "{cycles} kills: {} writes acknowledged at the other hubs, all kept; {} events read \
         once each by a reader resuming at another hub {resumed} times; {} fences and {} \
         snapshots seen in the log as it grew; takeover p50 {:?} (first tenth {:?}, last tenth {:?}), max {:?}",
        want.len(),
        logged.len(),
        audit.fences,
        audit.snapshots,
        p50(takeovers.clone()),
        p50(first),
        p50(last),
        takeovers.iter().max().unwrap()
    );
    // The log is rolled up as it goes: it starts with a snapshot, and holds fewer
    // commits after it than two rollups apart.
    let whole = observer.read(doc, 0).await.unwrap();
    assert!(
        matches!(
            whole.records[0].entry,
            swarmtodo::cluster::Entry::Snapshot(_)
        ),
        "{:?}",
        whole.records[0]
    );
    let commits = whole
        .records
        .iter()
        .filter(|r| matches!(r.entry, swarmtodo::cluster::Entry::Commit(_)))
        .count();
    assert!(
        (commits as u64) < 2 * ROLLUP_AFTER_COMMITS,
        "{commits} commits after the last snapshot"
    );
}

/// What the log showed of one list, read as it grows (a rollup drops what came
/// before it): one authority at a time — every commit is written by the hub whose fence
/// (or, read after a rollup, snapshot) opens its stretch — and the fences and
/// snapshots seen. (A lease's revision grows with each renewal: the hub names the
/// term between two fences.)
#[derive(Default)]
struct LogAudit {
    after: u64,
    writer: Option<String>,
    fences: usize,
    snapshots: usize,
}

impl LogAudit {
    async fn read_on(
        mut self,
        observer: &swarmtodo::cluster::Cluster,
        doc: swarmtodo::store::DocId,
    ) -> LogAudit {
        use swarmtodo::cluster::Entry;
        let read = observer.read(doc, self.after).await.unwrap();
        for r in &read.records {
            match &r.entry {
                Entry::Fence => {
                    self.fences += 1;
                    self.writer = Some(r.hub.clone());
                }
                // A snapshot is fenced as a commit is: its writer held the list. Read
                // after a rollup, it opens what is left of its term's stretch.
                Entry::Snapshot(_) => {
                    self.snapshots += 1;
                    self.writer = Some(r.hub.clone());
                }
                Entry::Commit(_) => {
                    assert_eq!(self.writer.as_ref(), Some(&r.hub), "record {}", r.seq);
                }
            }
        }
        self.after = read.through;
        self
    }
}

/// Two hubs, hub-a holding the list "swarm" with the lead connected there, and "sub"
/// connected at hub-b, which carries it to hub-a.
struct Carried {
    _nats: NatsServer,
    a: HubProc,
    b: HubProc,
    doc: swarmtodo::proto::wire::DocumentId,
    _lead: swarmtodo::client::Connection,
    sub: swarmtodo::client::Connection,
    sub_list: swarmtodo::model::TodoList,
    /// Last: removed after the hubs stop.
    _dir: Scratch,
}

async fn sub_carried(name: &str) -> Carried {
    use swarmtodo::client::{list_document_id, Connection};
    use swarmtodo::model::TodoList;

    let (nats, dir, a, b) = two_hubs(name);
    let doc = list_document_id("swarm");
    let mut lead = crate::common::planned();
    let mut c_lead = Connection::connect(&a.url, "lead").await.unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();
    let mut sub = TodoList::create(crate::common::actor(2));
    let mut c_sub = Connection::connect(&b.url, "sub").await.unwrap();
    c_sub.sync(doc, &mut sub).await.unwrap();
    assert_eq!(sub.read().tasks.len(), 3);
    assert_eq!(
        a.metric("swarmtodo_connections").await,
        2,
        "the lead, and sub carried here"
    );
    Carried {
        _nats: nats,
        a,
        b,
        doc,
        _lead: c_lead,
        sub: c_sub,
        sub_list: sub,
        _dir: dir,
    }
}

/// Waits until `hub` serves only `n` connections; how long that took.
async fn until_connections(hub: &HubProc, n: u64) -> Duration {
    let started = Instant::now();
    while hub.metric("swarmtodo_connections").await != n {
        assert!(started.elapsed() < Duration::from_secs(10), "never let go");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_lets_go_of_the_peers_of_a_hub_that_died() {
    let c = sub_carried("silent").await;
    // hub-b dies without a word: hub-a lets its peer go once hub-b has been silent for
    // SESSION_SILENT_MAX leases (1 s each here).
    c.b.kill9();
    let waited = until_connections(&c.a, 1).await;
    assert!(
        waited > Duration::from_secs(2),
        "let go after {waited:?}, before hub-b was silent long enough"
    );
}

/// A carrying hub paused past `SESSION_SILENT_MAX` leases: the holder lets its peer go,
/// and when that hub wakes up its peer is told to reconnect (1012 `list_moved`), not
/// that a hub stopped (1001).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_let_go_while_its_hub_slept_is_told_to_reconnect() {
    use swarmtodo::client::ClientError;

    let mut c = sub_carried("slept").await;
    c.b.signal(libc::SIGSTOP);
    until_connections(&c.a, 1).await;
    c.b.signal(libc::SIGCONT);
    let ended = tokio::time::timeout(Duration::from_secs(10), c.sub.sync(c.doc, &mut c.sub_list))
        .await
        .expect("the peer was never closed");
    match ended {
        Err(ClientError::Closed(why)) => assert!(why.starts_with("1012 list_moved"), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// A carrying hub cut from NATS for less than `SESSION_SILENT_MAX` leases misses what
/// the holder sent its peer meanwhile: NATS keeps nothing for a subscriber that is
/// away, and the holder does not let the session go. A session's messages are
/// numbered, so the carrying hub sees the gap at the holder's next one and tells its
/// peer to reconnect (1012): the peer gets the write it missed instead of waiting for
/// it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_hub_missed_the_holder_s_frames_reconnects_and_gets_them() {
    use crate::common::{actor, patch, planned, task, upsert, write, Cut};
    use swarmtodo::client::{list_document_id, Connection, SyncedList};
    use swarmtodo::model::TodoList;

    let nats = NatsServer::start("hubs-gap");
    let dir = scratch("cluster-gap");
    let cut = Cut::start(&nats.url).await.unwrap();
    let a = hub_in(&nats, &dir, "hub-a");
    let b = hub_on(&cut.url, &dir, "hub-b", 1000);
    let doc = list_document_id("swarm");
    let mut lead = planned();
    let mut c_lead = Connection::connect(&a.url, "lead").await.unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();
    let sub = SyncedList::with_list(&b.url, "sub", doc, TodoList::create(actor(2)));
    let has = |id: &str| sub.read().tasks.iter().any(|t| t.id == id);
    let started = Instant::now();
    while !has("t3") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "sub never synced"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until_connections(&a, 2).await;

    // hub-b is away from NATS for 0.8 s (its client reconnects about a second after
    // the cut): the lead's write reaches hub-a, and hub-a's frame to sub is lost.
    cut.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    write(
        &mut lead,
        "lead",
        patch(vec![upsert(task("t4", "Written while hub-b was away"))]),
    );
    c_lead.sync(doc, &mut lead).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cut.heal();

    let healed = Instant::now();
    while !has("t4") {
        assert!(
            healed.elapsed() < Duration::from_secs(15),
            "sub never got the write its hub missed: {:?}",
            sub.read().tasks.iter().map(|t| &t.id).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "gap: sub had the missed write {:?} after the heal",
        healed.elapsed()
    );
    drop((a, b, nats, dir));
}

/// The tasks whose creation `events` carry.
fn created(events: &[swarmtodo::proto::Event]) -> std::collections::BTreeSet<String> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            swarmtodo::proto::EventBody::TasksChanged { tasks, .. } => Some(tasks),
            _ => None,
        })
        .flatten()
        .filter(|t| t.before.is_none())
        .map(|t| t.task.clone())
        .collect()
}

/// Follows `list`'s event stream at `hub` from `from` in the background: its events as
/// they come.
fn follow_events(
    hub: &HubProc,
    list: &str,
    from: u64,
) -> tokio::sync::mpsc::UnboundedReceiver<swarmtodo::proto::Event> {
    use swarmtodo::client::http::StreamItem;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = Api::new(&hub.url).unwrap();
    let list = list.to_owned();
    tokio::spawn(async move {
        let _ = reader
            .events(&list, from, None, |item| match item {
                StreamItem::Event(e) => tx.send(*e).is_ok(),
                StreamItem::Snapshot(_) => true,
            })
            .await;
    });
    rx
}

/// Takes events from `rx` until those of every task in `tasks` came; all taken so far.
async fn events_creating(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<swarmtodo::proto::Event>,
    seen: &mut Vec<swarmtodo::proto::Event>,
    tasks: &[String],
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !tasks.iter().all(|t| created(seen).contains(t)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = tokio::time::timeout(left, rx.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "events for {tasks:?} did not come; seen {:?}",
                    created(seen)
                )
            })
            .expect("the stream ended");
        seen.push(e);
    }
}

/// Takes events from `rx` until the one numbered `last`; those taken.
async fn events_through(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<swarmtodo::proto::Event>,
    last: u64,
) -> Vec<swarmtodo::proto::Event> {
    let mut got = Vec::new();
    while got
        .last()
        .is_none_or(|e: &swarmtodo::proto::Event| e.seq < last)
    {
        let e = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("event {last} did not come; got {got:?}"))
            .expect("the stream ended");
        got.push(e);
    }
    got
}

/// How many times `hub` read a list's whole log for a list's past.
async fn log_reads(hub: &HubProc) -> u64 {
    hub.metric("swarmtodo_log_reads_total").await
}

/// At a hub of a cluster where a reader follows a list, readers that resume within its
/// last `STREAM_RECENT_MAX` events read them from memory, not the list's log — every
/// reader reconnecting after a failover resumes so — and each gets exactly the events
/// after the one it names; a reader from further back reads the log, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_resuming_within_the_last_events_read_them_from_memory_not_the_log() {
    use swarmtodo::hub::limits::STREAM_RECENT_MAX;

    let (_nats, _dir, a, b) = two_hubs("recent");
    lead(&a).create("plan").await.unwrap();
    // More events than the follower keeps.
    let mut written = Vec::new();
    for i in 0..STREAM_RECENT_MAX + 20 {
        let id = format!("t{i}");
        lead(&a).write("plan", &upsert(&id)).await.unwrap();
        written.push(id);
    }
    // A reader at hub-b, which does not hold the list; once it hears a write made after
    // it began, the follower of the log there has read the log.
    let mut follower = follow_events(&b, "plan", 0);
    let mut seen = Vec::new();
    events_creating(&mut follower, &mut seen, &written).await;
    lead(&a).write("plan", &upsert("last")).await.unwrap();
    written.push("last".to_owned());
    events_creating(&mut follower, &mut seen, &written).await;
    let last = seen.last().unwrap().seq;
    assert_eq!(
        seen.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=last).collect::<Vec<_>>()
    );
    let after = |from: u64| -> Vec<_> {
        seen.iter()
            .filter(|e| e.seq > from)
            .map(|e| (e.seq, e.body.clone()))
            .collect()
    };
    let resumed = |from: u64| {
        let mut rx = follow_events(&b, "plan", from);
        async move {
            let got = events_through(&mut rx, last).await;
            got.into_iter().map(|e| (e.seq, e.body)).collect::<Vec<_>>()
        }
    };
    let reads = log_reads(&b).await;
    let window = STREAM_RECENT_MAX as u64;
    for from in [last - 1, last - 10, last - window] {
        assert_eq!(
            resumed(from).await,
            after(from),
            "a reader from event {from}"
        );
    }
    assert_eq!(log_reads(&b).await, reads, "a resuming reader read the log");
    // From one event further back than the follower keeps: the log, once.
    let from = last - window - 1;
    assert_eq!(resumed(from).await, after(from));
    assert_eq!(log_reads(&b).await, reads + 1);
}

/// The JSON API's event stream at a hub that does not hold the list carries its events
/// live, numbered as at the holder, each once and in order — also while the holder is
/// killed and another hub takes the list, without the reader reconnecting. A task's
/// history reads the same at every hub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_at_any_hub_carries_every_event_once_through_a_failover() {
    let (nats, dir, a, b) = two_hubs("events");
    let c = hub_in(&nats, &dir, "hub-c");
    lead(&a).create("plan").await.unwrap();
    let mut written = Vec::new();
    for i in 0..3 {
        let id = format!("t{i}");
        lead(&a).write("plan", &upsert(&id)).await.unwrap();
        written.push(id);
    }
    // A reader at hub-b, which does not hold the list, from the start.
    let mut at_b = follow_events(&b, "plan", 0);
    let mut seen = Vec::new();
    events_creating(&mut at_b, &mut seen, &written).await;
    // Writes at hub-c, decided by hub-a: they reach the reader at hub-b live, past a
    // rollup (every 25 commits here).
    for i in 3..30 {
        let id = format!("t{i}");
        lead(&c).write("plan", &upsert(&id)).await.unwrap();
        written.push(id);
    }
    events_creating(&mut at_b, &mut seen, &written).await;
    assert_eq!(
        forwarded(&b).await,
        1,
        "hub-b forwarded only the stream's snapshot"
    );

    // hub-a dies; writes at hub-c go on once the list moves. The reader at hub-b goes
    // on too, on the same stream.
    a.kill9();
    let (_, waited) = read_when_held(&c, "plan").await;
    for i in 30..35 {
        let id = format!("t{i}");
        lead(&c).write("plan", &upsert(&id)).await.unwrap();
        written.push(id);
    }
    events_creating(&mut at_b, &mut seen, &written).await;
    let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "each event once, in order (the list moved after {waited:?})"
    );

    // A reader at hub-c, the holder now, from event 10: the same events, numbered alike.
    let mut at_c = follow_events(&c, "plan", 10);
    let mut from_c = Vec::new();
    events_creating(&mut at_c, &mut from_c, &written[10..]).await;
    let same: Vec<_> = seen
        .iter()
        .filter(|e| e.seq > 10)
        .take(from_c.len())
        .collect();
    assert_eq!(
        from_c.iter().map(|e| (e.seq, &e.body)).collect::<Vec<_>>(),
        same.iter().map(|e| (e.seq, &e.body)).collect::<Vec<_>>()
    );

    // A task's history at hub-b (which never held the list) and at hub-c, the holder.
    let at_holder = lead(&c).history("plan", "t7", None).await.unwrap();
    let elsewhere = lead(&b).history("plan", "t7", None).await.unwrap();
    assert!(!at_holder.entries.is_empty());
    assert_eq!(elsewhere, at_holder);
    let e = lead(&b)
        .history("nothing-here", "t1", None)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, HttpError::Api(e) if e.code == ErrorCode::UnknownList),
        "{e}"
    );
}

/// The index of lists at a hub, until `done` holds of it (or the test fails).
async fn index_until(
    hub: &HubProc,
    token: &str,
    done: impl Fn(&[swarmtodo::proto::ListSummary]) -> bool,
) -> Vec<swarmtodo::proto::ListSummary> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = Api::new(&hub.url)
                .unwrap()
                .token(token)
                .lists(after.as_deref())
                .await
                .unwrap();
            all.extend(page.lists);
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        if done(&all) {
            return all;
        }
        assert!(Instant::now() < deadline, "the index never came: {all:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every hub of a cluster answers the index with every list of the cluster, as their
/// holders last stored them, and admits the tokens any hub made for delegated tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_hub_lists_every_list_and_admits_every_made_token() {
    use crate::common::{LEAD_TOKEN, TOKENS_CONFIG};

    let nats = NatsServer::start("hubs-directory");
    let dir = scratch("cluster-directory");
    let [a, b, c] = ["hub-a", "hub-b", "hub-c"]
        .map(|id| hub_configured(&nats.url, &dir, id, 1000, TOKENS_CONFIG));
    let as_lead = |hub: &HubProc| Api::new(&hub.url).unwrap().token(LEAD_TOKEN);
    // hub-a makes "alpha" with two tasks; hub-b makes "beta" with one.
    as_lead(&a).create("alpha").await.unwrap();
    as_lead(&a).write("alpha", &upsert("t1")).await.unwrap();
    as_lead(&a).write("alpha", &upsert("t2")).await.unwrap();
    as_lead(&b).create("beta").await.unwrap();
    as_lead(&b).write("beta", &upsert("u1")).await.unwrap();
    // hub-c, which holds neither, lists both with their tasks (summaries are stored at
    // most once a second: the last comes a moment later).
    let counts = |all: &[swarmtodo::proto::ListSummary]| -> Vec<(Option<String>, u64)> {
        all.iter()
            .map(|l| (l.name.clone(), l.tasks.pending))
            .collect()
    };
    let want = vec![(Some("alpha".to_owned()), 2), (Some("beta".to_owned()), 1)];
    let listed = index_until(&c, LEAD_TOKEN, |all| counts(all) == want).await;
    assert!(listed.iter().all(|l| l.version.is_some()), "{listed:?}");

    // A task of alpha delegated at hub-a: its token works at hub-b and hub-c, which never
    // made it (a write at hub-b is decided by hub-a).
    let delegated = as_lead(&a)
        .delegate("alpha", "t1", "sub", Some("alpha-t1"))
        .await
        .unwrap();
    let token = delegated.token.expect("a hub with tokens makes one");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sub = Api::new(&b.url).unwrap().token(&token);
        match sub.write("alpha-t1", &upsert("s1")).await {
            Ok(_) => break,
            Err(HttpError::Api(e)) if e.code == ErrorCode::Unauthorized => {
                assert!(
                    Instant::now() < deadline,
                    "hub-b never admitted the token: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let sub_at_c = Api::new(&c.url).unwrap().token(&token);
    assert_eq!(ids(&sub_at_c.read("alpha-t1", None).await.unwrap()), ["s1"]);
    // The token names its list only: a write to another list is refused.
    let e = Api::new(&c.url)
        .unwrap()
        .token(&token)
        .write("beta", &upsert("u2"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, HttpError::Api(e) if e.code == ErrorCode::Forbidden),
        "{e}"
    );
    // The delegated list is in the index too.
    index_until(&b, LEAD_TOKEN, |all| {
        all.iter()
            .any(|l| l.name.as_deref() == Some("alpha-t1") && l.tasks.pending == 1)
    })
    .await;

    // A hub that starts now hears the directory before it serves: its first answer
    // lists every list, and it admits the token at once.
    let d = hub_configured(&nats.url, &dir, "hub-d", 1000, TOKENS_CONFIG);
    let first = index_until(&d, LEAD_TOKEN, |_| true).await;
    let names: Vec<_> = first.iter().filter_map(|l| l.name.as_deref()).collect();
    assert_eq!(names, ["alpha", "alpha-t1", "beta"], "{first:?}");
    let sub_at_d = Api::new(&d.url).unwrap().token(&token);
    assert_eq!(ids(&sub_at_d.read("alpha-t1", None).await.unwrap()), ["s1"]);
}

/// A delegated task takes the status its list rolls up to when the two lists are held
/// by different hubs: the parent's holder hears the sub-list's counts from the cluster's
/// index, and the link from the cluster's directory (the hub that made both is dead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegated_task_rolls_up_when_its_list_and_its_parent_are_held_by_different_hubs() {
    use swarmtodo::proto::Status;

    let (nats, dir, a, b) = two_hubs("rollup");
    let c = hub_in(&nats, &dir, "hub-c");
    delegated_plan(&a).await;
    // hub-a, which made both lists and held both, dies: hub-c takes the parent, hub-b
    // the task's list.
    a.kill9();
    read_when_held(&c, "plan").await;
    read_when_held(&b, "plan-t1").await;
    let forwarded_before = forwarded(&c).await;
    let done =
        r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"s1","status":"completed"}}]}"#;
    lead(&b).write("plan-t1", done).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let plan = lead(&c).read("plan", None).await.unwrap();
        let t1 = plan.tasks.iter().find(|t| t.id == "t1").map(|t| t.status);
        if t1 == Some(Status::Completed) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "t1 is {t1:?}: it never rolled up from plan-t1 at hub-b into plan at hub-c"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        forwarded(&c).await,
        forwarded_before,
        "hub-c held the parent all along"
    );
}
