//! Between the core's [`Commit`](swarmtodo_core::hub::Commit)s and the store: commits in one
//! transaction per batch, the stored lists, loads (async for the server, `_sync` on a
//! [`Db`] for the simulator).

use std::collections::{BTreeMap, BTreeSet};

use automerge::ActorId;

use crate::{Batch, ChangeRecord, Db, DocId, NewEvent, Store, StoreError};
use swarmtodo_core::hub::{Commit, HubCore, Stored, StoredList};
use swarmtodo_core::model::{Rebuilt, TodoList};
use swarmtodo_proto::wire::DocumentId;

/// The store's id of a document.
pub fn doc_id(d: &DocumentId) -> DocId {
    DocId(*d.as_bytes())
}

/// The JSON stored for an event: its time and body (the store adds the `seq`).
#[derive(Debug, serde::Serialize)]
struct StoredBody<'a> {
    at_ms: i64,
    #[serde(flatten)]
    body: &'a swarmtodo_proto::EventBody,
}

/// The kind an event is stored (and streamed) under: its `kind` field.
pub fn kind(body: &swarmtodo_proto::EventBody) -> &'static str {
    body.kind()
}

/// What one commit came to: its events' sequence numbers, or why the store refused it
/// for its own content.
type Answer = Result<Vec<u64>, StoreError>;

/// Makes several commits durable in one transaction (one write to disk, one request to
/// the store thread). Returns, per commit in order, its events' sequence numbers — or
/// why the store refused it for its own content (a record over a store limit): such a
/// commit is left out and the others are stored. An error of the store itself (I/O,
/// SQLite) is the `Err`.
pub async fn commit_all(
    store: &Store,
    known: &mut BTreeSet<DocumentId>,
    commits: &[Commit],
    now_ms: i64,
) -> Result<Vec<Answer>, StoreError> {
    let prepared = Prepared::new(known, commits, now_ms);
    store.call(move |db| prepared.store(db)).await
}

/// The answers of [`commit_all`] as the core takes them ([`HubCore::committed`]).
pub fn as_stored(answers: Vec<Answer>) -> Vec<Stored> {
    answers
        .into_iter()
        .map(|r| match r {
            Ok(seqs) => Stored::Durable(seqs),
            Err(e) => Stored::Refused(e.to_string()),
        })
        .collect()
}

/// [`commit_all`] on a synchronous [`Db`], for code without a runtime (the
/// simulation): the same rows in one transaction, the same answers.
pub fn commit_all_sync(
    db: &mut Db,
    known: &mut BTreeSet<DocumentId>,
    commits: &[Commit],
    now_ms: i64,
) -> Result<Vec<Answer>, StoreError> {
    Prepared::new(known, commits, now_ms).store(db)
}

/// A batch of commits as the store takes them: the lists new to it, the rows of each
/// commit it accepts, and an answer per commit (`Ok` filled in once stored).
struct Prepared {
    new_lists: Vec<DocumentId>,
    /// Delegated tasks' new lists and their links (kept once the list is).
    links: Vec<(DocumentId, swarmtodo_core::hub::Link)>,
    merges: Vec<(DocId, Batch)>,
    answers: Vec<Answer>,
}

impl Prepared {
    /// Builds the rows of `commits` (off the store thread); the lists new to `known`
    /// are added to it.
    fn new(known: &mut BTreeSet<DocumentId>, commits: &[Commit], now_ms: i64) -> Prepared {
        let mut p = Prepared {
            new_lists: Vec::new(),
            links: Vec::new(),
            merges: Vec::with_capacity(commits.len()),
            answers: Vec::with_capacity(commits.len()),
        };
        // A list's commits build on one another: after one is refused, the later ones
        // of the batch are too (stored, they would hold changes whose dependencies the
        // store lacks, and the list would not load again).
        let mut refused: BTreeMap<DocumentId, String> = BTreeMap::new();
        for commit in commits {
            let checked = match refused.get(&commit.doc) {
                Some(why) => Err(StoreError::AfterRefused {
                    doc: doc_id(&commit.doc),
                    why: why.clone(),
                }),
                None => batch(commit, now_ms).and_then(|b| b.check().map(|()| b)),
            };
            match checked {
                Ok(b) => {
                    if known.insert(commit.doc) {
                        p.new_lists.push(commit.doc);
                    }
                    if let Some(link) = &commit.link {
                        p.links.push((commit.doc, link.clone()));
                    }
                    p.merges.push((doc_id(&commit.doc), b));
                    p.answers.push(Ok(Vec::new()));
                }
                Err(e) => {
                    refused
                        .entry(commit.doc)
                        .or_insert_with(|| format!("{e} ({})", e.code()));
                    p.answers.push(Err(e));
                }
            }
        }
        p
    }

    /// Creates the new lists and stores the rows in one transaction.
    fn store(mut self, db: &mut Db) -> Result<Vec<Answer>, StoreError> {
        for doc in &self.new_lists {
            db.create_or_get_list(&doc.to_string(), doc_id(doc))?;
        }
        for (doc, link) in &self.links {
            db.set_link(doc_id(doc), link)?;
        }
        let mut stored = db.commit_merges(&self.merges)?.into_iter();
        for slot in self.answers.iter_mut().filter(|r| r.is_ok()) {
            if let Some(c) = stored.next() {
                *slot = Ok(c.seqs);
            }
        }
        Ok(self.answers)
    }
}

/// The store's batch for one commit: its changes, its events stamped `now_ms`, its
/// keys (the same bytes whoever builds it at the same `now_ms`: a cluster hub puts it
/// in the list's log before its own store).
pub fn batch(commit: &Commit, now_ms: i64) -> Result<Batch, StoreError> {
    let events = commit
        .events
        .iter()
        .map(|body| {
            NewEvent::new(
                kind(body),
                &StoredBody {
                    at_ms: now_ms,
                    body,
                },
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Batch {
        changes: commit
            .changes
            .iter()
            .map(ChangeRecord::from_change)
            .collect(),
        events,
        reported: commit.reported.clone(),
        summary: commit.summary.clone(),
    })
}

/// The lists of a synchronous [`Db`], told to the core (which loads each when a peer
/// asks for it: [`load_sync`]).
pub fn stored_sync(db: &Db, core: &mut HubCore) -> Result<BTreeSet<DocumentId>, StoreError> {
    let known: BTreeSet<DocumentId> = db
        .list_docs()?
        .into_iter()
        .map(|d| DocumentId::from_bytes(d.0))
        .collect();
    core.set_stored(known.iter().copied());
    core.set_links(db.links()?);
    Ok(known)
}

/// [`load`] from a synchronous [`Db`].
pub fn load_sync(
    db: &Db,
    id: DocumentId,
    actor: ActorId,
) -> Result<Option<StoredList>, StoreError> {
    let doc = doc_id(&id);
    let loaded = match db.load(doc) {
        Ok(Some(l)) => l,
        Ok(None) | Err(StoreError::UnknownList(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let since_compaction = loaded.changes.len();
    Ok(Some(StoredList {
        list: TodoList::from_doc(loaded.rebuild()?.with_actor(actor)),
        reported: db.reported(doc)?,
        since_compaction,
    }))
}

/// The stored lists, told to the core (which loads each when a peer asks for it:
/// [`load`]). Returns their ids.
pub async fn stored(store: &Store, core: &mut HubCore) -> Result<BTreeSet<DocumentId>, StoreError> {
    let known: BTreeSet<DocumentId> = store
        .list_docs()
        .await?
        .into_iter()
        .map(|d| DocumentId::from_bytes(d.0))
        .collect();
    core.set_stored(known.iter().copied());
    let links = store.call(|db| db.links()).await?;
    tracing::info!(
        lists = known.len(),
        delegated = links.len(),
        "lists stored (loaded when asked for)"
    );
    core.set_links(links);
    Ok(known)
}

/// One list from the store, rebuilt (off the runtime), with the authority's reported
/// keys; `None` when nothing is stored for it.
pub async fn load(
    store: &Store,
    id: DocumentId,
    actor: ActorId,
) -> Result<Option<StoredList>, StoreError> {
    let doc = doc_id(&id);
    let loaded = match store.load(doc).await {
        Ok(Some(l)) => l,
        Ok(None) | Err(StoreError::UnknownList(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let since_compaction = loaded.changes.len();
    // Rebuilding and indexing cost the document's size: off the runtime.
    let list = tokio::task::spawn_blocking(move || {
        loaded
            .rebuild()
            .map(|doc| TodoList::from_doc(doc.with_actor(actor)))
    })
    .await
    .map_err(|_| StoreError::Closed)??;
    let reported = store.reported(doc).await?;
    Ok(Some(StoredList {
        list,
        reported,
        since_compaction,
    }))
}

/// List `doc`'s document rebuilt from `snapshot`, and indexed, for a `Compaction` that
/// asks for it (`None` when the snapshot does not load: the list keeps its document, and
/// the failure is logged). The load costs the document's size: a runtime runs this off
/// the hub's task and hands the result to [`HubCore::rebuilt`].
pub fn rebuild(doc: &DocumentId, snapshot: &[u8]) -> Option<Rebuilt> {
    let started = std::time::Instant::now();
    match Rebuilt::load(snapshot) {
        Ok(rebuilt) => {
            tracing::debug!(
                %doc,
                ms = started.elapsed().as_millis() as u64,
                "snapshot loaded for a rebuild"
            );
            Some(rebuilt)
        }
        Err(e) => {
            tracing::warn!(%doc, error = %e, "a snapshot did not load for a rebuild");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // In tests a panic is the failure report.

    use super::*;
    use crate::REPORTED_KEY_BYTES_MAX;

    fn commit(doc: DocumentId, key: String) -> Commit {
        Commit {
            doc,
            notify: std::sync::Arc::from([]),
            changes: Vec::new(),
            events: Vec::new(),
            reported: vec![key],
            answers: Vec::new(),
            summary: None,
            link: None,
        }
    }

    /// A commit the store refuses for its own content is left out, and so are the later
    /// commits of its list in the same transaction — each may build on the refused one;
    /// the other lists' are stored (the hub then isolates only that list).
    #[tokio::test]
    async fn a_refused_commit_and_its_list_s_later_ones_are_left_out_the_others_stored() {
        let dir =
            std::env::temp_dir().join(format!("swarmtodo-persist-after-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::open(dir.join("hub.db")).await.unwrap();
        let (good, bad) = (
            DocumentId::from_bytes([1; 16]),
            DocumentId::from_bytes([2; 16]),
        );
        let commits = [
            commit(bad, "k".repeat(REPORTED_KEY_BYTES_MAX + 1)),
            commit(good, "fine".to_owned()),
            commit(bad, "small".to_owned()),
            commit(good, "fine too".to_owned()),
        ];
        let mut known = BTreeSet::new();
        let out = commit_all(&store, &mut known, &commits, 1).await.unwrap();
        assert!(
            matches!(out[0], Err(StoreError::TooLarge { .. })),
            "{out:?}"
        );
        assert!(out[1].is_ok() && out[3].is_ok(), "{out:?}");
        let after = out[2].as_ref().unwrap_err();
        assert_eq!(after.code(), "store_after_refused");
        assert!(after.to_string().contains("store_too_large"), "{after}");
        assert_eq!(
            store.reported(doc_id(&good)).await.unwrap(),
            ["fine", "fine too"]
        );
        assert!(
            !known.contains(&bad),
            "nothing of the refused list was stored"
        );
        store.close().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
