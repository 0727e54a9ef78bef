//! The SQLite store on real files: racing creators, a writer killed with SIGKILL,
//! compaction, resumable events, atomic commits and the async handle (docs/DESIGN.md §4, §6,
//! §8).
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use automerge::{transaction::Transactable, ActorId, Automerge, ReadDoc, ROOT};
use serde_json::json;
use swarmtodo::authority::{Authority, Policy, Roles};
use swarmtodo::hub::wire::DocumentId;
use swarmtodo::model::{parse_write_request, TodoList, WriteContext};
use swarmtodo::proto::{TaskCounts, Version};
use swarmtodo::store::{
    Batch, ChangeRecord, Db, DocId, NewEvent, Store, StoreError, StoredEvent, Summary,
    LISTS_PAGE_MAX, REPORTED_KEY_BYTES_MAX, SCHEMA_VERSION, STORE_QUEUE_MAX,
};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("swarmtodo-store-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("hub.sqlite3")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn doc_id(a: u8, b: u8) -> DocId {
    let mut id = [0u8; 16];
    id[0] = a;
    id[1] = b;
    DocId(id)
}

/// Commits a change that puts `key = value` and returns its record.
fn put(doc: &mut Automerge, key: &str, value: i64) -> ChangeRecord {
    let mut tx = doc.transaction();
    tx.put(ROOT, key, value).unwrap();
    tx.commit();
    ChangeRecord::from_change(&doc.get_last_local_change().unwrap())
}

fn event(i: u64) -> NewEvent {
    NewEvent::new("tasks_changed", &json!({ "i": i })).unwrap()
}

fn seqs(events: &[StoredEvent]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

/// Every event of the list, read in pages of `page` as a resuming subscriber would.
fn all_events(db: &Db, doc: DocId, page: usize) -> Vec<StoredEvent> {
    let mut out: Vec<StoredEvent> = Vec::new();
    loop {
        let after = out.last().map_or(0, |e| e.seq);
        let next = db.events_since(doc, after, page).unwrap();
        if next.is_empty() {
            return out;
        }
        out.extend(next);
    }
}

/// Keys and values of the document's root map, in key order.
fn contents(doc: &Automerge) -> Vec<(String, String)> {
    doc.keys(ROOT)
        .map(|k| {
            let v = doc.get(ROOT, &k).unwrap().unwrap().0;
            (k, v.to_string())
        })
        .collect()
}

#[test]
fn create_or_get_is_race_free_across_connections() {
    const CREATORS: usize = 8;
    const ROUNDS: usize = 6;
    let dir = TempDir::new("race");
    for round in 0..ROUNDS {
        let name = match round {
            0 => "swarm-42".to_owned(),
            r => format!("swarm-42-{r}"),
        };
        let barrier = Arc::new(Barrier::new(CREATORS));
        let creators: Vec<_> = (0..CREATORS)
            .map(|i| {
                let (path, barrier, name) = (dir.file(), barrier.clone(), name.clone());
                std::thread::spawn(move || {
                    // Round 0 also races the creation of the file and its schema.
                    if round == 0 {
                        barrier.wait();
                    }
                    let mut db = Db::open(path).unwrap();
                    if round > 0 {
                        barrier.wait();
                    }
                    db.create_or_get_list(&name, doc_id(round as u8, i as u8))
                        .unwrap()
                })
            })
            .collect();
        let got: Vec<(DocId, bool)> = creators.into_iter().map(|c| c.join().unwrap()).collect();
        let created: Vec<usize> = (0..CREATORS).filter(|&i| got[i].1).collect();
        assert_eq!(created.len(), 1, "round {round}: {got:?}");
        let winner = doc_id(round as u8, created[0] as u8);
        assert!(
            got.iter().all(|(d, _)| *d == winner),
            "round {round}: {got:?}"
        );
    }
    let db = Db::open(dir.file()).unwrap();
    assert_eq!(
        db.list_by_name("swarm-42").unwrap().map(|l| l.name),
        Some("swarm-42".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_or_get_is_race_free_across_tasks() {
    const CREATORS: u8 = 32;
    let dir = TempDir::new("race-tasks");
    let store = Store::open(dir.file()).await.unwrap();
    let tasks: Vec<_> = (0..CREATORS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.create_or_get_list("swarm-42", doc_id(9, i)).await })
        })
        .collect();
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap().unwrap());
    }
    assert_eq!(got.iter().filter(|(_, c)| *c).count(), 1, "{got:?}");
    let ids: BTreeSet<DocId> = got.iter().map(|(d, _)| *d).collect();
    assert_eq!(ids.len(), 1, "{got:?}");
    store.close().await.unwrap();
}

#[test]
fn lists_are_found_by_name_and_by_doc_id() {
    let dir = TempDir::new("lookup");
    let mut db = Db::open(dir.file()).unwrap();
    let a = doc_id(1, 1);
    let b = doc_id(1, 2);
    assert_eq!(db.create_or_get_list("swarm-42", a).unwrap(), (a, true));
    assert_eq!(db.create_or_get_list("swarm-7", b).unwrap(), (b, true));
    // Existing name: its id, whatever id is proposed.
    assert_eq!(
        db.create_or_get_list("swarm-42", doc_id(1, 3)).unwrap(),
        (a, false)
    );
    assert_eq!(db.list_by_name("swarm-7").unwrap().unwrap().doc, b);
    assert_eq!(db.list_by_doc(a).unwrap().unwrap().name, "swarm-42");
    assert_eq!(db.list_by_name("nope").unwrap(), None);
    assert_eq!(db.list_by_doc(doc_id(1, 9)).unwrap(), None);

    // `(name, proposed id, expected error code)`.
    let refused: &[(&str, DocId, &str)] = &[
        ("another", a, "store_doc_id_taken"),
        ("", doc_id(2, 0), "store_invalid_name"),
        ("tab\there", doc_id(2, 1), "store_invalid_name"),
        (&"n".repeat(257), doc_id(2, 2), "store_invalid_name"),
    ];
    for (name, id, code) in refused {
        let err = db.create_or_get_list(name, *id).unwrap_err();
        assert_eq!(err.code(), *code, "{name:?}: {err}");
    }

    // Calls on an unknown list.
    let unknown = doc_id(7, 7);
    let codes = [
        db.load(unknown).map(|_| ()),
        db.events_since(unknown, 0, 10).map(|_| ()),
        db.reported(unknown).map(|_| ()),
        db.append_events(unknown, &[event(0)]).map(|_| ()),
    ]
    .map(|r| r.unwrap_err().code());
    assert_eq!(codes, ["store_unknown_list"; 4]);

    // A list with nothing stored yet loads as `None`.
    assert_eq!(db.load(a).unwrap(), None);
}

/// `GET /v1/lists` reads this: every list in order of its key, a page of at most
/// `LISTS_PAGE_MAX`, each with what its last commit left (its name once an API call
/// named it, its version and tasks by status).
#[test]
fn lists_are_paged_in_key_order_with_what_their_last_commit_left() {
    let dir = TempDir::new("lists");
    let mut db = Db::open(dir.file()).unwrap();
    for i in 0..=LISTS_PAGE_MAX {
        let id = DocId([
            (i >> 8) as u8,
            i as u8,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
        ]);
        db.create_or_get_list(&format!("list-{i:05}"), id).unwrap();
    }
    // A list made by sync is stored under its document id, until an API call names it.
    let synced = DocumentId::from_bytes([3; 16]);
    let doc = DocId([3; 16]);
    db.create_or_get_list(&synced.to_string(), doc).unwrap();
    let summary = |name: Option<&str>, pending: u64| Summary {
        name: name.map(str::to_owned),
        version: Version("v-1".into()),
        tasks: TaskCounts {
            pending,
            in_progress: 1,
            ..TaskCounts::default()
        },
    };
    let commit = |db: &mut Db, s: Summary| {
        let batch = Batch {
            summary: Some(s),
            ..Batch::default()
        };
        db.commit_merge(doc, &batch).unwrap();
    };
    commit(&mut db, summary(None, 2));
    let find = |page: &swarmtodo::proto::ListsPage| {
        page.lists
            .iter()
            .find(|l| l.document == synced.to_string())
            .cloned()
    };
    let all = |db: &Db| {
        let mut lists = Vec::new();
        let mut after: Option<String> = None;
        let mut pages = 0;
        loop {
            let page = db.lists(after.as_deref(), LISTS_PAGE_MAX).unwrap();
            assert!(page.lists.len() <= LISTS_PAGE_MAX);
            pages += 1;
            lists.extend(page.lists.clone());
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        (lists, pages)
    };
    let (lists, pages) = all(&db);
    assert_eq!((lists.len(), pages), (LISTS_PAGE_MAX + 2, 2));
    let keys: Vec<String> = lists
        .iter()
        .map(|l| l.name.clone().unwrap_or_else(|| l.document.clone()))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "in key order");
    let first = db.lists(None, LISTS_PAGE_MAX).unwrap();
    assert_eq!(first.lists.len(), LISTS_PAGE_MAX);
    assert_eq!(
        first.next.as_deref(),
        Some(keys[LISTS_PAGE_MAX - 1].as_str())
    );
    let unnamed = lists
        .iter()
        .find(|l| l.document == synced.to_string())
        .unwrap();
    assert_eq!(unnamed.name, None);
    assert_eq!(unnamed.version, Some(Version("v-1".into())));
    assert_eq!((unnamed.tasks.pending, unnamed.tasks.in_progress), (2, 1));
    // A list nothing was committed to yet has no version.
    let bare = lists
        .iter()
        .find(|l| l.name.as_deref() == Some("list-00000"))
        .unwrap();
    assert_eq!((&bare.version, bare.tasks), (&None, TaskCounts::default()));

    // Named by a call: the name stays, and a second name for it is ignored.
    commit(&mut db, summary(Some("sprint"), 3));
    commit(&mut db, summary(Some("other"), 4));
    let named = find(&db.lists(Some("sprint\u{0}"), 10).unwrap());
    assert_eq!(named, None, "after its key");
    let named = find(&db.lists(Some("sprinp"), 10).unwrap()).unwrap();
    assert_eq!(named.name.as_deref(), Some("sprint"));
    assert_eq!(named.tasks.pending, 4);
}

/// A file of schema 1 (before the list index and the delegations' links and tokens)
/// opens with its lists, without a version until their next commit, and takes links.
#[test]
fn a_schema_1_file_is_migrated_and_keeps_its_lists() {
    let dir = TempDir::new("migrate");
    let mut db = Db::open(dir.file()).unwrap();
    db.create_or_get_list("old", doc_id(4, 4)).unwrap();
    drop(db);
    let c = rusqlite::Connection::open(dir.file()).unwrap();
    c.execute_batch(
        "DROP TABLE links; DROP TABLE tokens; \
         ALTER TABLE lists DROP COLUMN version; ALTER TABLE lists DROP COLUMN pending; \
         ALTER TABLE lists DROP COLUMN in_progress; ALTER TABLE lists DROP COLUMN completed; \
         ALTER TABLE lists DROP COLUMN cancelled; ALTER TABLE lists DROP COLUMN blocked; \
         PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(c);
    let mut db = Db::open(dir.file()).unwrap();
    let page = db.lists(None, 10).unwrap();
    assert_eq!(page.lists.len(), 1);
    assert_eq!(page.lists[0].name.as_deref(), Some("old"));
    assert_eq!(page.lists[0].version, None);
    assert!(db.links().unwrap().is_empty());
    let link = swarmtodo::hub::core::Link {
        parent: "plan".into(),
        task: "t2".into(),
        agent: "sub-1".into(),
        list: "old".into(),
    };
    db.set_link(doc_id(4, 4), &link).unwrap();
    assert_eq!(db.links().unwrap(), [link]);
    assert!(db.tokens().unwrap().is_empty());
}

#[test]
fn files_of_a_newer_schema_or_of_another_program_are_refused() {
    /// `(how the file is prepared, expected error code)`.
    type Prepare = fn(&Path);
    let cases: &[(&str, Prepare, &str)] = &[
        (
            "newer schema",
            |p| {
                drop(Db::open(p).unwrap());
                let c = rusqlite::Connection::open(p).unwrap();
                c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
                    .unwrap();
            },
            "store_schema_too_new",
        ),
        (
            "another program's tables",
            |p| {
                let c = rusqlite::Connection::open(p).unwrap();
                c.execute_batch("CREATE TABLE notes (body TEXT)").unwrap();
            },
            "store_not_a_store",
        ),
        (
            "another application id",
            |p| {
                let c = rusqlite::Connection::open(p).unwrap();
                c.pragma_update(None, "application_id", 7).unwrap();
            },
            "store_not_a_store",
        ),
        (
            "not SQLite at all",
            |p| std::fs::write(p, "x".repeat(4096)).unwrap(),
            "store_sqlite",
        ),
    ];
    for (what, prepare, code) in cases {
        let dir = TempDir::new("schema");
        prepare(&dir.file());
        let err = Db::open(dir.file()).unwrap_err();
        assert_eq!(err.code(), *code, "{what}: {err}");
    }

    // The current version reopens, and says which version it found when too new.
    let dir = TempDir::new("schema-ok");
    drop(Db::open(dir.file()).unwrap());
    drop(Db::open(dir.file()).unwrap());
    let c = rusqlite::Connection::open(dir.file()).unwrap();
    c.pragma_update(None, "user_version", 99).unwrap();
    drop(c);
    match Db::open(dir.file()) {
        Err(StoreError::SchemaTooNew { found, supported }) => {
            assert_eq!((found, supported), (99, SCHEMA_VERSION));
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

/// Set on the child process of [`acknowledged_writes_survive_sigkill`]: the directory
/// of the store it writes.
const CRASH_DIR_ENV: &str = "SWARMTODO_STORE_CRASH_DIR";

/// Times the child is started, then killed.
const CRASH_ROUNDS: usize = 3;

/// Acknowledgements the parent waits for before it kills the child.
const CRASH_ACKS_PER_ROUND: usize = 40;

/// The child compacts after this many commits, so some kills land in a compaction.
const CRASH_COMPACT_EVERY: u64 = 8;

/// Bound on the child's loop, far beyond what it reaches before the kill.
const CRASH_CHILD_WRITES_MAX: u64 = 1_000_000;

/// The child half of [`acknowledged_writes_survive_sigkill`]: reopens the store,
/// continues the list where the last run left it, and prints `ack <i> <change hash>`
/// after each durable commit until it is killed. Without [`CRASH_DIR_ENV`] it does
/// nothing.
#[test]
#[ignore = "run by acknowledged_writes_survive_sigkill as its child process"]
fn crash_child() {
    use std::io::Write;
    let Some(dir) = std::env::var_os(CRASH_DIR_ENV) else {
        return;
    };
    let mut db = Db::open(Path::new(&dir).join("hub.sqlite3")).unwrap();
    let (id, _) = db.create_or_get_list("swarm-42", doc_id(42, 0)).unwrap();
    // `Automerge::new()` and `load` pick a random actor: each run writes as a new one.
    let mut doc = match db.load(id).unwrap() {
        Some(loaded) => loaded.rebuild().unwrap(),
        None => Automerge::new(),
    };
    let start = db.list_by_doc(id).unwrap().unwrap().last_seq;
    let mut out = std::io::stdout().lock();
    for i in start..start + CRASH_CHILD_WRITES_MAX {
        let change = put(&mut doc, &format!("k{i:06}"), i as i64);
        let hash = change.hash();
        let batch = Batch {
            changes: vec![change],
            events: vec![event(i)],
            reported: vec![format!("r{i:06}")],
            summary: None,
        };
        assert_eq!(db.commit_merge(id, &batch).unwrap().seqs, vec![i + 1]);
        if (i + 1) % CRASH_COMPACT_EVERY == 0 {
            db.compact(id, &doc.save(), &doc.get_heads()).unwrap();
        }
        writeln!(out, "ack {i} {hash}").unwrap();
        out.flush().unwrap();
    }
}

#[cfg(unix)]
#[test]
fn acknowledged_writes_survive_sigkill() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    let dir = TempDir::new("crash");
    let mut acked: Vec<(u64, String)> = Vec::new();
    for round in 0..CRASH_ROUNDS {
        let mut child =
            common::dies_with_parent(&mut Command::new(std::env::current_exe().unwrap()))
                .args([
                    "--exact",
                    "crash_child",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CRASH_DIR_ENV, &dir.0)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
        // The pipe stays open until the child is dead: a closed pipe would make the
        // child fail on its own instead of being killed mid-write.
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut this_round = 0;
        while this_round < CRASH_ACKS_PER_ROUND {
            let Some(line) = lines.next() else { break };
            let line = line.unwrap();
            let Some(ack) = line.strip_prefix("ack ") else {
                continue; // the test harness's own lines
            };
            let (i, hash) = ack.split_once(' ').unwrap();
            acked.push((i.parse().unwrap(), hash.to_owned()));
            this_round += 1;
        }
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        drop(lines);
        assert_eq!(
            this_round, CRASH_ACKS_PER_ROUND,
            "round {round}: the child stopped on its own ({status})"
        );
        assert_eq!(status.signal(), Some(9), "round {round}: {status}");
        check_after_crash(&dir.file(), &acked);
    }
}

/// Everything acknowledged is there; changes, events and keys were committed together.
fn check_after_crash(path: &Path, acked: &[(u64, String)]) {
    let db = Db::open(path).unwrap();
    let list = db.list_by_name("swarm-42").unwrap().unwrap();
    let n = list.last_seq;
    assert!(n >= acked.len() as u64, "{n} events, {} acked", acked.len());

    let events = all_events(&db, list.doc, 7);
    assert_eq!(seqs(&events), (1..=n).collect::<Vec<_>>());
    for e in &events {
        let body: serde_json::Value = serde_json::from_str(&e.json).unwrap();
        assert_eq!(body["i"], json!(e.seq - 1));
    }

    let doc = db.load(list.doc).unwrap().unwrap().rebuild().unwrap();
    let hashes: BTreeSet<String> = doc
        .get_changes(&[])
        .iter()
        .map(|c| c.hash().to_string())
        .collect();
    for (i, hash) in acked {
        assert!(hashes.contains(hash), "acked change {i} ({hash}) lost");
        let value = doc.get(ROOT, format!("k{i:06}")).unwrap();
        assert!(value.is_some(), "acked key {i} lost");
    }
    // One commit = one change, one event, one key: the counts agree after any crash.
    assert_eq!(doc.keys(ROOT).count() as u64, n);
    assert_eq!(db.reported(list.doc).unwrap().len() as u64, n);
}

#[test]
fn compaction_reloads_the_same_document_and_drops_covered_changes() {
    let dir = TempDir::new("compact");
    let mut db = Db::open(dir.file()).unwrap();
    let (id, _) = db.create_or_get_list("swarm-42", doc_id(3, 0)).unwrap();
    let mut hub = Automerge::new().with_actor(ActorId::from([1u8; 16]));

    let first: Vec<_> = (0..6).map(|i| put(&mut hub, &format!("a{i}"), i)).collect();
    assert_eq!(db.append_changes(id, &first).unwrap(), 6);
    assert_eq!(db.append_changes(id, &first[..2]).unwrap(), 0, "duplicates");
    let (snapshot, snapshot_heads) = (hub.save(), hub.get_heads());

    // A peer forked before the snapshot and wrote concurrently; the hub wrote more;
    // all of it is appended before the compaction runs and is not covered by it.
    let mut peer = hub.fork().with_actor(ActorId::from([2u8; 16]));
    let branch: Vec<_> = (0..3)
        .map(|i| put(&mut peer, &format!("p{i}"), i))
        .collect();
    let later: Vec<_> = (6..9).map(|i| put(&mut hub, &format!("a{i}"), i)).collect();
    hub.merge(&mut peer).unwrap();
    let on_top = put(&mut hub, "merged", 1);
    db.append_changes(id, &later).unwrap();
    db.append_changes(id, &branch).unwrap();
    db.append_changes(id, std::slice::from_ref(&on_top))
        .unwrap();

    let info = db.compact(id, &snapshot, &snapshot_heads).unwrap();
    assert_eq!(info.changes, 7, "the 6 covered changes are deleted");
    assert_eq!(info.snapshot_bytes, snapshot.len() as u64);
    let loaded = db.load(id).unwrap().unwrap();
    assert_eq!(loaded.changes.len(), 7);
    assert_eq!(loaded.snapshot_heads, snapshot_heads);
    let rebuilt = loaded.rebuild().unwrap();
    assert_eq!(rebuilt.get_heads(), hub.get_heads());
    assert_eq!(contents(&rebuilt), contents(&hub));

    // After a reopen, and after compacting everything.
    drop(db);
    let mut db = Db::open(dir.file()).unwrap();
    let rebuilt = db.load(id).unwrap().unwrap().rebuild().unwrap();
    assert_eq!(rebuilt.get_heads(), hub.get_heads());
    let info = db.compact(id, &hub.save(), &hub.get_heads()).unwrap();
    assert_eq!((info.changes, info.change_bytes), (0, 0));
    let loaded = db.load(id).unwrap().unwrap();
    assert!(loaded.changes.is_empty());
    assert_eq!(loaded.rebuild().unwrap().get_heads(), hub.get_heads());

    // A stale snapshot would lose history: refused, nothing changes.
    let err = db.compact(id, &snapshot, &snapshot_heads).unwrap_err();
    assert_eq!(err.code(), "store_snapshot_behind", "{err}");
    let rebuilt = db.load(id).unwrap().unwrap().rebuild().unwrap();
    assert_eq!(rebuilt.get_heads(), hub.get_heads());

    // A change the snapshot already holds, appended again, is harmless.
    db.append_changes(id, &first[..1]).unwrap();
    let rebuilt = db.load(id).unwrap().unwrap().rebuild().unwrap();
    assert_eq!(contents(&rebuilt), contents(&hub));
}

#[test]
fn a_todo_list_reloads_with_the_same_tasks_and_version() {
    let dir = TempDir::new("todo");
    let mut db = Db::open(dir.file()).unwrap();
    let (id, _) = db.create_or_get_list("swarm-42", doc_id(4, 0)).unwrap();
    let mut list = TodoList::create(ActorId::from([0xA0u8; 16]));
    let write = |list: &mut TodoList, json: &str, seed: u64| {
        let req = parse_write_request(json).unwrap();
        list.write(&req, &WriteContext::new("lead", 1_000, seed))
            .unwrap();
    };
    let store_since = |db: &mut Db, list: &TodoList, heads: &[automerge::ChangeHash]| {
        let records: Vec<_> = list
            .changes_since(heads)
            .iter()
            .map(ChangeRecord::from_change)
            .collect();
        db.append_changes(id, &records).unwrap();
    };

    write(
        &mut list,
        r#"{"mode":"patch","ops":[
            {"op":"upsert","task":{"id":"t1","content":"Run the tests"}},
            {"op":"upsert","task":{"id":"t2","content":"Fix the bug"}}]}"#,
        1,
    );
    store_since(&mut db, &list, &[]);
    let compacted_at = list.heads();
    db.compact(id, &list.save(), &compacted_at).unwrap();
    write(
        &mut list,
        r#"{"mode":"patch","ops":[
            {"op":"upsert","task":{"id":"t2","status":"in_progress"}},
            {"op":"move","id":"t2"}]}"#,
        2,
    );
    store_since(&mut db, &list, &compacted_at);
    drop(db);

    let db = Db::open(dir.file()).unwrap();
    let doc = db.load(id).unwrap().unwrap().rebuild().unwrap();
    let reloaded = TodoList::from_doc(doc);
    assert_eq!(reloaded.read(), list.read());
    assert_eq!(reloaded.version(), list.version());
}

#[test]
fn a_missing_dependency_is_reported_on_rebuild() {
    let dir = TempDir::new("missing-dep");
    let mut db = Db::open(dir.file()).unwrap();
    let (id, _) = db.create_or_get_list("swarm-42", doc_id(5, 0)).unwrap();
    let mut doc = Automerge::new();
    let _parent = put(&mut doc, "a", 1);
    let child = put(&mut doc, "b", 2);
    db.append_changes(id, &[child]).unwrap();
    let err = db.load(id).unwrap().unwrap().rebuild().unwrap_err();
    assert_eq!(err.code(), "store_corrupt", "{err}");
}

#[test]
fn events_resume_without_gap_or_duplicate_across_reopen() {
    let dir = TempDir::new("events");
    let mut db = Db::open(dir.file()).unwrap();
    let (a, _) = db.create_or_get_list("swarm-a", doc_id(6, 1)).unwrap();
    let (b, _) = db.create_or_get_list("swarm-b", doc_id(6, 2)).unwrap();

    // Batches of different sizes, interleaved between the lists: each list counts alone.
    let mut next = [0u64; 2];
    for (round, size) in [1usize, 3, 0, 5, 2].into_iter().enumerate() {
        for (k, list) in [a, b].into_iter().enumerate() {
            let events: Vec<_> = (0..size as u64).map(|j| event(next[k] + j)).collect();
            let got = db.append_events(list, &events).unwrap();
            let want: Vec<u64> = (next[k] + 1..=next[k] + size as u64).collect();
            assert_eq!(got, want, "round {round}, list {k}");
            next[k] += size as u64;
        }
    }

    // A subscriber reads part, the hub restarts, the subscriber resumes.
    let first = db.events_since(a, 0, 4).unwrap();
    assert_eq!(seqs(&first), vec![1, 2, 3, 4]);
    drop(db);
    let mut db = Db::open(dir.file()).unwrap();
    let rest = db.events_since(a, 4, 100).unwrap();
    assert_eq!(seqs(&rest), (5..=11).collect::<Vec<_>>());
    assert!(db.events_since(a, 11, 100).unwrap().is_empty());
    assert!(db.events_since(a, u64::MAX, 100).unwrap().is_empty());
    assert!(db.events_since(a, 0, 0).unwrap().is_empty());

    // Numbering continues after the reopen.
    assert_eq!(db.append_events(a, &[event(11)]).unwrap(), vec![12]);
    for (list, count) in [(a, 12), (b, 11)] {
        let events = all_events(&db, list, 5);
        assert_eq!(seqs(&events), (1..=count).collect::<Vec<_>>());
        for e in &events {
            assert_eq!(e.kind, "tasks_changed");
            assert_eq!(e.json, json!({ "i": e.seq - 1 }).to_string());
        }
        assert_eq!(db.list_by_doc(list).unwrap().unwrap().last_seq, count);
    }
}

#[test]
fn reported_keys_survive_a_reopen_and_keep_reports_once() {
    let dir = TempDir::new("reported");
    let mut db = Db::open(dir.file()).unwrap();
    let (id, _) = db.create_or_get_list("swarm-42", doc_id(7, 0)).unwrap();

    // A list whose completed task waits on an open one: a dependency violation.
    let mut list = TodoList::create(ActorId::from([0xA0u8; 16]));
    let req = parse_write_request(
        r#"{"mode":"patch","ops":[
            {"op":"upsert","task":{"id":"t1","content":"Build"}},
            {"op":"upsert","task":{"id":"t2","content":"Ship","blocked_by":["t1"],
                                   "status":"completed"}}]}"#,
    )
    .unwrap();
    list.write(&req, &WriteContext::new("lead", 1_000, 1))
        .unwrap();
    let mut authority = Authority::new("hub", Policy::default(), Roles::default());
    let found = authority.check_all(&list);
    assert!(!found.violations.is_empty(), "{found:?}");
    let keys: Vec<String> = authority.reported().map(str::to_owned).collect();
    db.add_reported(id, &keys).unwrap();
    db.add_reported(id, &keys).unwrap(); // twice: stored once
    drop(db);

    let db = Db::open(dir.file()).unwrap();
    let stored = db.reported(id).unwrap();
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(stored, sorted);
    // A restarted authority knows what was reported and does not report it again.
    let mut restarted =
        Authority::new("hub", Policy::default(), Roles::default()).with_reported(stored);
    assert!(restarted.check_all(&list).violations.is_empty());
}

#[test]
fn a_failed_commit_leaves_nothing_behind() {
    let dir = TempDir::new("atomic");
    let mut db = Db::open(dir.file()).unwrap();
    let (id, _) = db.create_or_get_list("swarm-42", doc_id(8, 0)).unwrap();
    let mut doc = Automerge::new();
    let batch = |doc: &mut Automerge, i: u64, events: Vec<NewEvent>, key: &str| Batch {
        changes: vec![put(doc, &format!("k{i}"), i as i64)],
        events,
        reported: vec![key.to_owned()],
        summary: None,
    };
    db.commit_merge(id, &batch(&mut doc, 0, vec![event(0)], "r0"))
        .unwrap();

    // SQLite fails in the middle of the transaction, after the changes and the events
    // are written: a trigger (planted by another connection) refuses the key "boom".
    let planted = rusqlite::Connection::open(dir.file()).unwrap();
    planted
        .execute_batch(
            "CREATE TRIGGER boom BEFORE INSERT ON reported WHEN NEW.key = 'boom' \
             BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
        )
        .unwrap();
    // An oversize key after valid changes and events: refused before the transaction
    // starts.
    let oversize = "k".repeat(REPORTED_KEY_BYTES_MAX + 1);
    let failing = [
        (
            batch(&mut doc, 1, vec![event(1), event(2)], "boom"),
            "store_sqlite",
        ),
        (
            batch(&mut doc, 2, vec![event(1), event(2)], &oversize),
            "store_too_large",
        ),
    ];
    let before = db.list_by_doc(id).unwrap().unwrap();
    for (b, code) in &failing {
        let err = db.commit_merge(id, b).unwrap_err();
        assert_eq!(err.code(), *code, "{err}");
        assert_eq!(db.list_by_doc(id).unwrap().unwrap(), before);
        assert_eq!(seqs(&db.events_since(id, 0, 100).unwrap()), vec![1]);
        assert_eq!(db.reported(id).unwrap(), vec!["r0".to_owned()]);
        assert_eq!(db.load(id).unwrap().unwrap().changes.len(), 1);
    }
    drop(planted);

    // The next commit takes the next seq: the failures used none up.
    let ok = db
        .commit_merge(id, &batch(&mut doc, 3, vec![event(1)], "r3"))
        .unwrap();
    assert_eq!(ok.seqs, vec![2]);
    assert_eq!(ok.changes_added, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_store_serves_a_runtime_and_applies_backpressure() {
    // More concurrent writers than the queue holds: some wait for a slot.
    const WRITERS: u64 = STORE_QUEUE_MAX as u64 + 100;
    let dir = TempDir::new("async");
    let store = Store::open(dir.file()).await.unwrap();
    let (id, created) = store
        .create_or_get_list("swarm-42", doc_id(10, 0))
        .await
        .unwrap();
    assert!(created);

    let mut doc = Automerge::new();
    let change = put(&mut doc, "a", 1);
    let commit = store
        .commit_merge(
            id,
            Batch {
                changes: vec![change],
                events: vec![event(0)],
                reported: vec!["r0".into()],
                summary: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(commit.seqs, vec![1]);

    // Another connection holds the write lock: the store thread waits on it (within
    // its busy timeout) while the writers fill the queue and then wait for a slot.
    let blocker = rusqlite::Connection::open(dir.file()).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let writers: Vec<_> = (0..WRITERS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.append_events(id, vec![event(i + 1)]).await })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while store.queued() < STORE_QUEUE_MAX {
        assert!(std::time::Instant::now() < deadline, "{store:?}");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "nobody was dropped"
    );
    blocker.execute_batch("ROLLBACK").unwrap();
    drop(blocker);
    let mut got = Vec::new();
    for w in writers {
        got.extend(w.await.unwrap().unwrap());
    }
    got.sort_unstable();
    assert_eq!(got, (2..=WRITERS + 1).collect::<Vec<_>>());

    let events = store.events_since(id, WRITERS - 2, 10).await.unwrap();
    assert_eq!(seqs(&events), vec![WRITERS - 1, WRITERS, WRITERS + 1]);
    let loaded = store.load(id).await.unwrap().unwrap();
    let rebuilt = tokio::task::spawn_blocking(move || loaded.rebuild())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rebuilt.get_heads(), doc.get_heads());
    let info = store
        .compact(id, doc.save(), doc.get_heads())
        .await
        .unwrap();
    assert_eq!(info.changes, 0);
    assert_eq!(store.reported(id).await.unwrap(), vec!["r0".to_owned()]);
    let err = store
        .commit_merge(
            id,
            Batch {
                events: vec![event(9)],
                reported: vec!["k".repeat(REPORTED_KEY_BYTES_MAX + 1)],
                ..Batch::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "store_too_large");

    // Closing ends the thread; other handles then fail, and the file reopens.
    let other = store.clone();
    store.close().await.unwrap();
    let err = other.list_by_doc(id).await.unwrap_err();
    assert_eq!(err.code(), "store_closed");
    let store = Store::open(dir.file()).await.unwrap();
    let list = store.list_by_name("swarm-42").await.unwrap().unwrap();
    assert_eq!(list.last_seq, WRITERS + 1);
    drop(store);
}
