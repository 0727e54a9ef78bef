//! Between the core's [`Commit`](super::core::Commit)s and the store.

use std::collections::BTreeSet;

use automerge::ActorId;

use super::core::{Commit, HubCore, StoredList};
use super::wire::DocumentId;
use crate::model::TodoList;
use crate::store::{Batch, ChangeRecord, Db, DocId, NewEvent, Store, StoreError};

/// The store's id of a document.
pub(crate) fn doc_id(d: &DocumentId) -> DocId {
    DocId(*d.as_bytes())
}

/// The JSON stored for an event: its time and body (the store adds the `seq`).
#[derive(Debug, serde::Serialize)]
struct StoredBody<'a> {
    at_ms: i64,
    #[serde(flatten)]
    body: &'a crate::proto::EventBody,
}

fn kind(body: &crate::proto::EventBody) -> &'static str {
    use crate::proto::EventBody::*;
    match body {
        TasksChanged { .. } => "tasks_changed",
        Violation(_) => "violation",
        Conflict(_) => "conflict",
        Repaired { .. } => "repaired",
    }
}

/// Makes several commits durable in one transaction (one write to disk). Returns
/// each commit's events' sequence numbers, in order.
pub(crate) async fn commit_all(
    store: &Store,
    known: &mut BTreeSet<DocumentId>,
    commits: &[Commit],
    now_ms: i64,
) -> Result<Vec<Vec<u64>>, StoreError> {
    let mut merges = Vec::with_capacity(commits.len());
    for commit in commits {
        if !known.contains(&commit.doc) {
            store
                .create_or_get_list(commit.doc.to_string(), doc_id(&commit.doc))
                .await?;
            known.insert(commit.doc);
        }
        merges.push((doc_id(&commit.doc), batch(commit, now_ms)?));
    }
    Ok(store
        .commit_merges(merges)
        .await?
        .into_iter()
        .map(|c| c.seqs)
        .collect())
}

/// The store's batch for one commit: its changes, its events stamped `now_ms`, its keys.
fn batch(commit: &Commit, now_ms: i64) -> Result<Batch, StoreError> {
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
    })
}

/// [`commit`] on a synchronous [`Db`], for code without a runtime (the simulation):
/// the same rows as the hub writes.
pub(crate) fn commit_sync(
    db: &mut Db,
    known: &mut BTreeSet<DocumentId>,
    commit: &Commit,
    now_ms: i64,
) -> Result<(), StoreError> {
    let doc = doc_id(&commit.doc);
    if !known.contains(&commit.doc) {
        db.create_or_get_list(&commit.doc.to_string(), doc)?;
        known.insert(commit.doc);
    }
    db.commit_merge(doc, &batch(commit, now_ms)?)?;
    Ok(())
}

/// The lists of a synchronous [`Db`], told to the core (which loads each when a peer
/// asks for it: [`load_sync`]).
pub(crate) fn stored_sync(db: &Db, core: &mut HubCore) -> Result<BTreeSet<DocumentId>, StoreError> {
    let known: BTreeSet<DocumentId> = db
        .list_docs()?
        .into_iter()
        .map(|d| DocumentId::from_bytes(d.0))
        .collect();
    core.set_stored(known.iter().copied());
    Ok(known)
}

/// [`load`] from a synchronous [`Db`].
pub(crate) fn load_sync(
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

/// [`reload`] from a synchronous [`Db`].
pub(crate) fn reload_sync(db: &Db, core: &mut HubCore, id: DocumentId) -> Result<(), StoreError> {
    let doc = doc_id(&id);
    let loaded = match db.load(doc) {
        Ok(Some(l)) => l,
        Ok(None) | Err(StoreError::UnknownList(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    core.load_doc(id, loaded.rebuild()?, db.reported(doc)?);
    Ok(())
}

/// The stored lists, told to the core (which loads each when a peer asks for it:
/// [`load`]). Returns their ids.
pub(crate) async fn stored(
    store: &Store,
    core: &mut HubCore,
) -> Result<BTreeSet<DocumentId>, StoreError> {
    let known: BTreeSet<DocumentId> = store
        .list_docs()
        .await?
        .into_iter()
        .map(|d| DocumentId::from_bytes(d.0))
        .collect();
    core.set_stored(known.iter().copied());
    tracing::info!(lists = known.len(), "lists stored (loaded when asked for)");
    Ok(known)
}

/// One list from the store, rebuilt (off the runtime), with the authority's reported
/// keys; `None` when nothing is stored for it.
pub(crate) async fn load(
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

/// Reloads one list from the store into the core (after its in-memory state was
/// dropped). A list with nothing stored yet is simply forgotten.
pub(crate) async fn reload(
    store: &Store,
    core: &mut HubCore,
    id: DocumentId,
) -> Result<(), StoreError> {
    let doc = doc_id(&id);
    let loaded = match store.load(doc).await {
        Ok(Some(l)) => l,
        Ok(None) | Err(StoreError::UnknownList(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    let rebuilt = tokio::task::spawn_blocking(move || loaded.rebuild())
        .await
        .map_err(|_| StoreError::Closed)??;
    let reported = store.reported(doc).await?;
    core.load_doc(id, rebuilt, reported);
    tracing::info!(doc = %id, "list reloaded");
    Ok(())
}
