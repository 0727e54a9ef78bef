//! A task's history (blame) from the Automerge history: who changed which field to
//! what, when and why — across replicas, concurrent writes, a removal and a reload.

use serde_json::json;
use swarmtodo::model::{ErrorCode, PatchOp, Status, TaskPatch, TodoList, WriteContext};
use swarmtodo::proto::{HistoryEntry, HISTORY_ENTRIES_MAX};

use crate::common::{actor, patch, task, upsert};

fn at(agent: &str, ms: i64) -> WriteContext {
    WriteContext::new(agent, ms, ms as u64)
}

fn fields(e: &HistoryEntry) -> Vec<(&str, serde_json::Value, serde_json::Value)> {
    e.fields
        .iter()
        .map(|f| (f.field.as_str(), f.before.clone(), f.after.clone()))
        .collect()
}

#[test]
fn a_tasks_history_says_who_changed_which_field_to_what_when_and_why() {
    let mut lead = TodoList::create(actor(1));
    lead.write(
        &patch(vec![
            upsert(task("t1", "Write the parser")),
            upsert(task("t2", "Other")),
        ]),
        &at("lead", 1_000),
    )
    .unwrap();
    // A worker takes t1 on its replica while the lead renames t2 on its own.
    let mut w1 = lead.fork(actor(2));
    let mut take = patch(vec![upsert(TaskPatch {
        id: Some("t1".into()),
        status: Some(Status::InProgress),
        owner: Some(Some("w1".into())),
        ..TaskPatch::default()
    })]);
    take.explanation = Some("taking the parser".into());
    w1.write(&take, &at("w1", 2_000)).unwrap();
    lead.write(
        &patch(vec![upsert(task("t2", "Other, renamed"))]),
        &at("lead", 2_500),
    )
    .unwrap();
    lead.merge_from(&w1).unwrap();
    lead.write(
        &patch(vec![upsert(task("t1", "Write the JSON parser"))]),
        &at("lead", 3_000),
    )
    .unwrap();
    lead.write(
        &patch(vec![PatchOp::Remove { id: "t2".into() }]),
        &at("lead", 4_000),
    )
    .unwrap();

    let h = lead.history("t1", HISTORY_ENTRIES_MAX).unwrap();
    assert_eq!((h.task.as_str(), h.total, h.entries.len()), ("t1", 3, 3));
    let who: Vec<(Option<&str>, i64)> = h
        .entries
        .iter()
        .map(|e| (e.agent.as_deref(), e.at_ms))
        .collect();
    assert_eq!(
        who,
        [
            (Some("lead"), 1_000),
            (Some("w1"), 2_000),
            (Some("lead"), 3_000)
        ]
    );
    let created = fields(&h.entries[0]);
    assert_eq!(created[0], ("task", json!(false), json!(true)));
    assert!(created.contains(&("content", json!(null), json!("Write the parser"))));
    assert_eq!(
        fields(&h.entries[1]),
        [
            ("status", json!("pending"), json!("in_progress")),
            ("owner", json!(null), json!("w1")),
        ]
    );
    assert_eq!(
        h.entries[1].explanation.as_deref(),
        Some("taking the parser")
    );
    assert_eq!(
        fields(&h.entries[2]),
        [(
            "content",
            json!("Write the parser"),
            json!("Write the JSON parser")
        )]
    );

    // t2: created, renamed, removed; none of t1's changes.
    let h2 = lead.history("t2", HISTORY_ENTRIES_MAX).unwrap();
    assert_eq!(h2.total, 3);
    assert_eq!(
        fields(&h2.entries[2])[0],
        ("task", json!(true), json!(false))
    );

    // The latest only; the same from a reloaded replica; an unknown task refused.
    let last = lead.history("t1", 1).unwrap();
    assert_eq!((last.total, last.entries.as_slice()), (3, &h.entries[2..]));
    let reloaded = TodoList::load(&lead.save(), actor(3)).unwrap();
    assert_eq!(reloaded.history("t1", HISTORY_ENTRIES_MAX).unwrap(), h);
    let err = lead.history("t9", 10).unwrap_err();
    assert_eq!(err.code, ErrorCode::UnknownTask);
}

/// A history longer than `HISTORY_ENTRIES_MAX` answers its latest entries and counts all.
#[test]
fn a_long_history_answers_its_latest_entries() {
    let mut list = TodoList::create(actor(1));
    list.write(&patch(vec![upsert(task("t1", "v0"))]), &at("lead", 1))
        .unwrap();
    for i in 1..=HISTORY_ENTRIES_MAX as i64 + 10 {
        list.write(
            &patch(vec![upsert(task("t1", &format!("v{i}")))]),
            &at("lead", i + 1),
        )
        .unwrap();
    }
    let h = list.history("t1", usize::MAX).unwrap();
    assert_eq!(h.total, HISTORY_ENTRIES_MAX as u64 + 11);
    assert_eq!(h.entries.len(), HISTORY_ENTRIES_MAX);
    let last = h.entries.last().unwrap();
    assert_eq!(
        fields(last),
        [(
            "content",
            json!(format!("v{}", HISTORY_ENTRIES_MAX + 9)),
            json!(format!("v{}", HISTORY_ENTRIES_MAX + 10))
        )]
    );
}
