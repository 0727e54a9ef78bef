//! Lists in and out of memory: loaded, dropped after a crash or a refused commit.

use automerge::Automerge;

use super::events::change_count;
use super::limits::{LIST_SUMMARY_INTERVAL_MS, REBUILD_CATCH_UP_MAX, SYNC_WINDOW_QUIET_MS};
use super::merge::summary_of;
use super::{
    Close, Commit, ConnId, ConnState, DocState, Effects, EventKinds, HubCore, Identity, StoredList,
};
use crate::model::{Rebuilt, TodoList};
use crate::proto::wire::DocumentId;
use crate::proto::wire::PeerId;

/// A connection handed over to the hub of the cluster that holds the list it asked
/// for ([`HubCore::hand_over`]): who it is, and the frames that waited for the list.
#[derive(Debug, Clone)]
pub struct Handover {
    /// The connection (no longer this core's).
    pub conn: ConnId,
    /// The automerge-repo peer it joined as.
    pub peer: PeerId,
    /// Its token's identity, if it presented one.
    pub identity: Option<Identity>,
    /// Where it comes from.
    pub address: Option<std::net::IpAddr>,
    /// The kinds of event it asked to be pushed.
    pub events: EventKinds,
    /// Its frames that waited for the list, in the order they came.
    pub frames: Vec<Vec<u8>>,
}

impl HubCore {
    /// A list the runtime loaded for [`Effects::loads`] (`None`: the store has nothing
    /// for it), with the authority's reported keys; handles the frames that waited for
    /// it and returns what they cause.
    pub fn loaded(&mut self, now_ms: i64, id: DocumentId, loaded: Option<StoredList>) -> Effects {
        match loaded {
            Some(l) if !self.docs.contains_key(&id) => {
                self.insert_list(id, l.list, l.reported);
                if let Some(d) = self.docs.get_mut(&id) {
                    d.since_compaction = l.since_compaction;
                }
            }
            Some(_) => {}
            None => {
                self.stored.remove(&id);
            }
        }
        let mut fx = Effects::default();
        self.clock_ms = now_ms;
        if !self.docs.contains_key(&id) {
            self.found_empty = Some(id);
        }
        for (c, bytes) in self.waiting.remove(&id).unwrap_or_default().0 {
            self.frame(now_ms, c, &bytes, &mut fx);
        }
        self.calls_loaded(now_ms, id, &mut fx);
        self.found_empty = None;
        // A sub-list loaded again rolls up again (its parent may have missed the last);
        // a parent loaded here takes what its sub-lists held elsewhere roll up to.
        self.sub_list_touched(id);
        self.parent_loaded(id);
        self.roll_up_due(now_ms, &mut fx);
        self.check_presence(now_ms, &mut fx);
        self.flush_summaries(now_ms, false, &mut fx);
        self.answer(now_ms, false, &mut fx);
        // The peers that asked for it may have left while it loaded: then nobody syncs
        // it, and it leaves memory again.
        self.let_go(id);
        fx
    }

    /// List `id` could not be loaded here: another hub of the cluster holds it
    /// (`why` says which). The connections that asked for it are closed with 1013
    /// `list_elsewhere` and the calls waiting for it answered `list_elsewhere`, each
    /// with `why`; nothing else changes.
    pub fn unavailable(&mut self, now_ms: i64, id: DocumentId, why: &str) -> Effects {
        self.elsewhere(now_ms, id, why, false).0
    }

    /// List `id` is held by another hub of the cluster, which this hub's peers reach
    /// through it (docs/DESIGN.md §10): each connection that asked for it and syncs
    /// nothing here leaves this core, handed over to the runtime with the frames that
    /// waited, to be carried to that hub; a connection that syncs another list here is
    /// closed, and the calls answered, as by [`HubCore::unavailable`].
    pub fn hand_over(
        &mut self,
        now_ms: i64,
        id: DocumentId,
        why: &str,
    ) -> (Effects, Vec<Handover>) {
        self.elsewhere(now_ms, id, why, true)
    }

    /// List `id`'s stored document does not load (`why`: the store is damaged). The
    /// connections that asked for it are closed with 1011 `list_unreadable` and the
    /// calls waiting for it answered `internal`, each with `why`; every other list is
    /// served as usual, and the next peer or call that asks for it loads it again.
    pub fn unreadable(&mut self, now_ms: i64, id: DocumentId, why: &str) -> Effects {
        let message = format!(
            "the hub's store holds this list damaged ({why}): its operator must restore the \
             store; the hub's other lists are served"
        );
        let refused = Refusal {
            close: (1011, "list_unreadable"),
            error: crate::proto::ErrorCode::Internal,
            message,
        };
        self.refuse_waiting(now_ms, id, refused, false).0
    }

    fn elsewhere(
        &mut self,
        now_ms: i64,
        id: DocumentId,
        why: &str,
        hand: bool,
    ) -> (Effects, Vec<Handover>) {
        let refused = Refusal {
            close: (1013, "list_elsewhere"),
            error: crate::proto::ErrorCode::ListElsewhere,
            message: format!("{why}: connect to that hub, or retry here later"),
        };
        self.refuse_waiting(now_ms, id, refused, hand)
    }

    /// Refuses the connections and calls waiting for list `id` as `refused` says; with
    /// `hand`, the connections that sync nothing here are handed over instead.
    fn refuse_waiting(
        &mut self,
        now_ms: i64,
        id: DocumentId,
        refused: Refusal,
        hand: bool,
    ) -> (Effects, Vec<Handover>) {
        let mut fx = Effects::default();
        let mut handed: Vec<Handover> = Vec::new();
        self.clock_ms = now_ms;
        let Refusal {
            close: (code, reason),
            error,
            message,
        } = refused;
        for (c, frame) in self.waiting.remove(&id).map(|w| w.0).unwrap_or_default() {
            if let Some(h) = handed.iter_mut().find(|h| h.conn == c) {
                h.frames.push(frame);
                continue;
            }
            let Some(conn) = self.conns.get(&c) else {
                continue;
            };
            match &conn.state {
                ConnState::Ready(peer) if hand && conn.docs.is_empty() => {
                    handed.push(Handover {
                        conn: c,
                        peer: peer.clone(),
                        identity: conn.identity.clone(),
                        address: conn.address,
                        events: conn.events,
                        frames: vec![frame],
                    });
                    self.conns.remove(&c);
                }
                _ => self.fail(c, code, reason, message.clone(), &mut fx),
            }
        }
        for w in self.calls.remove(&id).unwrap_or_default() {
            fx.answers
                .push((w.id, Err(super::calls::error(error, None, message.clone()))));
        }
        (fx, handed)
    }

    /// This hub no longer holds list `id` (its lease in the cluster ended, `why`): the
    /// list leaves memory and its peers are closed with 1012 `list_moved`; they
    /// reconnect, and the next load finds where the list is.
    pub fn lost(&mut self, now_ms: i64, id: DocumentId, why: &str) -> Effects {
        let mut fx = Effects::default();
        self.clock_ms = now_ms;
        tracing::warn!(doc = %id, why, "this hub no longer holds the list; dropping it from memory");
        let moved = Close {
            code: 1012,
            reason: "list_moved".to_owned(),
            message: Some(format!(
                "this hub no longer holds the list ({why}): reconnect"
            )),
        };
        self.drop_list(id, None, &moved, &mut fx);
        fx
    }

    /// List `id`'s document rebuilt from a snapshot the core asked for
    /// ([`Compaction::rebuild`](super::Compaction::rebuild)), loaded by the runtime off the hub's task: it takes
    /// the place of the one in memory, with the changes the list took since the
    /// snapshot applied to it first. Nothing changes for the list's peers. A list that
    /// left memory meanwhile has nothing to take it (it is loaded in one piece anyway);
    /// a document that is not a save of the list, or that lacks more than
    /// [`REBUILD_CATCH_UP_MAX`] of its changes, is dropped and logged, and the list's next
    /// compaction asks for another.
    pub fn rebuilt(&mut self, id: DocumentId, rebuilt: impl Into<Rebuilt>) {
        let Some(doc) = self.docs.get_mut(&id) else {
            return;
        };
        match doc.list.adopt_rebuilt(rebuilt, REBUILD_CATCH_UP_MAX) {
            Ok(caught_up) => tracing::debug!(doc = %id, caught_up, "list rebuilt"),
            Err(e) => {
                tracing::info!(doc = %id, error = %e, "rebuild dropped; the next compaction asks for another");
                doc.changes_at_rebuild = 0;
            }
        }
    }

    /// Puts a list in memory before any peer asked for it, with the authority's reported
    /// keys, as a load would (tests and benchmarks start from a list this way; a runtime
    /// loads through [`Effects::loads`] and [`HubCore::loaded`]).
    pub fn load_doc(&mut self, id: DocumentId, doc: Automerge, reported: Vec<String>) {
        let list = TodoList::from_doc(doc.with_actor(self.config.actor.clone()));
        self.insert_list(id, list, reported);
    }

    pub(super) fn insert_list(&mut self, id: DocumentId, list: TodoList, reported: Vec<String>) {
        self.stored.insert(id);
        let authority = self.authority().with_reported(reported);
        let changes_at_rebuild = change_count(&list);
        self.docs
            .insert(id, DocState::new(list, authority, changes_at_rebuild));
        self.owners_may_be_new(id);
    }

    /// A list whose merge panicked: forget it, close the offender and the list's other
    /// peers (they reconnect and resync; the list is loaded from the store again).
    pub(super) fn crashed(&mut self, offender: ConnId, doc_id: DocumentId, fx: &mut Effects) {
        let reloading = Close {
            code: 1012,
            reason: "list_reloading".to_owned(),
            message: Some("the list is being reloaded: reconnect".to_owned()),
        };
        self.drop_list(doc_id, Some(offender), &reloading, fx);
        self.fail(
            offender,
            1008,
            "change_crashed_automerge",
            "a change of yours made Automerge fail; it was not applied".to_owned(),
            fx,
        );
    }

    /// Drops a list from memory and closes its peers (but `spare`) with `close`; the
    /// next peer that asks for it has it loaded from the store.
    pub(super) fn drop_list(
        &mut self,
        doc_id: DocumentId,
        spare: Option<ConnId>,
        close: &Close,
        fx: &mut Effects,
    ) {
        let peers: Vec<ConnId> = self
            .docs
            .remove(&doc_id)
            .map(|d| d.peers.into_keys().collect())
            .unwrap_or_default();
        self.owed.remove(&doc_id);
        self.news.remove(&doc_id);
        for p in peers.into_iter().filter(|p| Some(*p) != spare) {
            if let Some(conn) = self.conns.get_mut(&p) {
                conn.docs.remove(&doc_id);
            }
            fx.closes.push((p, close.clone()));
            self.drop_conn(p);
        }
    }

    /// The store refused a commit of list `doc_id` for the list's own reasons (a record
    /// over a store limit), or — `moved` — because another hub of the cluster took the
    /// list: nothing of it is durable, so nothing of it may be relayed. The list is
    /// dropped from memory (loaded from the store, as it was before the refused merge,
    /// when a peer asks for it again); its peers are closed with 1011 `list_refused`
    /// (1012 `list_moved`) and reconnect. Returns the peers closed.
    pub(super) fn isolate(
        &mut self,
        doc_id: DocumentId,
        why: &str,
        moved: bool,
        fx: &mut Effects,
    ) -> Vec<ConnId> {
        let peers: Vec<ConnId> = self
            .docs
            .get(&doc_id)
            .map(|d| d.peers.keys().copied().collect())
            .unwrap_or_default();
        if moved {
            tracing::info!(doc = %doc_id, why, "the list moved to another hub; dropping it from memory");
        } else {
            tracing::error!(doc = %doc_id, why, "the store refused a merge of this list; dropping it from memory");
        }
        let refused = if moved {
            Close {
                code: 1012,
                reason: "list_moved".to_owned(),
                message: Some(format!(
                    "the list moved to another hub ({why}); this hub's last merge was undone: reconnect and sync again"
                )),
            }
        } else {
            Close {
                code: 1011,
                reason: "list_refused".to_owned(),
                message: Some(format!(
                    "the hub could not store the last merge of this list ({why}); it was undone: reconnect and sync again"
                )),
            }
        };
        self.drop_list(doc_id, None, &refused, fx);
        peers
    }
}

impl HubCore {
    /// Writes the rows of the index of lists that wait for their interval and are due
    /// (`all`: every one), each as a commit of its own with nothing else in it.
    pub(super) fn flush_summaries(&mut self, now_ms: i64, all: bool, fx: &mut Effects) {
        if self.summaries_due.is_empty() {
            return;
        }
        for doc_id in std::mem::take(&mut self.summaries_due) {
            let Some(doc) = self.docs.get_mut(&doc_id) else {
                continue;
            };
            if !doc.summary_stale {
                continue;
            }
            if !all && now_ms.saturating_sub(doc.summary_written_ms) < LIST_SUMMARY_INTERVAL_MS {
                self.summaries_due.insert(doc_id);
                continue;
            }
            self.write_summary(now_ms, doc_id, fx);
        }
    }

    /// A commit of list `doc_id`'s row in the index of lists alone.
    pub(super) fn write_summary(&mut self, now_ms: i64, doc_id: DocumentId, fx: &mut Effects) {
        let Some(doc) = self.docs.get_mut(&doc_id) else {
            return;
        };
        doc.summary_written_ms = now_ms;
        doc.summary_stale = false;
        fx.commits.push(Commit {
            summary: Some(summary_of(doc)),
            ..Commit::empty(doc_id)
        });
    }

    /// When the next row of the index of lists is due.
    pub(super) fn next_summary_ms(&self) -> Option<i64> {
        self.summaries_due
            .iter()
            .filter_map(|d| self.docs.get(d))
            .map(|d| {
                d.summary_written_ms
                    .saturating_add(LIST_SUMMARY_INTERVAL_MS)
            })
            .min()
    }

    /// Lists nobody wrote to for [`SYNC_WINDOW_QUIET_MS`] give back their sync window
    /// (`TodoList::forget_window`); a list written to since is looked at again when that
    /// write is as old. Its cost follows the lists that are due. Returns how many
    /// changes the windows gave back.
    pub(super) fn forget_quiet_windows(&mut self, now_ms: i64) -> usize {
        let mut freed = 0;
        while let Some(&(at, doc_id)) = self.windows_due.first() {
            if at > now_ms {
                break;
            }
            self.windows_due.pop_first();
            let Some(doc) = self.docs.get_mut(&doc_id) else {
                continue;
            };
            let quiet_at = doc.written_ms.saturating_add(SYNC_WINDOW_QUIET_MS);
            if quiet_at > now_ms {
                self.windows_due.insert((quiet_at, doc_id));
                continue;
            }
            doc.window_due = false;
            let dropped = doc.list.forget_window();
            freed += dropped;
            tracing::debug!(doc = %doc_id, dropped, "quiet list: its sync window given back");
        }
        freed
    }

    /// Before the hub stops: every row of the index of lists that waits, written now.
    pub fn flush(&mut self, now_ms: i64) -> Effects {
        let mut fx = Effects::default();
        self.flush_summaries(now_ms, true, &mut fx);
        fx
    }
}

/// How the connections and calls waiting for a list that cannot be loaded here are
/// refused.
struct Refusal {
    /// The connections' close code and reason.
    close: (u16, &'static str),
    /// The calls' error code.
    error: crate::proto::ErrorCode,
    /// What both are told.
    message: String,
}
