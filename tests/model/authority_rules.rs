//! One test per invariant of docs/DESIGN.md §4. Every violation comes from real concurrent
//! replicas: forks of one list, edited apart and merged into the hub's replica.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use crate::common::*;
use swarmtodo::authority::{Action, ActiveScope, Authority, Policy, Report, Role, Roles};
use swarmtodo::model::TodoList;
use swarmtodo::proto::{Resolution, Rule, Status, TaskPatch};

fn authority(policy: Policy) -> Authority {
    Authority::new("hub", policy, Roles::default())
}

/// Merges each replica into the hub in turn, running the authority after each merge.
fn merge_all(hub: &mut TodoList, auth: &mut Authority, replicas: &[&TodoList]) -> Report {
    let mut all = Report::default();
    for (i, r) in replicas.iter().enumerate() {
        let m = hub.merge_from(r).unwrap();
        let rep = auth.process(hub, m, 10_000 + i as i64).unwrap();
        all.violations.extend(rep.violations);
        all.conflicts.extend(rep.conflicts);
        all.repairs.extend(rep.repairs);
    }
    all
}

fn in_progress(list: &TodoList) -> Vec<String> {
    list.read()
        .tasks
        .into_iter()
        .filter(|t| t.status == Status::InProgress)
        .map(|t| t.id)
        .collect()
}

// ---- rule 1: schema ----------------------------------------------------------------

/// `(written status, repaired to)`; `None`: reported only.
#[test]
fn schema_invalid_values_are_repaired_to_what_they_mean() {
    let cases: &[(&str, &str, &str)] = &[
        ("status", "done", "completed"),
        ("status", "In Progress", "in_progress"),
        ("status", "canceled", "cancelled"),
        ("status", "bogus", "pending"),
        ("priority", "urgent", "medium"),
        ("priority", "HIGH", "high"),
    ];
    for (field, written, repaired) in cases {
        let mut hub = hub_with(&["t1"]);
        let mut auth = authority(Policy::default());
        let mut peer = RawPeer::fork(&hub, 7, "js-agent");
        peer.put("t1", field, written);
        let m = hub.apply_changes(peer.changes_for(&hub)).unwrap();
        let rep = auth.process(&mut hub, m, 1).unwrap();
        assert_eq!(rep.violations.len(), 1, "{field}={written}");
        let v = &rep.violations[0];
        assert_eq!(v.rule, Rule::Schema);
        assert_eq!(v.tasks, vec!["t1"]);
        assert_eq!(v.agents, vec!["js-agent"]);
        assert_eq!(v.values[0].value, *written);
        assert!(matches!(v.resolution, Resolution::Repaired { .. }));
        let raw = hub.raw_task("t1").unwrap();
        let stored = if *field == "status" {
            &raw.status
        } else {
            &raw.priority
        };
        assert_eq!(stored.as_deref(), Some(*repaired), "{field}={written}");
        assert_eq!(rep.repairs.len(), 1, "one repair change");
        // The repair itself is valid: a full check finds nothing new.
        assert!(auth.check_all(&hub).violations.is_empty());
    }
}

#[test]
fn schema_empty_content_is_reported_not_invented() {
    let mut hub = hub_with(&["t1"]);
    let mut auth = authority(Policy::default());
    let mut peer = RawPeer::fork(&hub, 7, "js-agent");
    peer.put_text("t1", "content", "   ");
    let m = hub.apply_changes(peer.changes_for(&hub)).unwrap();
    let rep = auth.process(&mut hub, m, 1).unwrap();
    assert_eq!(rep.violations.len(), 1);
    assert_eq!(rep.violations[0].resolution, Resolution::Reported);
    assert!(rep.repairs.is_empty());
    // Reported once: later merges touching the task do not repeat it.
    let mut lead = hub.fork(actor(0x21));
    write(
        &mut lead,
        "lead",
        patch(vec![upsert(status("t1", Status::Blocked))]),
    );
    let rep = merge_all(&mut hub, &mut auth, &[&lead]);
    assert!(rep.violations.is_empty(), "{:#?}", rep.violations);
}

#[test]
fn schema_report_policy_leaves_the_value() {
    let mut hub = hub_with(&["t1"]);
    let mut auth = authority(Policy {
        schema: Action::Report,
        ..Policy::default()
    });
    let mut peer = RawPeer::fork(&hub, 7, "js-agent");
    peer.put("t1", "status", "done");
    let m = hub.apply_changes(peer.changes_for(&hub)).unwrap();
    let rep = auth.process(&mut hub, m, 1).unwrap();
    assert_eq!(rep.violations[0].resolution, Resolution::Reported);
    assert_eq!(hub.raw_task("t1").unwrap().status.as_deref(), Some("done"));
    // Reads already show what the value means.
    assert_eq!(hub.read().tasks[0].status, Status::Completed);
}

// ---- rule 2: single active task -----------------------------------------------------

fn start(list: &mut TodoList, agent: &str, id: &str, owner: &str) {
    write(
        list,
        agent,
        patch(vec![upsert(TaskPatch {
            status: Some(Status::InProgress),
            owner: Some(Some(owner.into())),
            ..status(id, Status::InProgress)
        })]),
    );
}

#[test]
fn single_active_concurrent_starts_are_repaired_deterministically() {
    let hub0 = hub_with(&["t1", "t2", "t3"]);
    let mut a = hub0.fork(actor(1));
    let mut b = hub0.fork(actor(2));
    let mut c = hub0.fork(actor(3));
    start(&mut a, "sub-a", "t1", "bob");
    start(&mut b, "sub-b", "t2", "bob");
    start(&mut c, "sub-c", "t3", "bob");

    // Two hubs see the same changes in different orders.
    let mut h1 = hub0.fork(actor(0xB1));
    let mut h2 = hub0.fork(actor(0xB2));
    let mut auth1 = authority(Policy::default());
    let mut auth2 = authority(Policy::default());
    let r1 = merge_all(&mut h1, &mut auth1, &[&a, &b, &c]);
    let r2 = merge_all(&mut h2, &mut auth2, &[&c, &a, &b]);
    for (h, r) in [(&h1, &r1), (&h2, &r2)] {
        assert!(r.violations.iter().all(|v| v.rule == Rule::SingleActive));
        assert!(!r.violations.is_empty());
        assert_eq!(in_progress(h).len(), 1, "{:?}", in_progress(h));
        for v in &r.violations {
            assert!(matches!(v.resolution, Resolution::Repaired { .. }));
        }
    }
    assert_eq!(
        in_progress(&h1),
        in_progress(&h2),
        "same repair in any order"
    );
    // The kept task is the one whose in_progress write comes last in Automerge's order
    // (equal counters: greatest actor), i.e. sub-c's t3.
    assert_eq!(in_progress(&h1), vec!["t3"]);

    // Everything converges, and no replica ever sees two tasks in progress after a sync
    // from the hub.
    h1.merge_from(&h2).unwrap();
    h2.merge_from(&h1).unwrap();
    assert_eq!(h1.version(), h2.version());
    assert_eq!(in_progress(&h1), vec!["t3"]);
}

#[test]
fn single_active_one_batch_gives_one_violation_with_all_agents() {
    let hub0 = hub_with(&["t1", "t2"]);
    let mut a = hub0.fork(actor(1));
    let mut b = hub0.fork(actor(2));
    start(&mut a, "sub-a", "t1", "bob");
    start(&mut b, "sub-b", "t2", "bob");
    let mut hub = hub0.fork(actor(0xB1));
    let mut changes = a.changes_since(&hub0.heads());
    changes.extend(b.changes_since(&hub0.heads()));
    let m = hub.apply_changes(changes).unwrap();
    let mut auth = authority(Policy::default());
    let rep = auth.process(&mut hub, m, 5).unwrap();
    assert_eq!(rep.violations.len(), 1);
    let v = &rep.violations[0];
    assert_eq!(v.tasks, vec!["t1", "t2"]);
    assert_eq!(v.agents, vec!["sub-a", "sub-b"]);
    assert_eq!(v.changes.len(), 2);
    assert_eq!(v.values.len(), 2);
    assert!(v.values.iter().all(|w| w.value == "in_progress"));
}

#[test]
fn single_active_per_owner_allows_two_owners_per_list_does_not() {
    for (scope, expected) in [(ActiveScope::PerOwner, 0), (ActiveScope::PerList, 1)] {
        let hub0 = hub_with(&["t1", "t2"]);
        let mut a = hub0.fork(actor(1));
        let mut b = hub0.fork(actor(2));
        start(&mut a, "alice", "t1", "alice");
        start(&mut b, "bob", "t2", "bob");
        let mut hub = hub0.fork(actor(0xB1));
        let mut auth = authority(Policy {
            single_active_scope: scope,
            ..Policy::default()
        });
        let rep = merge_all(&mut hub, &mut auth, &[&a, &b]);
        assert_eq!(rep.violations.len(), expected, "{scope:?}");
    }
}

#[test]
fn single_active_report_policy_reports_once() {
    let hub0 = hub_with(&["t1", "t2", "t3"]);
    let mut a = hub0.fork(actor(1));
    let mut b = hub0.fork(actor(2));
    start(&mut a, "sub-a", "t1", "bob");
    start(&mut b, "sub-b", "t2", "bob");
    let mut hub = hub0.fork(actor(0xB1));
    let mut auth = authority(Policy {
        single_active: Action::Report,
        ..Policy::default()
    });
    let rep = merge_all(&mut hub, &mut auth, &[&a, &b]);
    assert_eq!(rep.violations.len(), 1);
    assert_eq!(rep.violations[0].resolution, Resolution::Reported);
    assert_eq!(in_progress(&hub).len(), 2);
    // An unrelated edit of one of the two tasks does not re-report the same state.
    let mut c = hub.fork(actor(3));
    write(
        &mut c,
        "lead",
        patch(vec![upsert(TaskPatch {
            id: Some("t1".into()),
            content: Some("Do t1 carefully".into()),
            ..TaskPatch::default()
        })]),
    );
    let rep = merge_all(&mut hub, &mut auth, &[&c]);
    assert!(rep.violations.is_empty(), "{:#?}", rep.violations);
    // Across a restart, the persisted keys keep it reported once.
    let keys: Vec<String> = auth.reported().map(str::to_owned).collect();
    let mut restarted = authority(Policy {
        single_active: Action::Report,
        ..Policy::default()
    })
    .with_reported(keys);
    assert!(restarted.check_all(&hub).violations.is_empty());
    // Without them, the same state would be reported again: the keys are what matter.
    let mut amnesiac = authority(Policy {
        single_active: Action::Report,
        ..Policy::default()
    });
    assert_eq!(amnesiac.check_all(&hub).violations.len(), 1);
}

// ---- rule 3: dependencies -----------------------------------------------------------

fn depend(list: &mut TodoList, agent: &str, id: &str, on: &[&str]) {
    write(
        list,
        agent,
        patch(vec![upsert(TaskPatch {
            id: Some(id.into()),
            blocked_by: Some(on.iter().map(|s| (*s).to_owned()).collect()),
            ..TaskPatch::default()
        })]),
    );
}

#[test]
fn dependency_on_concurrently_removed_task() {
    for action in [Action::Report, Action::Repair] {
        let hub0 = hub_with(&["t1", "t2"]);
        let mut a = hub0.fork(actor(1));
        let mut b = hub0.fork(actor(2));
        depend(&mut a, "alice", "t2", &["t1"]);
        write(
            &mut b,
            "bob",
            patch(vec![swarmtodo::proto::PatchOp::Remove { id: "t1".into() }]),
        );
        let mut hub = hub0.fork(actor(0xB1));
        let mut auth = authority(Policy {
            dependencies: action,
            ..Policy::default()
        });
        let rep = merge_all(&mut hub, &mut auth, &[&a, &b]);
        assert_eq!(rep.violations.len(), 1, "{action:?}");
        let v = &rep.violations[0];
        assert_eq!(v.rule, Rule::Dependencies);
        assert_eq!(v.tasks, vec!["t2"]);
        let deps = &hub.raw_task("t2").unwrap().blocked_by;
        match action {
            Action::Report => assert_eq!(deps, &vec!["t1".to_owned()]),
            Action::Repair => assert!(deps.is_empty()),
        }
    }
}

#[test]
fn dependency_cycle_from_two_concurrent_edges() {
    for action in [Action::Report, Action::Repair] {
        let hub0 = hub_with(&["t1", "t2"]);
        let mut a = hub0.fork(actor(1));
        let mut b = hub0.fork(actor(2));
        depend(&mut a, "alice", "t1", &["t2"]);
        depend(&mut b, "bob", "t2", &["t1"]);
        let mut hub = hub0.fork(actor(0xB1));
        let mut auth = authority(Policy {
            dependencies: action,
            ..Policy::default()
        });
        let rep = merge_all(&mut hub, &mut auth, &[&a, &b]);
        assert_eq!(rep.violations.len(), 1, "{:#?}", rep.violations);
        let v = &rep.violations[0];
        assert_eq!(v.tasks, vec!["t1", "t2"]);
        assert_eq!(v.agents, vec!["alice", "bob"]);
        match action {
            Action::Report => {
                assert_eq!(v.resolution, Resolution::Reported);
                assert!(auth.check_all(&hub).violations.is_empty(), "reported once");
            }
            Action::Repair => {
                // Broken at the greatest id: t2 no longer waits on t1.
                assert!(hub.raw_task("t2").unwrap().blocked_by.is_empty());
                assert_eq!(hub.raw_task("t1").unwrap().blocked_by, vec!["t2"]);
                assert!(authority(Policy::default())
                    .check_all(&hub)
                    .violations
                    .is_empty());
            }
        }
    }
}

/// A chain of `n` tasks, each blocked by the one before, written by the lead in one
/// change and merged into a fresh hub replica.
fn chain(n: usize) -> (TodoList, TodoList) {
    let hub = TodoList::create(actor(0xA0));
    let mut lead = hub.fork(actor(0xA1));
    let ops = (0..n)
        .map(|i| {
            upsert(TaskPatch {
                blocked_by: Some(if i == 0 {
                    Vec::new()
                } else {
                    vec![format!("c{}", i - 1)]
                }),
                ..task(&format!("c{i}"), "Take the next step")
            })
        })
        .collect();
    write(&mut lead, "lead", patch(ops));
    (hub, lead)
}

/// A chain of 2,000 dependencies costs each check one visit per task reachable from what
/// changed (a walk per task with a copied path was about the cube of the length: the
/// hub's task stalled for over a minute); closing it into a cycle is one violation.
#[test]
fn a_dependency_chain_costs_one_visit_per_task() {
    let n = 2_000;
    let (mut hub, mut lead) = chain(n);
    let mut auth = authority(Policy::default());
    let rep = merge_all(&mut hub, &mut auth, &[&lead]);
    assert!(rep.violations.is_empty(), "{:#?}", rep.violations);
    let first = auth.dependency_visits();
    assert!(first <= n, "the upload visited {first} tasks for {n}");

    // A content edit changes no dependency: no walk at all.
    write(
        &mut lead,
        "lead",
        patch(vec![upsert(task("c1000", "Edited"))]),
    );
    merge_all(&mut hub, &mut auth, &[&lead]);
    assert_eq!(auth.dependency_visits(), first);

    // Closing the chain (c0 waits for the last): todo_write refuses it …
    let close = patch(vec![upsert(TaskPatch {
        id: Some("c0".into()),
        blocked_by: Some(vec![format!("c{}", n - 1)]),
        ..TaskPatch::default()
    })]);
    let refused = lead
        .write(&close, &swarmtodo::model::WriteContext::new("lead", 1, 1))
        .unwrap_err();
    assert!(
        refused.message.contains("cycle of 2000 tasks"),
        "{}",
        refused.message
    );
    // … and a raw peer that writes it anyway is reported once, at the same cost.
    let mut raw = RawPeer::fork(&hub, 9, "mallory");
    let tasks = automerge::ReadDoc::get(&raw.doc, automerge::ROOT, "tasks")
        .unwrap()
        .unwrap()
        .1;
    let c0 = automerge::ReadDoc::get(&raw.doc, &tasks, "c0")
        .unwrap()
        .unwrap()
        .1;
    let deps = automerge::ReadDoc::get(&raw.doc, &c0, "blocked_by")
        .unwrap()
        .unwrap()
        .1;
    let mut tx = raw.doc.transaction();
    automerge::transaction::Transactable::insert(&mut tx, &deps, 0, format!("c{}", n - 1)).unwrap();
    tx.commit();
    let m = hub.apply_changes(raw.changes_for(&hub)).unwrap();
    let before = auth.dependency_visits();
    let rep = auth.process(&mut hub, m, 20_000).unwrap();
    let cycles: Vec<_> = rep
        .violations
        .iter()
        .filter(|v| v.message.starts_with("dependency cycle"))
        .collect();
    assert_eq!(cycles.len(), 1, "{:#?}", rep.violations);
    assert_eq!(cycles[0].tasks_total, n as u64);
    assert!(cycles[0].tasks.len() <= swarmtodo::proto::VIOLATION_TASKS_MAX);
    let walked = auth.dependency_visits() - before;
    assert!(walked <= 2 * n, "closing the cycle visited {walked} tasks");
}

#[test]
fn completed_while_dependency_reopened_concurrently() {
    let mut hub0 = hub_with(&["t1", "t2"]);
    let mut lead = hub0.fork(actor(0x21));
    write(
        &mut lead,
        "lead",
        patch(vec![upsert(status("t1", Status::Completed))]),
    );
    depend(&mut lead, "lead", "t2", &["t1"]);
    hub0.merge_from(&lead).unwrap();
    let mut a = hub0.fork(actor(1));
    let mut b = hub0.fork(actor(2));
    write(
        &mut a,
        "alice",
        patch(vec![upsert(status("t2", Status::Completed))]),
    );
    write(
        &mut b,
        "bob",
        patch(vec![upsert(status("t1", Status::Pending))]),
    );
    let mut hub = hub0.fork(actor(0xB1));
    let mut auth = authority(Policy::default());
    let rep = merge_all(&mut hub, &mut auth, &[&a, &b]);
    assert_eq!(rep.violations.len(), 1, "{:#?}", rep.violations);
    let v = &rep.violations[0];
    assert_eq!(v.rule, Rule::Dependencies);
    assert_eq!(v.tasks, vec!["t1", "t2"]);
    assert_eq!(v.resolution, Resolution::Reported);
}

// ---- rule 4: ownership --------------------------------------------------------------

fn roles() -> Roles {
    let mut r = Roles::default();
    r.by_agent.insert("w1".into(), Role::Worker);
    r.by_agent.insert("obs".into(), Role::Observer);
    r
}

fn owned_hub() -> TodoList {
    let mut hub = hub_with(&["mine", "theirs", "free"]);
    let mut lead = hub.fork(actor(0x21));
    let own = |id: &str, o: &str| {
        upsert(TaskPatch {
            id: Some(id.into()),
            owner: Some(Some(o.into())),
            ..TaskPatch::default()
        })
    };
    write(
        &mut lead,
        "lead",
        patch(vec![own("mine", "w1"), own("theirs", "w2")]),
    );
    hub.merge_from(&lead).unwrap();
    hub
}

/// A worker's one change to 1,000 tasks it does not own: 1,000 violations, each
/// repaired, in one repair change whose message (quoted by the `repaired` event) names
/// a bounded number of them; every event stays far below what the store keeps.
#[test]
fn ownership_over_thousands_of_tasks_makes_bounded_events() {
    let n = 1_000;
    let ids: Vec<String> = (0..n).map(|i| format!("task-{i:05}")).collect();
    let mut hub = hub_with(&ids.iter().map(String::as_str).collect::<Vec<_>>());
    let mut lead = hub.fork(actor(0x21));
    let ops = ids
        .iter()
        .map(|id| {
            upsert(TaskPatch {
                id: Some(id.clone()),
                owner: Some(Some("w2".into())),
                ..TaskPatch::default()
            })
        })
        .collect();
    write(&mut lead, "lead", patch(ops));
    hub.merge_from(&lead).unwrap();
    let mut w = hub.fork(actor(5));
    let ops = ids
        .iter()
        .map(|id| upsert(task(id, "Taken over")))
        .collect();
    write(&mut w, "w1", patch(ops));
    let mut auth = Authority::new("hub", Policy::default(), roles());
    let rep = merge_all(&mut hub, &mut auth, &[&w]);
    assert_eq!(rep.violations.len(), n);
    assert!(hub
        .read()
        .tasks
        .iter()
        .all(|t| t.content.starts_with("Do ")));
    let message = rep.repairs[0].changes[0].change.message().unwrap().len();
    assert!(message < 32 * 1024, "a repair message of {message} bytes");
    for v in &rep.violations {
        let bytes = serde_json::to_vec(v).unwrap().len();
        assert!(bytes < 64 * 1024, "a violation of {bytes} bytes");
    }
}

#[test]
fn ownership_worker_may_change_own_and_claim_free_tasks() {
    let hub0 = owned_hub();
    let mut w = hub0.fork(actor(5));
    write(
        &mut w,
        "w1",
        patch(vec![upsert(status("mine", Status::Completed))]),
    );
    write(
        &mut w,
        "w1",
        patch(vec![upsert(TaskPatch {
            owner: Some(Some("w1".into())),
            ..status("free", Status::InProgress)
        })]),
    );
    let mut hub = hub0.fork(actor(0xB1));
    let mut auth = Authority::new("hub", Policy::default(), roles());
    let rep = merge_all(&mut hub, &mut auth, &[&w]);
    assert!(rep.violations.is_empty(), "{:#?}", rep.violations);
}

#[test]
fn ownership_worker_changing_anothers_task_is_reverted() {
    let hub0 = owned_hub();
    let mut w = hub0.fork(actor(5));
    write(
        &mut w,
        "w1",
        patch(vec![upsert(TaskPatch {
            content: Some("Hijacked".into()),
            ..status("theirs", Status::Cancelled)
        })]),
    );
    let mut hub = hub0.fork(actor(0xB1));
    let mut auth = Authority::new("hub", Policy::default(), roles());
    let rep = merge_all(&mut hub, &mut auth, &[&w]);
    assert_eq!(rep.violations.len(), 1, "{:#?}", rep.violations);
    let v = &rep.violations[0];
    assert_eq!(v.rule, Rule::Ownership);
    assert_eq!(v.tasks, vec!["theirs"]);
    assert_eq!(v.agents, vec!["w1"]);
    let t = hub
        .read()
        .tasks
        .into_iter()
        .find(|t| t.id == "theirs")
        .unwrap();
    assert_eq!(t.status, Status::Pending);
    assert_eq!(t.content, "Do theirs");
    assert_eq!(t.owner.as_deref(), Some("w2"));
}

#[test]
fn ownership_worker_deleting_or_giving_away_is_reverted_observer_may_not_write() {
    let hub0 = owned_hub();
    let mut w = hub0.fork(actor(5));
    write(
        &mut w,
        "w1",
        patch(vec![swarmtodo::proto::PatchOp::Remove {
            id: "theirs".into(),
        }]),
    );
    let mut o = hub0.fork(actor(6));
    write(
        &mut o,
        "obs",
        patch(vec![upsert(status("free", Status::Blocked))]),
    );
    let mut hub = hub0.fork(actor(0xB1));
    let mut auth = Authority::new("hub", Policy::default(), roles());
    let rep = merge_all(&mut hub, &mut auth, &[&w, &o]);
    assert_eq!(rep.violations.len(), 2, "{:#?}", rep.violations);
    assert!(rep.violations.iter().all(|v| v.rule == Rule::Ownership));
    let snap = hub.read();
    let theirs = snap
        .tasks
        .iter()
        .find(|t| t.id == "theirs")
        .expect("restored");
    assert_eq!(theirs.owner.as_deref(), Some("w2"));
    let free = snap.tasks.iter().find(|t| t.id == "free").unwrap();
    assert_eq!(free.status, Status::Pending);
    assert_eq!(snap.tasks.len(), 3);
}

// ---- rule 5: conflicts --------------------------------------------------------------

#[test]
fn concurrent_writes_to_one_field_are_reported_with_the_winner() {
    let hub0 = hub_with(&["t1"]);
    let mut a = hub0.fork(actor(1));
    let mut b = hub0.fork(actor(2));
    write(
        &mut a,
        "alice",
        patch(vec![upsert(task("t1", "Run unit tests"))]),
    );
    write(
        &mut b,
        "bob",
        patch(vec![upsert(task("t1", "Run all tests"))]),
    );
    let mut hub = hub0.fork(actor(0xB1));
    let mut auth = authority(Policy::default());
    let rep = merge_all(&mut hub, &mut auth, &[&a, &b]);
    assert!(rep.violations.is_empty(), "the merged state is valid");
    assert_eq!(rep.conflicts.len(), 1);
    let c = &rep.conflicts[0];
    assert_eq!((c.task.as_str(), c.field.as_str()), ("t1", "content"));
    assert_eq!(c.agents, vec!["alice", "bob"]);
    assert_eq!(c.values.len(), 2);
    let shown = hub.read().tasks[0].content.clone();
    assert_eq!(
        c.winner.value,
        shown.as_str(),
        "the winner is what everyone reads"
    );
    assert_eq!(
        c.winner.agent.as_deref(),
        Some("bob"),
        "greater actor wins a tie"
    );
    // Reported once.
    assert!(auth.check_all(&hub).conflicts.is_empty());
}

#[test]
fn concurrent_creation_of_one_id_is_a_conflict() {
    let hub0 = hub_with(&[]);
    let mut a = hub0.fork(actor(1));
    let mut b = hub0.fork(actor(2));
    write(&mut a, "alice", patch(vec![upsert(task("x", "Alice's x"))]));
    write(&mut b, "bob", patch(vec![upsert(task("x", "Bob's x"))]));
    let mut hub = hub0.fork(actor(0xB1));
    let mut auth = authority(Policy::default());
    let rep = merge_all(&mut hub, &mut auth, &[&a, &b]);
    assert_eq!(rep.conflicts.len(), 1, "{:#?}", rep.conflicts);
    assert_eq!(rep.conflicts[0].field, "task");
    assert_eq!(hub.len(), 1);
    assert_eq!(hub.read().tasks[0].content, "Bob's x");
}

#[test]
fn sequential_writes_are_not_conflicts() {
    let mut hub = hub_with(&["t1"]);
    let mut a = hub.fork(actor(1));
    write(&mut a, "alice", patch(vec![upsert(task("t1", "First"))]));
    let mut auth = authority(Policy::default());
    merge_all(&mut hub, &mut auth, &[&a]);
    let mut b = hub.fork(actor(2));
    write(&mut b, "bob", patch(vec![upsert(task("t1", "Second"))]));
    let rep = merge_all(&mut hub, &mut auth, &[&b]);
    assert!(rep.conflicts.is_empty());
    assert!(rep.violations.is_empty());
}
