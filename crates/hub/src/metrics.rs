//! What the hub counts, for `GET /metrics` (Prometheus text format): connections and
//! lists now, merges, violations by rule, conflicts, repairs, API calls and claims by
//! outcome, and latency histograms of a batch (merge, commit, fan-out) and of an API
//! write (asked to answered, durable). Updated by the hub task; read by any connection.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use swarmtodo_core::hub::Commit;
use swarmtodo_proto::{EventBody, Rule};

/// Upper bounds of the latency histograms' buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0,
];

/// A latency histogram with [`BUCKETS`].
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub(crate) fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, le) in BUCKETS.iter().enumerate() {
            if s <= *le {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, le) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{le}\"}} {}",
                self.counts[i].load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// How an API call ended, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Answered.
    Ok,
    /// Refused (any error).
    Refused,
}

/// The kind of an API call, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Create,
    Write,
    Claim,
}

/// The refusals that end a hub's term as a list's authority, each counted apart by
/// `swarmtodo_cluster_terms_ended_total`: by the log (another hub fenced the list), by
/// the hub's own clock (its lease ran out before it could renew), by the lease bucket
/// (a renewal refused: another hub took the list).
pub(crate) const TERM_END_CODES: [&str; 3] = [
    "cluster_fenced",
    "cluster_lease_expired",
    "cluster_lease_lost",
];

/// Every figure the hub exposes.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) connections: AtomicU64,
    pub(crate) lists_loaded: AtomicU64,
    pub(crate) lists_stored: AtomicU64,
    merges: AtomicU64,
    violations: [AtomicU64; Rule::ALL.len()],
    conflicts: AtomicU64,
    repairs: AtomicU64,
    leases_expired: AtomicU64,
    claims: AtomicU64,
    /// API calls sent to another hub of the cluster, the list's authority.
    pub(crate) forwarded: AtomicU64,
    /// Sync peers carried to another hub of the cluster, their list's authority.
    pub(crate) carried: AtomicU64,
    /// Whole reads of a list's log for its past (an event stream's, a task's history).
    pub(crate) log_reads: AtomicU64,
    /// Terms as a list's authority that ended while the hub held them, by the code of
    /// what ended them: [`TERM_END_CODES`], then any other.
    terms_ended: [AtomicU64; TERM_END_CODES.len() + 1],
    /// Per [`Kind`] (read, create, write, claim) and [`Outcome`].
    calls: [[AtomicU64; 2]; 4],
    pub(crate) batch: Histogram,
    pub(crate) write: Histogram,
}

impl Metrics {
    /// Counts a term as a list's authority that ended, by `code`, the error's.
    pub(crate) fn term_ended(&self, code: &str) {
        let i = TERM_END_CODES
            .iter()
            .position(|c| *c == code)
            .unwrap_or(TERM_END_CODES.len());
        self.terms_ended[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the merges and events of commits the store made durable.
    pub(crate) fn committed<'a>(&self, commits: impl Iterator<Item = &'a Commit>) {
        for c in commits {
            if !c.changes.is_empty() {
                self.merges.fetch_add(1, Ordering::Relaxed);
            }
            for e in &c.events {
                match e {
                    EventBody::Violation(v) => {
                        if let Some(i) = Rule::ALL.iter().position(|r| *r == v.rule) {
                            self.violations[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    EventBody::Conflict(_) => {
                        self.conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    EventBody::Repaired { .. } => {
                        self.repairs.fetch_add(1, Ordering::Relaxed);
                    }
                    EventBody::Claimed { .. } => {
                        self.claims.fetch_add(1, Ordering::Relaxed);
                    }
                    EventBody::LeaseExpired { .. } => {
                        self.leases_expired.fetch_add(1, Ordering::Relaxed);
                    }
                    EventBody::TasksChanged { .. }
                    | EventBody::Delegated { .. }
                    | EventBody::RolledUp { .. }
                    | EventBody::Unblocked { .. }
                    | EventBody::AgentJoined { .. }
                    | EventBody::AgentLeft { .. } => {}
                }
            }
        }
    }

    /// Counts an answered API call (a write's latency too).
    pub(crate) fn call(&self, kind: Kind, outcome: Outcome, took: Duration) {
        let k = kind as usize;
        let o = outcome as usize;
        self.calls[k][o].fetch_add(1, Ordering::Relaxed);
        if kind == Kind::Write || kind == Kind::Claim {
            self.write.observe(took);
        }
    }

    /// The Prometheus text of every figure.
    pub(crate) fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let scalars: [(&str, &str, &str, &AtomicU64); 11] = [
            (
                "swarmtodo_connections",
                "gauge",
                "Sync connections open.",
                &self.connections,
            ),
            (
                "swarmtodo_lists_loaded",
                "gauge",
                "Lists in memory.",
                &self.lists_loaded,
            ),
            (
                "swarmtodo_lists_stored",
                "gauge",
                "Lists in the store.",
                &self.lists_stored,
            ),
            (
                "swarmtodo_merges_total",
                "counter",
                "Durable commits that changed a list (merges and API writes).",
                &self.merges,
            ),
            (
                "swarmtodo_conflicts_total",
                "counter",
                "Concurrent-write conflicts reported.",
                &self.conflicts,
            ),
            (
                "swarmtodo_repairs_total",
                "counter",
                "Repairs the authority wrote.",
                &self.repairs,
            ),
            (
                "swarmtodo_claims_total",
                "counter",
                "Tasks the hub gave to claimers.",
                &self.claims,
            ),
            (
                "swarmtodo_calls_forwarded_total",
                "counter",
                "API calls sent to the hub of the cluster that holds their list.",
                &self.forwarded,
            ),
            (
                "swarmtodo_sessions_carried_total",
                "counter",
                "Sync peers carried to the hub of the cluster that holds their list.",
                &self.carried,
            ),
            (
                "swarmtodo_log_reads_total",
                "counter",
                "Reads of a list's whole log in a cluster, for an event stream's past or a task's history.",
                &self.log_reads,
            ),
            (
                "swarmtodo_leases_expired_total",
                "counter",
                "Agents gone past their lease while holding tasks in progress.",
                &self.leases_expired,
            ),
        ];
        for (name, kind, help, v) in scalars {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP swarmtodo_violations_total Violations reported, by rule.\n# TYPE swarmtodo_violations_total counter"
        );
        for (i, rule) in Rule::ALL.iter().enumerate() {
            let rule = serde_json::to_value(rule)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "swarmtodo_violations_total{{rule=\"{rule}\"}} {}",
                self.violations[i].load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP swarmtodo_calls_total API calls answered, by kind and outcome (claims: ok = a task given).\n# TYPE swarmtodo_calls_total counter"
        );
        for (k, kind) in ["read", "create", "write", "claim"].iter().enumerate() {
            for (o, outcome) in ["ok", "refused"].iter().enumerate() {
                let _ = writeln!(
                    out,
                    "swarmtodo_calls_total{{kind=\"{kind}\",outcome=\"{outcome}\"}} {}",
                    self.calls[k][o].load(Ordering::Relaxed)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP swarmtodo_cluster_terms_ended_total Terms as a list's authority that ended while this hub held them, by the refusal that ended them (other: any other failure).\n# TYPE swarmtodo_cluster_terms_ended_total counter"
        );
        for (i, code) in TERM_END_CODES.iter().chain(&["other"]).enumerate() {
            let _ = writeln!(
                out,
                "swarmtodo_cluster_terms_ended_total{{code=\"{code}\"}} {}",
                self.terms_ended[i].load(Ordering::Relaxed)
            );
        }
        self.batch.render(
            &mut out,
            "swarmtodo_batch_seconds",
            "One batch of the hub task: merge, commit, fan-out.",
        );
        self.write.render(
            &mut out,
            "swarmtodo_api_write_seconds",
            "An API write or claim, asked to answered (durable).",
        );
        out
    }
}
