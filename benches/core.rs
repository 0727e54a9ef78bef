//! Criterion benches of the per-merge path (docs/DESIGN.md §4):
//!
//! - `authority_check`: [`Authority::check`] of the merge of one single-task change,
//!   alone (goal: ≤ 50 µs median, flat across 100, 1,000 and 10,000 tasks);
//! - `merge_and_process`: the hub's whole per-merge path, `apply_changes` of that one
//!   change and [`Authority::process`] of its merge;
//! - `local_write`: [`TodoList::write`] of one status change on a replica;
//! - `snapshot_read`: [`TodoList::read`];
//! - `foreign_write_repair`: the hub's per-merge path for a worker's status change to a
//!   task another worker owns: the authority reports the ownership violation and
//!   repairs it, reading the task as it was before the change (at its parents' heads);
//! - `task_history`: [`TodoList::history`] of one task (a pass over every change).
//!
//! Each size gets a hub whose list holds N tasks (written in chunks of 1,000 by a lead)
//! and a history of 6,000 single-task status and content updates from several lead
//! agents, merged by the hub and checked by its authority. Four workers (`w0`..`w3`,
//! workers by the authority's roles) each own a quarter of the tasks and write
//! concurrently from their own replica, so the hub merges changes of several heads.
//! Every measured change is a real one: the status always moves to a different value
//! among pending, completed and blocked, so no write is a no-op and no invariant breaks
//! (the benches assert that the authority reported nothing).
//!
//! The state goes back to a clone of what setup built whenever a sample would take it
//! more than `RESET_AFTER` changes past it, so the document does not grow with the
//! number of iterations criterion picks: every measured change lands on the setup
//! history plus at most `RESET_AFTER` changes.
//!
//! Run: `cargo bench --bench core`.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use automerge::{ActorId, Change};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion};
use swarmtodo::authority::{Authority, Policy, Report, Role, Roles};
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
/// Worker agents; task `tJ` is owned by `WORKERS[J % 4]`.
const WORKERS: [&str; 4] = ["w0", "w1", "w2", "w3"];
/// Most changes the benches add to a fixture's state before it is reset to setup's.
const RESET_AFTER: u64 = 2_000;
/// The statuses writes cycle through (never `in_progress`: see "single active").
const CYCLE: [Status; 3] = [Status::Pending, Status::Completed, Status::Blocked];

fn fail(what: &str, e: impl std::fmt::Debug) -> ! {
    panic!("bench: {what}: {e:?}")
}

/// The hub's per-merge path for one change: apply it, then check and repair.
fn merge_one(list: &mut TodoList, authority: &mut Authority, change: Change, now: i64) -> Report {
    let merge = list
        .apply_changes(vec![change])
        .unwrap_or_else(|e| fail("hub apply", e));
    authority
        .process(list, merge, now)
        .unwrap_or_else(|e| fail("hub process", e))
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

/// One replica of an agent and the single-status-change writes it makes: which task
/// (one it owns), which status (always different from the one the replica holds), a
/// distinct time and id seed.
#[derive(Debug, Clone)]
struct Writer {
    list: TodoList,
    agent: &'static str,
    /// Tasks this agent owns.
    targets: Vec<usize>,
    /// Index into `CYCLE` of each task's status as this replica holds it.
    shadow: Vec<u8>,
    count: u64,
    base_ms: i64,
}

impl Writer {
    fn new(hub: &TodoList, actor: u8, agent: &'static str, base_ms: i64) -> Writer {
        let list = hub.fork(ActorId::from([actor; 16]));
        let n = list.len();
        let owner = WORKERS.iter().position(|w| *w == agent).unwrap_or(0);
        let mut shadow = vec![0u8; n];
        for t in list.read().tasks {
            if let Some(j) = t.id.strip_prefix('t').and_then(|s| s.parse::<usize>().ok()) {
                shadow[j] = cycle_index(t.status);
            }
        }
        Writer {
            list,
            agent,
            targets: (owner..n).step_by(WORKERS.len()).collect(),
            shadow,
            count: 0,
            base_ms,
        }
    }

    /// The next write (and the replica's shadow of the statuses moves on).
    fn next_request(&mut self) -> (WriteRequest, WriteContext) {
        // Stride 7 is coprime with every target count here (25, 250, 2,500).
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

    /// Writes the next status change and returns it (for the hub to merge).
    fn change(&mut self) -> Change {
        let (req, ctx) = self.next_request();
        let (res, _) = self
            .list
            .write(&req, &ctx)
            .unwrap_or_else(|e| fail("worker write", e));
        assert!(res.changed, "worker write changed nothing");
        self.list
            .doc()
            .get_last_local_change()
            .unwrap_or_else(|| fail("worker change", "none"))
    }
}

/// The hub side: the list everyone syncs with, its authority, and the workers whose
/// changes it merges (in turn, one change per merge).
#[derive(Debug, Clone)]
struct Hub {
    list: TodoList,
    authority: Authority,
    workers: Vec<Writer>,
    turn: usize,
    now_ms: i64,
}

impl Hub {
    /// The next worker's next change, with the time the hub merges it.
    fn next_change(&mut self) -> (Change, i64) {
        let w = self.turn % self.workers.len();
        self.turn += 1;
        self.now_ms += 1_000;
        (self.workers[w].change(), self.now_ms)
    }

    /// Asserts that the benches broke no invariant (nothing was ever reported).
    fn assert_clean(&self) {
        let reported: Vec<&str> = self.authority.reported().collect();
        assert!(reported.is_empty(), "the authority reported {reported:?}");
        assert_eq!(self.list.pending_changes(), 0, "changes wait at the hub");
    }
}

/// A state the benches change, reset to a clone of setup's when it has moved on too far.
#[derive(Debug)]
struct Live<T> {
    state: Option<T>,
    changes: u64,
}

impl<T: Clone> Live<T> {
    fn new() -> Self {
        Live {
            state: None,
            changes: 0,
        }
    }

    /// The state, ready to take `iters` more changes.
    fn get(&mut self, setup: &T, iters: u64) -> &mut T {
        if self.state.is_none() || self.changes + iters > RESET_AFTER.max(iters) {
            self.state = Some(setup.clone());
            self.changes = 0;
        }
        self.changes += iters;
        self.state.get_or_insert_with(|| setup.clone())
    }
}

/// One size's state as setup built it, and the live copies the benches change.
#[derive(Debug)]
struct Fixture {
    hub: Hub,
    /// A replica of worker `w1` for the local writes (never merged anywhere).
    local: Writer,
    live_hub: Live<Hub>,
    live_local: Live<Writer>,
    /// The hub and a replica of worker `w0` that writes to `w1`'s tasks.
    foreign: Foreign,
    live_foreign: Live<Foreign>,
}

/// A hub and a worker that writes only to tasks another worker owns.
#[derive(Debug, Clone)]
struct Foreign {
    list: TodoList,
    authority: Authority,
    writer: Writer,
    now_ms: i64,
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

        // History: single-task status and content updates by several agents in turn,
        // each on its own replica, catching up with the previous one first.
        let history_started = Instant::now();
        let mut replicas: Vec<TodoList> = (0..HISTORY_AGENTS.len())
            .map(|i| lead.fork(ActorId::from([0xA1 + i as u8; 16])))
            .collect();
        let mut shadow = vec![0u8; n];
        let mut last = 0;
        for u in 0..HISTORY_UPDATES {
            let turn = (u / HISTORY_TURN) % replicas.len();
            if turn != last {
                let caught_up = replicas[last].clone();
                replicas[turn]
                    .merge_from(&caught_up)
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

        let workers = WORKERS
            .iter()
            .enumerate()
            .map(|(i, w)| Writer::new(&hub, 0xB0 + i as u8, w, now))
            .collect();
        let local = Writer::new(&hub, 0xC0, WORKERS[1], now);
        let mut writer = Writer::new(&hub, 0xD0, WORKERS[0], now);
        writer.targets = (1..n).step_by(WORKERS.len()).collect();
        let foreign = Foreign {
            list: hub.clone(),
            authority: authority.clone(),
            writer,
            now_ms: now,
        };
        eprintln!(
            "setup n={n}: {:.2?} (create {:.2?}, {HISTORY_UPDATES} history writes {:.2?}, \
             hub merge + check {:.2?}); {} changes in the document, {} bytes saved",
            started.elapsed(),
            created,
            history,
            merged,
            hub.changes_since(&[]).len(),
            hub.save().len(),
        );
        Fixture {
            hub: Hub {
                list: hub,
                authority,
                workers,
                turn: 0,
                now_ms: now,
            },
            local,
            live_hub: Live::new(),
            live_local: Live::new(),
            foreign,
            live_foreign: Live::new(),
        }
    }
}

fn fixture(fixtures: &mut BTreeMap<usize, Fixture>, n: usize) -> &mut Fixture {
    fixtures.entry(n).or_insert_with(|| Fixture::new(n))
}

fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    g
}

fn benches(c: &mut Criterion, fixtures: &mut BTreeMap<usize, Fixture>) {
    // (a) The authority's check of one merge, alone: per iteration a worker writes one
    // status change and the hub applies it (not timed), then the check (timed).
    let mut g = group(c, "authority_check");
    for n in SIZES {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            let fx = fixture(fixtures, n);
            b.iter_custom(|iters| {
                let hub = fx.live_hub.get(&fx.hub, iters);
                let mut timed = Duration::ZERO;
                let mut outcomes = Vec::with_capacity(iters as usize);
                for _ in 0..iters {
                    let (change, _) = hub.next_change();
                    let merge = hub
                        .list
                        .apply_changes(vec![change])
                        .unwrap_or_else(|e| fail("hub apply", e));
                    let start = Instant::now();
                    let out = hub.authority.check(&hub.list, &merge);
                    timed += start.elapsed();
                    outcomes.push(out);
                }
                hub.assert_clean();
                timed
            });
        });
    }
    g.finish();

    // (b) The hub's whole per-merge path: apply one change, check it, (no) repair. The
    // workers' changes are made first (not timed), then merged one by one (timed).
    let mut g = group(c, "merge_and_process");
    for n in SIZES {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            let fx = fixture(fixtures, n);
            b.iter_custom(|iters| {
                let hub = fx.live_hub.get(&fx.hub, iters);
                let changes: Vec<(Change, i64)> = (0..iters).map(|_| hub.next_change()).collect();
                let mut reports = Vec::with_capacity(changes.len());
                let start = Instant::now();
                for (change, now) in changes {
                    reports.push(merge_one(&mut hub.list, &mut hub.authority, change, now));
                }
                let timed = start.elapsed();
                assert!(reports.iter().all(|r| r.repairs.is_empty()));
                hub.assert_clean();
                timed
            });
        });
    }
    g.finish();

    // (c) A local write of one status change on a replica.
    let mut g = group(c, "local_write");
    for n in SIZES {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            let fx = fixture(fixtures, n);
            b.iter_custom(|iters| {
                let w = fx.live_local.get(&fx.local, iters);
                let requests: Vec<_> = (0..iters).map(|_| w.next_request()).collect();
                let mut results = Vec::with_capacity(requests.len());
                let start = Instant::now();
                for (req, ctx) in &requests {
                    let out = w
                        .list
                        .write(req, ctx)
                        .unwrap_or_else(|e| fail("local write", e));
                    results.push(out);
                }
                let timed = start.elapsed();
                assert!(results.iter().all(|(r, _)| r.changed));
                timed
            });
        });
    }
    g.finish();

    // (d) A snapshot read of the whole list at the hub.
    let mut g = group(c, "snapshot_read");
    for n in SIZES {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            let hub = &fixture(fixtures, n).hub.list;
            b.iter(|| black_box(hub.read()));
        });
    }
    g.finish();

    // (e) A worker's status change to another worker's task, merged and processed by the
    // hub: reported and repaired (the repair reads the task before the change).
    let mut g = group(c, "foreign_write_repair");
    for n in SIZES {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            let fx = fixture(fixtures, n);
            b.iter_custom(|iters| {
                let f = fx.live_foreign.get(&fx.foreign, iters);
                let changes: Vec<Change> = (0..iters).map(|_| f.writer.change()).collect();
                let mut reports = Vec::with_capacity(changes.len());
                let start = Instant::now();
                for change in changes {
                    f.now_ms += 1_000;
                    reports.push(merge_one(&mut f.list, &mut f.authority, change, f.now_ms));
                }
                let timed = start.elapsed();
                assert!(reports
                    .iter()
                    .all(|r| !r.violations.is_empty() && !r.repairs.is_empty()));
                timed
            });
        });
    }
    g.finish();

    // (f) The history of one task (blame): one pass over the list's whole history.
    let mut g = group(c, "task_history");
    for n in SIZES {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            let hub = &fixture(fixtures, n).hub.list;
            b.iter(|| {
                let h = hub
                    .history("t0", swarmtodo::proto::HISTORY_ENTRIES_MAX)
                    .unwrap_or_else(|e| fail("history", e));
                black_box(h)
            });
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let mut fixtures = BTreeMap::new();
    benches(&mut c, &mut fixtures);
    c.final_summary();
}
