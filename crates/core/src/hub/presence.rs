//! Who is on a list (docs/DESIGN.md §6): an agent joins with its first connection
//! syncing the list or its first API call on it, and leaves once it has had no
//! connection and made no call for the presence window — the list's lease
//! (`Policy::lease_ms`) or, without one, [`AGENT_GONE_MS`]. With a lease, the tasks an
//! agent gone holds in progress are released to `pending` and unowned (`release`) or
//! only reported (`report`), with a `lease_expired` event naming agent and tasks.
//!
//! An agent is a token's agent, else the name a call gives, else the automerge-repo
//! peer id of a sync connection (the Rust client joins as its agent id; a peer without a
//! token whose peer id is not the agent id its tasks are owned by is not seen as that
//! agent — a hub with a lease gives its agents tokens). Owners of tasks in progress that
//! the hub has not seen since it loaded the list are counted as last seen then. A list
//! whose peers all left stays in memory while a lease is running on tasks in progress;
//! otherwise it leaves at once, and the agents still followed on it leave with it.

use std::collections::BTreeMap;

use super::limits::{AGENTS_TRACKED_MAX, AGENT_GONE_MS};
use super::{ConnId, DocState, Effects, HubCore};
use crate::authority::Action;
use crate::model::WriteContext;
use crate::proto::wire::DocumentId;
use crate::proto::{
    EventBody, PatchOp, Status, TaskPatch, WriteMode, WriteRequest, VIOLATION_TASKS_MAX,
};

/// One list's agents.
#[derive(Debug, Default)]
pub(super) struct Presence {
    /// The agent of each connection syncing the list.
    conns: BTreeMap<ConnId, String>,
    /// Every agent present, or gone and not yet past its window.
    agents: BTreeMap<String, Seen>,
    /// Events to commit at the end of the batch.
    events: Vec<EventBody>,
    /// The deadline registered in [`HubCore`]'s queue for this list, if any.
    due_ms: Option<i64>,
    /// Owners of tasks in progress may be unknown here (loaded, or written since).
    pub(super) owners_unchecked: bool,
}

#[derive(Debug)]
struct Seen {
    /// Its connections syncing the list.
    conns: usize,
    /// When it last had a connection or made a call (ms).
    last_ms: i64,
    /// An `agent_joined` was emitted (owners the hub only found in the list were not).
    announced: bool,
}

impl Presence {
    fn arrive(&mut self, agent: &str, now_ms: i64) -> &mut Seen {
        if !self.agents.contains_key(agent) && self.agents.len() >= AGENTS_TRACKED_MAX {
            // The agent gone longest is let go early (it is not coming back soon).
            let oldest = self
                .agents
                .iter()
                .filter(|(_, s)| s.conns == 0)
                .min_by_key(|(_, s)| s.last_ms)
                .map(|(a, _)| a.clone());
            if let Some(a) = oldest {
                if self.agents.remove(&a).is_some_and(|s| s.announced) {
                    self.events.push(EventBody::AgentLeft { agent: a });
                }
            }
        }
        let seen = self.agents.entry(agent.to_owned()).or_insert(Seen {
            conns: 0,
            last_ms: now_ms,
            announced: false,
        });
        seen.last_ms = seen.last_ms.max(now_ms);
        if !seen.announced {
            seen.announced = true;
            self.events.push(EventBody::AgentJoined {
                agent: agent.to_owned(),
            });
        }
        seen
    }

    /// Connection `c` of `agent` began syncing the list.
    pub(super) fn connect(&mut self, c: ConnId, agent: &str, now_ms: i64) {
        if self.conns.contains_key(&c) {
            return;
        }
        self.conns.insert(c, agent.to_owned());
        self.arrive(agent, now_ms).conns += 1;
    }

    /// `agent` made an API call on the list.
    pub(super) fn called(&mut self, agent: &str, now_ms: i64) {
        if !agent.is_empty() {
            self.arrive(agent, now_ms);
        }
    }

    /// Connection `c` stopped syncing the list; true when its agent has no connection
    /// left (its window starts).
    pub(super) fn disconnect(&mut self, c: ConnId, now_ms: i64) -> bool {
        let Some(agent) = self.conns.remove(&c) else {
            return false;
        };
        let Some(seen) = self.agents.get_mut(&agent) else {
            return false;
        };
        seen.conns = seen.conns.saturating_sub(1);
        seen.last_ms = seen.last_ms.max(now_ms);
        seen.conns == 0
    }

    /// When the next agent gone reaches the end of its window.
    fn next_due(&self, window_ms: i64) -> Option<i64> {
        self.agents
            .values()
            .filter(|s| s.conns == 0)
            .map(|s| s.last_ms.saturating_add(window_ms))
            .min()
    }
}

impl HubCore {
    /// How long an agent may be gone before it has left (and its lease expired).
    fn presence_window_ms(&self) -> i64 {
        self.config.policy.lease_ms.unwrap_or(AGENT_GONE_MS)
    }

    /// Notes that list `doc_id`'s presence has something to do at the end of the batch.
    pub(super) fn presence_touched(&mut self, doc_id: DocumentId) {
        self.presence_dirty.insert(doc_id);
    }

    /// After a load or a change: with a lease, owners of tasks in progress are counted
    /// as seen now if the hub has not seen them.
    pub(super) fn owners_may_be_new(&mut self, doc_id: DocumentId) {
        if self.config.policy.lease_ms.is_none() {
            return;
        }
        if let Some(doc) = self.docs.get_mut(&doc_id) {
            doc.presence.owners_unchecked = true;
            self.presence_dirty.insert(doc_id);
        }
    }

    /// The end of a batch: agents past their window leave (and with a lease, their
    /// tasks in progress are released or reported), presence events are committed, the
    /// next deadline of each list touched is queued; a list left with no peer, no call
    /// and no agent gone leaves memory.
    pub(super) fn check_presence(&mut self, now_ms: i64, fx: &mut Effects) {
        while let Some(&(at, doc_id)) = self.presence_due.first() {
            if at > now_ms {
                break;
            }
            self.presence_due.pop_first();
            if let Some(doc) = self.docs.get_mut(&doc_id) {
                if doc.presence.due_ms == Some(at) {
                    doc.presence.due_ms = None;
                }
            }
            self.presence_dirty.insert(doc_id);
        }
        let window = self.presence_window_ms();
        for doc_id in std::mem::take(&mut self.presence_dirty) {
            let Some(doc) = self.docs.get_mut(&doc_id) else {
                continue;
            };
            if std::mem::take(&mut doc.presence.owners_unchecked) {
                let owners: Vec<String> = doc.list.active_owners().map(str::to_owned).collect();
                for owner in owners {
                    doc.presence.agents.entry(owner).or_insert(Seen {
                        conns: 0,
                        last_ms: now_ms,
                        announced: false,
                    });
                }
            }
            let agents = &mut doc.presence.agents;
            let gone: Vec<String> = agents
                .iter()
                .filter(|(_, s)| s.conns == 0 && now_ms - s.last_ms >= window)
                .map(|(a, _)| a.clone())
                .collect();
            for agent in &gone {
                if agents.remove(agent).is_some_and(|s| s.announced) {
                    doc.presence.events.push(EventBody::AgentLeft {
                        agent: agent.clone(),
                    });
                }
            }
            for agent in &gone {
                self.lease_expired(now_ms, doc_id, agent, fx);
            }
            let kept = self.kept(&doc_id);
            let lease_on = self.config.policy.lease_ms.is_some();
            let Some(doc) = self.docs.get_mut(&doc_id) else {
                continue;
            };
            let mut events = std::mem::take(&mut doc.presence.events);
            let leaving = !kept && !doc.lease_pending(lease_on);
            if leaving {
                // Leaving memory: every agent still followed has left.
                events.extend(
                    std::mem::take(&mut doc.presence.agents)
                        .into_iter()
                        .filter(|(_, s)| s.announced)
                        .map(|(agent, _)| EventBody::AgentLeft { agent }),
                );
            } else if let Some(next) = doc.presence.next_due(window) {
                if doc.presence.due_ms.is_none_or(|d| next < d) {
                    doc.presence.due_ms = Some(next);
                    self.presence_due.insert((next, doc_id));
                }
            }
            // A list a peer only named, never stored, keeps no events.
            if !events.is_empty() && self.stored.contains(&doc_id) {
                let commit = super::Commit {
                    events,
                    ..super::Commit::empty(doc_id)
                };
                self.commit(doc_id, commit, fx);
            }
            if leaving {
                if self.docs.get(&doc_id).is_some_and(|d| d.summary_stale) {
                    self.write_summary(now_ms, doc_id, fx);
                }
                self.unload(doc_id);
            }
        }
    }

    /// Whether list `doc_id` is held in memory by a peer, a recent call or calls waiting.
    fn kept(&self, doc_id: &DocumentId) -> bool {
        self.docs.get(doc_id).is_some_and(|d| !d.peers.is_empty())
            || self.called.contains_key(doc_id)
            || self.calls.contains_key(doc_id)
    }

    /// A list that no peer, call or lease holds any more leaves memory (what it holds
    /// is in the store, or in commits handed out, performed before any load): at once
    /// when no agent is followed on it and its row in the index of lists is written,
    /// else at the end of the batch, after their `agent_left` events and that row.
    pub(super) fn let_go(&mut self, doc_id: DocumentId) {
        let Some(doc) = self.docs.get(&doc_id) else {
            return;
        };
        if self.kept(&doc_id) {
            return;
        }
        if doc.presence.agents.is_empty() && doc.presence.events.is_empty() && !doc.summary_stale {
            self.unload(doc_id);
        } else {
            self.presence_dirty.insert(doc_id);
        }
    }

    fn unload(&mut self, doc_id: DocumentId) {
        self.docs.remove(&doc_id);
        self.news.remove(&doc_id);
        self.owed.remove(&doc_id);
        tracing::debug!(doc = %doc_id, in_memory = self.docs.len(), "list out of memory: no peer, call or lease holds it");
    }

    /// With a lease: the tasks `agent` holds in progress, released (one change of the
    /// hub's, checked by the authority like any write) or reported, with an event.
    fn lease_expired(&mut self, now_ms: i64, doc_id: DocumentId, agent: &str, fx: &mut Effects) {
        if self.config.policy.lease_ms.is_none() {
            return;
        }
        let release = self.config.policy.lease == Action::Repair;
        let hub_agent = self.config.agent.clone();
        let Some(doc) = self.docs.get_mut(&doc_id) else {
            return;
        };
        let tasks: Vec<String> = doc.list.in_progress_of(agent).map(str::to_owned).collect();
        if tasks.is_empty() {
            return;
        }
        let event = EventBody::LeaseExpired {
            agent: agent.to_owned(),
            tasks: tasks.iter().take(VIOLATION_TASKS_MAX).cloned().collect(),
            tasks_total: tasks.len() as u64,
            released: release,
        };
        tracing::info!(doc = %doc_id, agent, tasks = tasks.len(), release, "lease expired");
        doc.presence.events.push(event);
        if !release {
            return;
        }
        let req = WriteRequest {
            mode: WriteMode::Patch {
                ops: tasks
                    .iter()
                    .map(|id| PatchOp::Upsert {
                        task: TaskPatch {
                            id: Some(id.clone()),
                            status: Some(Status::Pending),
                            owner: Some(None),
                            ..TaskPatch::default()
                        },
                    })
                    .collect(),
            },
            expected_version: None,
            explanation: Some(format!(
                "{agent}'s lease expired: its tasks go back to pending"
            )),
        };
        let ctx = WriteContext::new(hub_agent, now_ms, now_ms as u64);
        let merge = match doc.list.write(&req, &ctx) {
            Ok((result, merge)) if result.changed => merge,
            Ok(_) => return,
            Err(e) => {
                tracing::error!(doc = %doc_id, agent, error = %e.message, "releasing an expired lease failed");
                return;
            }
        };
        let mut commit = HubCore::check_and_repair(doc, doc_id, merge, now_ms);
        let mut events = std::mem::take(&mut doc.presence.events);
        events.append(&mut commit.events);
        commit.events = events;
        self.commit(doc_id, commit, fx);
        self.owed.entry(doc_id).or_default().moved = true;
    }

    /// When the next agent gone reaches the end of its window.
    pub(super) fn next_presence_ms(&self) -> Option<i64> {
        self.presence_due.first().map(|(at, _)| *at)
    }

    /// Connection `c` (of `agent`) began syncing list `doc_id`.
    pub(super) fn peer_arrived(&mut self, now_ms: i64, doc_id: DocumentId, c: ConnId, agent: &str) {
        if let Some(doc) = self.docs.get_mut(&doc_id) {
            doc.presence.connect(c, agent, now_ms);
            self.presence_dirty.insert(doc_id);
        }
    }
}

impl DocState {
    /// Whether an agent gone holds tasks in progress that its lease (`lease_on`) will
    /// deal with: the list stays in memory until then.
    fn lease_pending(&self, lease_on: bool) -> bool {
        lease_on
            && self
                .presence
                .agents
                .iter()
                .any(|(a, s)| s.conns == 0 && self.list.in_progress_of(a).next().is_some())
    }
}
