//! A peer's sync message: checked, merged, judged by the authority, committed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use automerge::{sync, ActorId, Automerge, ChangeHash};

use super::events::{change_count, tasks_changed};
use super::limits::{
    COMPACT_AFTER_CHANGES, COMPACT_AFTER_GROWTH_PERCENT, DOCS_MAX, DOCS_PER_CONN_MAX,
    LIST_SUMMARY_INTERVAL_MS, REBUILD_AFTER_GROWTH_PERCENT, SYNC_WINDOW_QUIET_MS,
};
use super::{
    Commit, Compaction, Conn, ConnId, ConnState, DocState, Effects, HubCore, Identity, Peer,
    Summary,
};
use crate::model::sync::SentIndex;
use crate::model::{normalize_status, Merge, ModelError, TodoList};
use crate::proto::wire::{self, DocumentId, PeerId, WireMessage};
use crate::proto::{EventBody, Status};
use crate::syncmsg;

/// A change refused because its actor belongs to someone else (see `HubCore::actors`).
#[derive(Debug)]
pub(super) struct Forged {
    pub(super) change: ChangeHash,
    pub(super) actor: ActorId,
    /// Whose it is, for the message ("agent \"lead\"", "the hub").
    pub(super) owner: String,
}

impl HubCore {
    /// A sync message from connection `c` (peer `remote`) about `doc_id`: checked,
    /// merged, judged by the authority and committed; what the batch owes its peers is
    /// noted for [`HubCore::answer`].
    #[allow(clippy::too_many_arguments)] // One message's fields; a struct would only rename them.
    pub(super) fn sync(
        &mut self,
        now_ms: i64,
        c: ConnId,
        remote: &PeerId,
        doc_id: DocumentId,
        data: &[u8],
        is_request: bool,
        fx: &mut Effects,
    ) {
        let Some((message, identity)) = self.admit(now_ms, c, remote, doc_id, data, is_request, fx)
        else {
            return;
        };
        let brought_earlier = self
            .owed
            .get(&doc_id)
            .and_then(|o| o.sent.get(&c))
            .is_some_and(|s| s.brought);
        let Some(doc) = self.docs.get_mut(&doc_id) else {
            return;
        };
        let before = doc.list.heads();
        let stock_before = doc.list.sync_counters().stock;
        // Its first message about the list: its agent (the token's, else its peer id)
        // arrives on the list.
        let arriving = (!doc.peers.contains_key(&c)).then(|| {
            identity
                .as_ref()
                .map_or_else(|| remote.to_string(), |who| who.agent.clone())
        });
        let at = Arrival {
            c,
            doc_id,
            now_ms,
            identity,
            brought_earlier,
        };
        // Automerge can still panic on a crafted change that passed validation (an op
        // on an object that does not exist). Contain it to this list: drop the list from
        // memory and close its peers; the next peer that asks has it loaded from the
        // store (which holds everything committed; the bad change never was).
        let actors = &mut self.actors;
        let hub_actor = &self.config.actor;
        let merged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            merge_message(doc, actors, hub_actor, &at, message)
        }));
        let (rejected, commit, continues) = match merged {
            Ok(Ok(Ok(m))) => m,
            Ok(Ok(Err(forged))) => {
                tracing::warn!(conn = c.0, doc = %doc_id, change = %forged.change, actor = %forged.actor, owner = %forged.owner, "a change by another's actor refused");
                return self.fail(
                    c,
                    1008,
                    "actor_forged",
                    format!(
                        "change {} is by actor {}, which belongs to {}: nothing of this message was applied; write with an actor id of your own (a fresh random one per replica) and drop that change",
                        forged.change, forged.actor, forged.owner
                    ),
                    fx,
                );
            }
            Ok(Err(e)) => {
                return self.fail(c, 1008, "sync_refused", format!("sync refused: {e}"), fx);
            }
            Err(_) => {
                tracing::error!(conn = c.0, doc = %doc_id, "automerge panicked on a peer's change; the list leaves memory");
                return self.crashed(c, doc_id, fx);
            }
        };
        if !rejected.is_empty() {
            tracing::warn!(conn = c.0, doc = %doc_id, ?rejected, "changes refused");
        }
        if let Some(commit) = commit {
            self.commit(doc_id, commit, fx);
        }
        if let Some(agent) = arriving {
            self.peer_arrived(now_ms, doc_id, c, &agent);
        }
        let Some(doc) = self.docs.get(&doc_id) else {
            return;
        };
        let moved = doc.list.heads() != before;
        let steps = doc.list.sync_counters().stock.saturating_sub(stock_before);
        let owed = self.owed.entry(doc_id).or_default();
        if !owed.sent.contains_key(&c) {
            owed.senders.push(c);
        }
        let sent = owed.sent.entry(c).or_default();
        sent.steps += steps;
        sent.brought |= moved;
        sent.continues |= continues;
        owed.moved |= moved;
    }

    /// The checks before a sync message may touch a list: a valid message, a writer's
    /// token if it carries changes, the connection's and the hub's list bounds, the
    /// creation budget for a list the hub does not hold (then made, empty). `None` when
    /// the message ends here (the connection closed, or "not found" answered).
    #[allow(clippy::too_many_arguments)] // The message's fields, as `sync` takes them.
    fn admit(
        &mut self,
        now_ms: i64,
        c: ConnId,
        remote: &PeerId,
        doc_id: DocumentId,
        data: &[u8],
        is_request: bool,
        fx: &mut Effects,
    ) -> Option<(sync::Message, Option<Arc<Identity>>)> {
        let message = match syncmsg::validate(data, &self.config.sync_limits) {
            Ok(checked) => checked.into_message(),
            Err(e) => {
                self.fail(c, 1008, e.code(), format!("bad sync message: {e}"), fx);
                return None;
            }
        };
        let identity = self
            .conns
            .get(&c)
            .and_then(|conn| conn.identity.clone())
            .map(Arc::new);
        let observer = identity
            .as_ref()
            .is_some_and(|who| who.role_in(&doc_id) == crate::authority::Role::Observer);
        if observer && !message.changes.is_empty() {
            self.fail(
                c,
                1008,
                "read_only",
                "this token is an observer's: it may read lists, not change them".to_owned(),
                fx,
            );
            return None;
        }
        let known = self.docs.contains_key(&doc_id);
        if !known && message.heads.is_empty() && message.changes.is_empty() {
            // Nothing here and nothing offered: automerge-repo's "not found". A peer
            // that has the document (heads) gets an empty one to sync into: the
            // hub's answer asks for the changes.
            if is_request {
                fx.sends.push((
                    c,
                    wire::encode(&WireMessage::DocUnavailable {
                        sender_id: self.config.peer_id.clone(),
                        target_id: remote.clone(),
                        document_id: doc_id,
                    }),
                ));
            }
            return None;
        }
        // A list this connection does not sync yet counts against its bound, whether
        // the list is new (checked before it is made) or held already.
        if self.conns.get(&c).is_some_and(|conn| {
            !conn.docs.contains(&doc_id) && conn.docs.len() >= DOCS_PER_CONN_MAX
        }) {
            self.fail(
                c,
                1008,
                "docs_per_conn_limit",
                format!("one connection may sync {DOCS_PER_CONN_MAX} lists at most"),
                fx,
            );
            return None;
        }
        if !known && !self.create(now_ms, c, doc_id, fx) {
            return None;
        }
        if let Some(conn) = self.conns.get_mut(&c) {
            conn.docs.insert(doc_id);
        }
        Some((message, identity))
    }

    /// Makes list `doc_id`, empty, for connection `c`, within the hub's list bound and
    /// the creation budget of `c`'s identity; false (and `c` closed) beyond them.
    fn create(&mut self, now_ms: i64, c: ConnId, doc_id: DocumentId, fx: &mut Effects) -> bool {
        let fresh = self
            .docs
            .keys()
            .filter(|d| !self.stored.contains(d))
            .count();
        if self.stored.len() + fresh >= DOCS_MAX {
            self.fail(
                c,
                1008,
                "docs_limit",
                format!("the hub has {DOCS_MAX} lists already: sync an existing list, or ask the hub's operator for room"),
                fx,
            );
            return false;
        }
        if !self.take_creation(now_ms, c) {
            let (burst, per_minute) = self.config.list_creations;
            self.fail(
                c,
                1008,
                "list_creation_rate",
                format!("too many new lists: {burst} at once, then {per_minute} a minute per token (or address without one); wait before creating more, or sync lists that exist"),
                fx,
            );
            return false;
        }
        let list = TodoList::from_doc(Automerge::new().with_actor(self.config.actor.clone()));
        let authority = self.authority();
        self.docs.insert(doc_id, DocState::new(list, authority, 0));
        true
    }

    /// Hands a merge's commit to the runtime (with the ready peers to notify of its
    /// events), and a snapshot when the list has grown enough since the last.
    pub(super) fn commit(&mut self, doc_id: DocumentId, mut commit: Commit, fx: &mut Effects) {
        let Some(doc) = self.docs.get_mut(&doc_id) else {
            return;
        };
        if !commit.events.is_empty() {
            let ready = doc.peers.keys().filter_map(|p| match self.conns.get(p) {
                Some(Conn {
                    state: ConnState::Ready(id),
                    ..
                }) => Some((*p, id)),
                _ => None,
            });
            if !ready.clone().eq(doc.notify.iter().map(|(c, id)| (*c, id))) {
                doc.notify = ready.map(|(c, id)| (c, id.clone())).collect();
            }
            commit.notify = Arc::clone(&doc.notify);
        }
        tracing::debug!(doc = %doc_id, changes = commit.changes.len(), events = commit.events.len(), "merged");
        if !commit.changes.is_empty() {
            if self.config.policy.lease_ms.is_some() {
                doc.presence.owners_unchecked = true;
                self.presence_dirty.insert(doc_id);
            }
            // The index of lists is written at most every LIST_SUMMARY_INTERVAL_MS per
            // list (a row update per write cost a fifth of the hub's sustained writes);
            // a later batch or tick writes the last one (`flush_summaries`).
            if self.clock_ms.saturating_sub(doc.summary_written_ms) >= LIST_SUMMARY_INTERVAL_MS {
                commit.summary = Some(summary_of(doc));
                doc.summary_written_ms = self.clock_ms;
                doc.summary_stale = false;
            } else {
                doc.summary_stale = true;
                self.summaries_due.insert(doc_id);
            }
        }
        doc.since_compaction += commit.changes.len();
        if !commit.changes.is_empty() {
            doc.written_ms = self.clock_ms;
            if !doc.window_due {
                doc.window_due = true;
                self.windows_due
                    .insert((self.clock_ms.saturating_add(SYNC_WINDOW_QUIET_MS), doc_id));
            }
        }
        self.stored.insert(doc_id);
        if !commit.changes.is_empty() && self.links.contains_key(&doc_id) {
            self.rollups_due.insert(doc_id);
        }
        fx.commits.push(commit);
        let compact_after =
            COMPACT_AFTER_CHANGES.max(change_count(&doc.list) * COMPACT_AFTER_GROWTH_PERCENT / 100);
        if doc.since_compaction >= compact_after {
            doc.since_compaction = 0;
            let changes = change_count(&doc.list);
            let grown = changes.saturating_sub(doc.changes_at_rebuild);
            let rebuild = grown * 100 >= doc.changes_at_rebuild * REBUILD_AFTER_GROWTH_PERCENT;
            if rebuild {
                // The rebuild itself runs off the hub's task: a load costs about 3.4 µs
                // per change of history (200 ms at 60,000), which every other list's
                // writes would wait for here.
                tracing::debug!(doc = %doc_id, changes, "rebuilding the list off the hub's task");
                doc.changes_at_rebuild = changes;
            }
            fx.compactions.push(Compaction {
                doc: doc_id,
                snapshot: doc.list.save(),
                heads: doc.list.heads(),
                rebuild,
            });
        }
    }

    /// Runs the authority on a merge, applies its repair, and gathers what to persist.
    pub(super) fn check_and_repair(
        doc: &mut DocState,
        doc_id: DocumentId,
        merge: Merge,
        now_ms: i64,
    ) -> Commit {
        let mut commit = Commit::empty(doc_id);
        let report = match doc.authority.process(&mut doc.list, merge.clone(), now_ms) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(doc = %doc_id, error = %e, "repair failed; the merge stands as is");
                Default::default()
            }
        };
        for m in std::iter::once(&merge).chain(&report.repairs) {
            commit
                .changes
                .extend(m.changes.iter().map(|c| c.change.clone()));
            commit.events.extend(tasks_changed(&doc.list, m));
        }
        for v in &report.violations {
            commit.reported.push(v.key.clone());
        }
        for cf in &report.conflicts {
            commit.reported.push(cf.key.clone());
        }
        commit
            .events
            .extend(report.conflicts.into_iter().map(EventBody::Conflict));
        commit
            .events
            .extend(report.violations.into_iter().map(EventBody::Violation));
        for r in &report.repairs {
            if let Some(c) = r.changes.first() {
                commit.events.push(EventBody::Repaired {
                    change: c.hash(),
                    notes: c.change.message().map(str::to_owned).into_iter().collect(),
                });
            }
        }
        let unblocked = unblocked(&doc.list, std::iter::once(&merge).chain(&report.repairs));
        commit.events.extend(unblocked);
        commit
    }
}

/// The `unblocked` events of a merge (and its repairs): for each task it completed or
/// removed, the pending, unowned tasks waiting for it whose dependencies are now all
/// completed (or gone). Its cost follows the tasks the merge touched and their
/// dependents, never the list.
fn unblocked<'a>(list: &TodoList, merges: impl Iterator<Item = &'a Merge>) -> Vec<EventBody> {
    let mut events = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for m in merges {
        for (id, delta) in &m.tasks {
            let was_done = delta
                .before
                .as_ref()
                .is_none_or(|t| normalize_status(t.status.as_deref()) == Status::Completed);
            if was_done || !list.is_done(id) {
                continue;
            }
            for d in list.dependents_of(id) {
                if list.is_ready(d) && seen.insert(d.to_owned()) {
                    events.push(EventBody::Unblocked {
                        task: d.to_owned(),
                        by: id.clone(),
                    });
                }
            }
        }
    }
    events
}

/// What the index of lists shows of `doc` now.
pub(super) fn summary_of(doc: &DocState) -> Summary {
    Summary {
        name: doc.name.clone(),
        version: TodoList::version_of(&doc.list.heads()),
        tasks: doc.list.counts(),
    }
}

/// Where a sync message came from: the connection, the list, when, the token's identity
/// (if any), and whether an earlier frame of the batch from it changed the list.
struct Arrival {
    c: ConnId,
    doc_id: DocumentId,
    now_ms: i64,
    identity: Option<Arc<Identity>>,
    brought_earlier: bool,
}

/// What a merge leaves: the changes not applied (hash and why), the commit to make
/// durable (when the list changed), and whether the peer was catching up (see
/// `Peer::catching_up`).
type Merged = (Vec<(String, String)>, Option<Commit>, bool);

/// Merges a sync message into `doc` for its peer: every change's actor checked against
/// its owner first (a forged one refuses the whole message), the actors a token brought
/// bound to it, the peer's sync state and window positions advanced, the authority run
/// on what changed.
fn merge_message(
    doc: &mut DocState,
    actors: &mut BTreeMap<ActorId, Arc<Identity>>,
    hub_actor: &ActorId,
    at: &Arrival,
    message: sync::Message,
) -> Result<Result<Merged, Forged>, ModelError> {
    let Arrival {
        c,
        doc_id,
        now_ms,
        ref identity,
        brought_earlier,
    } = *at;
    let peer = doc.peers.entry(c).or_insert_with(|| Peer {
        state: sync::State::new(),
        sent: SentIndex::default(),
        heard_at: 0,
        heard_ms: now_ms,
        unacked: VecDeque::new(),
        catching_up: false,
    });
    let state = &mut peer.state;
    let last_sent = state.last_sent_heads.clone();
    let took_as_known = (brought_earlier && message.changes.is_empty())
        .then(|| message.heads.clone())
        .filter(|heads| !heads.is_empty());
    // A change by an actor that belongs to another agent (or to the hub) is
    // refused before Automerge sees any of the message: once merged it could not
    // be taken out, and the owner's own next change with that sequence number
    // would be refused instead (locking the owner out).
    let mut to_bind: Vec<(ActorId, ChangeHash)> = Vec::new();
    let admitted =
        doc.list
            .receive_sync_message_admitting(state, &mut peer.sent, message, |fresh| {
                for change in fresh {
                    let actor = change.actor_id();
                    if let Some(owner) = owner_of(actors, hub_actor, identity.as_deref(), change) {
                        return Err(Forged {
                            change: change.hash(),
                            actor: actor.clone(),
                            owner,
                        });
                    }
                    let root = actor.to_bytes() == crate::model::ROOT_ACTOR;
                    if identity.is_some() && !root && !actors.contains_key(actor) {
                        to_bind.push((actor.clone(), change.hash()));
                    }
                }
                Ok(())
            })?;
    let mut merge = match admitted {
        Ok(merge) => merge,
        Err(forged) => return Ok(Err(forged)),
    };
    if let Some(who) = &identity {
        for (actor, hash) in to_bind {
            if doc.list.holds(&hash) {
                actors.entry(actor).or_insert_with(|| Arc::clone(who));
            }
        }
    }
    doc.list.settle_their_have(state);
    peer.heard_at = doc.list.window_end();
    peer.heard_ms = now_ms;
    let continues = std::mem::replace(&mut peer.catching_up, false);
    let covered = state
        .their_heads
        .as_deref()
        .and_then(|heads| doc.list.window_covered_by(heads));
    let sent = &mut peer.unacked;
    while sent
        .front()
        .is_some_and(|&at| covered.is_some_and(|c| at <= c))
    {
        sent.pop_front();
    }
    // Positions past the window's end are from before it started over.
    let end = doc.list.window_end();
    sent.retain(|&at| at <= end);
    // Stock sync takes a message without changes whose heads are ours as "the
    // peer knows our heads" and will not name them to it. When an earlier frame
    // of this batch from the same peer brought those heads' changes, the peer
    // has not heard that the hub has them: one answer for both frames must
    // still say so (a client waiting for it would wait forever).
    if took_as_known.is_some_and(|heads| state.last_sent_heads == heads) {
        state.last_sent_heads = last_sent;
    }
    let rejected = std::mem::take(&mut merge.rejected);
    // A token vouches for the writer: the changes of an actor a token brought are
    // its agent's, in its role, whatever agent id the actor registered in the
    // document (changes that waited for dependencies land with another peer's
    // message: each is bound to the identity that brought it).
    for change in &merge.changes {
        if let Some(owner) = actors.get(change.actor()) {
            if !doc
                .authority
                .bind(change.actor(), &owner.agent, owner.role_in(&doc_id))
            {
                tracing::warn!(conn = c.0, actor = %change.actor(), agent = %owner.agent, "an actor bound to another role");
            }
        }
    }
    let commit = (!merge.is_empty()).then(|| HubCore::check_and_repair(doc, doc_id, merge, now_ms));
    Ok(Ok((rejected, commit, continues)))
}

/// Whom `change`'s actor belongs to when it is not the sender's (`identity`, if it
/// presented a token) to write with: the hub's, the list's creation after its first
/// change, or another agent's. `None` when the sender may write with it.
fn owner_of(
    actors: &BTreeMap<ActorId, Arc<Identity>>,
    hub_actor: &ActorId,
    identity: Option<&Identity>,
    change: &automerge::Change,
) -> Option<String> {
    let actor = change.actor_id();
    // The list's first change is the same bytes in every list (see `TodoList::create`):
    // its actor is nobody's, and never writes again.
    if actor == hub_actor {
        Some("the hub".to_owned())
    } else if actor.to_bytes() == crate::model::ROOT_ACTOR {
        (change.seq() > 1).then(|| "the list's creation (it never writes again)".to_owned())
    } else {
        actors
            .get(actor)
            .filter(|o| identity.is_none_or(|who| who.agent != o.agent))
            .map(|o| format!("agent {:?}", o.agent))
    }
}
