//! The judge of a live run: the checker's [`FinalState`] built from what the run ended
//! with (the sessions' replicas, the hub's lists as read back, its SQLite file, the
//! configuration's policy and roles), its verdict, and the checks only a live run has
//! (the hub stayed alive, slow readers were dropped).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use automerge::ChangeHash;

use super::access::Access;
use super::controller::{ms_since, Ended, QUIET_SAMPLES};
use crate::check::{self, Check, FinalState, Replica, SideOutcome};
use crate::outcome::{LiveConfig, LiveFault, LiveStats, RunOutcome, SimError, SlowReaderOutcome};
use crate::scenario::Scenario;
use swarmtodo_core::authority::{Policy, Roles};
use swarmtodo_core::model::TodoList;
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_store::Db;

/// Deletes the most recent acknowledged change still in the store's change table.
fn plant_lost_write(path: &std::path::Path, acked: &BTreeSet<ChangeHash>) -> Option<String> {
    let conn = rusqlite::Connection::open(path).ok()?;
    let hashes: Vec<Vec<u8>> = {
        let mut q = conn
            .prepare("SELECT hash FROM changes ORDER BY id DESC")
            .ok()?;
        let rows = q.query_map([], |r| r.get::<_, Vec<u8>>(0)).ok()?;
        rows.filter_map(Result::ok).collect()
    };
    let victim = hashes
        .into_iter()
        .find(|h| ChangeHash::try_from(h.as_slice()).is_ok_and(|h| acked.contains(&h)))?;
    conn.execute("DELETE FROM changes WHERE hash = ?1", [&victim])
        .ok()?;
    ChangeHash::try_from(victim.as_slice())
        .ok()
        .map(|h| h.to_string())
}

/// The checker on what the live run left, plus what only a live run can check.
pub(super) fn judge(
    scenario: &Scenario,
    cfg: &LiveConfig,
    access: &Access,
    mut ended: Ended,
    started: Instant,
) -> Result<RunOutcome, SimError> {
    let mut acked: BTreeMap<DocumentId, BTreeSet<ChangeHash>> = BTreeMap::new();
    for s in &ended.sessions {
        acked
            .entry(s.spec.doc)
            .or_default()
            .extend(s.acked.iter().copied());
    }
    if cfg.fault == Some(LiveFault::StoreLosesAckedWrite) {
        let all: BTreeSet<ChangeHash> = acked.values().flatten().copied().collect();
        let gone = plant_lost_write(&ended.data, &all);
        ended.log.push(format!(
            "planted: acknowledged change {gone:?} deleted from the store"
        ));
    }
    let db = Db::open(&ended.data)?;
    // The checker judges by what the hub enforces: the policy and roles of the
    // configuration file it was started with (as the deterministic runner's hub has
    // them: the default policy, workers and the rogue as workers).
    let policy: Policy = access.config.policy();
    let roles: Roles = access.config.roles();
    let injected: Vec<_> = ended
        .sessions
        .iter()
        .flat_map(|s| s.injected.iter().cloned())
        .collect();
    let mut sides: Vec<SideOutcome> = Vec::new();
    for s in &ended.sessions {
        for side in &s.sides {
            sides.push(SideOutcome {
                conn: u64::try_from(sides.len()).unwrap_or(u64::MAX),
                ..side.clone()
            });
        }
    }
    let hub: Vec<(DocumentId, Option<&TodoList>)> = ended
        .docs
        .iter()
        .zip(&ended.hub_lists)
        .map(|(d, l)| (*d, l.as_ref()))
        .collect();
    let replicas: Vec<Replica<'_>> = ended
        .sessions
        .iter()
        .map(|s| Replica {
            name: s.spec.name.clone(),
            doc: s.spec.doc,
            list: &s.replica,
        })
        .collect();
    let state = FinalState {
        converged: ended.converged.is_some(),
        unsettled: Vec::new(),
        hub,
        replicas,
        db: &db,
        acked: &acked,
        injected: &injected,
        policy,
        roles,
        sides,
        closes: ended.stats.closes.clone(),
        clustered: scenario.cluster.is_some(),
        events: None,
    };
    let verdict = check::check(&state)?;
    let versions = state.hub_versions();
    drop(state);
    let mut checks = verdict.checks;
    for c in checks.iter_mut().filter(|c| c.name == "converged") {
        c.detail = if c.ok {
            format!(
                "every agent connected and in sync with the hub, one version per list, \
                 for {QUIET_SAMPLES} samples in a row"
            )
        } else {
            "no quiescence within settle_ms_max (wall clock)".into()
        };
    }
    let mut live = ended.live;
    live.acked_lost = u64::try_from(verdict.acked_lost).unwrap_or(u64::MAX);
    live.unpropagated = ended.unpropagated;

    // What only a live run has.
    let exits = &live.hub_exits;
    let stop_ok = live.hub_stop.starts_with("exit 0");
    checks.push(Check {
        name: "hub_alive",
        ok: exits.is_empty() && stop_ok,
        detail: if exits.is_empty() && stop_ok {
            format!(
                "the hub process ended only when killed ({} kills) and stopped cleanly on SIGTERM",
                live.kills
            )
        } else {
            format!("{}; stop: {}", exits.join("; "), live.hub_stop)
        },
        skipped: false,
    });
    let judged: Vec<&SlowReaderOutcome> = ended
        .slow
        .iter()
        .filter(|(_, j)| *j)
        .map(|(o, _)| o)
        .collect();
    let planned = scenario.faults.slow_readers as usize;
    checks.push(if planned == 0 {
        Check::skipped(
            "slow_readers_dropped",
            "the scenario has no slow reader".into(),
        )
    } else if judged.is_empty() {
        Check::skipped(
            "slow_readers_dropped",
            format!("{planned} slow readers, none lived without a hub kill"),
        )
    } else {
        let mut kept: Vec<String> = judged
            .iter()
            .filter(|o| !o.closed)
            .map(|o| {
                format!(
                    "a slow reader was never dropped ({} writes relayed to it)",
                    o.writes
                )
            })
            .collect();
        kept.extend(judged.iter().filter(|o| o.writer_failures > 0).map(|o| {
            format!(
                "the writer beside a slow reader had {} of {} writes unacknowledged",
                o.writer_failures, o.writes
            )
        }));
        Check {
            name: "slow_readers_dropped",
            ok: kept.is_empty(),
            detail: if kept.is_empty() {
                format!(
                    "{} slow readers dropped by the hub (after {:?} ms), the writer beside each \
                     acknowledged throughout; {} voided by kills",
                    judged.len(),
                    judged
                        .iter()
                        .filter_map(|o| o.closed_after_ms)
                        .collect::<Vec<_>>(),
                    ended.slow.len() - judged.len()
                )
            } else {
                kept.join("; ")
            },
            skipped: false,
        }
    });
    checks.push(match &live.cluster {
        None => Check::skipped("one_authority", "one hub: no cluster".into()),
        Some(c) => Check {
            name: "one_authority",
            ok: c.authority_problems.is_empty(),
            detail: if c.authority_problems.is_empty() {
                format!(
                    "every commit of the {} records read as the logs grew written by the hub \
                     whose fence opens its stretch ({} fences); terms ended: {}",
                    c.records_audited,
                    c.fences,
                    terms_text(&c.terms_ended)
                )
            } else {
                c.authority_problems.join("; ")
            },
            skipped: false,
        },
    });
    checks.push(Check::skipped(
        "frames_faults",
        "loopback TCP neither loses, doubles nor reorders frames; faults here are \
         cuts, partitions, kills and slow readers"
            .into(),
    ));

    let wall_ms = ms_since(started);
    Ok(RunOutcome {
        scenario: scenario.name.clone(),
        seed: cfg.seed,
        fault: None,
        convergence_ms: ended.converged,
        end_ms: ended.end_ms,
        latencies_ms: ended.latencies_ms,
        divergence: ended.divergence,
        stats: ended.stats,
        injected,
        rules: verdict.rules,
        checks,
        versions,
        trace_digest: 0,
        trace: if cfg.trace { ended.log } else { Vec::new() },
        wall_ms,
        live: Some(LiveStats {
            storm_ms: ended.storm_ms,
            ..live
        }),
    })
}

/// Terms ended by code, as `cluster_fenced 2, cluster_lease_lost 1` (`none` without any).
pub(crate) fn terms_text(ended: &std::collections::BTreeMap<String, u64>) -> String {
    if ended.is_empty() {
        return "none".into();
    }
    ended
        .iter()
        .map(|(code, n)| format!("{code} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
