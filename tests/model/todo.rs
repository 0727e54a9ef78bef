//! `todo_write` / `todo_read` on a replica (docs/DESIGN.md §3, §5).
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use crate::common::*;
use swarmtodo::model::{parse_write_request, TodoList, WriteContext};
use swarmtodo::proto::{
    ApiError, ErrorCode, PatchOp, Priority, Status, TaskPatch, Version, WriteMode, WriteRequest,
};

/// A list with t1 (in_progress for "bob"), t2, t3.
fn list() -> TodoList {
    let mut l = hub_with(&["t1", "t2", "t3"]).fork(actor(0x10));
    write(
        &mut l,
        "lead",
        patch(vec![upsert(TaskPatch {
            owner: Some(Some("bob".into())),
            ..status("t1", Status::InProgress)
        })]),
    );
    l
}

fn ids(l: &TodoList) -> Vec<String> {
    l.read().tasks.into_iter().map(|t| t.id).collect()
}

/// Data-driven check of refused writes: `(request JSON, code, field)`. A refused write
/// must leave the list exactly as it was.
#[test]
fn invalid_writes_are_refused_with_a_typed_error_and_change_nothing() {
    let cases: &[(&str, ErrorCode, &str)] = &[
        (
            r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"t2","status":"done"}}]}"#,
            ErrorCode::InvalidValue,
            "ops[0].task.status",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"t2","priority":"urgent"}}]}"#,
            ErrorCode::InvalidValue,
            "ops[0].task.priority",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"t2","colour":"red"}}]}"#,
            ErrorCode::InvalidValue,
            "ops[0].task.colour",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"n1","content":"a"}},{"op":"upsert","task":{"id":"n1","content":"b"}}]}"#,
            ErrorCode::DuplicateId,
            "ops[1].task.id",
        ),
        (
            r#"{"mode":"replace","tasks":[{"id":"t1","content":"a"},{"id":"t1","content":"b"}]}"#,
            ErrorCode::DuplicateId,
            "tasks[1].id",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"t2","status":"in_progress","owner":"bob"}}]}"#,
            ErrorCode::SecondInProgress,
            "task t2.status",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"t2","content":"  "}}]}"#,
            ErrorCode::MissingField,
            "ops[0].task.content",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"new"}}]}"#,
            ErrorCode::MissingField,
            "ops[0].task.content",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"remove","id":"nope"}]}"#,
            ErrorCode::UnknownTask,
            "ops[0].id",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"move","id":"t1","after":"nope"}]}"#,
            ErrorCode::UnknownTask,
            "ops[0].after",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"t2","blocked_by":["nope"]}}]}"#,
            ErrorCode::InvalidDependency,
            "task t2.blocked_by",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"t2","blocked_by":["t3"]}},{"op":"upsert","task":{"id":"t3","blocked_by":["t2"]}}]}"#,
            ErrorCode::InvalidDependency,
            "task t2.blocked_by",
        ),
        (
            r#"{"mode":"patch","ops":[],"expected_version":"0"}"#,
            ErrorCode::StaleVersion,
            "expected_version",
        ),
        (
            r#"{"mode":"replace","tasks":[],"base_version":"0.1"}"#,
            ErrorCode::InvalidValue,
            "version",
        ),
        (r#"{"mode":"shuffle"}"#, ErrorCode::InvalidValue, "mode"),
        (
            r#"{"mode":"patch","ops":[],"why":"x"}"#,
            ErrorCode::InvalidValue,
            "why",
        ),
        (
            r#"{"mode":"patch","ops":[{"op":"rename","id":"t1"}]}"#,
            ErrorCode::InvalidValue,
            "ops[0].op",
        ),
    ];
    for (json, code, field) in cases {
        let mut l = list();
        let before = l.read();
        let err: ApiError = match parse_write_request(json) {
            Err(e) => e,
            Ok(req) => l
                .write(&req, &WriteContext::new("lead", 5, 5))
                .expect_err(json),
        };
        assert_eq!(err.code, *code, "{json}: {err}");
        assert_eq!(err.field.as_deref().unwrap_or(""), *field, "{json}: {err}");
        assert!(!err.message.is_empty());
        assert_eq!(l.read(), before, "{json} changed the list");
    }
}

#[test]
fn unknown_enum_values_list_what_is_allowed() {
    let err = parse_write_request(
        r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"t","status":"done"}}]}"#,
    )
    .unwrap_err();
    assert_eq!(
        err.allowed,
        vec![
            "pending",
            "in_progress",
            "completed",
            "cancelled",
            "blocked"
        ]
    );
    let err = parse_write_request(
        r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"t","priority":"p0"}}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.allowed, vec!["high", "medium", "low"]);
}

#[test]
fn limits_are_refused() {
    let mut l = list();
    let long = "x".repeat(swarmtodo::proto::TASK_ID_BYTES_MAX + 1);
    let err = l
        .write(
            &patch(vec![upsert(task(&long, "Do it"))]),
            &WriteContext::new("lead", 1, 1),
        )
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::LimitExceeded);
    let big = "y".repeat(swarmtodo::proto::TASK_TEXT_BYTES_MAX + 1);
    let err = l
        .write(
            &patch(vec![upsert(task("t9", &big))]),
            &WriteContext::new("lead", 1, 1),
        )
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::LimitExceeded);
    assert_eq!(err.field.as_deref(), Some("ops[0].task.content"));
}

#[test]
fn writing_what_is_there_changes_nothing() {
    let mut l = list();
    let v = l.version();
    let req = patch(vec![
        upsert(task("t2", "Do t2")),
        upsert(status("t3", Status::Pending)),
    ]);
    let (res, merge) = l.write(&req, &WriteContext::new("lead", 9, 9)).unwrap();
    assert!(!res.changed);
    assert!(merge.is_empty());
    assert_eq!(res.version, v);
    assert_eq!(l.version(), v);
    // The same for a replace that sends the list as it is.
    let same: Vec<TaskPatch> = l
        .read()
        .tasks
        .iter()
        .map(|t| TaskPatch {
            id: Some(t.id.clone()),
            content: Some(t.content.clone()),
            status: Some(t.status),
            ..TaskPatch::default()
        })
        .collect();
    let req = WriteRequest {
        mode: WriteMode::Replace {
            tasks: same,
            base_version: Some(v.clone()),
        },
        expected_version: Some(v.clone()),
        explanation: None,
    };
    let (res, _) = l.write(&req, &WriteContext::new("lead", 9, 9)).unwrap();
    assert!(!res.changed);
    assert_eq!(l.version(), v);
}

#[test]
fn compare_and_set_accepts_the_current_version_and_refuses_a_stale_one() {
    let mut l = list();
    let v0 = l.version();
    let mut req = patch(vec![upsert(status("t2", Status::Blocked))]);
    req.expected_version = Some(v0.clone());
    let (res, _) = l.write(&req, &WriteContext::new("lead", 1, 1)).unwrap();
    assert!(res.changed);
    assert_ne!(res.version, v0);
    let mut again = patch(vec![upsert(status("t3", Status::Blocked))]);
    again.expected_version = Some(v0);
    let err = l
        .write(&again, &WriteContext::new("lead", 2, 2))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::StaleVersion);
    let current = err
        .current
        .expect("the current list comes with the refusal");
    assert_eq!(current.version, l.version());
    assert_eq!(current.tasks[1].status, Status::Blocked);
    assert_eq!(l.read().tasks[2].status, Status::Pending, "nothing changed");
}

#[test]
fn replace_from_a_stale_base_keeps_what_others_added() {
    let mut a = list();
    let base = a.read();
    // Someone else adds t4 after A read the list.
    let mut b = a.fork(actor(0x30));
    write(
        &mut b,
        "bob",
        patch(vec![upsert(task("t4", "Added by bob"))]),
    );
    a.merge_from(&b).unwrap();
    // A replaces with what it saw, minus t2, plus a new task, reordered.
    let mut tasks: Vec<TaskPatch> = base
        .tasks
        .iter()
        .filter(|t| t.id != "t2")
        .map(|t| TaskPatch {
            id: Some(t.id.clone()),
            content: Some(t.content.clone()),
            ..TaskPatch::default()
        })
        .rev()
        .collect();
    tasks.push(task("t5", "Added by A"));
    let req = WriteRequest {
        mode: WriteMode::Replace {
            tasks,
            base_version: Some(base.version.clone()),
        },
        expected_version: None,
        explanation: Some("replan".into()),
    };
    let (res, _) = a.write(&req, &WriteContext::new("alice", 3, 3)).unwrap();
    assert_eq!(res.removed, vec!["t2"]);
    assert_eq!(res.created, vec!["t5"]);
    let order = ids(&a);
    assert!(
        order.contains(&"t4".to_owned()),
        "bob's task survives: {order:?}"
    );
    let mine: Vec<&String> = order.iter().filter(|id| *id != "t4").collect();
    assert_eq!(mine, vec!["t3", "t1", "t5"]);
    // The explanation travels with the change.
    let change = a.doc().get_last_local_change().unwrap();
    assert_eq!(change.message(), Some("replan"));
}

#[test]
fn replace_without_ids_matches_tasks_by_content() {
    let mut l = TodoList::create(actor(1));
    let plan = |statuses: [Status; 2]| WriteRequest {
        mode: WriteMode::Replace {
            tasks: vec![
                TaskPatch {
                    content: Some("Run the tests".into()),
                    status: Some(statuses[0]),
                    ..TaskPatch::default()
                },
                TaskPatch {
                    content: Some("Fix the bug".into()),
                    status: Some(statuses[1]),
                    ..TaskPatch::default()
                },
            ],
            base_version: None,
        },
        expected_version: None,
        explanation: None,
    };
    let (r1, _) = l
        .write(
            &plan([Status::InProgress, Status::Pending]),
            &WriteContext::new("agent", 1, 42),
        )
        .unwrap();
    assert_eq!(r1.created.len(), 2);
    let first = ids(&l);
    let (r2, _) = l
        .write(
            &plan([Status::Completed, Status::InProgress]),
            &WriteContext::new("agent", 2, 43),
        )
        .unwrap();
    assert!(r2.created.is_empty() && r2.removed.is_empty(), "{r2:?}");
    assert_eq!(ids(&l), first, "the same tasks, not new ones");
    let s: Vec<Status> = l.read().tasks.iter().map(|t| t.status).collect();
    assert_eq!(s, vec![Status::Completed, Status::InProgress]);
}

#[test]
fn patch_moves_and_removes() {
    let mut l = list();
    write(
        &mut l,
        "lead",
        patch(vec![PatchOp::Move {
            id: "t3".into(),
            after: None,
        }]),
    );
    assert_eq!(ids(&l), vec!["t3", "t1", "t2"]);
    write(
        &mut l,
        "lead",
        patch(vec![PatchOp::Move {
            id: "t3".into(),
            after: Some("t1".into()),
        }]),
    );
    assert_eq!(ids(&l), vec!["t1", "t3", "t2"]);
    write(
        &mut l,
        "lead",
        patch(vec![
            PatchOp::Move {
                id: "t1".into(),
                after: Some("t2".into()),
            },
            PatchOp::Remove { id: "t3".into() },
            upsert(task("t4", "Last")),
        ]),
    );
    assert_eq!(ids(&l), vec!["t2", "t1", "t4"]);
    // Moving changes only the moved task's position.
    let before: Vec<String> = ["t2", "t4"]
        .iter()
        .map(|id| l.raw_task(id).unwrap().position.to_string())
        .collect();
    let (res, merge) = l
        .write(
            &patch(vec![PatchOp::Move {
                id: "t4".into(),
                after: None,
            }]),
            &WriteContext::new("lead", 1, 1),
        )
        .unwrap();
    assert_eq!(res.updated, vec!["t4"]);
    assert_eq!(merge.tasks.keys().collect::<Vec<_>>(), vec!["t4"]);
    assert_eq!(l.raw_task("t2").unwrap().position, before[0]);
}

#[test]
fn new_tasks_get_generated_ids_when_none_is_given() {
    let mut l = TodoList::create(actor(1));
    let req = patch(vec![upsert(TaskPatch {
        content: Some("No id".into()),
        priority: Some(Priority::High),
        ..TaskPatch::default()
    })]);
    let (res, _) = l.write(&req, &WriteContext::new("a", 1, 7)).unwrap();
    assert_eq!(res.created.len(), 1);
    assert!(uuid_like(&res.created[0]), "{}", res.created[0]);
    assert_eq!(l.read().tasks[0].priority, Priority::High);
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4
}

#[test]
fn concurrent_appends_at_one_spot_are_ordered_by_id() {
    let base = hub_with(&["t1"]);
    let mut a = base.fork(actor(1));
    let mut b = base.fork(actor(2));
    write(&mut a, "a", patch(vec![upsert(task("zz", "From a"))]));
    write(&mut b, "b", patch(vec![upsert(task("aa", "From b"))]));
    a.merge_from(&b).unwrap();
    b.merge_from(&a).unwrap();
    assert_eq!(
        a.raw_task("zz").unwrap().position,
        a.raw_task("aa").unwrap().position
    );
    assert_eq!(ids(&a), vec!["t1", "aa", "zz"]);
    assert_eq!(a.read(), b.read());
}

#[test]
fn read_as_of_an_earlier_version() {
    let mut l = list();
    let v1 = l.version();
    let snap1 = l.read();
    write(
        &mut l,
        "lead",
        patch(vec![PatchOp::Remove { id: "t2".into() }]),
    );
    assert_eq!(l.read().tasks.len(), 2);
    assert_eq!(l.read_at(&v1).unwrap(), snap1);
    let err = l
        .read_at(&Version("11111111111111111111111111111111".into()))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::UnknownVersion);
    let err = l.read_at(&Version("not a version!".into())).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidValue);
}

/// The authority reads a task as it was before the change that broke a rule (to put
/// it back) at that change's parent heads, and `todo_read` at a version reads the list
/// at its heads, without copying the document: they must read what a copy of the list
/// at those heads holds — Text fields, dependency lists, a task removed since or not
/// yet made, the order.
#[test]
fn a_task_read_at_earlier_heads_is_the_task_a_copy_at_those_heads_holds() {
    let mut l = list();
    let mut marks = vec![l.heads()];
    let mut peer = RawPeer::fork(&l, 9, "js");
    peer.put_text("t2", "content", "Written as Text");
    peer.put_text("t2", "owner", "js");
    l.apply_changes(peer.changes_for(&l)).unwrap();
    marks.push(l.heads());
    write(
        &mut l,
        "lead",
        patch(vec![upsert(TaskPatch {
            blocked_by: Some(vec!["t1".into(), "t2".into()]),
            ..status("t3", Status::Pending)
        })]),
    );
    marks.push(l.heads());
    write(
        &mut l,
        "lead",
        patch(vec![upsert(task("t4", "Made later"))]),
    );
    write(
        &mut l,
        "bob",
        patch(vec![upsert(status("t1", Status::Completed))]),
    );
    write(
        &mut l,
        "lead",
        patch(vec![PatchOp::Move {
            id: "t3".into(),
            after: None,
        }]),
    );
    marks.push(l.heads());
    write(
        &mut l,
        "lead",
        patch(vec![PatchOp::Remove { id: "t2".into() }]),
    );
    marks.push(l.heads());
    for heads in &marks {
        let copy = TodoList::load(&l.doc().fork_at(heads).unwrap().save(), actor(0x55)).unwrap();
        assert_eq!(
            l.read_at(&copy.version()).unwrap(),
            copy.read(),
            "todo_read at {heads:?}"
        );
        for id in ["t1", "t2", "t3", "t4", "none"] {
            assert_eq!(
                l.raw_task_at(id, heads),
                copy.raw_task(id),
                "task {id} at {heads:?}"
            );
        }
    }
    assert!(l.raw_task_at("t2", &marks[1]).unwrap().content.as_deref() == Some("Written as Text"));
    assert!(l.raw_task_at("t2", &marks[4]).is_none(), "removed by then");
    assert!(l.raw_task_at("t4", &marks[2]).is_none(), "not made yet");
    assert_eq!(
        l.raw_task_at("t3", &marks[2]).unwrap().blocked_by,
        ["t1", "t2"]
    );
    let ids_at = |m: usize| -> Vec<String> {
        let v = TodoList::version_of(&marks[m]);
        l.read_at(&v)
            .unwrap()
            .tasks
            .into_iter()
            .map(|t| t.id)
            .collect()
    };
    assert_eq!(ids_at(2), ["t1", "t2", "t3"]);
    assert_eq!(ids_at(3), ["t3", "t1", "t2", "t4"], "moved first");
    assert_eq!(ids_at(4), ["t3", "t1", "t4"]);
}

#[test]
fn two_creators_of_one_list_share_one_root() {
    let mut a = TodoList::create(actor(1));
    let mut b = TodoList::create(actor(2));
    assert_eq!(
        a.version(),
        b.version(),
        "the first change is the same everywhere"
    );
    write(&mut a, "a", patch(vec![upsert(task("x", "From a"))]));
    write(&mut b, "b", patch(vec![upsert(task("y", "From b"))]));
    a.merge_from(&b).unwrap();
    b.merge_from(&a).unwrap();
    assert_eq!(ids(&a), vec!["x", "y"]);
    assert_eq!(a.read(), b.read());
}

#[test]
fn text_objects_and_scalar_strings_read_the_same() {
    let mut l = hub_with(&["t1", "t2"]);
    let mut peer = RawPeer::fork(&l, 9, "js");
    peer.put_text("t1", "content", "Run the tests");
    peer.put_text("t1", "status", "in_progress");
    peer.put_text("t1", "owner", "js");
    l.apply_changes(peer.changes_for(&l)).unwrap();
    let t = &l.read().tasks[0];
    assert_eq!(t.content, "Run the tests");
    assert_eq!(t.status, Status::InProgress);
    assert_eq!(t.owner.as_deref(), Some("js"));
    // A second in-progress task for the same owner is refused even though the first
    // was written as Text.
    let err = l
        .write(
            &patch(vec![upsert(TaskPatch {
                owner: Some(Some("js".into())),
                ..status("t2", Status::InProgress)
            })]),
            &WriteContext::new("js", 1, 1),
        )
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::SecondInProgress);
}

#[test]
fn changes_out_of_order_and_duplicated_converge() {
    let base = hub_with(&["t1"]);
    let mut a = base.fork(actor(1));
    for i in 0..5 {
        write(
            &mut a,
            "a",
            patch(vec![upsert(task(&format!("n{i}"), &format!("Task {i}")))]),
        );
    }
    let mut changes = a.changes_since(&base.heads());
    changes.reverse();
    let mut b = base.fork(actor(2));
    // Deliver the newest first: they wait for their dependencies.
    b.apply_changes(changes[..2].to_vec()).unwrap();
    assert_eq!(b.pending_changes(), 2);
    assert_eq!(b.len(), 1);
    b.apply_changes(changes.clone()).unwrap();
    b.apply_changes(changes).unwrap();
    assert_eq!(b.pending_changes(), 0);
    assert_eq!(b.read(), a.read());
}

#[test]
fn save_and_load_round_trip() {
    let l = list();
    let back = TodoList::load(&l.save(), actor(0x44)).unwrap();
    assert_eq!(back.read(), l.read());
    assert!(TodoList::load(b"definitely not automerge", actor(1)).is_err());
}

#[test]
fn requests_round_trip_through_json() {
    let reqs = vec![
        WriteRequest {
            mode: WriteMode::Replace {
                tasks: vec![TaskPatch {
                    active_form: Some(None),
                    owner: Some(Some("bob".into())),
                    blocked_by: Some(vec!["t1".into()]),
                    ..task("t2", "Do t2")
                }],
                base_version: Some(Version("0".into())),
            },
            expected_version: Some(Version("0".into())),
            explanation: Some("why".into()),
        },
        patch(vec![
            upsert(status("t1", Status::Cancelled)),
            PatchOp::Remove { id: "t2".into() },
            PatchOp::Move {
                id: "t3".into(),
                after: Some("t1".into()),
            },
            PatchOp::Move {
                id: "t3".into(),
                after: None,
            },
        ]),
    ];
    for req in reqs {
        let json = serde_json::to_string(&req).unwrap();
        let back = parse_write_request(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
        // `null` (clear the field) survives the round trip.
        assert_eq!(back, req, "{json}");
    }
    let clear = parse_write_request(
        r#"{"mode":"patch","ops":[{"op":"upsert","task":{"id":"t1","owner":null}}]}"#,
    )
    .unwrap();
    let WriteMode::Patch { ops } = clear.mode else {
        panic!()
    };
    assert_eq!(
        ops[0],
        PatchOp::Upsert {
            task: TaskPatch {
                id: Some("t1".into()),
                owner: Some(None),
                ..TaskPatch::default()
            }
        }
    );
}

#[test]
fn replace_from_a_stale_base_writes_only_what_the_writer_changed() {
    let mut a = list();
    let base = a.read();
    let mut b = a.fork(actor(0x30));
    write(
        &mut b,
        "bob",
        patch(vec![
            upsert(status("t2", Status::Blocked)),
            PatchOp::Remove { id: "t3".into() },
        ]),
    );
    a.merge_from(&b).unwrap();
    // A sends back the list exactly as it read it, but with t2's content edited.
    let tasks: Vec<TaskPatch> = base
        .tasks
        .iter()
        .map(|t| TaskPatch {
            id: Some(t.id.clone()),
            content: Some(if t.id == "t2" {
                "Do t2 properly".into()
            } else {
                t.content.clone()
            }),
            status: Some(t.status),
            owner: Some(t.owner.clone()),
            ..TaskPatch::default()
        })
        .collect();
    let req = WriteRequest {
        mode: WriteMode::Replace {
            tasks,
            base_version: Some(base.version.clone()),
        },
        expected_version: None,
        explanation: None,
    };
    a.write(&req, &WriteContext::new("alice", 3, 3)).unwrap();
    let snap = a.read();
    assert_eq!(ids(&a), vec!["t1", "t2"], "t3 stays removed");
    let t2 = &snap.tasks[1];
    assert_eq!(t2.content, "Do t2 properly", "A's edit lands");
    assert_eq!(t2.status, Status::Blocked, "B's concurrent status survives");
}

#[test]
fn a_forged_change_is_refused_and_the_rest_of_the_batch_lands() {
    let base = hub_with(&["t1"]);
    let mut honest = base.fork(actor(2));
    write(&mut honest, "a", patch(vec![upsert(task("x", "Honest"))]));
    // Another replica reuses actor 2: its first change has the same actor and sequence
    // number as the honest one, with different content.
    let mut forger = base.fork(actor(2));
    write(
        &mut forger,
        "evil",
        patch(vec![upsert(task("y", "Forged"))]),
    );
    let mut good = base.fork(actor(3));
    write(&mut good, "b", patch(vec![upsert(task("z", "Good"))]));

    let mut hub = base.fork(actor(0xB1));
    hub.merge_from(&honest).unwrap();
    let mut batch = forger.changes_since(&base.heads());
    batch.extend(good.changes_since(&base.heads()));
    let m = hub.apply_changes(batch).unwrap();
    assert_eq!(m.rejected.len(), 1, "{:?}", m.rejected);
    assert_eq!(m.changes.len(), 1, "the good change landed");
    assert_eq!(ids(&hub), vec!["t1", "x", "z"]);
    assert_eq!(hub.pending_changes(), 0);
}

#[test]
fn replicas_sync_with_automerge_sync_messages_and_report_what_changed() {
    let base = hub_with(&["t1"]);
    let mut a = base.fork(actor(1));
    let mut b = TodoList::create(actor(2));
    write(&mut a, "a", patch(vec![upsert(task("t2", "From a"))]));
    let (mut sa, mut sb) = (automerge::sync::State::new(), automerge::sync::State::new());
    let mut touched = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let mut quiet = true;
        if let Some(m) = a.generate_sync_message(&mut sa) {
            quiet = false;
            let m = automerge::sync::Message::decode(&m.encode()).unwrap();
            let merge = b.receive_sync_message(&mut sb, m).unwrap();
            touched.extend(merge.tasks.keys().cloned());
        }
        if let Some(m) = b.generate_sync_message(&mut sb) {
            quiet = false;
            let m = automerge::sync::Message::decode(&m.encode()).unwrap();
            a.receive_sync_message(&mut sa, m).unwrap();
        }
        if quiet {
            break;
        }
    }
    assert_eq!(b.read(), a.read());
    assert_eq!(touched.into_iter().collect::<Vec<_>>(), vec!["t1", "t2"]);
}

/// Random letters (they do not compress much), `n` of them.
fn noise(x: &mut u64, n: usize) -> String {
    (0..n)
        .map(|_| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            char::from(b'a' + (*x % 26) as u8)
        })
        .collect()
}

/// One sync message from `from` to `to`, if it has one; checks its changes against the
/// bound. Returns the bytes of changes it carried.
fn step_under_bound(
    from: &TodoList,
    s_from: &mut automerge::sync::State,
    to: &mut TodoList,
    s_to: &mut automerge::sync::State,
) -> Option<usize> {
    use swarmtodo::model::chunk_changes;
    use swarmtodo::model::sync::SYNC_CHANGES_BYTES_MAX;
    let m = from.generate_sync_message(s_from)?;
    let m = automerge::sync::Message::decode(&m.encode()).unwrap();
    let changes: Vec<_> = m
        .changes
        .iter()
        .flat_map(|c| chunk_changes(c).unwrap())
        .collect();
    let bytes: usize = changes.iter().map(|c| c.raw_bytes().len()).sum();
    assert!(
        bytes <= SYNC_CHANGES_BYTES_MAX || changes.len() == 1,
        "a message with {} changes, {bytes} bytes",
        changes.len()
    );
    to.receive_sync_message(s_to, m).unwrap();
    Some(bytes)
}

/// Replicas that each wrote more than one message may carry sync it over several, each
/// with at most SYNC_CHANGES_BYTES_MAX bytes of changes (or one change), oldest first,
/// whichever way stock sync would have sent it: the changes the peer lacks (a peer
/// behind by less than a third of the history) or the whole document (more).
#[test]
fn large_catch_ups_go_over_messages_under_the_changes_bound() {
    use swarmtodo::model::sync::SYNC_CHANGES_BYTES_MAX;
    use swarmtodo::proto::TASK_TEXT_BYTES_MAX;
    const TASKS_PER_WRITE: usize = 16;
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    // (history both have, big writes by a, big writes by b)
    for (shared, by_a, by_b) in [(120, 20, 12), (1, 20, 0)] {
        let mut base = list_with_history(10, shared);
        let mut a = base.fork(actor(1));
        let mut b = base.fork(actor(2));
        for (list, who, writes) in [(&mut a, "a", by_a), (&mut b, "b", by_b)] {
            for _ in 0..writes {
                let ops = (0..TASKS_PER_WRITE)
                    .map(|i| {
                        let text = noise(&mut x, TASK_TEXT_BYTES_MAX);
                        upsert(task(&format!("{who}-{i}"), &text))
                    })
                    .collect();
                write(list, who, patch(ops));
            }
        }
        let (mut sa, mut sb) = (automerge::sync::State::new(), automerge::sync::State::new());
        let mut messages = 0;
        let mut most = 0;
        for _ in 0..1_000 {
            let ab = step_under_bound(&a, &mut sa, &mut b, &mut sb);
            let ba = step_under_bound(&b, &mut sb, &mut a, &mut sa);
            if ab.is_none() && ba.is_none() {
                break;
            }
            for bytes in ab.into_iter().chain(ba) {
                messages += 1;
                most = most.max(bytes);
            }
        }
        assert_eq!(a.read(), b.read(), "shared {shared}: converged");
        let (mut ha, mut hb) = (a.heads(), b.heads());
        ha.sort();
        hb.sort();
        assert_eq!(ha, hb, "shared {shared}: same heads");
        // Random letters deflate to ~60 %: at least half of what was written is sent.
        let written = (by_a + by_b) * TASKS_PER_WRITE * TASK_TEXT_BYTES_MAX;
        assert!(
            messages * SYNC_CHANGES_BYTES_MAX * 2 > written && a.sync_counters().cut > 0,
            "shared {shared}: {written} bytes written went in {messages} messages"
        );
        assert!(
            most > SYNC_CHANGES_BYTES_MAX / 2,
            "shared {shared}: messages were filled: {most}"
        );
        base.merge_from(&a).unwrap();
        assert_eq!(base.read(), a.read());
    }
}

/// A replica takes a document rebuilt from a save of it made a while ago (the hub loads
/// its snapshot off its task): the changes since the save are applied to it first, from
/// the sync window when the save is recent and by automerge's walk back when it is older
/// than the window; a document that is not a save of the list, or that lacks more
/// changes than the caller lets it take, is refused.
#[test]
fn a_list_adopts_a_rebuilt_save_of_itself_with_the_changes_since() {
    use swarmtodo::model::sync::SYNC_WINDOW_CHANGES;
    for later in [3, SYNC_WINDOW_CHANGES + 10] {
        let mut l = list_with_history(10, 5).fork(actor(0x20));
        let saved = l.save();
        for i in 0..later {
            write(
                &mut l,
                "lead",
                patch(vec![upsert(task(
                    &format!("n{i}"),
                    "Written after the save",
                ))]),
            );
        }
        let (heads, tasks) = (l.heads(), l.read());
        // Not when it lacks more than it may take.
        let late = l.adopt_rebuilt(automerge::Automerge::load(&saved).unwrap(), later - 1);
        assert!(
            late.is_err(),
            "{later} changes behind, at most {} taken",
            later - 1
        );
        assert_eq!(l.heads(), heads);
        let taken = l
            .adopt_rebuilt(automerge::Automerge::load(&saved).unwrap(), later)
            .unwrap();
        assert_eq!(taken, later);
        assert_eq!(l.heads(), heads, "{later} changes after the save");
        assert_eq!(l.doc().get_heads(), heads);
        assert_eq!(l.read(), tasks);
        // It goes on writing as itself.
        assert_eq!(l.doc().get_actor(), &actor(0x20));
        write(&mut l, "lead", patch(vec![upsert(task("last", "After"))]));
        assert_eq!(l.len(), tasks.tasks.len() + 1);
    }
    let mut l = list_with_history(10, 5).fork(actor(0x21));
    let heads = l.heads();
    let foreign = list_with_history(3, 1);
    assert!(l.adopt_rebuilt(foreign.doc().clone(), usize::MAX).is_err());
    assert_eq!(l.heads(), heads);
}
