//! Automerge sync whose cost follows what changed, not the history.
//!
//! Automerge 0.12's `receive_sync_message` walks every ancestor of the peer's heads on
//! every message (`filter_changes` → `remove_ancestors`), even an acknowledgement that
//! carries nothing, and `generate_sync_message` recomputes "the changes since the
//! shared heads" from the change graph (`get_hashes`) for every peer. Both grow with
//! the history. Here the same algorithm runs over [`SyncWindow`]: the last
//! [`SYNC_WINDOW_CHANGES`] changes this replica applied, in the order it applied them,
//! with the heads after each. The common cases — a peer acknowledging heads we had, one
//! new change going to every peer that was up to date — are answered from the window;
//! anything the window cannot answer exactly (a peer far behind, a fresh peer that needs
//! the whole document, a peer whose last word was "I have all this since the
//! beginning") falls back to the stock functions, once per such message. The result is the same
//! message and the same [`State`] either way (the differential test
//! `tests/sync_fast.rs` runs both on random histories).
//!
//! Why the window is exact: changes enter it in causal order (every change after its
//! dependencies), so
//! - the changes that are not ancestors of the heads recorded after window entry `k`
//!   are exactly the entries after `k` (the applied set is causally closed at every
//!   step); and
//! - a path of dependencies from any head down to a change `x` only passes through
//!   changes applied after `x`, so "is `x` an ancestor of these heads" is decided by a
//!   walk that never leaves the window when `x` is in it.

use std::collections::{BTreeSet, VecDeque};

/// The hash maps of this module are keyed by change hashes, which peers send: foldhash
/// (seeded per process) costs a fraction of std's SipHash on 32 bytes, and sync runs
/// these lookups for every peer of every write.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

use automerge::sync::{BloomFilter, ChunkList, Have, Message, MessageFlags, MessageVersion, State};
use automerge::{Automerge, Change, ChangeHash};

pub use crate::limits::{
    SYNC_CHANGES_BYTES_MAX, SYNC_WINDOW_CHANGES, SYNC_WINDOW_CHANGES_MAX, SYNC_WINDOW_FLOOR_SLACK,
};

/// How many sync steps took the window and how many fell back to the stock functions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncCounters {
    /// Messages received or generated from the window alone.
    pub fast: u64,
    /// Messages handled by automerge's stock functions.
    pub stock: u64,
    /// Messages generated with part of their changes left for the next one
    /// ([`SYNC_CHANGES_BYTES_MAX`]).
    pub cut: u64,
}

/// [`SyncCounters`] kept by a replica (atomics, so a replica stays `Sync`).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    fast: std::sync::atomic::AtomicU64,
    stock: std::sync::atomic::AtomicU64,
    cut: std::sync::atomic::AtomicU64,
}

impl Counters {
    pub(crate) fn count(&self, fast: bool) {
        let c = if fast { &self.fast } else { &self.stock };
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn count_cut(&self) {
        self.cut.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> SyncCounters {
        SyncCounters {
            fast: self.fast.load(std::sync::atomic::Ordering::Relaxed),
            stock: self.stock.load(std::sync::atomic::Ordering::Relaxed),
            cut: self.cut.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

impl Clone for Counters {
    /// A copy starts counting from zero.
    fn clone(&self) -> Self {
        Counters::default()
    }
}

/// The position of a dependency that was not in the window when its dependent was
/// recorded.
const NOT_IN_WINDOW: u64 = u64::MAX;

/// Sets of heads up to this size are also looked up less one member when the window
/// bounds their ancestry ([`SyncWindow::low_of`]): a lookup each.
const LOW_SUBSETS_MAX: usize = 16;

/// One change of the window: what sync needs of it (its hash, its dependencies, its
/// bytes), not the decoded `Change` — a `Change` is several hundred bytes before its
/// heap parts, and the window holds [`SYNC_WINDOW_CHANGES`] of them per list.
#[derive(Debug, Clone)]
struct Entry {
    hash: ChangeHash,
    /// Its absolute position (see [`SyncWindow::end`]).
    pos: u64,
    deps: Box<[ChangeHash]>,
    /// The positions of its dependencies ([`NOT_IN_WINDOW`] for those older than the
    /// window), so that a walk over the window follows them without hashing.
    dep_pos: Box<[u64]>,
    bytes: Box<[u8]>,
    /// The replica's heads right after this change (sorted).
    heads_after: Vec<ChangeHash>,
    /// A position before which every change is an ancestor of this one (absolute;
    /// `None`: not known within the window). Under concurrent writers a change's
    /// ancestry reaches far below its own position — a writer whose messages wait in
    /// the hub's queue writes on top of what it heard long before — and a peer that
    /// shares such a change with us still needs the window from there.
    low: Option<u64>,
}

/// The last changes a replica applied, in order (see the module docs).
#[derive(Debug)]
pub(crate) struct SyncWindow {
    /// Which window this is, for [`SentIndex`]: positions are this window's own (a
    /// window that starts over, or a copy that goes its own way, takes a new one).
    epoch: u64,
    /// Heads before the first entry (sorted).
    base_heads: Vec<ChangeHash>,
    entries: VecDeque<Entry>,
    /// Absolute number of the first entry (entries ever evicted).
    offset: u64,
    /// Absolute position of every change in the window.
    by_hash: HashMap<ChangeHash, u64>,
    /// Sorted heads → the number of changes applied when they were the heads (absolute).
    by_heads: HashMap<Vec<ChangeHash>, u64>,
    /// Entries from this absolute position on are kept past [`SYNC_WINDOW_CHANGES`]
    /// (up to [`SYNC_WINDOW_CHANGES_MAX`]): a peer still needs them. `u64::MAX`: none.
    keep_from: u64,
    /// The document's number of changes when its heads were last seen to be the
    /// window's. A history only grows, so while the number is the same the heads are
    /// too: [`SyncWindow::in_step`] without asking automerge for its heads (which collects
    /// and sorts them: with concurrent writers, a hundred, several times per message).
    doc_changes: u64,
}

/// The last epoch given to a window ([`SyncWindow::epoch`]; 0 is none).
static EPOCHS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn next_epoch() -> u64 {
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
    fn full(&self) -> bool {
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
    fn low_of(&self, sorted: &[ChangeHash]) -> Option<u64> {
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
    fn evict_first(&mut self) {
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

    fn in_step_at(&self, doc_changes: u64) -> bool {
        doc_changes == self.doc_changes
    }

    /// True when `doc` has change `h`: the window answers for its own changes without
    /// a lookup in automerge's change graph.
    pub(crate) fn has_change(&self, doc: &Automerge, h: &ChangeHash) -> bool {
        self.by_hash.contains_key(h) || doc.get_change_meta_by_hash(h).is_some()
    }

    /// The changes that are not ancestors of `heads`, in the order applied — the stock
    /// `get_hashes(heads)` — when the window can tell: `heads` were this replica's heads
    /// within the window (a suffix of it), or they are changes of the window (or the
    /// heads it starts from) whose ancestors include everything before the window. The
    /// second case is what concurrent writers bring: a peer's heads, or what it shares
    /// with us, are often a set of changes this replica never had as its heads. The walk
    /// back from them never leaves the window.
    fn since(&self, heads: &[ChangeHash]) -> Option<Vec<&Entry>> {
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

    fn entry(&self, h: &ChangeHash) -> Option<&Entry> {
        let pos = *self.by_hash.get(h)?;
        self.entries.get(usize::try_from(pos - self.offset).ok()?)
    }

    /// What the stock `remove_ancestors(sent, heads)` drops from `sent`: the positions
    /// in `sent` (sorted; see [`SentIndex`]) of changes that are ancestors of `heads`
    /// (inclusive). `None` when one is older than the window (the walk would leave it).
    /// Returned rather than applied so that an acknowledgement costs what it
    /// acknowledges, not a copy of everything in flight (a lagging peer has thousands).
    fn ancestors_among(&self, sent: &[u64], heads: &[ChangeHash]) -> Option<Vec<u64>> {
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
    fn hash_at(&self, pos: u64) -> Option<ChangeHash> {
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
    epoch: u64,
    positions: Vec<u64>,
}

impl SentIndex {
    /// The positions of `state.sent_hashes`, made again from the hashes unless this
    /// index is of `window` and as long (the fast paths below keep both in step; a
    /// stock step drops the index: [`SentIndex::forget`]). `None` when a change
    /// in flight is not in the window.
    fn of<'i>(&'i mut self, window: &SyncWindow, state: &State) -> Option<&'i [u64]> {
        if self.epoch != window.epoch || self.positions.len() != state.sent_hashes.len() {
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

fn change_count(doc: &Automerge) -> usize {
    usize::try_from(doc_change_count(doc)).unwrap_or(usize::MAX)
}

fn doc_change_count(doc: &Automerge) -> u64 {
    automerge::ReadDoc::stats(doc).num_changes
}

fn supports_v2(state: &State) -> bool {
    state
        .their_capabilities
        .as_ref()
        .is_some_and(|c| c.contains(&automerge::sync::Capability::MessageV2))
}

fn peer_supports_sync_reset(state: &State) -> bool {
    state
        .their_capabilities
        .as_ref()
        .is_some_and(|c| c.contains(&automerge::sync::Capability::SyncReset))
}
