//! The recent-changes window ([`SyncWindow`]): the last changes a replica applied, in
//! order, with the heads after each; and [`SentIndex`], a peer's changes in flight by
//! window position.

use std::collections::VecDeque;

use automerge::sync::State;
use automerge::{Automerge, Change, ChangeHash};

use super::{change_count, doc_change_count, HashMap, HashSet};
use crate::limits::{SYNC_WINDOW_CHANGES, SYNC_WINDOW_CHANGES_MAX, SYNC_WINDOW_FLOOR_SLACK};

/// The position of a dependency that was not in the window when its dependent was
/// recorded.
pub(super) const NOT_IN_WINDOW: u64 = u64::MAX;

/// Sets of heads up to this size are also looked up less one member when the window
/// bounds their ancestry ([`SyncWindow::low_of`]): a lookup each.
pub(super) const LOW_SUBSETS_MAX: usize = 16;

/// One change of the window: what sync needs of it (its hash, its dependencies, its
/// bytes), not the decoded `Change` — a `Change` is several hundred bytes before its
/// heap parts, and the window holds [`SYNC_WINDOW_CHANGES`] of them per list.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) hash: ChangeHash,
    /// Its absolute position (see [`SyncWindow::end`]).
    pub(super) pos: u64,
    pub(super) deps: Box<[ChangeHash]>,
    /// The positions of its dependencies ([`NOT_IN_WINDOW`] for those older than the
    /// window), so that a walk over the window follows them without hashing.
    pub(super) dep_pos: Box<[u64]>,
    pub(super) bytes: Box<[u8]>,
    /// The replica's heads right after this change (sorted).
    pub(super) heads_after: Vec<ChangeHash>,
    /// A position before which every change is an ancestor of this one (absolute;
    /// `None`: not known within the window). Under concurrent writers a change's
    /// ancestry reaches far below its own position — a writer whose messages wait in
    /// the hub's queue writes on top of what it heard long before — and a peer that
    /// shares such a change with us still needs the window from there.
    pub(super) low: Option<u64>,
}

/// The last changes a replica applied, in order (see the module docs).
#[derive(Debug)]
pub(crate) struct SyncWindow {
    /// Which window this is, for [`SentIndex`]: positions are this window's own (a
    /// window that starts over, or a copy that goes its own way, takes a new one).
    pub(super) epoch: u64,
    /// Heads before the first entry (sorted).
    pub(super) base_heads: Vec<ChangeHash>,
    pub(super) entries: VecDeque<Entry>,
    /// Absolute number of the first entry (entries ever evicted).
    pub(super) offset: u64,
    /// Absolute position of every change in the window.
    pub(super) by_hash: HashMap<ChangeHash, u64>,
    /// Sorted heads → the number of changes applied when they were the heads (absolute).
    pub(super) by_heads: HashMap<Vec<ChangeHash>, u64>,
    /// Entries from this absolute position on are kept past [`SYNC_WINDOW_CHANGES`]
    /// (up to [`SYNC_WINDOW_CHANGES_MAX`]): a peer still needs them. `u64::MAX`: none.
    pub(super) keep_from: u64,
    /// The document's number of changes when its heads were last seen to be the
    /// window's. A history only grows, so while the number is the same the heads are
    /// too: [`SyncWindow::in_step`] without asking automerge for its heads (which collects
    /// and sorts them: with concurrent writers, a hundred, several times per message).
    pub(super) doc_changes: u64,
}

/// The last epoch given to a window ([`SyncWindow::epoch`]; 0 is none).
static EPOCHS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(super) fn next_epoch() -> u64 {
    EPOCHS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

impl Clone for SyncWindow {
    /// A copy with an epoch of its own: the copy goes its own way (a forked list), and a
    /// [`SentIndex`] made against one must not pass for the other's.
    fn clone(&self) -> Self {
        SyncWindow {
            epoch: next_epoch(),
            base_heads: self.base_heads.clone(),
            entries: self.entries.clone(),
            offset: self.offset,
            by_hash: self.by_hash.clone(),
            by_heads: self.by_heads.clone(),
            keep_from: self.keep_from,
            doc_changes: self.doc_changes,
        }
    }
}

impl SyncWindow {
    /// An empty window at `heads`, the heads of a document of `doc_changes` changes.
    pub(crate) fn at(heads: Vec<ChangeHash>, doc_changes: u64) -> SyncWindow {
        let mut by_heads = HashMap::default();
        by_heads.insert(heads.clone(), 0);
        SyncWindow {
            epoch: next_epoch(),
            base_heads: heads,
            entries: VecDeque::new(),
            offset: 0,
            by_hash: HashMap::default(),
            by_heads,
            keep_from: u64::MAX,
            doc_changes,
        }
    }

    /// The window of a document just loaded or wrapped: all of its changes when they
    /// fit (a young list syncs its first peers without the stock path), else empty at
    /// its heads.
    pub(crate) fn of(doc: &Automerge) -> SyncWindow {
        if change_count(doc) <= SYNC_WINDOW_CHANGES {
            let mut r = SyncWindow::at(Vec::new(), 0);
            r.record(doc, doc.get_changes(&[]).iter());
            r
        } else {
            SyncWindow::at(doc.get_heads(), doc_change_count(doc))
        }
    }

    /// The heads after the last entry.
    pub(crate) fn heads(&self) -> &[ChangeHash] {
        self.entries
            .back()
            .map_or(&self.base_heads, |e| &e.heads_after)
    }

    /// Records changes just applied to `doc`, in the order they were applied. If the
    /// window no longer describes the document (a change went in some other way), it
    /// starts over, empty, at the document's heads.
    pub(crate) fn record<'a>(
        &mut self,
        doc: &Automerge,
        changes: impl Iterator<Item = &'a Change>,
    ) {
        let mut recorded = 0u64;
        for c in changes {
            let hash = c.hash();
            if self.by_hash.contains_key(&hash) {
                continue;
            }
            recorded += 1;
            let mut heads: Vec<ChangeHash> = self
                .heads()
                .iter()
                .filter(|h| !c.deps().contains(h))
                .copied()
                .collect();
            heads.push(hash);
            heads.sort_unstable();
            let low = self.low_of_deps(c.deps());
            let dep_pos = c
                .deps()
                .iter()
                .map(|d| self.by_hash.get(d).copied().unwrap_or(NOT_IN_WINDOW))
                .collect();
            let pos = self.offset + self.entries.len() as u64;
            self.by_hash.insert(hash, pos);
            self.by_heads.insert(heads.clone(), pos + 1);
            if self.full() {
                self.evict_first();
            } else if self.entries.len() == self.entries.capacity() {
                // Grow by doubling up to the window and not past it: a bulk record
                // (a first sync of a long history) must not leave a queue sized for
                // all of its changes.
                let len = self.entries.len();
                let room = SYNC_WINDOW_CHANGES_MAX - len;
                self.entries.reserve_exact(len.max(16).min(room).max(1));
            }
            self.entries.push_back(Entry {
                hash,
                pos,
                deps: c.deps().into(),
                dep_pos,
                bytes: c.raw_bytes().into(),
                heads_after: heads,
                low,
            });
        }
        // The document grew by exactly the changes recorded since its heads were last
        // the window's: they still are (each change went in after its dependencies).
        let count = doc_change_count(doc);
        if count == self.doc_changes + recorded {
            self.doc_changes = count;
            return;
        }
        let now = doc.get_heads();
        if self.heads() != now.as_slice() {
            tracing::debug!("sync window out of step with the document; starting over");
            *self = SyncWindow::at(now, count);
        } else {
            self.doc_changes = count;
        }
    }

    /// True when recording a change must first drop the oldest: the window is at its
    /// size and no peer needs the oldest entry, or it is at its most.
    pub(super) fn full(&self) -> bool {
        let len = self.entries.len();
        len >= SYNC_WINDOW_CHANGES_MAX
            || (len >= SYNC_WINDOW_CHANGES && self.offset < self.keep_from)
    }

    /// A position before which every change is an ancestor of a change with
    /// dependencies `deps` (`None`: not known within the window): the position at which
    /// `deps` were this replica's heads (a writer writes on top of a state it heard),
    /// else the highest such position of a dependency (its ancestors are ours). Also a
    /// peer's heads: the position up to which it has every change.
    pub(crate) fn low_of_deps(&self, deps: &[ChangeHash]) -> Option<u64> {
        let mut key = deps.to_vec();
        key.sort_unstable();
        key.dedup();
        self.low_of(&key)
    }

    /// [`SyncWindow::low_of_deps`] for a sorted, deduplicated set of changes: a position
    /// before which every change is an ancestor of one of them.
    pub(super) fn low_of(&self, sorted: &[ChangeHash]) -> Option<u64> {
        // Every change before that position is an ancestor, the set's own included:
        // nothing below can say more.
        if let Some(&at) = self.by_heads.get(sorted) {
            return Some(at);
        }
        // A writer's heads are often a state it heard plus its own newest change.
        let but_one = if sorted.len() > 1 && sorted.len() <= LOW_SUBSETS_MAX {
            let mut rest = Vec::with_capacity(sorted.len() - 1);
            (0..sorted.len())
                .filter_map(|skip| {
                    rest.clear();
                    rest.extend(
                        sorted
                            .iter()
                            .enumerate()
                            .filter(|&(i, _)| i != skip)
                            .map(|(_, h)| *h),
                    );
                    self.by_heads.get(&rest).copied()
                })
                .max()
        } else {
            None
        };
        let by_change = sorted
            .iter()
            .filter_map(|h| self.entry(h).and_then(|e| e.low))
            .max();
        but_one.max(by_change)
    }

    /// Keeps the entries a peer in one of `states` may still need. For each peer, every
    /// set of heads the window may be asked about — what it shares with us, what it
    /// last said it synced, its heads — needs the window from where the changes stop
    /// being all ancestors of that set ([`SyncWindow::since`] walks back to there); what is
    /// in flight to the peer is not older (a receive drops from it every ancestor of
    /// the peer's heads), but for changes it asked for by hash. The window keeps from the lowest of those, less
    /// [`SYNC_WINDOW_FLOOR_SLACK`]. Sets older than the window, and peers who share
    /// nothing yet, are synced by the stock path whatever the window keeps. Entries no
    /// longer needed beyond [`SYNC_WINDOW_CHANGES`] go at once, and the memory with them.
    pub(crate) fn keep_for<'a>(&mut self, states: impl Iterator<Item = &'a State>) {
        let mut lowest: Option<u64> = None;
        // Peers in step all hold the same sets (the list's heads): each distinct set
        // is looked up once in a row, so a thousand peers cost a comparison each.
        let mut last: Option<(&[ChangeHash], Option<u64>)> = None;
        for s in states {
            let have = s.their_have.iter().flatten().map(|h| &h.last_sync);
            for set in [&s.shared_heads]
                .into_iter()
                .chain(have)
                .chain(s.their_heads.as_ref())
            {
                if set.is_empty() {
                    continue;
                }
                let low = match last {
                    Some((prev, low)) if prev == set.as_slice() => low,
                    _ => {
                        let mut key = set.clone();
                        key.sort_unstable();
                        key.dedup();
                        let low = self.low_of(&key);
                        last = Some((set.as_slice(), low));
                        low
                    }
                };
                if let Some(low) = low {
                    lowest = Some(lowest.map_or(low, |l| l.min(low)));
                }
            }
        }
        self.keep_from = lowest.map_or(u64::MAX, |p| p.saturating_sub(SYNC_WINDOW_FLOOR_SLACK));
        if self.entries.len() <= SYNC_WINDOW_CHANGES || self.offset >= self.keep_from {
            return;
        }
        while self.entries.len() > SYNC_WINDOW_CHANGES && self.offset < self.keep_from {
            self.evict_first();
        }
        if self.entries.capacity() > 2 * SYNC_WINDOW_CHANGES.max(self.entries.len()) {
            self.entries.shrink_to_fit();
            self.by_hash.shrink_to_fit();
            self.by_heads.shrink_to_fit();
        }
    }

    /// Drops every entry as if each had aged out ([`SyncWindow::evict_first`]):
    /// positions go on from where they were, and the window starts at the heads it
    /// ended at. A change still in flight to a peer may go with them: the window takes
    /// a new epoch, so that no [`SentIndex`] names a position it no longer holds (the
    /// index is made again from the hashes, and the stock path answers for what the
    /// window lacks). Returns how many it dropped.
    pub(crate) fn forget(&mut self) -> usize {
        let dropped = self.entries.len();
        while !self.entries.is_empty() {
            self.evict_first();
        }
        self.epoch = next_epoch();
        self.entries = VecDeque::new();
        self.by_hash = HashMap::default();
        self.by_heads.shrink_to_fit();
        self.keep_from = u64::MAX;
        dropped
    }

    /// Changes in the window.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The position the next change recorded will take (changes ever recorded, since
    /// the window last started over).
    pub(crate) fn end(&self) -> u64 {
        self.offset + self.entries.len() as u64
    }

    /// Drops the oldest entry; the window then starts at the heads after it.
    pub(super) fn evict_first(&mut self) {
        if let Some(first) = self.entries.pop_front() {
            self.by_hash.remove(&first.hash);
            self.by_heads.remove(&self.base_heads);
            self.base_heads = first.heads_after;
            self.offset += 1;
        }
    }

    /// True when the window ends at the document's heads.
    pub(crate) fn in_step(&self, doc: &Automerge) -> bool {
        self.in_step_at(doc_change_count(doc))
    }

    pub(super) fn in_step_at(&self, doc_changes: u64) -> bool {
        doc_changes == self.doc_changes
    }

    /// True when `doc` has change `h`: the window answers for its own changes without
    /// a lookup in automerge's change graph.
    pub(crate) fn has_change(&self, doc: &Automerge, h: &ChangeHash) -> bool {
        self.by_hash.contains_key(h) || doc.get_change_meta_by_hash(h).is_some()
    }

    /// The bytes of the changes that are not ancestors of `heads`, in the order applied,
    /// when the window can tell (see [`SyncWindow::since`]).
    pub(crate) fn change_bytes_since(&self, heads: &[ChangeHash]) -> Option<Vec<&[u8]>> {
        Some(self.since(heads)?.into_iter().map(|e| &*e.bytes).collect())
    }

    /// The changes that are not ancestors of `heads`, in the order applied — the stock
    /// `get_hashes(heads)` — when the window can tell: `heads` were this replica's heads
    /// within the window (a suffix of it), or they are changes of the window (or the
    /// heads it starts from) whose ancestors include everything before the window. The
    /// second case is what concurrent writers bring: a peer's heads, or what it shares
    /// with us, are often a set of changes this replica never had as its heads. The walk
    /// back from them never leaves the window.
    pub(super) fn since(&self, heads: &[ChangeHash]) -> Option<Vec<&Entry>> {
        let mut key = heads.to_vec();
        key.sort_unstable();
        key.dedup();
        if let Some(&at) = self.by_heads.get(&key) {
            let skip = usize::try_from(at.checked_sub(self.offset)?).ok()?;
            return Some(self.entries.iter().skip(skip).collect());
        }
        if key
            .iter()
            .any(|h| !self.by_hash.contains_key(h) && !self.base_heads.contains(h))
        {
            return None;
        }
        // Walk the window backwards from the newest of `heads`, collecting their
        // ancestors, until the heads right before some entry are all ancestors: every
        // change before that entry is then one too. A peer a few changes behind costs a
        // few steps, not the window.
        let top = key
            .iter()
            .filter_map(|h| self.by_hash.get(h))
            .max()
            .map(|&pos| usize::try_from(pos - self.offset).unwrap_or(usize::MAX));
        // Reached: ancestors of `heads` (and the heads), by window index; hashes older
        // than the window apart (few: base heads and what concurrent writers built on).
        let len = top.map_or(0, |t| t.min(self.entries.len().saturating_sub(1)) + 1);
        let mut reached = vec![false; len];
        let mut reached_out: HashSet<ChangeHash> = HashSet::default();
        let index = |pos: u64| {
            pos.checked_sub(self.offset)
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| i < len)
        };
        for h in &key {
            match self.by_hash.get(h).and_then(|&p| index(p)) {
                Some(i) => reached[i] = true,
                None => {
                    reached_out.insert(*h);
                }
            }
        }
        let is_reached =
            |reached: &[bool], reached_out: &HashSet<ChangeHash>, h: &ChangeHash| match self
                .by_hash
                .get(h)
                .and_then(|&p| index(p))
            {
                Some(i) => reached[i],
                None => reached_out.contains(h),
            };
        let mut cut = None;
        if len == 0 {
            if self.base_heads.iter().all(|b| reached_out.contains(b)) {
                cut = Some(0);
            }
        } else {
            for idx in (0..len).rev() {
                let e = &self.entries[idx];
                if reached[idx] {
                    for (d, &p) in e.deps.iter().zip(e.dep_pos.iter()) {
                        match index(p) {
                            Some(i) => reached[i] = true,
                            None => {
                                reached_out.insert(*d);
                            }
                        }
                    }
                }
                // The entry right before is one of the heads before this one: unless it
                // is reached, they are not all (an index, where the heads cost a hash
                // lookup each, and concurrent writers leave dozens).
                let before = match idx {
                    0 => &self.base_heads,
                    _ if !reached[idx - 1] => continue,
                    _ => &self.entries[idx - 1].heads_after,
                };
                if before.iter().all(|h| is_reached(&reached, &reached_out, h)) {
                    cut = Some(idx);
                    break;
                }
            }
        }
        let cut = cut?;
        Some(
            self.entries
                .iter()
                .enumerate()
                .skip(cut)
                .filter(|(i, _)| !reached.get(*i).copied().unwrap_or(false))
                .map(|(_, e)| e)
                .collect(),
        )
    }

    pub(super) fn entry(&self, h: &ChangeHash) -> Option<&Entry> {
        let pos = *self.by_hash.get(h)?;
        self.entries.get(usize::try_from(pos - self.offset).ok()?)
    }

    /// What the stock `remove_ancestors(sent, heads)` drops from `sent`: the positions
    /// in `sent` (sorted; see [`SentIndex`]) of changes that are ancestors of `heads`
    /// (inclusive). `None` when one is older than the window (the walk would leave it).
    /// Returned rather than applied so that an acknowledgement costs what it
    /// acknowledges, not a copy of everything in flight (a lagging peer has thousands).
    pub(super) fn ancestors_among(&self, sent: &[u64], heads: &[ChangeHash]) -> Option<Vec<u64>> {
        let Some(&lowest) = sent.first() else {
            return Some(Vec::new());
        };
        if lowest < self.offset {
            return None;
        }
        // Every change before `low` is an ancestor (a peer's heads are usually a state
        // it heard from us and its own changes since): those in flight are
        // acknowledged without a walk.
        let mut key = heads.to_vec();
        key.sort_unstable();
        key.dedup();
        let low = self.low_of(&key).unwrap_or(0);
        let below = sent.partition_point(|&p| p < low);
        let mut found = sent[..below].to_vec();
        let rest = &sent[below..];
        let Some(&bottom) = rest.first() else {
            return Some(found);
        };
        // The rest: a sweep down from the newest of `heads` to the lowest of them in
        // flight, marking ancestors by position (the window is in causal order: a
        // change's ancestors stand before it). Heads older than the window, or unknown,
        // reach nothing in it.
        let Some(top) = key
            .iter()
            .filter_map(|h| self.by_hash.get(h).copied())
            .filter(|&p| p >= bottom)
            .max()
        else {
            return Some(found);
        };
        let span = usize::try_from(top - bottom).ok()? + 1;
        let slot = |pos: u64| {
            pos.checked_sub(bottom)
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| i < span)
        };
        let mut reached = vec![false; span];
        for h in &key {
            if let Some(i) = self.by_hash.get(h).and_then(|&p| slot(p)) {
                reached[i] = true;
            }
        }
        let base = usize::try_from(bottom - self.offset).ok()?;
        // `rest` from its end: the next position in flight at or below the sweep's.
        let mut next = rest.len();
        for i in (0..span).rev() {
            let pos = bottom + i as u64;
            while next > 0 && rest[next - 1] > pos {
                next -= 1;
            }
            if next == 0 {
                break;
            }
            if !reached[i] {
                continue;
            }
            if rest[next - 1] == pos {
                found.push(pos);
            }
            for &d in self.entries.get(base + i)?.dep_pos.iter() {
                if let Some(j) = slot(d) {
                    reached[j] = true;
                }
            }
        }
        Some(found)
    }

    /// The hash of the change at window position `pos`, if the window holds it.
    pub(super) fn hash_at(&self, pos: u64) -> Option<ChangeHash> {
        let i = usize::try_from(pos.checked_sub(self.offset)?).ok()?;
        self.entries.get(i).map(|e| e.hash)
    }
}

/// The window positions of a peer's `sent_hashes` (sorted), kept beside its sync
/// [`State`] by a replica that syncs it often (a hub, for each peer). A peer behind a
/// busy hub has thousands of changes in flight, and each of its messages asks which
/// of them its heads acknowledge: by hash, that is a lookup per change in flight per
/// message; by position, a sweep over the window from its heads down. It is only a
/// cache: when it does not match the state (a stock sync step changed `sent_hashes`,
/// the window started over), it is made again from the hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SentIndex {
    /// The window the positions are of ([`SyncWindow::epoch`]); 0: none yet.
    pub(super) epoch: u64,
    pub(super) positions: Vec<u64>,
}

impl SentIndex {
    /// The positions of `state.sent_hashes`, made again from the hashes unless this
    /// index is of `window` and as long (the fast paths below keep both in step; a
    /// stock step drops the index: [`SentIndex::forget`]). `None` when a change
    /// in flight is not in the window.
    pub(super) fn of<'i>(&'i mut self, window: &SyncWindow, state: &State) -> Option<&'i [u64]> {
        let evicted = self.positions.first().is_some_and(|&p| p < window.offset);
        if self.epoch != window.epoch || self.positions.len() != state.sent_hashes.len() || evicted
        {
            self.epoch = 0;
            let mut positions: Vec<u64> = state
                .sent_hashes
                .iter()
                .map(|h| window.by_hash.get(h).copied())
                .collect::<Option<_>>()?;
            positions.sort_unstable();
            self.positions = positions;
            self.epoch = window.epoch;
        }
        debug_assert!(
            self.positions.len() == state.sent_hashes.len()
                && self.positions.iter().all(|&p| window
                    .hash_at(p)
                    .is_some_and(|h| state.sent_hashes.contains(&h))),
            "sent index out of step with sent_hashes"
        );
        Some(&self.positions)
    }

    /// Forgets the positions: `sent_hashes` changed some other way (a stock sync
    /// step), and the next use makes them again.
    pub(crate) fn forget(&mut self) {
        self.epoch = 0;
        self.positions.clear();
    }
}
