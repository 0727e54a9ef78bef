//! The end of a simulated run: the divergence samples, the quiescence test, why a run
//! that never settled is not settled, and the checker's verdict on the final state as a
//! [`RunOutcome`].

use std::collections::BTreeMap;

use automerge::{sync, ChangeHash};

use super::agents::in_sync;
use super::{Sim, UNSETTLED_SHOWN_MAX};
use crate::check::{self, FinalState, Replica, SideOutcome};
use crate::outcome::{RunOutcome, SimError};
use swarmtodo_core::hub::ConnId;
use swarmtodo_core::model::TodoList;
use swarmtodo_proto::wire::DocumentId;

impl Sim<'_> {
    pub(super) fn sample(&mut self) {
        let Some(hub) = &self.hub else {
            return;
        };
        let mut off = 0u64;
        for agent in &self.agents {
            for l in &agent.lists {
                let hub_heads = hub.doc(&l.doc).map(|d| d.list().heads());
                if hub_heads.as_ref() != Some(&l.replica.heads()) {
                    off += 1;
                }
            }
        }
        self.divergence.push((self.now, off));
    }

    pub(super) fn quiescent(&self) -> bool {
        let Some(hub) = &self.hub else {
            return false;
        };
        self.queue.frames_in_flight() == 0
            && !hub.deferred()
            && self.agents.iter().all(|a| {
                a.ready
                    && a.conn.is_some()
                    && a.lists.iter().all(|l| {
                        in_sync(&a.client, l)
                            && hub.doc(&l.doc).map(|d| d.list().heads()) == Some(l.replica.heads())
                    })
            })
    }

    /// Why the run is not quiescent, for the report of a run that never was: the
    /// frames in flight, and each agent's list that is not settled (at most
    /// `UNSETTLED_SHOWN_MAX`).
    fn unsettled(&self) -> Vec<String> {
        let mut out = Vec::new();
        let Some(hub) = &self.hub else {
            return vec!["the hub is down".into()];
        };
        let frames = self.queue.frames_in_flight();
        if frames > 0 {
            out.push(format!("{frames} frames in flight"));
        }
        let short = |heads: &[ChangeHash]| -> String {
            let mut h: Vec<String> = heads
                .iter()
                .map(|h| h.to_string()[..8].to_owned())
                .collect();
            h.sort();
            h.join(",")
        };
        for a in &self.agents {
            if !a.ready || a.conn.is_none() {
                out.push(format!(
                    "{}: not connected (ready {}, online {}, connecting {})",
                    a.name, a.ready, a.online, a.connecting
                ));
                continue;
            }
            for l in &a.lists {
                let hub_heads = hub.doc(&l.doc).map(|d| d.list().heads());
                if in_sync(&a.client, l) && hub_heads.as_ref() == Some(&l.replica.heads()) {
                    continue;
                }
                let fresh = sync::State::new();
                let s = a.client.state(l.doc).unwrap_or(&fresh);
                out.push(format!(
                    "{} list {}: heads [{}], hub [{}], the hub said [{}], last sent [{}], \
                     pending {}, in flight {}, unacked {}",
                    a.name,
                    l.list,
                    short(&l.replica.heads()),
                    hub_heads.as_deref().map(short).unwrap_or_default(),
                    s.their_heads.as_deref().map(short).unwrap_or_default(),
                    short(&s.last_sent_heads),
                    l.replica.pending_changes(),
                    s.in_flight,
                    l.unacked.len()
                ));
            }
            if out.len() >= UNSETTLED_SHOWN_MAX {
                out.push("…".into());
                break;
            }
        }
        out
    }

    // ----- the end -----

    pub(super) fn finish(mut self, started: std::time::Instant) -> Result<RunOutcome, SimError> {
        let unsettled = if self.converged_at.is_some() {
            Vec::new()
        } else {
            self.unsettled()
        };
        // The connections still open at both ends: their event streams must be whole.
        let open: Vec<ConnId> = self
            .agents
            .iter()
            .filter_map(|a| a.conn)
            .filter(|c| self.hub_conns.contains(c))
            .collect();
        for c in open {
            self.delivery.open_at_end(c);
        }
        let hub = self.hub.take();
        let empty = BTreeMap::new();
        let hub_lists: Vec<(DocumentId, Option<&TodoList>)> = self
            .docs
            .iter()
            .map(|d| (*d, hub.as_ref().and_then(|h| h.doc(d)).map(|s| s.list())))
            .collect();
        let replicas: Vec<Replica<'_>> = self
            .agents
            .iter()
            .flat_map(|a| {
                a.lists.iter().map(|l| Replica {
                    name: a.name.clone(),
                    doc: l.doc,
                    list: &l.replica,
                })
            })
            .collect();
        let sides: Vec<SideOutcome> = self
            .sides
            .iter()
            .filter(|(_, s)| !s.void)
            .map(|(c, s)| SideOutcome {
                conn: c.0,
                what: s.what,
                expect: s.expect.to_vec(),
                got: s.got,
            })
            .collect();
        let state = FinalState {
            converged: self.converged_at.is_some(),
            unsettled,
            hub: hub_lists,
            replicas,
            db: &self.db,
            acked: if self.acked.is_empty() {
                &empty
            } else {
                &self.acked
            },
            injected: &self.injected,
            policy: self.policy.clone(),
            roles: self.roles.clone(),
            sides,
            closes: self.stats.closes.clone(),
            clustered: false,
            events: Some(&self.delivery),
        };
        let verdict = check::check(&state)?;
        let versions = state.hub_versions();
        drop(state);
        let end = self.now;
        self.note(format!("end versions {versions:?}"));
        Ok(RunOutcome {
            scenario: self.scenario.name.clone(),
            seed: self.cfg.seed,
            fault: self.cfg.fault,
            convergence_ms: self.converged_at.map(|t| t.saturating_sub(self.storm_end)),
            end_ms: end,
            latencies_ms: self.latencies,
            divergence: self.divergence,
            stats: self.stats,
            injected: self.injected,
            rules: verdict.rules,
            checks: verdict.checks,
            versions,
            trace_digest: self.digest,
            trace: self.trace,
            wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            live: None,
        })
    }
}
