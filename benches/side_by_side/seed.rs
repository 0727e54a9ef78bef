//! The workload every server gets: one list of [`TASKS`] tasks with a history of at least
//! the requested number of changes, built once and cached on disk.
//!
//! Task `t` is owned by agent `t % AGENTS_MAX`, every agent's actor is registered in the
//! list's agent map, and the history is the lead's status updates cycling over the tasks
//! (never `in_progress`, so the history itself breaks no invariant).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use automerge::sync::{self, SyncDoc};
use automerge::transaction::Transactable;
use automerge::{ActorId, Automerge, ChangeHash, ReadDoc, ROOT};
use swarmtodo::model::{TodoList, WriteContext};
use swarmtodo::proto::{PatchOp, Status, TaskPatch, WriteMode, WriteRequest};

/// Tasks in the list.
pub(crate) const TASKS: usize = 1_000;
/// Agents the list registers (the largest swarm measured).
pub(crate) const AGENTS_MAX: usize = 1_000;
/// Tasks created per write while building.
const TASKS_PER_WRITE: usize = 100;
/// The statuses the history and the measured writes cycle through.
pub(crate) const STATUSES: [Status; 3] = [Status::Pending, Status::Blocked, Status::Completed];

/// The agent id of agent `i`.
pub(crate) fn agent_name(i: usize) -> String {
    format!("agent-{i}")
}

/// The actor of agent `i` (fixed, registered in the list).
pub(crate) fn agent_actor(i: usize) -> ActorId {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(b"benchagt");
    bytes[8..].copy_from_slice(&(i as u64).to_be_bytes());
    ActorId::from(bytes)
}

/// The lead that built the list.
const LEAD: &str = "lead";

/// Where one task's status lives: its map and the op that wrote the current status, in
/// automerge's `counter@actor` notation.
#[derive(Debug, Clone)]
pub(crate) struct TaskRef {
    pub(crate) obj: String,
    pub(crate) status_op: String,
    pub(crate) status: String,
}

/// The shared list.
pub(crate) struct Seed {
    /// The saved document.
    pub(crate) bytes: Vec<u8>,
    /// The document (for the seeding peer and for changes a server asks for by hash).
    pub(crate) doc: std::sync::Mutex<Automerge>,
    /// Its heads, sorted.
    pub(crate) heads: Vec<ChangeHash>,
    /// Every change hash in it.
    pub(crate) hashes: HashSet<ChangeHash>,
    /// The largest op counter in it.
    pub(crate) max_op: u64,
    /// Task `t`'s status location.
    pub(crate) tasks: Vec<TaskRef>,
    /// The first sync message of a peer that holds exactly this document (fresh sync
    /// state): heads and a Bloom filter of the whole history, as automerge builds it.
    pub(crate) hello: sync::Message,
}

impl Seed {
    /// Loads the list with ≥ `changes` changes from `dir`, building and saving it first
    /// if it is not there.
    pub(crate) fn load_or_build(changes: usize, dir: &Path) -> anyhow::Result<Arc<Seed>> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("seed-{TASKS}-tasks-{changes}-changes.automerge"));
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(_) => {
                eprintln!("building the {changes}-change list (cached in {path:?}) …");
                let b = build(changes)?;
                std::fs::write(&path, &b)?;
                b
            }
        };
        Self::from_bytes(bytes)
    }

    fn from_bytes(bytes: Vec<u8>) -> anyhow::Result<Arc<Seed>> {
        let doc = Automerge::load(&bytes)?;
        let mut heads = doc.get_heads();
        heads.sort();
        let mut hashes = HashSet::new();
        let mut max_op = 0;
        for c in doc.get_changes(&[]) {
            hashes.insert(c.hash());
            max_op = max_op.max(c.max_op());
        }
        let (_, tasks_obj) = doc
            .get(ROOT, "tasks")?
            .ok_or_else(|| anyhow::anyhow!("the list has no tasks map"))?;
        let mut tasks = Vec::with_capacity(TASKS);
        for t in 0..TASKS {
            let (_, obj) = doc
                .get(&tasks_obj, task_id(t))?
                .ok_or_else(|| anyhow::anyhow!("task {t} missing"))?;
            let (status, op) = doc
                .get(&obj, "status")?
                .ok_or_else(|| anyhow::anyhow!("task {t} has no status"))?;
            tasks.push(TaskRef {
                obj: obj.to_string(),
                status_op: op.to_string(),
                status: status.as_str().unwrap_or_default().to_owned(),
            });
        }
        let hello = doc
            .generate_sync_message(&mut sync::State::new())
            .ok_or_else(|| anyhow::anyhow!("automerge had nothing to say"))?;
        Ok(Arc::new(Seed {
            bytes,
            doc: std::sync::Mutex::new(doc),
            heads,
            hashes,
            max_op,
            tasks,
            hello,
        }))
    }

    /// Changes in the history.
    pub(crate) fn changes(&self) -> usize {
        self.hashes.len()
    }
}

/// The id of task `t`.
pub(crate) fn task_id(t: usize) -> String {
    format!("t{t:04}")
}

fn request(ops: Vec<PatchOp>) -> WriteRequest {
    WriteRequest {
        mode: WriteMode::Patch { ops },
        expected_version: None,
        explanation: None,
    }
}

fn build(changes: usize) -> anyhow::Result<Vec<u8>> {
    let mut list = TodoList::create(ActorId::from(*b"benchlead0000000"));
    let mut seq = 0u64;
    let mut ctx = || {
        seq += 1;
        WriteContext::new(LEAD, 1_700_000_000_000 + seq as i64, seq)
    };
    for chunk in (0..TASKS).collect::<Vec<_>>().chunks(TASKS_PER_WRITE) {
        let ops = chunk
            .iter()
            .map(|&t| PatchOp::Upsert {
                task: TaskPatch {
                    id: Some(task_id(t)),
                    content: Some(format!("Task {t}: a unit of work of the benchmark swarm")),
                    status: Some(Status::Pending),
                    owner: Some(Some(agent_name(t % AGENTS_MAX))),
                    ..TaskPatch::default()
                },
            })
            .collect();
        list.write(&request(ops), &ctx())?;
    }
    // Register every agent's actor (one change by the lead).
    let mut doc = Automerge::load(&list.save())?.with_actor(ActorId::from(*b"benchlead0000000"));
    {
        let (_, agents) = doc
            .get(ROOT, "agents")?
            .ok_or_else(|| anyhow::anyhow!("no agents map"))?;
        let mut tx = doc.transaction();
        for i in 0..AGENTS_MAX {
            tx.put(&agents, agent_actor(i).to_hex_string(), agent_name(i))?;
        }
        tx.commit();
    }
    let mut list = TodoList::from_doc(doc);
    let bar = indicatif::ProgressBar::new(changes as u64);
    let mut k = 0usize;
    while list.doc().get_changes(&[]).len() < changes {
        // Enough writes to reach the target, then count again.
        let missing = changes - list.doc().get_changes(&[]).len();
        for _ in 0..missing {
            let t = k % TASKS;
            let status = STATUSES[(k / TASKS + 1) % STATUSES.len()];
            list.write(
                &request(vec![PatchOp::Upsert {
                    task: TaskPatch {
                        id: Some(task_id(t)),
                        status: Some(status),
                        ..TaskPatch::default()
                    },
                }]),
                &ctx(),
            )?;
            k += 1;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(list.save())
}
