//! Events of durable commits, as frames for the peers of their lists.

use std::collections::{BTreeMap, BTreeSet};

use super::limits::TASKS_CHANGED_BYTES_SPLIT;
use super::{Commit, ConnId, EVENTS_SESSION};
use crate::model::{normalize, ChangeInfo, Merge, TodoList};
use crate::proto::wire::{self, DocumentId, PeerId, WireMessage};
use crate::proto::{EventBody, TaskChange, EVENT_KINDS};

/// The kinds of event a sync peer is pushed: those it asked for when it connected
/// (`?events=` on its URL), else [`EventKinds::DEFAULT`]. The store and the HTTP event
/// stream have them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventKinds(u32);

impl EventKinds {
    /// Every kind.
    pub const ALL: EventKinds = EventKinds((1 << EVENT_KINDS.len()) - 1);
    /// None: the peer only syncs.
    pub const NONE: EventKinds = EventKinds(0);
    /// What a replica cannot see for itself: violations, conflicts, repairs, unblocked
    /// tasks, claims, expired leases, delegations and roll-ups — not `tasks_changed` (a replica receives the
    /// change itself) nor agents' comings and goings (a swarm's joins would cost every
    /// peer a frame each).
    pub const DEFAULT: EventKinds =
        EventKinds(EventKinds::ALL.0 & !(1 << 0) & !(1 << 6) & !(1 << 7));

    /// `default`, `all`, `none`, or kinds separated by commas (`violation,claimed`).
    pub fn parse(text: &str) -> Result<EventKinds, String> {
        match text {
            "default" => return Ok(EventKinds::DEFAULT),
            "all" => return Ok(EventKinds::ALL),
            "none" | "" => return Ok(EventKinds::NONE),
            _ => {}
        }
        let mut kinds = 0;
        for k in text.split(',') {
            let i = EVENT_KINDS.iter().position(|known| *known == k).ok_or_else(|| {
                format!(
                    "{k:?} is no event kind: ask for `default`, `all`, `none` or some of {}, separated by commas",
                    EVENT_KINDS.join(", ")
                )
            })?;
            kinds |= 1 << i;
        }
        Ok(EventKinds(kinds))
    }

    /// Whether a peer with these kinds is pushed `body`.
    pub fn wants(self, body: &EventBody) -> bool {
        self.0 & (1 << body.kind_index()) != 0
    }
}

impl Default for EventKinds {
    fn default() -> Self {
        EventKinds::DEFAULT
    }
}

/// The frames that push the events of durable commits (each with its events' sequence
/// numbers in the store and the time it was committed) to the peers each names that
/// `wants` them (its [`EventKinds`]): one
/// `ephemeral` frame per peer and list for all of them (session [`EVENTS_SESSION`],
/// `count` = the last seq), its data the CBOR text of the event's JSON — or of a JSON
/// array of events when there are several. Under load a batch of merges costs each
/// peer one frame, not one per write.
pub(super) fn event_frames(
    hub: &PeerId,
    commits: &[(Commit, Vec<u64>, i64)],
    wants: impl Fn(ConnId, &EventBody) -> bool,
) -> Vec<(ConnId, Vec<u8>)> {
    // Every event once; then (list, peer) → the indexes of its events, in order.
    let mut events: Vec<crate::proto::Event> = Vec::new();
    let mut per_peer: BTreeMap<(DocumentId, ConnId), (PeerId, Vec<usize>)> = BTreeMap::new();
    for (commit, seqs, at_ms) in commits {
        let at_ms = *at_ms;
        for (body, &seq) in commit.events.iter().zip(seqs.iter()) {
            events.push(crate::proto::Event {
                seq,
                list: commit.doc.to_string(),
                at_ms,
                body: body.clone(),
            });
            for (conn, peer) in commit.notify.iter() {
                if !wants(*conn, body) {
                    continue;
                }
                per_peer
                    .entry((commit.doc, *conn))
                    .or_insert_with(|| (peer.clone(), Vec::new()))
                    .1
                    .push(events.len() - 1);
            }
        }
    }
    // Peers of one list usually get the same events: encode each set once, for any
    // target.
    let mut encoded: BTreeMap<(DocumentId, Vec<usize>), Option<wire::ToEach>> = BTreeMap::new();
    let mut frames = Vec::new();
    for ((doc, conn), (peer, mine)) in per_peer {
        let each = encoded
            .entry((doc, mine))
            .or_insert_with_key(|(doc, mine)| {
                let json = match mine.as_slice() {
                    [one] => serde_json::to_string(&events[*one]),
                    many => {
                        serde_json::to_string(&many.iter().map(|i| &events[*i]).collect::<Vec<_>>())
                    }
                };
                let m = WireMessage::Ephemeral {
                    sender_id: hub.clone(),
                    target_id: peer.clone(),
                    document_id: *doc,
                    count: mine.last().map_or(0, |i| events[*i].seq),
                    session_id: EVENTS_SESSION.to_owned(),
                    data: minicbor::to_vec(json.ok()?.as_str()).ok()?,
                };
                wire::ToEach::new(&m)
            });
        if let Some(each) = each {
            frames.push((conn, each.to(&peer)));
        }
    }
    frames
}

/// The events an `ephemeral` message carries when it is the hub's: sent by `hub` (the
/// peer id the hub gave in the handshake) in [`EVENTS_SESSION`]; none otherwise (a
/// message relayed from another peer is never the hub's events).
pub fn events_of(
    hub: &PeerId,
    sender_id: &PeerId,
    session_id: &str,
    data: &[u8],
) -> Vec<crate::proto::Event> {
    if sender_id != hub || session_id != EVENTS_SESSION {
        return Vec::new();
    }
    let Ok(json) = minicbor::decode::<&str>(data) else {
        return Vec::new();
    };
    if let Ok(one) = serde_json::from_str::<crate::proto::Event>(json) {
        return vec![one];
    }
    serde_json::from_str(json).unwrap_or_default()
}

/// The number of changes in a list's history.
pub(super) fn change_count(list: &TodoList) -> usize {
    usize::try_from(automerge::ReadDoc::stats(list.doc()).num_changes).unwrap_or(usize::MAX)
}

/// The `tasks_changed` events of one merge: one, or several when its task changes are
/// too large for one (each names the merge's agents and changes, and some of the tasks).
pub(super) fn tasks_changed(list: &TodoList, m: &Merge) -> Vec<EventBody> {
    if m.tasks.is_empty() {
        return Vec::new();
    }
    let agents: Vec<String> = m
        .changes
        .iter()
        .filter_map(|c| list.agent_of(c.actor()))
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect();
    let changes: Vec<String> = m
        .changes
        .iter()
        .skip(
            m.changes
                .len()
                .saturating_sub(crate::proto::TASKS_CHANGED_HASHES_MAX),
        )
        .map(ChangeInfo::hash)
        .collect();
    let mut events = Vec::new();
    let mut tasks: Vec<TaskChange> = Vec::new();
    let mut bytes = 0usize;
    for (id, d) in &m.tasks {
        let change = TaskChange {
            task: id.clone(),
            fields: d
                .fields
                .iter()
                .map(|f| {
                    if f.is_empty() {
                        "task".to_owned()
                    } else {
                        f.clone()
                    }
                })
                .collect(),
            before: d.before.as_ref().map(|r| normalize(id, r)),
            after: d.after.as_ref().map(|r| normalize(id, r)),
        };
        let size = serde_json::to_vec(&change).map_or(0, |v| v.len());
        if !tasks.is_empty() && bytes + size > TASKS_CHANGED_BYTES_SPLIT {
            events.push(EventBody::TasksChanged {
                agents: agents.clone(),
                changes: changes.clone(),
                tasks: std::mem::take(&mut tasks),
            });
            bytes = 0;
        }
        bytes += size;
        tasks.push(change);
    }
    events.push(EventBody::TasksChanged {
        agents,
        changes,
        tasks,
    });
    events
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // In tests a panic is the failure report.

    use super::*;

    #[test]
    fn event_kinds_parse_from_a_url_and_say_what_a_peer_is_pushed() {
        let claimed = EventBody::Claimed {
            task: "t1".into(),
            agent: "w1".into(),
        };
        let changed = EventBody::TasksChanged {
            agents: Vec::new(),
            changes: Vec::new(),
            tasks: Vec::new(),
        };
        let joined = EventBody::AgentJoined { agent: "w1".into() };
        assert_eq!(EventKinds::parse("default").unwrap(), EventKinds::DEFAULT);
        assert!(EventKinds::DEFAULT.wants(&claimed));
        assert!(!EventKinds::DEFAULT.wants(&changed));
        assert!(!EventKinds::DEFAULT.wants(&joined));
        assert!(EventKinds::parse("all").unwrap().wants(&joined));
        assert!(!EventKinds::parse("none").unwrap().wants(&claimed));
        let some = EventKinds::parse("tasks_changed,agent_joined").unwrap();
        assert!(some.wants(&changed) && some.wants(&joined) && !some.wants(&claimed));
        let err = EventKinds::parse("violation,nope").unwrap_err();
        assert!(err.contains("\"nope\" is no event kind"), "{err}");
        for (i, kind) in EVENT_KINDS.iter().enumerate() {
            assert_eq!(EventKinds::parse(kind).unwrap(), EventKinds(1 << i));
        }
    }
}
