//! The answers to a batch: the senders first, then the news for every other peer.

use std::collections::BTreeMap;

use automerge::sync;

use super::limits::{
    FANOUT_DEFER_MAX_MS, FANOUT_HOLD_HEARD_MAX_MS, FANOUT_UNACKED_MAX, UNACKED_KEPT_MAX,
};
use super::{Conn, ConnId, ConnState, Effects, HubCore, Peer};
use crate::model::sync::SentIndex;
use crate::model::TodoList;
use crate::proto::wire::{self, DocumentId, WireMessage};

/// What the last peers of a list got in one round of answers, for the next.
#[derive(Debug, Default)]
pub(super) struct FanOut {
    /// The last generation for a peer that only hears the news.
    pub(super) generated: Option<Generated>,
    /// The last sync message made, and its frame for any peer.
    pub(super) encoded: Option<(sync::Message, wire::ToEach)>,
}

/// One generation of a sync message: the peer's state before and after, and the frame
/// it made (if any), for any peer.
#[derive(Debug)]
pub(super) struct Generated {
    pub(super) before: sync::State,
    pub(super) heard_at: u64,
    pub(super) after: sync::State,
    pub(super) after_sent: SentIndex,
    pub(super) frame: Option<wire::ToEach>,
    /// The message was cut (see `Peer::catching_up`).
    pub(super) cut: bool,
}

/// Who is owed a sync message about one list after a batch of inputs.
#[derive(Debug, Default)]
pub(super) struct Owed {
    /// The connections that sent sync messages, in the order they first did.
    pub(super) senders: Vec<ConnId>,
    /// What each sender's messages did.
    pub(super) sent: BTreeMap<ConnId, Sent>,
    /// The list changed: every peer is owed the news.
    pub(super) moved: bool,
}

/// What one peer's sync messages of a batch did.
#[derive(Debug, Default)]
pub(super) struct Sent {
    /// Stock sync steps they cost (charged with the answer's to its work budget).
    pub(super) steps: u64,
    /// They changed the list.
    pub(super) brought: bool,
    /// The peer was catching up (`Peer::catching_up`): they answer a message the hub
    /// cut, and the history work of this round trip is the hub's own doing (a peer
    /// far behind the window costs stock steps on every part), not charged.
    pub(super) continues: bool,
}

impl HubCore {
    /// Sends what the inputs just handled owe: for each list, the senders first, then
    /// (if it changed) every other peer. Peers that were in step get the same message:
    /// it is encoded once.
    pub(super) fn answer(&mut self, now_ms: i64, defer: bool, fx: &mut Effects) {
        let mut over_budget = Vec::new();
        let mut owed = std::mem::take(&mut self.owed);
        for (doc_id, o) in &owed {
            if o.moved {
                self.news.entry(*doc_id).or_insert(now_ms);
            }
        }
        // Lists whose news goes out now: all of them, unless deferring (then those
        // whose news has waited long enough).
        let due: Vec<DocumentId> = self
            .news
            .iter()
            .filter(|(_, since)| !defer || now_ms - **since >= FANOUT_DEFER_MAX_MS)
            .map(|(d, _)| *d)
            .collect();
        for d in due {
            self.news.remove(&d);
            owed.entry(d).or_default().moved = true;
        }
        for (doc_id, owed) in owed {
            let Some(doc) = self.docs.get(&doc_id) else {
                self.news.remove(&doc_id);
                continue;
            };
            let mut targets = owed.senders;
            // News owed since this batch or an earlier one; a peer answered as a sender
            // meanwhile gets nothing more unless the list moved since (its state says so).
            // A busy hub holds it from peers FANOUT_UNACKED_MAX messages behind that
            // spoke lately (FANOUT_HOLD_HEARD_MAX_MS). A peer catching up over several
            // messages gets it with the next part, when it answers the last.
            let mut held = false;
            if owed.moved && !self.news.contains_key(&doc_id) {
                for (t, peer) in &doc.peers {
                    if owed.sent.contains_key(t) || peer.catching_up {
                        continue;
                    }
                    if defer
                        && peer.unacked.len() >= FANOUT_UNACKED_MAX
                        && now_ms - peer.heard_ms < FANOUT_HOLD_HEARD_MAX_MS
                    {
                        held = true;
                    } else {
                        targets.push(*t);
                    }
                }
            }
            let mut fan_out = FanOut::default();
            for t in targets {
                let sent = owed.sent.get(&t).map(|s| (s.steps, s.continues));
                if !self.reply(now_ms, doc_id, t, sent, &mut fan_out, fx) {
                    over_budget.push((t, doc_id));
                }
            }
            if held {
                self.news.entry(doc_id).or_insert(now_ms);
            }
            // What the peers still need from the window is looked at when the list
            // moved (the window is consulted when it records a change) or while the
            // window holds more than its size for lagging peers (so that it shrinks
            // once they caught up). Not after every acknowledgement: at 1,000 peers that
            // was a look at every peer for each of the 999 acknowledgements of a write.
            // A floor left from an earlier batch only keeps more than needed, as peers'
            // acknowledgements only move their sets forward.
            if let Some(doc) = self.docs.get_mut(&doc_id) {
                if owed.moved || doc.list.window_len() > crate::model::sync::SYNC_WINDOW_CHANGES {
                    doc.list
                        .keep_window_for(doc.peers.values().map(|p| &p.state));
                }
            }
        }
        for (c, doc_id) in over_budget {
            self.over_budget(c, doc_id, fx);
        }
    }

    /// Generates and queues the sync message for peer `t` of list `doc_id`, if there is
    /// anything to say. `sent`: the stock sync steps the peer's own messages cost, when
    /// this answers them (charged, with this message's, to its work budget, unless they
    /// continue a catch-up: `Sent::continues`); false when that budget is exhausted
    /// (nothing is sent). `fan_out` is what the list's last
    /// peer got, reused when this one is in the same state.
    pub(super) fn reply(
        &mut self,
        now_ms: i64,
        doc_id: DocumentId,
        t: ConnId,
        sent: Option<(u64, bool)>,
        fan_out: &mut FanOut,
        fx: &mut Effects,
    ) -> bool {
        let Some(doc) = self.docs.get_mut(&doc_id) else {
            return true;
        };
        let Some(Conn {
            state: ConnState::Ready(target_id),
            ..
        }) = self.conns.get(&t)
        else {
            return true;
        };
        let Some(peer) = doc.peers.get_mut(&t) else {
            return true;
        };
        let target_id = target_id.clone();
        let heard_at = peer.heard_at;
        // A peer that only hears the news, in the state the last one was in, gets what
        // it got: generating is a function of the list and the state (the peers of a
        // list in step are all in one state, so one generation serves them all).
        if sent.is_none() {
            if let Some(same) = &fan_out.generated {
                if same.heard_at == heard_at && same.before == peer.state {
                    peer.state.clone_from(&same.after);
                    peer.sent.clone_from(&same.after_sent);
                    if let Some(each) = &same.frame {
                        fx.sends.push((t, each.to(&target_id)));
                        peer.catching_up = same.cut;
                        Self::note_sent(&doc.list, peer);
                    }
                    return true;
                }
            }
        }
        let before = sent.is_none().then(|| peer.state.clone());
        let counted = doc.list.sync_counters();
        let m = doc
            .list
            .generate_sync_message_after(&mut peer.state, &mut peer.sent, heard_at);
        let states = before.map(|before| (before, peer.state.clone(), peer.sent.clone()));
        let made = m.is_some();
        let cut = doc.list.sync_counters().cut > counted.cut;
        if let Some((sent, false)) = sent {
            let steps = sent + doc.list.sync_counters().stock.saturating_sub(counted.stock);
            let limits = self.config.sync_work;
            if !Self::charge(&mut self.conns, doc, t, now_ms, steps, limits) {
                return false;
            }
        }
        if let Some(m) = m {
            if fan_out.encoded.as_ref().is_none_or(|(last, _)| *last != m) {
                let out = WireMessage::Sync {
                    document_id: doc_id,
                    sender_id: self.config.peer_id.clone(),
                    target_id: target_id.clone(),
                    data: m.clone().encode(),
                };
                fan_out.encoded = wire::ToEach::new(&out).map(|each| (m, each));
            }
        }
        let each = if made {
            fan_out.encoded.as_ref().map(|(_, each)| each)
        } else {
            None
        };
        if let Some((before, after, after_sent)) = states {
            fan_out.generated = Some(Generated {
                before,
                heard_at,
                after,
                after_sent,
                frame: each.cloned(),
                cut,
            });
        }
        if let Some(each) = each {
            fx.sends.push((t, each.to(&target_id)));
            if let Some(peer) = doc.peers.get_mut(&t) {
                peer.catching_up = cut;
                Self::note_sent(&doc.list, peer);
            }
        }
        true
    }

    /// Remembers that `peer` was sent the list as it stands (see [`FANOUT_UNACKED_MAX`]),
    /// unless the peer's heads cover it already: such a message (the last of a
    /// handshake, say) only names heads the peer has, and it will not answer it.
    pub(super) fn note_sent(list: &TodoList, peer: &mut Peer) {
        let end = list.window_end();
        let covered = peer
            .state
            .their_heads
            .as_deref()
            .and_then(|heads| list.window_covered_by(heads))
            .is_some_and(|low| low >= end);
        if covered {
            return;
        }
        let sent = &mut peer.unacked;
        if sent.len() >= UNACKED_KEPT_MAX {
            sent.pop_front();
        }
        sent.push_back(end);
    }
}
