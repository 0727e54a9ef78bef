//! The projections of a list (`swarmtodo::proto::projection`) against golden files, and
//! the ACP one read back with the ACP crate's own types. `UPDATE_GOLDEN=1 cargo test
//! --test projection` rewrites the golden files after a deliberate change.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::path::Path;

use agent_client_protocol_schema::v1::{
    PlanEntryPriority, PlanEntryStatus, SessionNotification, SessionUpdate,
};
use swarmtodo::proto::projection::{self, CodexTodoList};
use swarmtodo::proto::{EventBody, Priority, Snapshot, Status, Task, TaskChange, Version};

fn task(id: &str, content: &str, status: Status) -> Task {
    Task {
        id: id.into(),
        content: content.into(),
        active_form: None,
        status,
        priority: Priority::Medium,
        owner: None,
        blocked_by: vec![],
    }
}

/// Every status, priority, an owner, an active form, dependencies, and text that looks
/// like markup.
fn list() -> Snapshot {
    let mut parse = task("t2", "Write the *parser*", Status::InProgress);
    parse.owner = Some("worker-1".into());
    parse.active_form = Some("Writing the parser".into());
    parse.priority = Priority::High;
    let mut tests = task("t3", "Write the tests", Status::Pending);
    tests.blocked_by = vec!["t2".into()];
    let mut docs = task("t5", "Update the docs", Status::Blocked);
    docs.priority = Priority::Low;
    Snapshot {
        version: Version("4fRw.9kQz".into()),
        tasks: vec![
            task("t1", "Read the issue", Status::Completed),
            parse,
            tests,
            task("t4", "Port to Windows", Status::Cancelled),
            docs,
        ],
    }
}

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    if name.ends_with(".md") {
        assert_eq!(actual, expected, "{name} differs from its golden file");
        return;
    }
    // JSON: compared as values, line by line (the order serde_json keeps an object's
    // keys in depends on its features in this build).
    let values = |text: &str| -> Vec<serde_json::Value> {
        if name.ends_with(".jsonl") {
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        } else {
            vec![serde_json::from_str(text).unwrap()]
        }
    };
    assert_eq!(
        values(actual),
        values(&expected),
        "{name} differs from its golden file"
    );
}

#[test]
fn the_markdown_checklist_says_every_status() {
    golden("projection.md", &projection::markdown(&list()));
}

#[test]
fn the_acp_plan_reads_back_with_acps_own_types_and_keeps_the_rest_in_meta() {
    let update = projection::acp_session_update(&list(), "sess-1");
    golden(
        "projection-acp.json",
        &(serde_json::to_string_pretty(&update).unwrap() + "\n"),
    );
    let n: SessionNotification = serde_json::from_value(update["params"].clone()).unwrap();
    let SessionUpdate::Plan(plan) = n.update else {
        panic!("a plan update: {:?}", n.update)
    };
    // ACP skips entries it cannot read: every task must be there.
    assert_eq!(plan.entries.len(), 5);
    let statuses: Vec<PlanEntryStatus> = plan.entries.iter().map(|e| e.status.clone()).collect();
    assert_eq!(
        statuses,
        [
            PlanEntryStatus::Completed,
            PlanEntryStatus::InProgress,
            PlanEntryStatus::Pending,
            PlanEntryStatus::Completed,
            PlanEntryStatus::Pending
        ]
    );
    assert_eq!(plan.entries[1].priority, PlanEntryPriority::High);
    assert_eq!(plan.entries[4].priority, PlanEntryPriority::Low);
    // What ACP cannot say is in _meta, and ACP's types keep it (a malformed _meta would
    // read as none).
    let meta = |i: usize| {
        serde_json::to_value(plan.entries[i].meta.as_ref().expect("_meta kept")).unwrap()
    };
    assert_eq!(meta(3)["swarmtodo"]["status"], "cancelled");
    assert_eq!(meta(4)["swarmtodo"]["status"], "blocked");
    assert_eq!(meta(1)["swarmtodo"]["owner"], "worker-1");
    assert_eq!(meta(2)["swarmtodo"]["blocked_by"][0], "t2");
}

#[test]
fn the_codex_item_goes_started_updated_completed() {
    let mut lifecycle = CodexTodoList::new("item_0");
    let mut list = list();
    let mut lines = vec![lifecycle.next(&list).unwrap()];
    assert_eq!(lifecycle.next(&list), None, "the same list: no line");
    // A tasks_changed event: t2 completed, t6 added, t4 removed.
    let mut done = list.tasks[1].clone();
    done.status = Status::Completed;
    let added = task("t6", "Ship it", Status::Pending);
    let event = EventBody::TasksChanged {
        agents: vec!["worker-1".into()],
        changes: vec![],
        tasks: vec![
            TaskChange {
                task: "t2".into(),
                fields: vec!["status".into()],
                before: Some(list.tasks[1].clone()),
                after: Some(done),
            },
            TaskChange {
                task: "t4".into(),
                fields: vec![],
                before: Some(list.tasks[3].clone()),
                after: None,
            },
            TaskChange {
                task: "t6".into(),
                fields: vec![],
                before: None,
                after: Some(added),
            },
        ],
    };
    projection::apply(&mut list, &event);
    let ids: Vec<&str> = list.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["t1", "t2", "t3", "t5", "t6"]);
    lines.push(lifecycle.next(&list).unwrap());
    lines.push(lifecycle.finish().unwrap());
    let jsonl: String = lines.iter().map(|l| format!("{l}\n")).collect();
    golden("projection-codex.jsonl", &jsonl);
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["item.started", "item.updated", "item.completed"]);
}
