//! Where the JSON API reads a list's past — the events an event stream resumes from, the
//! document a task's history is read from: the hub's store, or, on a hub of a cluster,
//! the list's log (docs/DESIGN.md §10). A cluster hub's store holds only what it
//! replayed while it held a list; the log holds the list whichever hub holds it, and
//! numbers its events as every hub does.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use swarmtodo_cluster::Cluster;
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_store::{persist, Loaded, Store, StoreError, StoredEvent};

use crate::limits::STREAM_PAGE_MAX;
use crate::metrics::Metrics;

/// Where a list's past is read.
#[derive(Debug, Clone)]
pub(crate) enum Past {
    /// The hub's own store (a hub alone).
    Store(Store),
    /// The list's log (a hub of a cluster); each read of it counted in `metrics`.
    Log(Box<(Cluster, Arc<Metrics>)>),
}

impl Past {
    /// Events of list `doc` after `last`, in order, and whether more follow them (read
    /// again after the last one given). From the store a page of at most
    /// [`STREAM_PAGE_MAX`]; from the log all of them (it is read whole, from its last
    /// snapshot, to number them).
    pub(crate) async fn events_after(
        &self,
        doc: DocumentId,
        last: u64,
    ) -> Result<(Vec<StoredEvent>, bool), String> {
        match self {
            Past::Store(store) => {
                let page = store
                    .events_since(persist::doc_id(&doc), last, STREAM_PAGE_MAX)
                    .await
                    .map_err(|e| format!("the store could not read the list's events ({e})"))?;
                let more = page.len() == STREAM_PAGE_MAX;
                Ok((page, more))
            }
            Past::Log(log) => {
                let mut all = log_events(log, doc).await?;
                all.retain(|e| e.seq > last);
                Ok((all, false))
            }
        }
    }

    /// The `seq` of list `doc`'s last event (0: none).
    pub(crate) async fn last_event_seq(&self, doc: DocumentId) -> Result<u64, String> {
        match self {
            Past::Store(store) => store
                .last_event_seq(persist::doc_id(&doc))
                .await
                .map_err(|e| format!("the store could not read the list's events ({e})")),
            Past::Log(log) => Ok(log_events(log, doc).await?.len() as u64),
        }
    }

    /// List `doc`'s document as stored (`None`: no such list).
    pub(crate) async fn document(&self, doc: DocumentId) -> Result<Option<Loaded>, String> {
        match self {
            Past::Store(store) => match store.load(persist::doc_id(&doc)).await {
                Ok(loaded) => Ok(loaded),
                Err(StoreError::UnknownList(_)) => Ok(None),
                Err(e) => Err(format!("the store could not read the list ({e})")),
            },
            Past::Log(log) => {
                let (cluster, metrics) = &**log;
                metrics.log_reads.fetch_add(1, Ordering::Relaxed);
                cluster
                    .document(persist::doc_id(&doc))
                    .await
                    .map_err(|e| format!("the list's log could not be read ({e})"))
            }
        }
    }
}

/// Every event of list `doc` as its log numbers them now: a read of the whole log, from
/// its last snapshot, counted.
async fn log_events(
    (cluster, metrics): &(Cluster, Arc<Metrics>),
    doc: DocumentId,
) -> Result<Vec<StoredEvent>, String> {
    metrics.log_reads.fetch_add(1, Ordering::Relaxed);
    cluster
        .events(persist::doc_id(&doc))
        .await
        .map_err(|e| format!("the list's log could not be read ({e})"))
}
