//! The checker: what must hold once a run is quiet.
//!
//! It reads only final state — the hub's lists, the agents' replicas, the SQLite store,
//! and what the run recorded (acknowledged changes, injected violations, the hub's
//! answers to bad frames) — so the live runner can build the same [`FinalState`] from
//! a real hub's store and its clients' replicas.
//!
//! Checks: convergence; identical heads and snapshot everywhere; invariants hold (what
//! still stands was reported, and nothing repairable stands); every injected violation
//! reported exactly once; no violation or conflict key reported twice; every
//! acknowledged change in the hub and in the store; gap-free event streams; the store
//! reloads to the hub's state; bad frames closed with the right code; no well-behaved
//! agent closed by the hub; every peer received every event of its lists once, in seq
//! order, with no gap ([`Delivery`]).

use std::collections::{BTreeMap, BTreeSet};

use automerge::ChangeHash;
use serde::Serialize;

use super::outcome::Injection;
pub use super::outcome::{Check, RuleCount};
use super::scenario::Action;
use swarmtodo_core::authority::{Authority, Policy, Roles};
use swarmtodo_core::hub::{Commit, ConnId, EventKinds, HUB_AGENT};
use swarmtodo_core::model::TodoList;
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::{Resolution, Rule};
use swarmtodo_store::persist;
use swarmtodo_store::{Db, StoreError, EVENTS_PAGE_MAX};

/// Problems listed in full in one check's detail; the rest are counted.
pub const DETAIL_ITEMS_MAX: usize = 5;

/// One replica at the end.
#[derive(Debug)]
pub struct Replica<'a> {
    /// The agent.
    pub name: String,
    /// The list.
    pub doc: DocumentId,
    /// Its replica.
    pub list: &'a TodoList,
}

/// What the hub answered to one bad frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SideOutcome {
    /// The side connection.
    pub conn: u64,
    /// What was sent.
    pub what: Action,
    /// Close codes that are right.
    pub expect: Vec<u16>,
    /// The close code received (None: the connection was never closed).
    pub got: Option<u16>,
}

/// Everything the checker reads.
#[derive(Debug)]
pub struct FinalState<'a> {
    /// Quiescence was reached in time.
    pub converged: bool,
    /// When it was not: what was not settled at the end (frames in flight, agents'
    /// lists not acknowledged).
    pub unsettled: Vec<String>,
    /// Each list's hub copy (None: the hub does not hold it).
    pub hub: Vec<(DocumentId, Option<&'a TodoList>)>,
    /// Every agent's replica of every list it syncs.
    pub replicas: Vec<Replica<'a>>,
    /// The hub's store.
    pub db: &'a Db,
    /// Changes the hub acknowledged to their writers, per list.
    pub acked: &'a BTreeMap<DocumentId, BTreeSet<ChangeHash>>,
    /// Violations caused on purpose.
    pub injected: &'a [Injection],
    /// The hub's policy.
    pub policy: Policy,
    /// The hub's roles.
    pub roles: Roles,
    /// The hub's answers to bad frames.
    pub sides: Vec<SideOutcome>,
    /// Closes of well-behaved agents' connections by the hub (`"code reason"` → count).
    pub closes: BTreeMap<String, u64>,
    /// The run was of a cluster of hubs (lists move between them).
    pub clustered: bool,
    /// The events the store made durable for each connection and what it received
    /// (None: the run cannot see them, as a live run).
    pub events: Option<&'a Delivery>,
}

/// The event streams of one run, per connection and list: the sequence numbers of the
/// events the store made durable while the connection was a peer of the list (from the
/// store's answers to the hub's commits, and each commit's peers), and those the
/// connection's client received from the hub (from its real client session).
#[derive(Debug, Default)]
pub struct Delivery {
    durable: BTreeMap<(ConnId, DocumentId), Vec<u64>>,
    /// The kinds of event each connection asked for (absent: the default).
    kinds: BTreeMap<ConnId, EventKinds>,
    received: BTreeMap<(ConnId, DocumentId), Vec<u64>>,
    /// Connections still open at the end, whose streams must be complete.
    open: BTreeSet<ConnId>,
}

impl Delivery {
    /// The store made `commit` durable and its events got `seqs`: each of its peers is
    /// owed those of the kinds it asked for.
    pub fn durable(&mut self, commit: &Commit, seqs: &[u64]) {
        for (c, _) in commit.notify.iter() {
            let kinds = self.kinds.get(c).copied().unwrap_or_default();
            let owed = self.durable.entry((*c, commit.doc)).or_default();
            for (body, seq) in commit.events.iter().zip(seqs) {
                if kinds.wants(body) {
                    owed.push(*seq);
                }
            }
        }
    }

    /// Connection `c` asked for events of `kinds`.
    pub fn subscribed(&mut self, c: ConnId, kinds: EventKinds) {
        self.kinds.insert(c, kinds);
    }

    /// Connection `c`'s client received events of `doc` with these seqs, in this order.
    pub fn received(&mut self, c: ConnId, doc: DocumentId, seqs: impl IntoIterator<Item = u64>) {
        self.received.entry((c, doc)).or_default().extend(seqs);
    }

    /// Connection `c` is open at the end of the run.
    pub fn open_at_end(&mut self, c: ConnId) {
        self.open.insert(c);
    }

    /// What each connection received is the start of what it was owed (once each, in
    /// seq order, no gap), and all of it for a connection still open at the end (a
    /// connection that closed lost what was in flight).
    fn check(&self) -> Check {
        let mut p = Problems::default();
        let mut events = 0usize;
        let empty = Vec::new();
        let keys: BTreeSet<&(ConnId, DocumentId)> =
            self.durable.keys().chain(self.received.keys()).collect();
        for key in keys {
            let (c, doc) = key;
            let owed = self.durable.get(key).unwrap_or(&empty);
            let got = self.received.get(key).unwrap_or(&empty);
            events += got.len();
            if !got.windows(2).all(|w| w[0] < w[1]) {
                p.add(format!(
                    "connection {} list {doc}: events out of order or twice: {}",
                    c.0,
                    seq_list(got)
                ));
            } else if !owed.starts_with(got) {
                p.add(format!(
                    "connection {} list {doc}: received {}, but the store made {} durable for it",
                    c.0,
                    seq_list(got),
                    seq_list(owed)
                ));
            } else if self.open.contains(c) && got.len() < owed.len() {
                p.add(format!(
                    "connection {} list {doc}: open at the end, but never received {}",
                    c.0,
                    seq_list(&owed[got.len()..])
                ));
            }
        }
        p.verdict(
            "events_delivered",
            format!(
                "{events} events received over {} connections' lists, each once, in seq order, no gap",
                self.received.len()
            ),
        )
    }
}

/// At most a few seqs of a stream, for a check's detail.
fn seq_list(seqs: &[u64]) -> String {
    const SHOWN: usize = 8;
    let shown: Vec<String> = seqs.iter().take(SHOWN).map(u64::to_string).collect();
    match seqs.len() {
        n if n > SHOWN => format!("[{}, … ({n} in all)]", shown.join(", ")),
        _ => format!("[{}]", shown.join(", ")),
    }
}

impl FinalState<'_> {
    /// The hub's version of each list (empty where it has none).
    pub fn hub_versions(&self) -> Vec<String> {
        self.hub
            .iter()
            .map(|(_, l)| l.map(|l| l.version().0).unwrap_or_default())
            .collect()
    }
}

/// The checker's result.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Every check, in a fixed order.
    pub checks: Vec<Check>,
    /// By rule (snake_case name).
    pub rules: BTreeMap<String, RuleCount>,
    /// Acknowledged changes missing from the hub or from the store.
    pub acked_lost: usize,
}

/// Collects problems and renders them.
#[derive(Default)]
struct Problems {
    items: Vec<String>,
    count: usize,
}

impl Problems {
    fn add(&mut self, p: String) {
        self.count += 1;
        if self.items.len() < DETAIL_ITEMS_MAX {
            self.items.push(p);
        }
    }

    fn verdict(self, name: &'static str, fine: String) -> Check {
        if self.count == 0 {
            return Check {
                name,
                ok: true,
                detail: fine,
                skipped: false,
            };
        }
        let more = self.count - self.items.len();
        let mut detail = self.items.join("; ");
        if more > 0 {
            detail.push_str(&format!("; and {more} more"));
        }
        Check {
            name,
            ok: false,
            detail,
            skipped: false,
        }
    }
}

/// One stored violation or conflict.
#[derive(Debug)]
struct Reported {
    kind: String,
    key: String,
    rule: Option<Rule>,
    changes: Vec<String>,
}

fn rule_name(r: Rule) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{r:?}"))
}

/// Runs every check.
pub fn check(state: &FinalState<'_>) -> Result<Verdict, StoreError> {
    let mut v = Verdict::default();
    v.checks.push(Check {
        name: "converged",
        ok: state.converged,
        detail: if state.converged {
            "quiescent: no frame in flight, every replica acknowledged".into()
        } else {
            format!(
                "no quiescence within settle_ms_max: {}",
                state.unsettled.join("; ")
            )
        },
        skipped: false,
    });

    let hub: BTreeMap<DocumentId, Option<&TodoList>> = state.hub.iter().copied().collect();

    // Identical heads and snapshot on every replica.
    let mut p = Problems::default();
    for r in &state.replicas {
        match hub.get(&r.doc).copied().flatten() {
            None => p.add(format!("the hub does not hold {}'s list {}", r.name, r.doc)),
            Some(h) if h.heads() != r.list.heads() => p.add(format!(
                "{} on {}: version {} ≠ hub {}",
                r.name,
                r.doc,
                r.list.version(),
                h.version()
            )),
            Some(h) if h.read() != r.list.read() => p.add(format!(
                "{} on {}: same heads, different snapshot",
                r.name, r.doc
            )),
            Some(_) => {}
        }
    }
    v.checks.push(p.verdict(
        "replicas_identical",
        format!("{} replicas equal the hub", state.replicas.len()),
    ));

    // Stored violations and conflicts, event streams.
    let mut reported: BTreeMap<DocumentId, Vec<Reported>> = BTreeMap::new();
    let mut gaps = Problems::default();
    let mut events_total = 0u64;
    for (doc, _) in &state.hub {
        let id = persist::doc_id(doc);
        let Some(info) = state.db.list_by_doc(id)? else {
            continue;
        };
        let mut after = 0u64;
        let mut list = Vec::new();
        loop {
            let page = state.db.events_since(id, after, EVENTS_PAGE_MAX)?;
            let Some(last) = page.last() else { break };
            let last = last.seq;
            for e in page {
                if e.seq != after + 1 {
                    gaps.add(format!("{doc}: seq {} after {after}", e.seq));
                }
                after = e.seq;
                events_total += 1;
                if e.kind == "violation" || e.kind == "conflict" {
                    let json: serde_json::Value =
                        serde_json::from_str(&e.json).unwrap_or(serde_json::Value::Null);
                    list.push(Reported {
                        kind: e.kind.clone(),
                        key: json["key"].as_str().unwrap_or_default().to_owned(),
                        rule: serde_json::from_value(json["rule"].clone()).ok(),
                        changes: json["changes"]
                            .as_array()
                            .map(|a| {
                                a.iter()
                                    .filter_map(|c| c.as_str().map(str::to_owned))
                                    .collect()
                            })
                            .unwrap_or_default(),
                    });
                }
            }
            after = last;
        }
        if after != info.last_seq {
            gaps.add(format!(
                "{doc}: stream ends at {after}, list says {}",
                info.last_seq
            ));
        }
        reported.insert(*doc, list);
    }
    v.checks.push(gaps.verdict(
        "events_gap_free",
        format!("{events_total} events, seq 1..n on every list"),
    ));

    // No key reported twice.
    let mut p = Problems::default();
    let mut keys = 0usize;
    for (doc, list) in &reported {
        let mut seen: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for r in list {
            *seen.entry((r.kind.as_str(), r.key.as_str())).or_default() += 1;
        }
        keys += seen.len();
        for ((kind, key), n) in seen.into_iter().filter(|(_, n)| *n > 1) {
            p.add(format!("{doc}: {kind} {key} reported {n} times"));
        }
    }
    v.checks.push(p.verdict(
        "reported_once",
        format!("{keys} violation and conflict keys, each reported once"),
    ));

    // Injected violations: exactly one report each.
    let mut p = Problems::default();
    for rule in Rule::ALL {
        v.rules.insert(rule_name(rule), RuleCount::default());
    }
    for list in reported.values() {
        for r in list.iter().filter(|r| r.kind == "violation") {
            if let Some(rule) = r.rule {
                v.rules.entry(rule_name(rule)).or_default().reported += 1;
            }
        }
    }
    for inj in state.injected {
        let count = v.rules.entry(rule_name(inj.rule)).or_default();
        count.injected += 1;
        let doc = state.hub.get(inj.list).map(|(d, _)| *d);
        let n = doc
            .and_then(|d| reported.get(&d))
            .map(|list| {
                list.iter()
                    .filter(|r| {
                        r.kind == "violation"
                            && r.rule == Some(inj.rule)
                            && std::iter::once(&inj.change)
                                .chain(&inj.also)
                                .any(|c| r.changes.contains(c))
                    })
                    .count()
            })
            .unwrap_or(0);
        if n == 1 {
            count.reported_once += 1;
        } else {
            p.add(format!(
                "{:?} by {} at {} ms (change {}): reported {n} times",
                inj.action, inj.agent, inj.at_ms, inj.change
            ));
        }
    }
    let summary: Vec<String> = v
        .rules
        .iter()
        .filter(|(_, c)| c.injected > 0)
        .map(|(r, c)| format!("{r} {}/{}", c.reported_once, c.injected))
        .collect();
    v.checks.push(p.verdict(
        "injected_reported_once",
        format!("{} injected: {}", state.injected.len(), summary.join(", ")),
    ));

    // Invariants: whatever still stands was reported, and nothing repairable stands.
    let mut p = Problems::default();
    let mut standing = 0usize;
    for (doc, list) in &state.hub {
        let Some(list) = list else { continue };
        let stored: BTreeSet<String> = match state.db.list_by_doc(persist::doc_id(doc))? {
            Some(_) => state
                .db
                .reported(persist::doc_id(doc))?
                .into_iter()
                .collect(),
            None => BTreeSet::new(),
        };
        let mut fresh = Authority::new(HUB_AGENT, state.policy.clone(), state.roles.clone());
        let out = fresh.check_all(list);
        standing += out.violations.len() + out.conflicts.len();
        for viol in &out.violations {
            if !stored.contains(&viol.key) {
                p.add(format!("{doc}: {} stands unreported", viol.key));
            }
            if matches!(viol.resolution, Resolution::Repaired { .. }) {
                p.add(format!(
                    "{doc}: {} stands although its rule repairs",
                    viol.key
                ));
            }
        }
        for c in &out.conflicts {
            if !stored.contains(&c.key) {
                p.add(format!("{doc}: conflict {} stands unreported", c.key));
            }
        }
    }
    v.checks.push(p.verdict(
        "invariants",
        format!("{standing} standing findings, all reported and none repairable"),
    ));

    // Acknowledged changes are in the hub and in the store; the store reloads to the
    // hub's state.
    let mut lost = Problems::default();
    let mut reload = Problems::default();
    let mut acked_total = 0usize;
    for (doc, list) in &state.hub {
        let id = persist::doc_id(doc);
        let loaded = match state.db.list_by_doc(id)? {
            Some(_) => state.db.load(id)?,
            None => None,
        };
        let rebuilt = match loaded.map(|l| l.rebuild()).transpose() {
            Ok(d) => d,
            Err(e) => {
                reload.add(format!("{doc}: {e}"));
                None
            }
        };
        let acked = state.acked.get(doc);
        acked_total += acked.map_or(0, BTreeSet::len);
        for h in acked.into_iter().flatten() {
            let in_hub = list.is_some_and(|l| l.doc().get_change_meta_by_hash(h).is_some());
            let in_store = rebuilt
                .as_ref()
                .is_some_and(|d| d.get_change_meta_by_hash(h).is_some());
            if !in_hub {
                lost.add(format!("{doc}: acknowledged change {h} is not in the hub"));
            }
            if !in_store {
                lost.add(format!(
                    "{doc}: acknowledged change {h} is not in the store"
                ));
            }
            v.acked_lost += usize::from(!in_hub || !in_store);
        }
        match (list, rebuilt) {
            (Some(l), Some(d)) => {
                let back = TodoList::from_doc(d);
                if back.heads() != l.heads() {
                    reload.add(format!(
                        "{doc}: the store reloads as {}, the hub has {}",
                        back.version(),
                        l.version()
                    ));
                } else if back.read() != l.read() {
                    reload.add(format!(
                        "{doc}: same heads, different snapshot after reload"
                    ));
                }
            }
            (Some(l), None) => reload.add(format!(
                "{doc}: nothing stored, the hub has {}",
                l.version()
            )),
            (None, Some(_)) | (None, None) => {}
        }
    }
    v.checks.push(lost.verdict(
        "acknowledged_durable",
        format!("{acked_total} acknowledged changes, all in the hub and the store"),
    ));
    v.checks.push(reload.verdict(
        "store_reloads",
        "every list reloads from the store to the hub's heads and snapshot".into(),
    ));

    // Bad frames: each connection closed with the right code.
    let mut p = Problems::default();
    for s in &state.sides {
        match s.got {
            Some(code) if s.expect.contains(&code) => {}
            got => p.add(format!(
                "{:?} on connection {}: closed with {got:?}, expected one of {:?}",
                s.what, s.conn, s.expect
            )),
        }
    }
    v.checks.push(p.verdict(
        "bad_frames_refused",
        format!(
            "{} bad frames, each refused with its close code",
            state.sides.len()
        ),
    ));

    // No well-behaved agent closed by the hub (a list reload's 1012 is expected; in a
    // cluster, a list moving — 1012 `list_moved` — and one changing hands — 1013
    // `list_elsewhere` — too).
    let mut p = Problems::default();
    for (what, n) in &state.closes {
        let expected = what.starts_with("1012 ")
            || (state.clustered && what.starts_with("1013 list_elsewhere"));
        if !expected {
            p.add(format!("{n} × {what}"));
        }
    }
    v.checks.push(p.verdict(
        "agents_not_closed",
        "no well-behaved agent was closed by the hub".into(),
    ));

    v.checks.push(match state.events {
        Some(d) => d.check(),
        None => Check::skipped(
            "events_delivered",
            "the event frames a live hub sends are not recorded".into(),
        ),
    });
    Ok(v)
}
