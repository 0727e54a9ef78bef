//! A peer's sync message into a replica: its changes applied, then the peer's sync state
//! updated from the window when it can answer, else by automerge's stock function.

use std::collections::BTreeSet;

use automerge::sync::{Message, MessageFlags, State};
use automerge::{Automerge, AutomergeError, Change, ChangeHash};

use super::window::{SentIndex, SyncWindow};
use crate::model::sync;
use crate::model::{chunk_changes, Merge, ModelError, TodoList};

impl TodoList {
    /// Receives an Automerge sync message from a peer: its changes go through
    /// [`TodoList::apply_changes`] (causal order, index kept in step), then the peer's
    /// sync state is updated from the rest of the message — from the recent-changes
    /// window when it can answer (cost independent of the history; see [`sync`]),
    /// else by automerge's stock function. The message must have been validated (the
    /// hub's `syncmsg` module) before it gets here.
    pub fn receive_sync_message(
        &mut self,
        state: &mut automerge::sync::State,
        message: automerge::sync::Message,
    ) -> Result<Merge, ModelError> {
        self.receive_sync_message_indexed(state, &mut sync::SentIndex::default(), message)
    }

    /// [`TodoList::receive_sync_message`] for a peer whose changes in flight are kept
    /// indexed beside its state (`sent`, see [`sync::SentIndex`]): what the peer acknowledges
    /// costs a walk from its heads, not a lookup per change in flight. A hub keeps one
    /// per peer.
    pub fn receive_sync_message_indexed(
        &mut self,
        state: &mut automerge::sync::State,
        sent: &mut sync::SentIndex,
        message: automerge::sync::Message,
    ) -> Result<Merge, ModelError> {
        let admitted = self.receive_sync_message_admitting(state, sent, message, |_| {
            Ok::<(), std::convert::Infallible>(())
        })?;
        match admitted {
            Ok(merge) => Ok(merge),
            Err(never) => match never {},
        }
    }

    /// [`TodoList::receive_sync_message_indexed`] that first shows `admit` the message's
    /// changes this replica does not hold yet (neither applied nor waiting), before
    /// Automerge sees any of them. When `admit` refuses, nothing of the message is
    /// applied, the sync state is untouched, and its error comes back (`Ok(Err(..))`):
    /// the hub refuses a change whose actor belongs to another agent this way, as once
    /// Automerge holds a change nothing can take it out (and the actor's own next change
    /// with the same sequence number would be refused instead).
    pub fn receive_sync_message_admitting<E>(
        &mut self,
        state: &mut automerge::sync::State,
        sent: &mut sync::SentIndex,
        message: automerge::sync::Message,
        admit: impl FnOnce(&[Change]) -> Result<(), E>,
    ) -> Result<Result<Merge, E>, ModelError> {
        let changes = Self::message_changes(&message)?;
        let fresh: Vec<Change> = changes
            .iter()
            .filter(|c| !self.holds(&c.hash()))
            .cloned()
            .collect();
        if let Err(e) = admit(&fresh) {
            return Ok(Err(e));
        }
        let before = self.heads();
        let merge = self.apply_changes(changes)?;
        match sync::receive_state(&self.doc, &self.window, state, sent, message, &before) {
            Ok(()) => {
                self.sync_counters.count(true);
                Ok(Ok(merge))
            }
            Err(message) => {
                self.sync_counters.count(false);
                tracing::debug!(
                    heads = message.heads.len(),
                    sent = state.sent_hashes.len(),
                    "receive: stock sync step"
                );
                sent.forget();
                self.receive_state_stock(state, message, &before)?;
                Ok(Ok(merge))
            }
        }
    }

    /// [`TodoList::receive_sync_message`] by automerge's stock function only (whose
    /// cost follows the history): the reference of the differential test and the
    /// benches.
    pub fn receive_sync_message_stock(
        &mut self,
        state: &mut automerge::sync::State,
        message: automerge::sync::Message,
    ) -> Result<Merge, ModelError> {
        let (merge, before, message) = self.receive_changes(message)?;
        self.receive_state_stock(state, message, &before)?;
        Ok(merge)
    }

    /// Applies a sync message's changes; returns what they touched and the heads before.
    fn receive_changes(
        &mut self,
        message: automerge::sync::Message,
    ) -> Result<(Merge, Vec<ChangeHash>, automerge::sync::Message), ModelError> {
        let changes = Self::message_changes(&message)?;
        let before = self.heads();
        let merge = self.apply_changes(changes)?;
        Ok((merge, before, message))
    }

    /// The changes a sync message carries, decoded from its chunks.
    fn message_changes(message: &automerge::sync::Message) -> Result<Vec<Change>, ModelError> {
        let mut changes = Vec::new();
        for (index, chunk) in message.changes.iter().enumerate() {
            changes.extend(
                chunk_changes(chunk).map_err(|reason| ModelError::BadChunk { index, reason })?,
            );
        }
        Ok(changes)
    }

    /// The state part of the stock `receive_sync_message`, its changes already applied
    /// (heads `before` them): the message goes to automerge without its changes, and
    /// what automerge would have done differently with them is done here.
    fn receive_state_stock(
        &mut self,
        state: &mut automerge::sync::State,
        mut message: automerge::sync::Message,
        before: &[ChangeHash],
    ) -> Result<(), AutomergeError> {
        let had_changes = !message.changes.is_empty();
        let after = self.doc.get_heads();
        let last_sent = state.last_sent_heads.clone();
        if had_changes && !state.read_only {
            state.shared_heads = sync::advance_heads(before, &after, &state.shared_heads);
        }
        // Without its changes and with heads equal to ours, automerge takes the message
        // as "the peer already knows our heads" and records them as sent, which it
        // does not do for a message that carried changes.
        let took_as_known = had_changes && message.heads == after && !message.heads.is_empty();
        message.changes = automerge::sync::ChunkList::from(Vec::<Vec<u8>>::new());
        automerge::sync::SyncDoc::receive_sync_message(&mut self.doc, state, message)?;
        if took_as_known {
            state.last_sent_heads = last_sent;
        }
        Ok(())
    }
}

/// Stock `receive_sync_message` for the state part, when the changes (if any) were
/// already applied by the caller: `before` are the heads before they were. Returns
/// `false` (state untouched) when the window cannot answer; the caller then runs the
/// stock function.
pub(crate) fn receive_state(
    doc: &Automerge,
    window: &SyncWindow,
    state: &mut State,
    sent: &mut SentIndex,
    message: Message,
    before: &[ChangeHash],
) -> Result<(), Message> {
    if !window.in_step(doc) {
        tracing::debug!(why = "window out of step", "receive: no window answer");
        return Err(message);
    }
    let known: Vec<ChangeHash> = message
        .heads
        .iter()
        .filter(|h| window.has_change(doc, h))
        .copied()
        .collect();
    let Some(acknowledged) = sent
        .of(window, state)
        .and_then(|positions| window.ancestors_among(positions, &known))
    else {
        tracing::debug!(
            why = "a change in flight is older than the window",
            missing = state.sent_hashes.iter().filter(|h| !window.by_hash.contains_key(h)).count(),
            sent = state.sent_hashes.len(),
            shared_pos = ?state.shared_heads.iter().map(|h| window.by_hash.get(h).copied()).collect::<Vec<_>>(),
            offset = window.offset,
            len = window.entries.len(),
            keep_from = window.keep_from,
            "receive: no window answer"
        );
        return Err(message);
    };
    let Message {
        heads,
        need,
        have,
        changes,
        flags,
        ..
    } = message;
    state.in_flight = false;
    if let Some(flags) = flags {
        let mut caps = vec![automerge::sync::Capability::MessageV2];
        if flags.contains(MessageFlags::SUPPORTS_SYNC_RESET) {
            caps.push(automerge::sync::Capability::SyncReset);
        }
        state.their_capabilities = Some(caps);
        if flags.contains(MessageFlags::SYNC_RESET) {
            state.sent_hashes.clear();
            sent.positions.clear();
        }
        state.peer_read_only = flags.contains(MessageFlags::READ_ONLY);
    }
    let after = window.heads().to_vec();
    if !changes.is_empty() && !state.read_only {
        state.shared_heads = advance_heads(before, &after, &state.shared_heads);
    }
    // The stock function removes ancestors after a possible reset cleared the set.
    if !state.sent_hashes.is_empty() {
        for &p in &acknowledged {
            if let Some(h) = window.hash_at(p) {
                state.sent_hashes.remove(&h);
            }
        }
        let mut acknowledged = acknowledged;
        acknowledged.sort_unstable();
        sent.positions
            .retain(|p| acknowledged.binary_search(p).is_err());
    }
    if changes.is_empty() && heads.as_slice() == before {
        state.last_sent_heads.clone_from(&heads);
    }
    if known.len() == heads.len() {
        state.shared_heads.clone_from(&heads);
        if heads.is_empty() {
            state.last_sent_heads = Vec::new();
            state.sent_hashes = BTreeSet::new();
            sent.positions.clear();
        }
    } else {
        let mut shared: Vec<ChangeHash> =
            state.shared_heads.iter().chain(&known).copied().collect();
        shared.sort_unstable();
        shared.dedup();
        state.shared_heads = shared;
    }
    state.their_have = Some(have);
    state.their_heads = Some(heads);
    state.their_need = Some(need);
    Ok(())
}

/// Automerge's `advance_heads` (private there).
pub(crate) fn advance_heads(
    old_heads: &[ChangeHash],
    new_heads: &[ChangeHash],
    old_shared: &[ChangeHash],
) -> Vec<ChangeHash> {
    let mut out: Vec<ChangeHash> = new_heads
        .iter()
        .filter(|h| !old_heads.contains(h))
        .chain(old_shared.iter().filter(|h| new_heads.contains(h)))
        .copied()
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}
