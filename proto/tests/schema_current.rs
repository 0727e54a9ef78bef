//! The committed JSON Schemas in `proto/schema/` are exactly what the Rust types
//! generate. After changing a wire type, regenerate them with
//! `cargo run -- schema` (or `SWARMTODO_UPDATE_SCHEMA=1 cargo test -p swarmtodo-proto`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::path::Path;

#[test]
fn committed_schemas_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
    let update = std::env::var_os("SWARMTODO_UPDATE_SCHEMA").is_some();
    for (name, schema) in swarmtodo_proto::schemas() {
        let text = swarmtodo_proto::schema_text(&schema);
        let path = dir.join(name);
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `cargo run -- schema`", path.display()));
        assert_eq!(
            committed,
            text,
            "{} is stale: run `cargo run -- schema`",
            path.display()
        );
    }
}

/// An event, as the hub pushes and stores it, reads back as the same event.
#[test]
fn an_event_reads_back() {
    use swarmtodo_proto::{Event, EventBody};
    let e = Event {
        seq: 7,
        list: "4FvxaPuPEUoh6bchuS5Z7YHcTq5B".into(),
        at_ms: 1_700_000_000_000,
        body: EventBody::Repaired {
            change: "ab12".into(),
            notes: vec!["kept the later start".into()],
        },
    };
    let json = serde_json::to_string(&e).unwrap();
    assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), e, "{json}");
}
