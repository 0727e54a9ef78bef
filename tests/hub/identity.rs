//! Identities against a real `swarmtodo serve` with tokens: a worker that writes with the
//! lead's actor id (a real automerge-repo peer, `tests/js/forge_actor.mjs`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::time::Duration;

use crate::common::*;
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::model::TodoList;

fn content(list: &TodoList, id: &str) -> String {
    list.read()
        .tasks
        .into_iter()
        .find(|t| t.id == id)
        .map(|t| t.content)
        .unwrap_or_default()
}

/// A worker clones the list with the lead's actor id and edits a lead task, with the
/// sequence number the lead's next change will have: the hub refuses the forged change
/// before merging it (`actor_forged`), nobody ever sees its text, and the lead's own
/// change with that actor and sequence number merges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_writing_with_the_leads_actor_is_refused_and_the_lead_keeps_syncing() {
    let (hub, _dir) = hub_with_config("identity-forge", TOKENS_CONFIG);
    let doc = list_document_id("forged");

    // The lead plans with actor 1 (its first change binds the actor to "lead").
    let mut lead = planned();
    let mut c_lead = Connection::connect(&with_token(&hub.url, LEAD_TOKEN), "lead")
        .await
        .unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();
    let mut obs = TodoList::create(actor(3));
    let mut c_obs = Connection::connect(&with_token(&hub.url, OBSERVER_TOKEN), "dashboard")
        .await
        .unwrap();
    c_obs.sync(doc, &mut obs).await.unwrap();

    // Wendy, a worker, writes as the lead's actor.
    let report = run_js(
        "forge_actor.mjs",
        &[
            with_token(&hub.url, WORKER_TOKEN),
            doc.to_string(),
            actor(1).to_hex_string(),
            "t1".to_owned(),
            "FORGED BY WENDY".to_owned(),
        ],
    )
    .await;
    eprintln!("forger: {report}");

    // The lead's next change has the same actor and sequence number as the forgery.
    write(
        &mut lead,
        "lead",
        patch(vec![upsert(task("t2", "The lead's own edit"))]),
    );
    tokio::time::timeout(Duration::from_secs(10), c_lead.sync(doc, &mut lead))
        .await
        .expect("the lead's change is acknowledged (not refused as a duplicate seq)")
        .unwrap();
    assert!(
        c_lead.in_sync(doc, &lead),
        "{}",
        c_lead.debug_state(doc, &lead)
    );
    c_obs.sync(doc, &mut obs).await.unwrap();
    let mut fresh = TodoList::create(actor(4));
    let mut c_fresh = Connection::connect(&with_token(&hub.url, OBSERVER_TOKEN), "fresh")
        .await
        .unwrap();
    c_fresh.sync(doc, &mut fresh).await.unwrap();
    for (who, list) in [("lead", &lead), ("observer", &obs), ("fresh peer", &fresh)] {
        assert_eq!(content(list, "t1"), "Read the issue", "{who} sees t1");
        assert_eq!(content(list, "t2"), "The lead's own edit", "{who} sees t2");
    }
    assert_eq!(
        report["close"]["reason"], "actor_forged",
        "the forger is told why: {report}"
    );
    assert!(
        report["errors"][0]
            .as_str()
            .is_some_and(|m| m.contains("actor id of your own")),
        "the forger is told what to do: {report}"
    );

    // The lead keeps writing with its actor.
    write(
        &mut lead,
        "lead",
        patch(vec![upsert(task("t3", "And another"))]),
    );
    c_lead.sync(doc, &mut lead).await.unwrap();
    c_obs.sync(doc, &mut obs).await.unwrap();
    assert_eq!(content(&obs, "t3"), "And another");
    drop(hub);
}
