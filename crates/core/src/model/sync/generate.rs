//! The next sync message for a peer: from the window when it can answer, else by
//! automerge's stock function; cut to a bound on its changes' bytes.

use std::collections::BTreeSet;

use automerge::sync::{BloomFilter, ChunkList, Have, Message, MessageFlags, MessageVersion, State};
use automerge::{Automerge, Change, ChangeHash};

use super::window::{Entry, SentIndex, SyncWindow};
use super::{change_count, peer_supports_sync_reset, supports_v2, HashMap, HashSet};
use crate::format::CHUNK_TYPE_DOCUMENT;
use crate::model::sync;
use crate::model::{dependencies_first, storage_chunk_len, TodoList};

impl TodoList {
    /// The next sync message for a peer, if there is anything to say: from the
    /// recent-changes window when it can answer (see [`sync`]), else by automerge's
    /// stock function.
    pub fn generate_sync_message(
        &self,
        state: &mut automerge::sync::State,
    ) -> Option<automerge::sync::Message> {
        self.generate_with(state, &mut sync::SentIndex::default(), None)
    }

    /// [`TodoList::generate_sync_message`] with the peer's changes in flight indexed
    /// (see [`TodoList::receive_sync_message_indexed`]).
    pub fn generate_sync_message_indexed(
        &self,
        state: &mut automerge::sync::State,
        sent: &mut sync::SentIndex,
    ) -> Option<automerge::sync::Message> {
        self.generate_with(state, sent, None)
    }

    /// [`TodoList::generate_sync_message`] for a peer whose last message was received
    /// at window position `heard_at` ([`TodoList::window_end`] then): the changes
    /// applied since are sent even when the peer's Bloom filter claims them. That
    /// filter was made before they existed here, so a hit is a false positive (about
    /// one check in a hundred), and stock sync would withhold the change until the peer
    /// asks for it by hash — a round trip more for that peer. Sending a change the peer
    /// already has (from another connection) costs only its bytes. The hub answers
    /// this way; replicas keep stock behaviour.
    pub fn generate_sync_message_after(
        &self,
        state: &mut automerge::sync::State,
        sent: &mut sync::SentIndex,
        heard_at: u64,
    ) -> Option<automerge::sync::Message> {
        self.generate_with(state, sent, Some(heard_at))
    }

    fn generate_with(
        &self,
        state: &mut automerge::sync::State,
        sent: &mut sync::SentIndex,
        fresh_from: Option<u64>,
    ) -> Option<automerge::sync::Message> {
        let budget = sync::SYNC_CHANGES_BYTES_MAX;
        let mut cut = None;
        let window = sync::generate(
            &self.doc,
            &self.window,
            &self.pending,
            state,
            sent,
            fresh_from,
            budget,
            &mut cut,
        );
        let m = match window {
            Some(m) => {
                self.sync_counters.count(true);
                m
            }
            None => {
                self.sync_counters.count(false);
                tracing::debug!(
                    their_heads = ?state.their_heads.as_ref().map(Vec::len),
                    last_sync = ?state.their_have.as_ref().and_then(|h| h.first()).map(|h| h.last_sync.len()),
                    shared = state.shared_heads.len(),
                    "generate: stock sync step"
                );
                sent.forget();
                let mut m = self.generate_sync_message_stock(state);
                if let Some(m) = &mut m {
                    cut = self.cut_message(m, state, budget);
                }
                m
            }
        }?;
        if let Some((sent, left)) = cut {
            self.sync_counters.count_cut();
            tracing::debug!(
                sent,
                left,
                "generate: message cut to the changes bytes bound"
            );
        }
        Some(m)
    }

    /// Cuts a message whose changes add up to more than `budget` bytes to the first of
    /// them in causal order (every change after its dependencies) that fit, at least
    /// one; the others leave the peer's `sent_hashes`, so that the next message to it
    /// carries them. The peer applies what it got and answers, and the answer brings
    /// the next part: a peer back after many changes catches up over several round
    /// trips instead of one message larger than either side reads (a hub refuses
    /// frames over `FRAME_BYTES_MAX`; tungstenite refuses to queue more than its write
    /// buffer). The message keeps our heads: the peer asks for the ones it lacks.
    /// Returns how many changes went and how many were left out, if it cut.
    fn cut_message(
        &self,
        m: &mut automerge::sync::Message,
        state: &mut automerge::sync::State,
        budget: usize,
    ) -> Option<(usize, usize)> {
        let bytes: usize = m.changes.iter().map(<[u8]>::len).sum();
        if bytes <= budget {
            return None;
        }
        let mut changes = Vec::new();
        'chunks: for chunk in m.changes.iter() {
            let mut rest = chunk;
            while !rest.is_empty() {
                let Ok(len) = storage_chunk_len(rest) else {
                    return None;
                };
                let (one, tail) = rest.split_at(len);
                rest = tail;
                if one.get(8) == Some(&CHUNK_TYPE_DOCUMENT) {
                    // The whole document (stock sync sends it for a peer that lacks
                    // more than a third of it): the changes the peer lacks instead,
                    // those that are not ancestors of the heads it has of ours.
                    let theirs: Vec<ChangeHash> = state
                        .their_heads
                        .iter()
                        .flatten()
                        .filter(|h| self.doc.get_change_meta_by_hash(h).is_some())
                        .copied()
                        .collect();
                    changes = self.doc.get_changes(&theirs);
                    break 'chunks;
                }
                let Ok(c) = Change::from_bytes(one.to_vec()) else {
                    return None;
                };
                changes.push(c);
            }
        }
        let ordered = dependencies_first(changes);
        let mut taken = 0usize;
        let mut used = 0usize;
        for c in &ordered {
            let len = c.raw_bytes().len();
            if taken > 0 && used + len > budget {
                break;
            }
            taken += 1;
            used += len;
        }
        let left = &ordered[taken..];
        for c in left {
            state.sent_hashes.remove(&c.hash());
        }
        let v2 = m.version == automerge::sync::MessageVersion::V2;
        let (chunks, _) = sync::change_chunks(ordered[..taken].iter().map(Change::raw_bytes), v2);
        m.changes = automerge::sync::ChunkList::from(chunks);
        (!left.is_empty()).then_some((taken, left.len()))
    }

    /// [`TodoList::generate_sync_message`] by automerge's stock function only (the
    /// `need` it asks for walks the changes waiting here, as automerge walks its queue).
    pub fn generate_sync_message_stock(
        &self,
        state: &mut automerge::sync::State,
    ) -> Option<automerge::sync::Message> {
        // Automerge's own queue is always empty here (see `apply_changes`).
        let waiting = (!self.pending.is_empty())
            .then(|| sync::need_and_have(&self.doc, &self.window, &self.pending, state));
        let mut m = automerge::sync::SyncDoc::generate_sync_message(&self.doc, state)?;
        if let Some((need, have)) = waiting {
            m.need = need;
            if !have {
                m.have.clear();
            }
        }
        Some(m)
    }
}

/// Stock `generate_sync_message` from the window. `None` when the window cannot
/// answer (state untouched); `Some(None)` when there is nothing to send. Changes over
/// `budget` bytes are cut to the oldest that fit (at least one; the others are left
/// for the next message, see `TodoList::generate_sync_message`), and `cut` says how
/// many went and how many were left.
#[allow(clippy::too_many_arguments)]
pub(crate) fn generate(
    doc: &Automerge,
    window: &SyncWindow,
    pending: &[Change],
    state: &mut State,
    sent: &mut SentIndex,
    fresh_from: Option<u64>,
    budget: usize,
    cut: &mut Option<(usize, usize)>,
) -> Option<Option<Message>> {
    if !window.in_step(doc) {
        return None;
    }
    let our_heads = window.heads().to_vec();
    let (our_need, send_have) = need_and_have(doc, window, pending, state);
    if let Some(first) = state.their_have.as_ref().and_then(|h| h.first()) {
        if !first.last_sync.iter().all(|h| window.has_change(doc, h)) {
            let mut flags = MessageFlags::new();
            flags.set(MessageFlags::SUPPORTS_SYNC_RESET);
            // Stock `Message::reset`.
            return Some(Some(Message {
                heads: our_heads,
                need: Vec::new(),
                have: vec![Have::default()],
                changes: ChunkList::empty(),
                flags: Some(flags),
                version: MessageVersion::V1,
            }));
        }
    }
    let v2 = supports_v2(state);
    let changes: Vec<&Entry> = if state.is_peer_read_only() {
        Vec::new()
    } else if let (Some(have), Some(need)) = (&state.their_have, &state.their_need) {
        if state.their_heads.as_deref() == Some(&[]) && v2 {
            // The whole document: the history, by definition.
            return no_answer("the peer has nothing");
        }
        let (need_part, since_part) = hashes_to_send(
            doc,
            window,
            have,
            need,
            state.their_heads.as_deref(),
            fresh_from,
        )
        .or_else(|| no_answer("the peer's last sync is older than the window"))?;
        let need_part: Vec<ChangeHash> = need_part
            .into_iter()
            .filter(|h| !state.sent_hashes.contains(h))
            .collect();
        // In flight already: by position when the index has them all (a lagging
        // peer has thousands, and the window's changes come in position order).
        let since_part: Vec<&Entry> = match sent.of(window, state) {
            Some(positions) => {
                let mut at = 0;
                since_part
                    .into_iter()
                    .filter(|e| {
                        at += positions[at..].partition_point(|&p| p < e.pos);
                        positions.get(at) != Some(&e.pos)
                    })
                    .collect()
            }
            None => since_part
                .into_iter()
                .filter(|e| !state.sent_hashes.contains(&e.hash))
                .collect(),
        };
        let count = need_part.len() + since_part.len();
        if v2 && count > change_count(doc) / 3 {
            tracing::debug!(
                why = "more than a third of the history to send",
                hashes = count,
                "generate: no window answer"
            );
            return None;
        }
        let mut changes: Vec<&Entry> = need_part
            .iter()
            .map(|h| window.entry(h))
            .collect::<Option<_>>()?;
        changes.extend(since_part);
        if changes.iter().map(|e| e.bytes.len()).sum::<usize>() > budget {
            // The window holds changes in the order they were applied: causal order.
            changes.sort_unstable_by_key(|e| e.pos);
            changes.dedup_by_key(|e| e.pos);
            let mut used = 0;
            let taken = changes
                .iter()
                .take_while(|e| {
                    used += e.bytes.len();
                    used == e.bytes.len() || used <= budget
                })
                .count();
            *cut = Some((taken, changes.len() - taken));
            changes.truncate(taken);
        }
        changes
    } else {
        Vec::new()
    };
    let heads_unchanged = state.last_sent_heads == our_heads;
    let heads_equal = state.their_heads.as_ref() == Some(&our_heads);
    if heads_unchanged && state.have_responded {
        if (heads_equal || state.read_only) && changes.is_empty() {
            return Some(None);
        }
        if state.in_flight {
            return Some(None);
        }
    }
    let our_have = if send_have {
        let bloom = BloomFilter::from_hashes(
            window
                .since(&state.shared_heads)
                .or_else(|| no_answer("the shared heads are older than the window"))?
                .into_iter()
                .map(|e| e.hash)
                .collect::<Vec<_>>()
                .into_iter(),
        );
        vec![Have {
            last_sync: state.shared_heads.clone(),
            bloom,
        }]
    } else {
        Vec::new()
    };

    state.have_responded = true;
    state.last_sent_heads.clone_from(&our_heads);
    let was_indexed = sent.epoch == window.epoch && sent.positions.len() == state.sent_hashes.len();
    state.sent_hashes.extend(changes.iter().map(|e| e.hash));
    if was_indexed {
        sent.positions.extend(changes.iter().map(|e| e.pos));
        sent.positions.sort_unstable();
        sent.positions.dedup();
    } else {
        sent.forget();
    }
    let mut flags = MessageFlags::new();
    flags.set(MessageFlags::SUPPORTS_SYNC_RESET);
    if state.read_only {
        flags.set(MessageFlags::READ_ONLY);
    }
    let heads = if state.needs_reset {
        state.needs_reset = false;
        if peer_supports_sync_reset(state) {
            flags.set(MessageFlags::SYNC_RESET);
            our_heads
        } else {
            Vec::new()
        }
    } else {
        our_heads
    };
    let (chunks, version) = change_chunks(changes.iter().map(|e| &*e.bytes), v2);
    state.in_flight = true;
    Some(Some(Message {
        heads,
        need: our_need,
        have: our_have,
        changes: ChunkList::from(chunks),
        flags: Some(flags),
        version,
    }))
}

/// Why [`generate`] leaves a message to the stock function, logged; `None`.
fn no_answer<T>(why: &'static str) -> Option<T> {
    tracing::debug!(why, "generate: no window answer");
    None
}

/// The change list of a sync message as stock automerge lays it out: one chunk with
/// the changes one after the other for a peer that reads V2 messages, else one chunk
/// per change (V1).
pub fn change_chunks<'a>(
    changes: impl Iterator<Item = &'a [u8]>,
    v2: bool,
) -> (Vec<Vec<u8>>, MessageVersion) {
    if v2 {
        // Slice by slice: collecting the bytes one at a time was 7 % of a busy hub.
        let parts: Vec<&[u8]> = changes.collect();
        let mut joined: Vec<u8> = Vec::with_capacity(parts.iter().map(|c| c.len()).sum());
        for c in parts {
            joined.extend_from_slice(c);
        }
        let chunks = if joined.is_empty() {
            Vec::new()
        } else {
            vec![joined]
        };
        (chunks, MessageVersion::V2)
    } else {
        (changes.map(<[u8]>::to_vec).collect(), MessageVersion::V1)
    }
}

/// What a message to this peer asks for, and whether it says what we have: stock
/// `missing_deps_from(their_heads)` with automerge's queue being `pending` (the
/// replica holds changes whose dependencies are missing there, not in automerge).
pub(crate) fn need_and_have(
    doc: &Automerge,
    window: &SyncWindow,
    pending: &[Change],
    state: &State,
) -> (Vec<ChangeHash>, bool) {
    let need = if state.read_only {
        Vec::new()
    } else {
        let queued: HashMap<ChangeHash, &Change> = pending.iter().map(|c| (c.hash(), c)).collect();
        let mut missing = BTreeSet::new();
        let mut seen = HashSet::default();
        let mut stack: Vec<ChangeHash> = state.their_heads.iter().flatten().copied().collect();
        while let Some(h) = stack.pop() {
            if window.has_change(doc, &h) || !seen.insert(h) {
                continue;
            }
            match queued.get(&h) {
                Some(c) => stack.extend(c.deps().iter().copied()),
                None => {
                    missing.insert(h);
                }
            }
        }
        missing.into_iter().collect()
    };
    let theirs: HashSet<&ChangeHash> = state.their_heads.iter().flatten().collect();
    let have = need.iter().all(|h| theirs.contains(h));
    (need, have)
}

/// Stock `get_hashes_to_send`, from the window: the hashes the peer asked for that are
/// not among the rest, then the window's changes to send, in order. With
/// `fresh_from`, the window's changes from that position on are sent whatever the
/// peer's Bloom filters say (see
/// [`crate::model::TodoList::generate_sync_message_after`]).
///
/// Stock marks the changes its peer's filters do not hold, then adds, transitively,
/// every change depending on a marked one. The window is in causal order (a change
/// comes after its dependencies), so one pass in that order does both: a change is
/// sent when the filters miss it or one of its dependencies is sent. A lagging peer
/// has thousands of changes since its last sync, and this runs for every answer to
/// it: the pass follows dependencies by position, with no hashing.
#[allow(clippy::type_complexity)]
fn hashes_to_send<'r>(
    doc: &Automerge,
    window: &'r SyncWindow,
    have: &[Have],
    need: &[ChangeHash],
    their_heads: Option<&[ChangeHash]>,
    fresh_from: Option<u64>,
) -> Option<(Vec<ChangeHash>, Vec<&'r Entry>)> {
    let need: Vec<ChangeHash> = need
        .iter()
        .filter(|h| window.has_change(doc, h))
        .copied()
        .collect();
    if have.is_empty() {
        return Some((need, Vec::new()));
    }
    let last_sync: Vec<ChangeHash> = have
        .iter()
        .flat_map(|h| h.last_sync.iter().copied())
        .collect();
    // A peer whose last word was "last sync: never" (its first message after
    // connecting) sent a Bloom filter of its whole history, taken at the heads it sent
    // with it. Stock walks the whole history against that filter; but every ancestor of
    // those heads is in the filter (a Bloom filter has no false negatives), so only the
    // changes after them can be sent — the window's entries after those heads, when it
    // has them. Same changes, same order (the document's), without the walk.
    let after_their_heads = match (have, their_heads) {
        ([only], Some(heads)) if only.last_sync.is_empty() && !heads.is_empty() => {
            window.since(heads)
        }
        _ => None,
    };
    let since: Vec<&Entry> = match after_their_heads {
        Some(after) => after,
        None => window.since(&last_sync)?,
    };
    let (Some(first), Some(last)) = (since.first(), since.last()) else {
        return Some((need, Vec::new()));
    };
    let base = first.pos;
    let span = usize::try_from(last.pos - base).ok()? + 1;
    let mut marked = vec![false; span];
    let slot = move |pos: u64| {
        pos.checked_sub(base)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < span)
    };
    let mut to_send = Vec::new();
    for e in since {
        let fresh = fresh_from.is_some_and(|f| e.pos >= f);
        let send = fresh
            || have.iter().all(|h| !h.bloom.contains_hash(&e.hash))
            || e.dep_pos
                .iter()
                .any(|&p| slot(p).is_some_and(|i| marked[i]));
        if send {
            if let Some(i) = slot(e.pos) {
                marked[i] = true;
            }
            to_send.push(e);
        }
    }
    let need = need
        .into_iter()
        .filter(|h| {
            window
                .by_hash
                .get(h)
                .and_then(|&p| slot(p))
                .is_none_or(|i| !marked[i])
        })
        .collect();
    Some((need, to_send))
}
