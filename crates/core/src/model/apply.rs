//! Changes into a replica: a peer's changes applied in causal order (those missing a
//! dependency wait), the changes a sync message's chunks carry, and the causal order itself.

use automerge::{Automerge, Change, ChangeHash};

use super::{Merge, ModelError, TodoList, PENDING_CHANGES_MAX};
use crate::format::{CHUNK_MAGIC, CHUNK_TYPE_DOCUMENT};

impl TodoList {
    /// Applies changes from a peer (in any order, with duplicates) and says what they
    /// touched.
    ///
    /// Automerge is only ever handed changes whose dependencies it has, one at a time in
    /// causal order, so its own queue stays empty and this replica's index sees every
    /// change that lands. Changes whose dependencies are missing wait here, at most
    /// [`PENDING_CHANGES_MAX`] of them; a change Automerge refuses (say, a forged
    /// sequence number) is dropped and listed in [`Merge::rejected`], and the rest of
    /// the batch still lands.
    pub fn apply_changes(&mut self, changes: Vec<Change>) -> Result<Merge, ModelError> {
        let mut fresh: Vec<Change> = Vec::with_capacity(changes.len());
        let mut seen = std::collections::HashSet::new();
        for c in self.pending.drain(..).chain(changes) {
            let h = c.hash();
            if self.doc.get_change_meta_by_hash(&h).is_none() && seen.insert(h) {
                fresh.push(c);
            }
        }
        if fresh.is_empty() {
            return Ok(Merge::default());
        }
        let (ready, waiting) = causal_order(&self.doc, fresh);
        let mut applied = Vec::with_capacity(ready.len());
        let mut rejected = Vec::new();
        let mut failed: std::collections::HashSet<ChangeHash> = std::collections::HashSet::new();
        // The common case: the whole ready batch lands in one call. When Automerge
        // refuses it, whatever did land stays, and the rest is retried one by one so that
        // only the bad change (and what depends on it) is dropped.
        let batch_ok = self.doc.apply_changes(ready.iter().cloned()).is_ok();
        for c in ready {
            if self.doc.get_change_meta_by_hash(&c.hash()).is_some() {
                applied.push(c);
                continue;
            }
            if batch_ok {
                failed.insert(c.hash());
                rejected.push((c.hash().to_string(), "not applied".to_owned()));
                continue;
            }
            // A change whose parent was refused cannot land either.
            if c.deps().iter().any(|d| failed.contains(d)) {
                failed.insert(c.hash());
                rejected.push((
                    c.hash().to_string(),
                    "depends on a refused change".to_owned(),
                ));
                continue;
            }
            match self.doc.apply_changes(std::iter::once(c.clone())) {
                Ok(()) if self.doc.get_change_meta_by_hash(&c.hash()).is_some() => applied.push(c),
                Ok(()) => {
                    failed.insert(c.hash());
                    rejected.push((c.hash().to_string(), "not applied".to_owned()));
                }
                Err(e) => {
                    failed.insert(c.hash());
                    rejected.push((c.hash().to_string(), e.to_string()));
                }
            }
        }
        let mut waiting = waiting;
        if waiting.len() > PENDING_CHANGES_MAX {
            for c in waiting.drain(PENDING_CHANGES_MAX..) {
                rejected.push((
                    c.hash().to_string(),
                    format!(
                        "more than {PENDING_CHANGES_MAX} changes wait for missing dependencies"
                    ),
                ));
            }
        }
        self.pending = waiting;
        self.window.record(&self.doc, applied.iter());
        let mut merge = self.index.absorb(&self.doc, &applied);
        merge.rejected = rejected;
        Ok(merge)
    }

    /// Pulls every change `other` has and this replica lacks.
    pub fn merge_from(&mut self, other: &TodoList) -> Result<Merge, ModelError> {
        let changes = self.doc.get_changes_added(&other.doc);
        self.apply_changes(changes)
    }

    /// The changes since `heads` (for sending to a peer).
    pub fn changes_since(&self, heads: &[ChangeHash]) -> Vec<Change> {
        self.doc.get_changes(heads)
    }
}

/// The changes in one entry of a sync message's change list. Depending on the sender's
/// version that is one change, several changes one after the other, a bundle, or a
/// whole saved document (V2 messages); each storage chunk is decoded by its type.
/// The message was validated before (sizes and inflation bounded).
pub fn chunk_changes(bytes: &[u8]) -> Result<Vec<Change>, String> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let len = storage_chunk_len(rest)?;
        let (chunk, tail) = rest.split_at(len);
        rest = tail;
        if chunk.get(8) == Some(&CHUNK_TYPE_DOCUMENT) {
            let doc = Automerge::load(chunk).map_err(|e| format!("document chunk: {e}"))?;
            out.extend(doc.get_changes(&[]));
            continue;
        }
        match Change::from_bytes(chunk.to_vec()) {
            // `from_bytes` does not verify the chunk's checksum (the first four bytes
            // of the change's hash): a flipped byte would land as a different change.
            Ok(c) if c.hash().as_ref()[..4] != chunk[4..8] => {
                return Err(format!(
                    "change {} does not match its checksum: corrupt",
                    c.hash()
                ));
            }
            Ok(c) => out.push(c),
            Err(change_err) => {
                let bundle = automerge::Bundle::try_from(chunk)
                    .map_err(|e| format!("{change_err}; as a bundle: {e}"))?;
                out.extend(bundle.to_changes().map_err(|e| e.to_string())?);
            }
        }
    }
    Ok(out)
}

/// Length of the storage chunk at the start of `bytes`: magic (4), checksum (4), type
/// (1), LEB128 length, then that many bytes. A sync message's change chunk is one or
/// more of these, one after the other.
pub fn storage_chunk_len(bytes: &[u8]) -> Result<usize, String> {
    if bytes.len() < 9 || bytes[..4] != CHUNK_MAGIC {
        return Err("not an Automerge storage chunk".to_owned());
    }
    let mut len: u64 = 0;
    let mut shift = 0u32;
    let mut i = 9;
    loop {
        let b = *bytes.get(i).ok_or("truncated chunk length")?;
        i += 1;
        len |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return Err("chunk length overflows".to_owned());
        }
    }
    let total = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(i))
        .ok_or("chunk length overflows")?;
    if total > bytes.len() {
        return Err(format!(
            "chunk claims {total} bytes, {} present",
            bytes.len()
        ));
    }
    Ok(total)
}

/// `changes` in an order where every change follows those of its dependencies that are
/// among them (the others are the peer's already: a sync message's changes).
pub(crate) fn dependencies_first(changes: Vec<Change>) -> Vec<Change> {
    let (ready, waiting) = split_in_causal_order(changes, |_| false);
    debug_assert!(waiting.is_empty());
    ready
}

/// Splits `changes` (none of them in `doc`) into those that can be applied now, in an
/// order where every change follows its dependencies (Kahn's algorithm), and those that
/// wait for a dependency nobody has sent yet.
fn causal_order(doc: &Automerge, changes: Vec<Change>) -> (Vec<Change>, Vec<Change>) {
    split_in_causal_order(changes, |d| doc.get_change_meta_by_hash(d).is_none())
}

/// Kahn's algorithm over `changes`: those whose dependencies among them come first, in
/// order (ties in the order given), then those that depend, directly or not, on a
/// change `missing` says is nowhere (asked only for dependencies not among them).
fn split_in_causal_order(
    changes: Vec<Change>,
    missing: impl Fn(&ChangeHash) -> bool,
) -> (Vec<Change>, Vec<Change>) {
    let index: std::collections::HashMap<ChangeHash, usize> = changes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.hash(), i))
        .collect();
    let mut waiting_on = vec![0usize; changes.len()];
    let mut blocked = vec![false; changes.len()];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); changes.len()];
    for (i, c) in changes.iter().enumerate() {
        for d in c.deps() {
            if let Some(&j) = index.get(d) {
                waiting_on[i] += 1;
                children[j].push(i);
            } else if missing(d) {
                blocked[i] = true;
            }
        }
    }
    let mut queue: std::collections::VecDeque<usize> = (0..changes.len())
        .filter(|&i| waiting_on[i] == 0 && !blocked[i])
        .collect();
    let mut order = Vec::with_capacity(changes.len());
    while let Some(i) = queue.pop_front() {
        order.push(i);
        for &k in &children[i] {
            waiting_on[k] -= 1;
            if waiting_on[k] == 0 && !blocked[k] {
                queue.push_back(k);
            }
        }
    }
    let mut slots: Vec<Option<Change>> = changes.into_iter().map(Some).collect();
    let ready: Vec<Change> = order.iter().filter_map(|&i| slots[i].take()).collect();
    let waiting: Vec<Change> = slots.into_iter().flatten().collect();
    (ready, waiting)
}
