//! The synchronous core: one SQLite connection and plain methods.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use automerge::ChangeHash;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::record::check_len;
use super::{
    schema, Batch, ChangeRecord, Commit, DocId, ListInfo, Loaded, NewEvent, StoreError,
    StoredEvent, EVENTS_PAGE_MAX, LISTS_PAGE_MAX, LIST_NAME_BYTES_MAX, SNAPSHOT_BYTES_MAX,
    SNAPSHOT_HEADS_MAX,
};
use swarmtodo_core::hub::Link;
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::{ListSummary, ListsPage, TaskCounts, Version};

/// Bytes of one change hash.
const HASH_BYTES: usize = 32;

/// A store file, opened: one connection, used from one thread at a time.
///
/// Every method that writes runs one `BEGIN IMMEDIATE` transaction and returns once it is
/// durable; when it fails nothing of it was written. Several `Db`s (threads, processes)
/// may share a file: SQLite serializes their writes, and a writer waits up to
/// [`super::STORE_BUSY_TIMEOUT_MS`] for another's lock.
///
/// The calls block on disk I/O: async code uses [`super::Store`].
#[derive(Debug)]
pub struct Db {
    conn: Connection,
    path: PathBuf,
}

impl Db {
    /// Opens the store at `path`, creating the file and its schema when missing. Fails
    /// on a file of a newer schema ([`StoreError::SchemaTooNew`]) or of another program.
    pub fn open(path: impl AsRef<Path>) -> Result<Db, StoreError> {
        let path = path.as_ref().to_path_buf();
        let conn = schema::open(&path)?;
        tracing::debug!(path = %path.display(), "store opened");
        Ok(Db { conn, path })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The list called `name`, created with document id `doc_if_new` when there is none.
    /// Returns the list's document id and whether this call created it.
    ///
    /// Race-free: of concurrent creators of one name (threads, processes), exactly one
    /// creates it and all get its document id (`UNIQUE` name, insert-or-ignore and read
    /// back in one transaction). Fails with [`StoreError::DocIdTaken`] when `doc_if_new`
    /// is another list's id.
    pub fn create_or_get_list(
        &mut self,
        name: &str,
        doc_if_new: DocId,
    ) -> Result<(DocId, bool), StoreError> {
        check_name(name)?;
        let tx = self.write()?;
        let inserted = tx
            .prepare_cached("INSERT OR IGNORE INTO lists (name, doc_id) VALUES (?1, ?2)")?
            .execute(params![name, doc_if_new.as_bytes()])?;
        let found: Option<[u8; 16]> = tx
            .prepare_cached("SELECT doc_id FROM lists WHERE name = ?1")?
            .query_row([name], |r| r.get(0))
            .optional()?;
        let Some(doc) = found.map(DocId) else {
            // Ignored, yet no list has the name: the id was the one taken.
            let owner: String = tx
                .prepare_cached("SELECT name FROM lists WHERE doc_id = ?1")?
                .query_row([doc_if_new.as_bytes()], |r| r.get(0))?;
            return Err(StoreError::DocIdTaken {
                doc: doc_if_new,
                owner,
            });
        };
        tx.commit()?;
        if inserted > 0 {
            tracing::info!(name, %doc, "list created");
        }
        Ok((doc, inserted > 0))
    }

    /// The list called `name`.
    pub fn list_by_name(&self, name: &str) -> Result<Option<ListInfo>, StoreError> {
        self.list_where("l.name = ?1", &name)
    }

    /// The document ids of every list, in creation order (what a hub loads at start).
    pub fn list_docs(&self) -> Result<Vec<DocId>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT doc_id FROM lists ORDER BY id")?;
        let rows = stmt.query_map([], |r| r.get::<_, [u8; 16]>(0))?;
        let mut out = Vec::new();
        for r in rows {
            out.push(DocId(r?));
        }
        Ok(out)
    }

    /// A page of the lists, in order of their key (the name API calls use, else the
    /// document id): at most `limit` (and [`LISTS_PAGE_MAX`]) lists after key `after`.
    pub fn lists(&self, after: Option<&str>, limit: usize) -> Result<ListsPage, StoreError> {
        let limit = limit.min(LISTS_PAGE_MAX);
        let mut stmt = self.conn.prepare_cached(
            "SELECT name, doc_id, version, pending, in_progress, completed, cancelled, blocked \
             FROM lists WHERE name > ?1 ORDER BY name LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![after.unwrap_or(""), int(limit + 1)], |r| {
            let name: String = r.get(0)?;
            let doc = DocumentId::from_bytes(r.get(1)?).to_string();
            Ok(ListSummary {
                name: (name != doc).then_some(name),
                document: doc,
                version: r.get::<_, Option<String>>(2)?.map(Version),
                tasks: TaskCounts {
                    pending: unsigned(r.get(3)?, 3)?,
                    in_progress: unsigned(r.get(4)?, 4)?,
                    completed: unsigned(r.get(5)?, 5)?,
                    cancelled: unsigned(r.get(6)?, 6)?,
                    blocked: unsigned(r.get(7)?, 7)?,
                },
            })
        })?;
        let mut lists = rows.collect::<Result<Vec<_>, _>>()?;
        let next = if lists.len() > limit {
            lists.truncate(limit);
            lists
                .last()
                .map(|l| l.name.clone().unwrap_or_else(|| l.document.clone()))
        } else {
            None
        };
        Ok(ListsPage { lists, next })
    }

    /// The list with document id `doc`.
    pub fn list_by_doc(&self, doc: DocId) -> Result<Option<ListInfo>, StoreError> {
        self.list_where("l.doc_id = ?1", doc.as_bytes())
    }

    /// Stores changes (duplicates, by hash, skipped); returns how many were new.
    pub fn append_changes(
        &mut self,
        doc: DocId,
        changes: &[ChangeRecord],
    ) -> Result<usize, StoreError> {
        let batch = Batch {
            changes: changes.to_vec(),
            ..Batch::default()
        };
        Ok(self.commit_merge(doc, &batch)?.changes_added)
    }

    /// Appends events; returns their `seq`s (consecutive, after the list's last one).
    pub fn append_events(
        &mut self,
        doc: DocId,
        events: &[NewEvent],
    ) -> Result<Vec<u64>, StoreError> {
        let batch = Batch {
            events: events.to_vec(),
            ..Batch::default()
        };
        Ok(self.commit_merge(doc, &batch)?.seqs)
    }

    /// Adds reported keys (duplicates skipped).
    pub fn add_reported(&mut self, doc: DocId, keys: &[String]) -> Result<(), StoreError> {
        let batch = Batch {
            reported: keys.to_vec(),
            ..Batch::default()
        };
        self.commit_merge(doc, &batch).map(|_| ())
    }

    /// The hub's main path: stores a merge's changes, its events and the keys they
    /// reported in one durable transaction. Either all of the batch is stored or, on an
    /// error, none of it (and no `seq` is used up).
    pub fn commit_merge(&mut self, doc: DocId, batch: &Batch) -> Result<Commit, StoreError> {
        batch.check()?;
        let tx = self.write()?;
        let commit = merge_in(&tx, doc, batch)?;
        tx.commit()?;
        Ok(commit)
    }

    /// [`Db::commit_merge`] for several merges in one transaction (one write to disk
    /// for all of them): all are durable, or none.
    pub fn commit_merges(&mut self, merges: &[(DocId, Batch)]) -> Result<Vec<Commit>, StoreError> {
        for (_, batch) in merges {
            batch.check()?;
        }
        let tx = self.write()?;
        let commits = merges
            .iter()
            .map(|(doc, batch)| merge_in(&tx, *doc, batch))
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        Ok(commits)
    }

    /// Replaces the list's snapshot with `snapshot` (an `Automerge::save()` whose heads
    /// are `heads`) and deletes the stored changes it covers (`heads` and their stored
    /// ancestors), atomically: a load before or after sees the same document.
    ///
    /// Changes appended later than the snapshot stay. Fails with
    /// [`StoreError::SnapshotBehind`] when the stored snapshot's heads are not among the
    /// ancestors of `heads` (a stale snapshot, or changes that were never appended):
    /// replacing it would lose history.
    pub fn compact(
        &mut self,
        doc: DocId,
        snapshot: &[u8],
        heads: &[ChangeHash],
    ) -> Result<ListInfo, StoreError> {
        check_len("a snapshot", snapshot.len(), SNAPSHOT_BYTES_MAX)?;
        if heads.len() > SNAPSHOT_HEADS_MAX {
            return Err(StoreError::TooMany {
                what: "snapshot heads",
                count: heads.len(),
                max: SNAPSHOT_HEADS_MAX,
            });
        }
        let started = std::time::Instant::now();
        let tx = self.write()?;
        let list = list_id(&tx, doc)?;
        let old_heads: Option<Vec<u8>> = tx
            .prepare_cached("SELECT heads FROM snapshots WHERE list_id = ?1")?
            .query_row([list], |r| r.get(0))
            .optional()?;

        // Walk the stored changes back from `heads`. Every change the walk reaches is in
        // the snapshot; it stops at changes that are not stored (in the old snapshot).
        let mut reached: HashSet<ChangeHash> = HashSet::new();
        let mut covered: Vec<(i64, usize)> = Vec::new();
        let mut todo: Vec<ChangeHash> = heads.to_vec();
        {
            let mut find = tx.prepare_cached(
                "SELECT id, deps, length(bytes) FROM changes WHERE list_id = ?1 AND hash = ?2",
            )?;
            while let Some(h) = todo.pop() {
                if !reached.insert(h) {
                    continue;
                }
                let row: Option<(i64, Vec<u8>, i64)> = find
                    .query_row(params![list, h.0], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                    .optional()?;
                if let Some((id, deps, len)) = row {
                    covered.push((id, usize::try_from(len).unwrap_or(0)));
                    todo.extend(decode_hashes(&deps));
                }
            }
        }
        if let Some(old) = old_heads {
            if let Some(missing) = decode_hashes(&old).find(|h| !reached.contains(h)) {
                return Err(StoreError::SnapshotBehind {
                    doc,
                    missing: missing.to_string(),
                });
            }
        }
        {
            let mut delete = tx.prepare_cached("DELETE FROM changes WHERE id = ?1")?;
            for (id, _) in &covered {
                delete.execute([id])?;
            }
        }
        let removed_bytes: usize = covered.iter().map(|(_, len)| len).sum();
        tx.prepare_cached(
            "UPDATE lists SET changes = changes - ?2, change_bytes = change_bytes - ?3 \
             WHERE id = ?1",
        )?
        .execute(params![list, int(covered.len()), int(removed_bytes)])?;
        tx.prepare_cached(
            "INSERT INTO snapshots (list_id, heads, bytes) VALUES (?1, ?2, ?3) \
             ON CONFLICT (list_id) DO UPDATE SET heads = excluded.heads, bytes = excluded.bytes",
        )?
        .execute(params![list, encode_hashes(heads), snapshot])?;
        let info = list_info(&tx, "l.id = ?1", &list)?.ok_or(StoreError::UnknownList(doc))?;
        tx.commit()?;
        tracing::debug!(
            %doc,
            removed = covered.len(),
            snapshot_bytes = snapshot.len(),
            ms = started.elapsed().as_millis() as u64,
            "compacted"
        );
        Ok(info)
    }

    /// The list's document as stored: `None` when nothing is stored for it yet. Fails
    /// with [`StoreError::UnknownList`] when there is no such list. Snapshot and changes
    /// are read in one transaction, so a concurrent compaction is seen whole or not at
    /// all.
    pub fn load(&self, doc: DocId) -> Result<Option<Loaded>, StoreError> {
        // Every method ends its transaction before returning, so none is open here.
        let tx = self.conn.unchecked_transaction()?;
        let list = list_id(&tx, doc)?;
        let snapshot: Option<(Vec<u8>, Vec<u8>)> = tx
            .prepare_cached("SELECT heads, bytes FROM snapshots WHERE list_id = ?1")?
            .query_row([list], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let changes = tx
            .prepare_cached("SELECT bytes FROM changes WHERE list_id = ?1 ORDER BY id")?
            .query_map([list], |r| r.get(0))?
            .collect::<Result<Vec<Vec<u8>>, _>>()?;
        tx.finish()?;
        if snapshot.is_none() && changes.is_empty() {
            return Ok(None);
        }
        let (snapshot_heads, snapshot) = match snapshot {
            Some((heads, bytes)) => (decode_hashes(&heads).collect(), Some(bytes)),
            None => (Vec::new(), None),
        };
        Ok(Some(Loaded {
            doc,
            snapshot,
            snapshot_heads,
            changes,
        }))
    }

    /// The `seq` of list `doc`'s last event (0: none yet).
    pub fn last_event_seq(&self, doc: DocId) -> Result<u64, StoreError> {
        let list = list_id(&self.conn, doc)?;
        let last: Option<i64> = self
            .conn
            .prepare_cached("SELECT MAX(seq) FROM events WHERE list_id = ?1")?
            .query_row(params![list], |r| r.get(0))?;
        Ok(last.map_or(Ok(0), |s| unsigned(s, 0))?)
    }

    /// The events after `after_seq` in `seq` order, at most `limit` of them (and never
    /// more than [`EVENTS_PAGE_MAX`]). Paging with the last `seq` returned resumes with
    /// no gap and no duplicate.
    pub fn events_since(
        &self,
        doc: DocId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let list = list_id(&self.conn, doc)?;
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let limit = int(limit.min(EVENTS_PAGE_MAX));
        let events = self
            .conn
            .prepare_cached(
                "SELECT seq, kind, json FROM events WHERE list_id = ?1 AND seq > ?2 \
                 ORDER BY seq LIMIT ?3",
            )?
            .query_map(params![list, after, limit], |r| {
                Ok(StoredEvent {
                    seq: unsigned(r.get(0)?, 0)?,
                    kind: r.get(1)?,
                    json: r.get(2)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(events)
    }

    /// True when the store holds every change of `heads`, and so all of their history:
    /// each is a stored change or a head of the stored snapshot. (A change a compaction
    /// covered without being one of its heads is not found: the answer is then false,
    /// never wrongly true.)
    pub fn holds_heads(&self, doc: DocId, heads: &[ChangeHash]) -> Result<bool, StoreError> {
        let list = list_id(&self.conn, doc)?;
        let snapshot: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT heads FROM snapshots WHERE list_id = ?1")?
            .query_row([list], |r| r.get(0))
            .optional()?;
        let snapshot: HashSet<ChangeHash> = snapshot
            .as_deref()
            .map(|h| decode_hashes(h).collect())
            .unwrap_or_default();
        let mut find = self
            .conn
            .prepare_cached("SELECT 1 FROM changes WHERE list_id = ?1 AND hash = ?2")?;
        for h in heads {
            if !snapshot.contains(h) && !find.exists(params![list, h.0])? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// All of the list's events, in `seq` order.
    pub fn all_events(&self, doc: DocId) -> Result<Vec<StoredEvent>, StoreError> {
        let mut all = Vec::new();
        loop {
            let after = all.last().map_or(0, |e: &StoredEvent| e.seq);
            let page = self.events_since(doc, after, EVENTS_PAGE_MAX)?;
            let done = page.len() < EVENTS_PAGE_MAX;
            all.extend(page);
            if done {
                return Ok(all);
            }
        }
    }

    /// The list's reported keys, sorted.
    pub fn reported(&self, doc: DocId) -> Result<Vec<String>, StoreError> {
        let list = list_id(&self.conn, doc)?;
        let keys = self
            .conn
            .prepare_cached("SELECT key FROM reported WHERE list_id = ?1 ORDER BY key")?
            .query_map([list], |r| r.get(0))?
            .collect::<Result<Vec<String>, _>>()?;
        Ok(keys)
    }

    /// Keeps list `doc`'s link to the task it was delegated for (again: replaced).
    pub fn set_link(&mut self, doc: DocId, link: &Link) -> Result<(), StoreError> {
        let tx = self.write()?;
        let list = list_id(&tx, doc)?;
        tx.prepare_cached(
            "INSERT OR REPLACE INTO links (list_id, parent, task, agent, name) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![list, link.parent, link.task, link.agent, link.list])?;
        tx.commit()?;
        Ok(())
    }

    /// Every delegated task's list and its link.
    pub fn links(&self) -> Result<Vec<Link>, StoreError> {
        let links = self
            .conn
            .prepare_cached("SELECT parent, task, agent, name FROM links ORDER BY list_id")?
            .query_map([], |r| {
                Ok(Link {
                    parent: r.get(0)?,
                    task: r.get(1)?,
                    agent: r.get(2)?,
                    list: r.get(3)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(links)
    }

    /// Keeps a token the hub made for `agent` on list `list` (delegated from `parent`):
    /// its SHA-256 only.
    pub fn add_token(
        &mut self,
        token_sha256: [u8; 32],
        agent: &str,
        list: &str,
        parent: &str,
    ) -> Result<(), StoreError> {
        let tx = self.write()?;
        tx.prepare_cached(
            "INSERT OR REPLACE INTO tokens (token_sha256, agent, list, parent) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![token_sha256, agent, list, parent])?;
        tx.commit()?;
        Ok(())
    }

    /// Every token the hub made.
    pub fn tokens(&self) -> Result<Vec<MadeToken>, StoreError> {
        let tokens = self
            .conn
            .prepare_cached("SELECT token_sha256, agent, list, parent FROM tokens")?
            .query_map([], |r| {
                Ok(MadeToken {
                    sha256: r.get(0)?,
                    agent: r.get(1)?,
                    list: r.get(2)?,
                    parent: r.get(3)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(tokens)
    }

    fn write(&mut self) -> Result<Transaction<'_>, StoreError> {
        Ok(self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?)
    }

    fn list_where(
        &self,
        condition: &str,
        value: &dyn rusqlite::ToSql,
    ) -> Result<Option<ListInfo>, StoreError> {
        list_info(&self.conn, condition, value)
    }
}

fn check_name(name: &str) -> Result<(), StoreError> {
    if name.is_empty() {
        return Err(StoreError::InvalidName("the name is empty".into()));
    }
    if name.len() > LIST_NAME_BYTES_MAX {
        return Err(StoreError::InvalidName(format!(
            "{} bytes, more than the {LIST_NAME_BYTES_MAX} allowed",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(StoreError::InvalidName(format!(
            "{name:?} holds a control character"
        )));
    }
    Ok(())
}

/// The row id of the list with document id `doc`.
fn list_id(conn: &Connection, doc: DocId) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT id FROM lists WHERE doc_id = ?1")?
        .query_row([doc.as_bytes()], |r| r.get(0))
        .optional()?
        .ok_or(StoreError::UnknownList(doc))
}

/// A token the hub made for an agent it delegated a task to: its SHA-256 (never the
/// token), the agent, its list and the list the task is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeToken {
    /// SHA-256 of the token.
    pub sha256: [u8; 32],
    /// The agent.
    pub agent: String,
    /// Its list (a worker there).
    pub list: String,
    /// The list the delegated task is in.
    pub parent: String,
}

/// One merge's rows inside the caller's transaction.
fn merge_in(tx: &Transaction<'_>, doc: DocId, batch: &Batch) -> Result<Commit, StoreError> {
    let list = list_id(tx, doc)?;
    let mut added = 0usize;
    let mut added_bytes = 0usize;
    if !batch.changes.is_empty() {
        let mut insert = tx.prepare_cached(
            "INSERT OR IGNORE INTO changes (list_id, hash, deps, bytes) \
             VALUES (?1, ?2, ?3, ?4)",
        )?;
        for c in &batch.changes {
            let n = insert.execute(params![
                list,
                c.hash().0,
                encode_hashes(c.deps()),
                c.bytes()
            ])?;
            if n > 0 {
                added += 1;
                added_bytes += c.bytes().len();
            }
        }
        tx.prepare_cached(
            "UPDATE lists SET changes = changes + ?2, change_bytes = change_bytes + ?3 \
             WHERE id = ?1",
        )?
        .execute(params![list, int(added), int(added_bytes)])?;
    }
    if let Some(s) = &batch.summary {
        let t = &s.tasks;
        tx.prepare_cached(
            "UPDATE lists SET version = ?2, pending = ?3, in_progress = ?4, completed = ?5, \
             cancelled = ?6, blocked = ?7 WHERE id = ?1",
        )?
        .execute(params![
            list,
            s.version.0,
            int64(t.pending),
            int64(t.in_progress),
            int64(t.completed),
            int64(t.cancelled),
            int64(t.blocked)
        ])?;
        if let Some(name) = &s.name {
            // A list made by sync is stored under its document id until an API call
            // names it; a name some other list holds already is left as it is.
            tx.prepare_cached("UPDATE OR IGNORE lists SET name = ?2 WHERE id = ?1 AND name = ?3")?
                .execute(params![
                    list,
                    name,
                    DocumentId::from_bytes(doc.0).to_string()
                ])?;
        }
    }
    let mut seqs = Vec::with_capacity(batch.events.len());
    if !batch.events.is_empty() {
        let last: i64 = tx
            .prepare_cached("SELECT last_seq FROM lists WHERE id = ?1")?
            .query_row([list], |r| r.get(0))?;
        let mut insert = tx.prepare_cached(
            "INSERT INTO events (list_id, seq, kind, json) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut seq = last;
        for e in &batch.events {
            seq += 1;
            insert.execute(params![list, seq, e.kind(), e.json()])?;
            seqs.push(unsigned(seq, 0)?);
        }
        tx.prepare_cached("UPDATE lists SET last_seq = ?2 WHERE id = ?1")?
            .execute(params![list, seq])?;
    }
    if !batch.reported.is_empty() {
        let mut insert =
            tx.prepare_cached("INSERT OR IGNORE INTO reported (list_id, key) VALUES (?1, ?2)")?;
        for k in &batch.reported {
            insert.execute(params![list, k])?;
        }
    }
    let info = list_info(tx, "l.id = ?1", &list)?.ok_or(StoreError::UnknownList(doc))?;
    Ok(Commit {
        seqs,
        changes_added: added,
        list: info,
    })
}

/// The list matching `condition` (on `lists l`, one parameter `?1`).
fn list_info(
    conn: &Connection,
    condition: &str,
    value: &dyn rusqlite::ToSql,
) -> Result<Option<ListInfo>, StoreError> {
    let sql = format!(
        "SELECT l.name, l.doc_id, l.last_seq, l.changes, l.change_bytes, \
                coalesce(length(s.bytes), 0) \
         FROM lists l LEFT JOIN snapshots s ON s.list_id = l.id WHERE {condition}"
    );
    let info = conn
        .prepare_cached(&sql)?
        .query_row([value], |r| {
            Ok(ListInfo {
                name: r.get(0)?,
                doc: DocId(r.get(1)?),
                last_seq: unsigned(r.get(2)?, 2)?,
                changes: unsigned(r.get(3)?, 3)?,
                change_bytes: unsigned(r.get(4)?, 4)?,
                snapshot_bytes: unsigned(r.get(5)?, 5)?,
            })
        })
        .optional()?;
    Ok(info)
}

/// A count or size for SQLite (all of ours are far below `i64::MAX`).
fn int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A count for SQLite.
fn int64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A column that a `CHECK (… >= 0)` keeps non-negative.
fn unsigned(v: i64, column: usize) -> rusqlite::Result<u64> {
    u64::try_from(v).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(column, v))
}

fn encode_hashes(hashes: &[ChangeHash]) -> Vec<u8> {
    hashes.iter().flat_map(|h| h.0).collect()
}

fn decode_hashes(bytes: &[u8]) -> impl Iterator<Item = ChangeHash> + '_ {
    // `CHECK (length(…) % 32 = 0)` leaves no remainder; one would be ignored.
    bytes.chunks_exact(HASH_BYTES).map(|c| {
        let mut h = [0u8; HASH_BYTES];
        h.copy_from_slice(c);
        ChangeHash(h)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_round_trip() {
        let hashes = vec![ChangeHash([1; 32]), ChangeHash([2; 32])];
        let bytes = encode_hashes(&hashes);
        assert_eq!(bytes.len(), 64);
        assert_eq!(decode_hashes(&bytes).collect::<Vec<_>>(), hashes);
        assert_eq!(decode_hashes(&[]).count(), 0);
    }

    #[test]
    fn a_commit_is_durable_when_it_returns() {
        let dir = std::env::temp_dir().join(format!("swarmtodo-db-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(dir.join("pragmas.sqlite3")).unwrap();
        let pragma = |name: &str| -> String {
            db.conn
                .pragma_query_value(None, name, |r| r.get::<_, rusqlite::types::Value>(0))
                .map(|v| format!("{v:?}"))
                .unwrap()
        };
        assert_eq!(pragma("journal_mode"), r#"Text("wal")"#);
        // 2 is FULL: the WAL is synced at every commit.
        assert_eq!(pragma("synchronous"), "Integer(2)");
        assert_eq!(pragma("foreign_keys"), "Integer(1)");
        assert_eq!(
            pragma("user_version"),
            format!("Integer({})", schema::SCHEMA_VERSION)
        );
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names() {
        let check = |name: &str, ok: bool| {
            assert_eq!(check_name(name).is_ok(), ok, "{name:?}");
        };
        check("swarm-42", true);
        check("équipe/α", true);
        check("", false);
        check("a\nb", false);
        check(&"n".repeat(LIST_NAME_BYTES_MAX), true);
        check(&"n".repeat(LIST_NAME_BYTES_MAX + 1), false);
    }
}
