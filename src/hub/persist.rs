//! Between the core's [`Commit`](super::core::Commit)s and the store.

use std::collections::BTreeSet;

use automerge::Automerge;

use super::core::{Commit, HubCore};
use super::wire::DocumentId;
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

/// [`load_all`] from a synchronous [`Db`].
pub(crate) fn load_all_sync(
    db: &Db,
    core: &mut HubCore,
) -> Result<BTreeSet<DocumentId>, StoreError> {
    let mut known = BTreeSet::new();
    for doc in db.list_docs()? {
        let id = DocumentId::from_bytes(doc.0);
        known.insert(id);
        reload_sync(db, core, id)?;
    }
    Ok(known)
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

/// Loads every stored list into the core. Returns the ids loaded.
pub(crate) async fn load_all(
    store: &Store,
    core: &mut HubCore,
) -> Result<BTreeSet<DocumentId>, StoreError> {
    let mut known = BTreeSet::new();
    for doc in store.list_docs().await? {
        let id = DocumentId::from_bytes(doc.0);
        known.insert(id);
        let Some(loaded) = store.load(doc).await? else {
            continue;
        };
        // Rebuilding costs the document's size: off the runtime.
        let rebuilt: Result<Automerge, StoreError> =
            tokio::task::spawn_blocking(move || loaded.rebuild())
                .await
                .map_err(|_| StoreError::Closed)?;
        let reported = store.reported(doc).await?;
        core.load_doc(id, rebuilt?, reported);
        tracing::info!(doc = %id, "list loaded");
    }
    Ok(known)
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
