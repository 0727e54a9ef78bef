//! A real JS Automerge peer (`@automerge/automerge`, installed by `.ci/run` into
//! `tests/js/node_modules`) reads a list a Rust replica wrote and edits it with native JS
//! strings (stored as Text objects). The Rust replica must read both forms the same, and
//! the authority must catch and repair the JS peer's invalid status.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::scratch;
use automerge::{ActorId, Automerge, ObjType, ReadDoc, Value};
use swarmtodo::authority::{Authority, Policy, Roles};
use swarmtodo::model::{TodoList, WriteContext};
use swarmtodo::proto::{Priority, Resolution, Rule, Status, TaskPatch, WriteMode, WriteRequest};

fn js_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js")
}

#[test]
fn js_peer_reads_rust_strings_and_rust_reads_js_text() {
    let js = js_dir();
    assert!(
        js.join("node_modules/@automerge/automerge").exists(),
        "the JS peer is not installed: run `npm install --prefix tests/js` (.ci/run does)"
    );

    let mut hub = TodoList::create(ActorId::from([0xA0; 16]));
    let mut lead = hub.fork(ActorId::from([0x01; 16]));
    let plan = WriteRequest {
        mode: WriteMode::Replace {
            tasks: vec![
                TaskPatch {
                    id: Some("t1".into()),
                    content: Some("Run the tests".into()),
                    ..TaskPatch::default()
                },
                TaskPatch {
                    id: Some("t2".into()),
                    content: Some("Write the docs — ünïcode ✓".into()),
                    status: Some(Status::InProgress),
                    owner: Some(Some("lead".into())),
                    ..TaskPatch::default()
                },
            ],
            base_version: None,
        },
        expected_version: None,
        explanation: None,
    };
    lead.write(&plan, &WriteContext::new("lead", 1, 1)).unwrap();
    let m = hub.merge_from(&lead).unwrap();
    let mut authority = Authority::new("hub", Policy::default(), Roles::default());
    assert!(authority
        .process(&mut hub, m, 2)
        .unwrap()
        .violations
        .is_empty());

    let dir = scratch("js");
    let input = dir.join("rust.automerge");
    let output = dir.join("js.automerge");
    std::fs::write(&input, hub.save()).unwrap();
    let js_actor = "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b";
    let out = Command::new("node")
        .arg(js.join("interop.mjs"))
        .args(["edit"])
        .arg(&input)
        .arg(&output)
        .arg(js_actor)
        .output()
        .expect("node must be installed");
    assert!(
        out.status.success(),
        "JS peer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    // JS reads what Rust wrote (scalar strings) as the same text.
    let read = report["read"].as_array().unwrap();
    let t2 = read.iter().find(|t| t["id"] == "t2").unwrap();
    assert_eq!(t2["content"], "Write the docs — ünïcode ✓");
    assert_eq!(t2["status"], "in_progress");
    assert_eq!(t2["owner"], "lead");
    assert_eq!(report["kinds"]["js1_content_is_string"], true);

    // Rust reads what JS wrote (Text objects) as the same strings.
    let js_doc = Automerge::load(&std::fs::read(&output).unwrap()).unwrap();
    let changes = hub.doc().get_changes_added(&js_doc);
    assert_eq!(changes.len(), 1, "one change from the JS peer");
    let merge = hub.apply_changes(changes).unwrap();
    assert_eq!(
        merge.tasks.keys().cloned().collect::<Vec<_>>(),
        vec!["js1", "t1", "t2"]
    );
    let tasks = hub.doc().get(automerge::ROOT, "tasks").unwrap().unwrap().1;
    let js1 = hub.doc().get(&tasks, "js1").unwrap().unwrap().1;
    assert!(
        matches!(
            hub.doc().get(&js1, "content").unwrap().unwrap().0,
            Value::Object(ObjType::Text)
        ),
        "JS stores native strings as Text objects"
    );
    let snap = hub.read();
    let ids: Vec<&str> = snap.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, vec!["t1", "t2", "js1"], "JS appended at the end");
    let js1 = &snap.tasks[2];
    assert_eq!(js1.content, "Written in JS");
    assert_eq!(js1.priority, Priority::High);
    assert_eq!(snap.tasks[0].content, "Edited in JS");
    assert_eq!(
        hub.agent_of(&ActorId::from(vec![0x0b; 16])).as_deref(),
        Some("js-agent")
    );

    // The JS peer's invalid status is detected and repaired to what it means.
    let report = authority.process(&mut hub, merge, 3).unwrap();
    assert_eq!(report.violations.len(), 1, "{:#?}", report.violations);
    let v = &report.violations[0];
    assert_eq!(v.rule, Rule::Schema);
    assert_eq!(v.tasks, vec!["t2"]);
    assert_eq!(v.agents, vec!["js-agent"]);
    assert_eq!(v.values[0].value, "done");
    assert!(matches!(v.resolution, Resolution::Repaired { .. }));
    assert_eq!(
        hub.raw_task("t2").unwrap().status.as_deref(),
        Some("completed")
    );
    assert_eq!(hub.read().tasks[1].status, Status::Completed);

    // A Rust write over a JS-written Text field replaces it with a plain string.
    let mut edit = hub.fork(ActorId::from([0x02; 16]));
    let req = WriteRequest {
        mode: WriteMode::Patch {
            ops: vec![swarmtodo::proto::PatchOp::Upsert {
                task: TaskPatch {
                    id: Some("js1".into()),
                    content: Some("Rewritten in Rust".into()),
                    ..TaskPatch::default()
                },
            }],
        },
        expected_version: None,
        explanation: None,
    };
    let (res, _) = edit.write(&req, &WriteContext::new("lead", 4, 4)).unwrap();
    assert!(res.changed);
    assert_eq!(edit.read().tasks[2].content, "Rewritten in Rust");
}
