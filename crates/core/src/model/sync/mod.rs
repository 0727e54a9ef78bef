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
//! `tests/model/sync_fast.rs` runs both on random histories).
//!
//! Why the window is exact: changes enter it in causal order (every change after its
//! dependencies), so
//! - the changes that are not ancestors of the heads recorded after window entry `k`
//!   are exactly the entries after `k` (the applied set is causally closed at every
//!   step); and
//! - a path of dependencies from any head down to a change `x` only passes through
//!   changes applied after `x`, so "is `x` an ancestor of these heads" is decided by a
//!   walk that never leaves the window when `x` is in it.

mod generate;
mod receive;
mod window;

/// The hash maps of this module are keyed by change hashes, which peers send: foldhash
/// (seeded per process) costs a fraction of std's SipHash on 32 bytes, and sync runs
/// these lookups for every peer of every write.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

use automerge::sync::State;
use automerge::Automerge;

use crate::model::TodoList;

pub use self::generate::change_chunks;
pub(crate) use self::generate::{generate, need_and_have};
pub(crate) use self::receive::{advance_heads, receive_state};
pub use self::window::SentIndex;
pub(crate) use self::window::SyncWindow;
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

impl TodoList {
    /// Replaces what a peer's last message said it has (`their_have`: a Bloom filter of
    /// its changes since some heads, 12 KiB for a peer that joined with a 10,000-change
    /// history) by the same fact in a few bytes, when this replica has every change of
    /// the peer's heads: the peer has exactly the ancestors of its heads, so "last sync:
    /// its heads, nothing since" says what the filter says, minus the filter's false
    /// positives (changes it would have withheld by mistake). A hub keeps one such state
    /// per idle peer; the filter was most of it. Returns true when it replaced one.
    pub fn settle_their_have(&self, state: &mut automerge::sync::State) -> bool {
        let (Some(heads), Some(have)) = (&state.their_heads, &state.their_have) else {
            return false;
        };
        let settled =
            have.len() == 1 && have[0].last_sync == *heads && have[0].bloom.to_bytes().is_empty();
        if settled || heads.iter().any(|h| !self.window.has_change(&self.doc, h)) {
            return false;
        }
        state.their_have = Some(vec![automerge::sync::Have {
            last_sync: heads.clone(),
            bloom: automerge::sync::BloomFilter::default(),
        }]);
        true
    }

    /// Keeps in the recent-changes window what the peers in `states` may still need
    /// (see `sync::SYNC_WINDOW_CHANGES_MAX`): a hub calls it for a list's peers after
    /// answering them, so that peers whose acknowledgements lag stay on the window's
    /// path instead of making every message walk the history.
    pub fn keep_window_for<'a>(
        &mut self,
        states: impl Iterator<Item = &'a automerge::sync::State>,
    ) {
        self.window.keep_for(states);
    }

    /// Changes in the recent-changes window.
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    /// A window position before which every change is an ancestor of `heads` (`None`:
    /// the window cannot tell): a peer whose heads these are has every change this
    /// replica had when its window ended there ([`TodoList::window_end`]).
    pub fn window_covered_by(&self, heads: &[automerge::ChangeHash]) -> Option<u64> {
        self.window.low_of_deps(heads)
    }

    /// Where the next change applied will stand in the recent-changes window: taken
    /// when a peer's message has been received, it tells the changes applied since.
    pub fn window_end(&self) -> u64 {
        self.window.end()
    }

    /// How many sync steps were answered from the window and by the stock functions.
    pub fn sync_counters(&self) -> SyncCounters {
        self.sync_counters.get()
    }
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
