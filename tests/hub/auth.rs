//! Tokens, roles and the configuration file (docs/DESIGN.md §7):
//! a real hub process started with `--config`, real clients.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::process::Command;

use crate::common::*;
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::model::TodoList;
use swarmtodo::proto::{EventBody, Rule, Status, TaskPatch};

const CONFIG: &str = r#"
log = "warn"

[policy]
ownership = "repair"

[[tokens]]
token = "lead-token-0123456789"
agent = "lead"
role = "lead"
lists = { "board" = "observer" }

[[tokens]]
token = "worker-token-0123456789"
agent = "sub-a"
role = "worker"

[[tokens]]
token = "observer-token-0123456789"
agent = "dashboard"
role = "observer"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_admit_agents_with_their_roles() {
    let (hub, _dir) = hub_with_config("auth", CONFIG);
    let doc = list_document_id("secured");

    // No token, or an unknown one: refused at the WebSocket upgrade, with a reason.
    for url in [hub.url.clone(), with_token(&hub.url, "nope-nope-nope-nope")] {
        let err = Connection::connect(&url, "stranger").await.unwrap_err();
        assert!(err.to_string().contains("401"), "{url}: {err}");
    }

    // The lead plans, t1 owned by the lead.
    let mut lead = planned();
    write(
        &mut lead,
        "lead",
        patch(vec![upsert(TaskPatch {
            owner: Some(Some("lead".into())),
            ..task("t1", "Read the issue")
        })]),
    );
    let mut c_lead = Connection::connect(&with_token(&hub.url, "lead-token-0123456789"), "lead")
        .await
        .unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();
    assert!(c_lead.in_sync(doc, &lead));

    // The worker (its role from its token) changes the lead's task: reported, repaired.
    let mut sub = TodoList::create(actor(2));
    let mut c_sub = Connection::connect(&with_token(&hub.url, "worker-token-0123456789"), "sub-a")
        .await
        .unwrap();
    c_sub.sync(doc, &mut sub).await.unwrap();
    write(
        &mut sub,
        "sub-a",
        patch(vec![upsert(status("t1", Status::Cancelled))]),
    );
    c_sub.sync(doc, &mut sub).await.unwrap();
    c_sub.sync(doc, &mut sub).await.unwrap();
    let events = c_sub.take_events();
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.body, EventBody::Violation(v) if v.rule == Rule::Ownership)),
        "{events:?}"
    );
    let t1 = sub.read().tasks.into_iter().find(|t| t.id == "t1").unwrap();
    assert_eq!(
        t1.status,
        Status::Pending,
        "the worker's change to the lead's task was undone"
    );

    // The worker's token, a new replica that registers itself as "lead" in the list:
    // the token says who it is, not the document.
    let mut spoof = TodoList::create(actor(5));
    let mut c_spoof =
        Connection::connect(&with_token(&hub.url, "worker-token-0123456789"), "sub-a-2")
            .await
            .unwrap();
    c_spoof.sync(doc, &mut spoof).await.unwrap();
    write(
        &mut spoof,
        "lead",
        patch(vec![upsert(status("t1", Status::Cancelled))]),
    );
    c_spoof.sync(doc, &mut spoof).await.unwrap();
    c_spoof.sync(doc, &mut spoof).await.unwrap();
    let t1 = spoof
        .read()
        .tasks
        .into_iter()
        .find(|t| t.id == "t1")
        .unwrap();
    assert_eq!(
        t1.status,
        Status::Pending,
        "a worker calling itself lead is still a worker"
    );

    // The observer reads, and may not write.
    let mut obs = TodoList::create(actor(3));
    let mut c_obs = Connection::connect(
        &with_token(&hub.url, "observer-token-0123456789"),
        "dashboard",
    )
    .await
    .unwrap();
    c_obs.sync(doc, &mut obs).await.unwrap();
    assert_eq!(obs.read().tasks.len(), 3);
    write(
        &mut obs,
        "dashboard",
        patch(vec![upsert(task("t9", "Sneaky"))]),
    );
    let err = c_obs.sync(doc, &mut obs).await.unwrap_err();
    assert!(err.to_string().contains("observer"), "{err}");
    c_lead.sync(doc, &mut lead).await.unwrap();
    assert!(lead.read().tasks.iter().all(|t| t.id != "t9"));

    // Per-list roles: the lead is only an observer of "board".
    let board = list_document_id("board");
    let mut b = planned();
    let err = c_lead.sync(board, &mut b).await.unwrap_err();
    assert!(err.to_string().contains("observer"), "{err}");
    drop(hub);
}

fn serve_fails(args: &[&str]) -> String {
    let out = crate::common::dies_with_parent(&mut Command::new(env!("CARGO_BIN_EXE_swarmtodo")))
        .arg("serve")
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_bad_config_or_an_open_public_hub_is_refused_with_the_reason() {
    let dir = scratch("auth-config");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[policy]\nsingle_active = \"ignore\"\n").unwrap();
    let err = serve_fails(&["--config", bad.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    assert!(
        err.contains("single_active") && err.contains("bad.toml"),
        "{err}"
    );
    std::fs::write(
        &bad,
        "[[tokens]]\ntoken = \"short\"\nagent = \"a\"\nrole = \"lead\"\n",
    )
    .unwrap();
    let err = serve_fails(&["--config", bad.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    assert!(err.contains("tokens[0].token"), "{err}");
    let err = serve_fails(&[
        "--listen",
        "0.0.0.0:0",
        "--data",
        dir.join("x.db").to_str().unwrap(),
    ]);
    assert!(err.contains("needs tokens"), "{err}");
}
