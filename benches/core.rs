//! Criterion benches of the per-merge path (DESIGN.md §4, issue "Criterion benches"):
//!
//! - `authority_check`: `Authority::check` on the merge of one single-task change, alone
//!   (goal: ≤ 50 µs median, flat across 100, 1,000 and 10,000 tasks);
//! - `merge_and_process`: the hub's whole per-merge path, `apply_changes` of that one
//!   change and `Authority::process` of its merge;
//! - `local_write`: `TodoList::write` of one status change on a replica;
//! - `snapshot_read`: `TodoList::read`.
//!
//! Each size gets a hub whose list holds N tasks (written in chunks of 1,000 by a lead)
//! and a history of single-task status and content updates from several agents,
//! merged by the hub and checked by its authority. Every measured change is a real
//! one (the status always moves to a different value, among pending, completed and
//! blocked, so no write is a no-op and no invariant is broken).
//!
//! Run: `CARGO_TARGET_DIR=/work/target-bench cargo bench --bench core`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use automerge::{ActorId, Change};
use criterion::{BatchSize, BenchmarkId, Criterion};
use swarmtodo::authority::{Authority, Policy, Role, Roles};
use swarmtodo::model::{TodoList, WriteContext};
use swarmtodo::proto::{PatchOp, Priority, Status, TaskPatch, WriteMode, WriteRequest};

/// List sizes measured.
const SIZES: [usize; 3] = [100, 1_000, 10_000];
/// Tasks per write when the lead creates the list.
const CREATE_CHUNK: usize = 1_000;
/// Single-task updates written after the list is created (the document's history).
const HISTORY_UPDATES: usize = 6_000;
/// Updates one history agent writes before the next one takes over.
const HISTORY_TURN: usize = 500;
/// Agents writing the history (leads by the authority's roles).
const HISTORY_AGENTS: [&str; 4] = ["lead", "planner", "reviewer", "scheduler"];
/// Worker agents that own the tasks (task `tJ` is owned by `WORKERS[J % 4]`).
const WORKERS: [&str; 4] = ["w0", "w1", "w2", "w3"];
/// The statuses the writes cycle through (never `in_progress`: see "single active").
const CYCLE: [Status; 3] = [Status::Pending, Status::Completed, Status::Blocked];

fn fail(what: &str, e: impl std::fmt::Debug) -> ! {
    panic!("bench setup: {what}: {e:?}")
}

fn task_id(j: usize) -> String {
    format!("t{j}")
}

fn patch(ops: Vec<PatchOp>, explanation: Option<String>) -> WriteRequest {
    WriteRequest {
        mode: WriteMode::Patch { ops },
        expected_version: None,
        explanation,
    }
}

fn status_update(id: String, status: Status) -> WriteRequest {
    patch(
        vec![PatchOp::Upsert {
            task: TaskPatch {
                id: Some(id),
                status: Some(status),
                ..TaskPatch::default()
            },
        }],
        None,
    )
}

fn cycle_index(s: Status) -> u8 {
    CYCLE.iter().position(|c| *c == s).unwrap_or(0) as u8
}

/// Makes the single-status-change writes of one replica: which task, which status
/// (always different from the one the replica holds), a distinct time and seed.
#[derive(Debug)]
struct Writes {
    agent: &'static str,
    /// Tasks this agent may change (the ones it owns).
    targets: Vec<usize>,
    /// Index into `CYCLE` of each task's status as this replica holds it.
    shadow: Vec<u8>,
    count: u64,
    base_ms: i64,
}

impl Writes {
    fn new(list: &TodoList, agent: &'static str, base_ms: i64) -> Writes {
        let n = list.len();
        let owner = WORKERS.iter().position(|w| *w == agent).unwrap_or(0);
        let mut shadow = vec![0u8; n];
        for t in list.read().tasks {
            if let Some(j) = t.id.strip_prefix('t').and_then(|s| s.parse::<usize>().ok()) {
                shadow[j] = cycle_index(t.status);
            }
        }
        Writes {
            agent,
            targets: (owner..n).step_by(WORKERS.len()).collect(),
            shadow,
            count: 0,
            base_ms,
        }
    }

    fn next(&mut self) -> (WriteRequest, WriteContext) {
        // Spread the writes over the tasks (a stride coprime with any target count
        // that is a power of ten divided by four).
        let k = self.count as usize;
        let j = self.targets[(k * 7) % self.targets.len()];
        let next = (self.shadow[j] + 1) % CYCLE.len() as u8;
        self.shadow[j] = next;
        self.count += 1;
        let ctx = WriteContext::new(
            self.agent,
            self.base_ms + 1_000 * self.count as i64,
            0x5EED_0000 + self.count,
        );
        (status_update(task_id(j), CYCLE[next as usize]), ctx)
    }
}

/// One size's state: the hub with its authority, a worker whose changes the hub merges,
/// and a separate replica for the local writes.
#[derive(Debug)]
struct Fixture {
    n: usize,
    hub: RefCell<TodoList>,
    authority: Authority,
    worker: TodoList,
    worker_writes: Writes,
    local: TodoList,
    local_writes: Writes,
    hub_now: i64,
}

impl Fixture {
    fn new(n: usize) -> Fixture {
        let started = Instant::now();
        let mut hub = TodoList::create(ActorId::from([0xA0; 16]));
        let roles = Roles {
            by_agent: WORKERS
                .iter()
                .map(|w| ((*w).to_owned(), Role::Worker))
                .collect(),
            default: Role::Lead,
        };
        let mut authority = Authority::new("hub", Policy::default(), roles);

        // The lead writes the N tasks, CREATE_CHUNK per change.
        let mut lead = hub.fork(ActorId::from([0xA1; 16]));
        let mut now = 1_700_000_000_000_i64;
        for (c, start) in (0..n).step_by(CREATE_CHUNK).enumerate() {
            let ops = (start..(start + CREATE_CHUNK).min(n))
                .map(|j| PatchOp::Upsert {
                    task: TaskPatch {
                        id: Some(task_id(j)),
                        content: Some(format!("Implement step {j} of the plan")),
                        active_form: Some(Some(format!("Implementing step {j}"))),
                        status: Some(Status::Pending),
                        priority: Some(Priority::ALL[j % 3]),
                        owner: Some(Some(WORKERS[j % WORKERS.len()].to_owned())),
                        blocked_by: None,
                    },
                })
                .collect();
            now += 1_000;
            let req = patch(ops, Some(format!("plan, part {c}")));
            lead.write(&req, &WriteContext::new("lead", now, c as u64))
                .unwrap_or_else(|e| fail("create tasks", e));
        }
        let created = started.elapsed();

        // History: single-task status and content updates, in turns of several agents
        // (each one its own replica, catching up with the previous one first).
        let history_started = Instant::now();
        let mut replicas: Vec<TodoList> = (0..HISTORY_AGENTS.len())
            .map(|i| lead.fork(ActorId::from([0xA1 + i as u8; 16])))
            .collect();
        let mut shadow = vec![0u8; n];
        let mut last = 0;
        for u in 0..HISTORY_UPDATES {
            let turn = (u / HISTORY_TURN) % replicas.len();
            if turn != last {
                let (a, b) = (last.min(turn), last.max(turn));
                let (left, right) = replicas.split_at_mut(b);
                let (from, to) = if last < turn {
                    (&left[a], &mut right[0])
                } else {
                    (&right[0], &mut left[a])
                };
                to.merge_from(from)
                    .unwrap_or_else(|e| fail("history merge", e));
                last = turn;
            }
            let j = (u * 7_919) % n;
            let req = if u % 2 == 0 {
                let next = (shadow[j] + 1) % CYCLE.len() as u8;
                shadow[j] = next;
                status_update(task_id(j), CYCLE[next as usize])
            } else {
                patch(
                    vec![PatchOp::Upsert {
                        task: TaskPatch {
                            id: Some(task_id(j)),
                            content: Some(format!("Implement step {j} of the plan (rev {u})")),
                            ..TaskPatch::default()
                        },
                    }],
                    Some(format!("refine t{j}")),
                )
            };
            now += 1_000;
            let ctx = WriteContext::new(HISTORY_AGENTS[turn], now, 1_000_000 + u as u64);
            let (res, _) = replicas[turn]
                .write(&req, &ctx)
                .unwrap_or_else(|e| fail("history write", e));
            assert!(res.changed, "history write {u} changed nothing");
        }
        let history = history_started.elapsed();

        // The hub merges it all and its authority checks the merge.
        let merge_started = Instant::now();
        let merge = hub
            .merge_from(&replicas[last])
            .unwrap_or_else(|e| fail("hub merge", e));
        let report = authority
            .process(&mut hub, merge, now)
            .unwrap_or_else(|e| fail("hub process", e));
        assert!(
            report.violations.is_empty() && report.repairs.is_empty(),
            "setup broke an invariant: {:?}",
            report.violations
        );
        let merged = merge_started.elapsed();
        assert_eq!(hub.len(), n);

        let worker = hub.fork(ActorId::from([0xB0; 16]));
        let worker_writes = Writes::new(&worker, "w0", now);
        let local = hub.fork(ActorId::from([0xC0; 16]));
        let local_writes = Writes::new(&local, "w1", now);
        let changes = hub.changes_since(&[]).len();
        eprintln!(
            "setup n={n}: {:.2?} total (create {:.2?}, {HISTORY_UPDATES} history writes {:.2?}, \
             hub merge + check {:.2?}); {changes} changes, {} bytes saved",
            started.elapsed(),
            created,
            history,
            merged,
            hub.save().len(),
        );
        Fixture {
            n,
            hub: RefCell::new(hub),
            authority,
            worker,
            worker_writes,
            local,
            local_writes,
            hub_now: now,
        }
    }

    /// Checks that the benches broke no invariant (nothing was ever reported).
    fn assert_clean(&self) {
        let reported: Vec<&str> = self.authority.reported().collect();
        assert!(reported.is_empty(), "n={}: reported {reported:?}", self.n);
        assert_eq!(self.hub.borrow().pending_changes(), 0);
    }
}

/// `worker` writes its next status change; returns it (for the hub to merge).
fn worker_change(worker: &mut TodoList, writes: &mut Writes) -> Change {
    let (req, ctx) = writes.next();
    let (res, _) = worker
        .write(&req, &ctx)
        .unwrap_or_else(|e| fail("worker write", e));
    assert!(res.changed, "worker write changed nothing");
    worker
        .doc()
        .get_last_local_change()
        .unwrap_or_else(|| fail("worker change", "none"))
}

fn fixture(fixtures: &mut BTreeMap<usize, Fixture>, n: usize) -> &mut Fixture {
    fixtures.entry(n).or_insert_with(|| Fixture::new(n))
}

fn configure<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    g
}

fn benches(c: &mut Criterion, fixtures: &mut BTreeMap<usize, Fixture>) {
    // (a) The authority's check of one merge, alone.
    {
        let mut g = configure(c, "authority_check");
        for n in SIZES {
            let fx = fixture(fixtures, n);
            g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                let Fixture {
                    hub,
                    authority,
                    worker,
                    worker_writes,
                    ..
                } = &mut *fx;
                let hub = &*hub;
                b.iter_batched(
                    || {
                        let change = worker_change(worker, worker_writes);
                        hub.borrow_mut()
                            .apply_changes(vec![change])
                            .unwrap_or_else(|e| fail("hub apply", e))
                    },
                    |merge| authority.check(&hub.borrow(), &merge),
                    BatchSize::PerIteration,
                );
            });
            fx.assert_clean();
        }
        g.finish();
    }

    // (b) The hub's whole per-merge path: apply the change, check, (no) repair.
    {
        let mut g = configure(c, "merge_and_process");
        for n in SIZES {
            let fx = fixture(fixtures, n);
            g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                let Fixture {
                    hub,
                    authority,
                    worker,
                    worker_writes,
                    hub_now,
                    ..
                } = &mut *fx;
                let hub = hub.get_mut();
                b.iter_batched(
                    || {
                        *hub_now += 1_000;
                        (worker_change(worker, worker_writes), *hub_now)
                    },
                    |(change, now)| {
                        let merge = hub
                            .apply_changes(vec![change])
                            .unwrap_or_else(|e| fail("hub apply", e));
                        authority
                            .process(hub, merge, now)
                            .unwrap_or_else(|e| fail("hub process", e))
                    },
                    BatchSize::SmallInput,
                );
            });
            fx.assert_clean();
        }
        g.finish();
    }

    // (c) A local write of one status change on a replica.
    {
        let mut g = configure(c, "local_write");
        for n in SIZES {
            let fx = fixture(fixtures, n);
            g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                let Fixture {
                    local,
                    local_writes,
                    ..
                } = &mut *fx;
                b.iter_batched(
                    || local_writes.next(),
                    |(req, ctx)| {
                        let out = local
                            .write(&req, &ctx)
                            .unwrap_or_else(|e| fail("local write", e));
                        debug_assert!(out.0.changed);
                        out
                    },
                    BatchSize::SmallInput,
                );
            });
        }
        g.finish();
    }

    // (d) A snapshot read of the whole list.
    {
        let mut g = configure(c, "snapshot_read");
        for n in SIZES {
            let fx = fixture(fixtures, n);
            let hub = fx.hub.get_mut();
            g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                b.iter(|| black_box(hub.read()));
            });
        }
        g.finish();
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let mut fixtures = BTreeMap::new();
    benches(&mut c, &mut fixtures);
    for fx in fixtures.values() {
        eprintln!(
            "after benches n={}: {} changes in the hub's document",
            fx.n,
            fx.hub.borrow().changes_since(&[]).len()
        );
    }
    c.final_summary();
}
