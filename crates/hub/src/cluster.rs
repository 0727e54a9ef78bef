//! The hub as one of a cluster (docs/DESIGN.md §10): it acts only for the lists whose
//! lease it holds. Before it loads a list it takes the list — the lease, a fence on the
//! list's log — and replays into its own store what other hubs wrote to the log; every
//! commit goes to the log (which refuses it once another hub fenced the list) before
//! the hub's store; leases are renewed every third of their time to live, and given
//! back when the list leaves memory or the hub stops. A hub that cannot take a list
//! answers that another hub holds it; one that loses a list drops it from memory.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc;

use swarmtodo_cluster::{replay_into, Cluster, ClusterError, Replayed, Snapshot, Tenure};
use swarmtodo_core::hub::Stored;
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_store::persist::doc_id;
use swarmtodo_store::{Batch, ChangeRecord, NewEvent, Store};

use crate::channel::{ToHub, Unavailable};
use crate::directory::IndexWriter;
use crate::limits::HOLDERS_KNOWN_MAX;
use crate::metrics::Metrics;

/// What a hub logs when a term it held as a list's authority ends, followed by `: ` and
/// the code of the refusal that ended it (`cluster_fenced`, `cluster_lease_expired`,
/// `cluster_lease_lost`, …): from then on it acts for the list no more. The live
/// cluster simulation counts these lines in the hubs' logs.
pub const TERM_ENDED_LOG: &str = "no longer the list's authority";

/// One term as a list's authority, used by one task at a time.
type Term = Arc<tokio::sync::Mutex<Tenure>>;

/// The hub's side of the cluster: its handle and the lists it holds.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSide {
    cluster: Cluster,
    terms: Arc<Mutex<BTreeMap<DocumentId, Term>>>,
    /// Lists another hub was found holding, and when: taken as still held for a third
    /// of a lease, so that calls and peers going there do not each try the lease first.
    holders: Arc<Mutex<Holders>>,
    /// Writes the summaries of the lists it holds into the cluster's index.
    index: IndexWriter,
    metrics: Arc<Metrics>,
}

/// Lists another hub was found holding, and when; at most [`HOLDERS_KNOWN_MAX`] (past it
/// the memory starts over).
#[derive(Debug, Default)]
struct Holders(BTreeMap<DocumentId, (String, Instant)>);

impl Holders {
    /// The hub found holding `doc` less than `fresh` ago.
    fn get(&self, doc: &DocumentId, fresh: std::time::Duration) -> Option<String> {
        self.0
            .get(doc)
            .filter(|(_, at)| at.elapsed() < fresh)
            .map(|(h, _)| h.clone())
    }

    fn remember(&mut self, doc: DocumentId, holder: &str) {
        if self.0.len() >= HOLDERS_KNOWN_MAX && !self.0.contains_key(&doc) {
            self.0.clear();
        }
        self.0.insert(doc, (holder.to_owned(), Instant::now()));
    }

    fn forget(&mut self, doc: &DocumentId) {
        self.0.remove(doc);
    }
}

impl ClusterSide {
    pub(crate) fn new(cluster: Cluster, metrics: Arc<Metrics>) -> ClusterSide {
        ClusterSide {
            terms: Arc::default(),
            holders: Arc::default(),
            index: IndexWriter::start(&cluster),
            cluster,
            metrics,
        }
    }

    /// Logs and counts the end of a term this hub held on list `doc`, by `e`.
    fn ended(&self, doc: &DocumentId, e: &ClusterError) {
        self.metrics.term_ended(e.code());
        tracing::warn!(%doc, error = %e, "{TERM_ENDED_LOG}: {}", e.code());
    }

    fn term(&self, doc: &DocumentId) -> Option<Term> {
        self.terms.lock().ok()?.get(doc).cloned()
    }

    /// The cluster.
    /// The cluster's index of lists, which the summaries of the lists this hub holds go
    /// to.
    pub(crate) fn index(&self) -> &IndexWriter {
        &self.index
    }

    pub(crate) fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// True when this hub holds list `doc` (its term is on).
    pub(crate) fn holds(&self, doc: &DocumentId) -> bool {
        self.term(doc).is_some()
    }

    /// How many lists this hub holds.
    pub(crate) fn held_count(&self) -> usize {
        self.terms.lock().map(|t| t.len()).unwrap_or(0)
    }

    /// The lists this hub holds.
    pub(crate) fn held(&self) -> Vec<DocumentId> {
        self.terms
            .lock()
            .map(|t| t.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Makes this hub list `doc`'s authority, its store up to date with the log: takes
    /// the list (unless it holds it already), then replays the log into the store. An
    /// `Err` says why it cannot act for the list (another hub holds it, NATS failed).
    pub(crate) async fn take(
        &self,
        doc: DocumentId,
        store: &Store,
    ) -> Result<Replayed, Unavailable> {
        if self.term(&doc).is_some() {
            return Ok(Replayed::default());
        }
        if let Some(holder) = self.known_holder(&doc) {
            return Err(Unavailable {
                why: format!("list {doc} is held by hub {holder}"),
                holder: Some(holder),
            });
        }
        let id = doc_id(&doc);
        let tenure = match self.cluster.take(id).await {
            Ok(t) => t,
            // This hub's former process (killed, restarted) held the list: nobody
            // acts for it until that lease ends, and nothing is carried or forwarded
            // to this hub itself.
            Err(ClusterError::LeaseHeld { by, .. }) if by == self.cluster.hub() => {
                return Err(Unavailable {
                    why: format!(
                        "list {doc} is held by this hub's former process until its lease \
                         ends (at most {:?}): retry",
                        self.cluster.lease_ttl()
                    ),
                    holder: None,
                });
            }
            Err(e) => {
                if let ClusterError::LeaseHeld { by, .. } = &e {
                    self.remember_holder(doc, by);
                }
                return Err(e.into());
            }
        };
        let (through, lease) = (tenure.last(), tenure.lease().revision);
        // Held from now on, and renewed with the others while the log is replayed.
        if let Ok(mut terms) = self.terms.lock() {
            terms.insert(doc, Arc::new(tokio::sync::Mutex::new(tenure)));
        }
        let started = Instant::now();
        let replayed = match self.cluster.read(id, 0).await {
            Ok(read) if read.through >= through => {
                let read_ms = started.elapsed().as_millis() as u64;
                tracing::debug!(%doc, read_ms, records = read.records.len(), "the list's log read");
                if let Some(term) = self.term(&doc) {
                    term.lock().await.caught_up(&read.records);
                }
                let name = doc.to_string();
                store
                    .with_db(move |db| Ok(replay_into(db, id, &name, &read.records)))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
            }
            Ok(read) => Err(format!(
                "the log of {doc} reads only to {} of {through}: retry",
                read.through
            )),
            Err(e) => Err(e.to_string()),
        };
        match replayed {
            Ok(r) => {
                let ms = started.elapsed().as_millis() as u64;
                tracing::info!(%doc, lease, commits = r.commits, events = r.events, ms, "list taken; its log replayed into the store");
                self.sweep_in_background(doc);
                Ok(r)
            }
            Err(e) => {
                self.release(doc).await;
                Err(e.into())
            }
        }
    }

    /// Appends one commit of list `doc` to its log. A list the hub made without loading
    /// it (a delegated task's new list) is taken first; if the log held it already the
    /// commit is refused (the list is loaded again, as the log has it). An `Err` says
    /// why the log did not take the commit — [`Stored::Refused`] for a record over the
    /// log's limit, [`Stored::Elsewhere`] when this hub cannot act for the list — and
    /// the list is dropped from memory by the caller's refusal.
    pub(crate) async fn append(
        &self,
        doc: DocumentId,
        batch: &Batch,
        store: &Store,
    ) -> Result<(), Stored> {
        let term = match self.term(&doc) {
            Some(t) => t,
            None => {
                let replayed = self
                    .take(doc, store)
                    .await
                    .map_err(|u| Stored::Elsewhere(u.why))?;
                if replayed != Replayed::default() {
                    return Err(Stored::Elsewhere(format!(
                        "list {doc} exists in the cluster already: it is loaded as the log has it"
                    )));
                }
                self.term(&doc).ok_or_else(|| {
                    Stored::Elsewhere(format!("this hub does not hold list {doc} in the cluster"))
                })?
            }
        };
        let mut tenure = term.lock().await;
        match self.cluster.append(&mut tenure, batch).await {
            Ok(_) => Ok(()),
            Err(e @ ClusterError::TooLarge { .. }) => Err(Stored::Refused(lost_why(&e))),
            Err(e) => {
                if self.forget_term(&doc, &term) {
                    self.ended(&doc, &e);
                }
                Err(Stored::Elsewhere(lost_why(&e)))
            }
        }
    }

    /// When list `doc`'s log is due for it, rolls it up into a snapshot of the list as
    /// the store holds it (the store holds all that this hub appended: it is called
    /// after the store's commit). Nothing is lost when it fails: the log stays as it
    /// is, and it is logged; a refusal by the log ends the term, as an append's would.
    pub(crate) async fn roll_up_if_due(&self, doc: DocumentId, store: &Store) {
        let Some(term) = self.term(&doc) else {
            return;
        };
        let at = {
            let mut tenure = term.lock().await;
            if !self.cluster.rollup_due(&tenure) {
                return;
            }
            tenure.begin_snapshot()
        };
        let started = Instant::now();
        let rolled = async {
            let snapshot = snapshot_of(store, doc).await?;
            let events = snapshot.batch.events.len();
            let document_bytes = snapshot.document.len();
            // Encoded, and kept in parts if it must be, while the term is
            // free: its lease goes on being renewed.
            let kept = self.cluster.keep_snapshot(at, &snapshot).await?;
            let seq = self.cluster.roll_up(&mut *term.lock().await, kept).await?;
            Ok::<_, ClusterError>((seq, events, document_bytes))
        };
        match rolled.await {
            Ok((seq, events, document_bytes)) => tracing::info!(
                %doc,
                seq,
                events,
                document_bytes,
                ms = started.elapsed().as_millis() as u64,
                "the list's log rolled up into a snapshot"
            ),
            Err(e) => {
                tracing::warn!(%doc, error = %e, code = e.code(), "the list's log was not rolled up")
            }
        }
    }

    /// Deletes, off the way of everything else, the snapshot parts of list `doc` (just
    /// taken) that its last snapshot does not name.
    fn sweep_in_background(&self, doc: DocumentId) {
        let Some(term) = self.term(&doc) else {
            return;
        };
        let cluster = self.cluster.clone();
        self.cluster.spawn(async move {
            let keep = term.lock().await.snapshot_parts().map(str::to_owned);
            match cluster
                .sweep_snapshot_parts(doc_id(&doc), keep.as_deref())
                .await
            {
                Ok(0) => {}
                Ok(swept) => tracing::info!(%doc, swept, "snapshot parts no rollup names purged"),
                Err(e) => tracing::info!(%doc, error = %e, "snapshot parts not swept"),
            }
        });
    }

    /// The hub found holding list `doc` less than a third of a lease ago.
    fn known_holder(&self, doc: &DocumentId) -> Option<String> {
        let fresh = self.cluster.lease_ttl() / 3;
        self.holders.lock().ok()?.get(doc, fresh)
    }

    fn remember_holder(&self, doc: DocumentId, holder: &str) {
        if let Ok(mut holders) = self.holders.lock() {
            holders.remember(doc, holder);
        }
    }

    /// Forgets who holds list `doc` (a call forwarded there got no answer).
    pub(crate) fn forget_holder(&self, doc: &DocumentId) {
        if let Ok(mut holders) = self.holders.lock() {
            holders.forget(doc);
        }
    }

    fn forget(&self, doc: &DocumentId) -> Option<Term> {
        self.terms.lock().ok()?.remove(doc)
    }

    /// Forgets `term` if it is still list `doc`'s (not given back, nor taken again
    /// since); true when it was.
    fn forget_term(&self, doc: &DocumentId, term: &Term) -> bool {
        let Ok(mut terms) = self.terms.lock() else {
            return false;
        };
        if terms.get(doc).is_some_and(|t| Arc::ptr_eq(t, term)) {
            terms.remove(doc);
            return true;
        }
        false
    }

    /// Gives list `doc` back (it left memory): another hub may take it at once.
    pub(crate) async fn release(&self, doc: DocumentId) {
        let Some(term) = self.forget(&doc) else {
            return;
        };
        // The renewal loop may hold the term a moment: the lock waits for it, and the
        // term, ended, renews and appends no more.
        let mut tenure = term.lock().await;
        match self.cluster.release(&mut tenure).await {
            Ok(()) => tracing::debug!(%doc, lease = tenure.lease().revision, "list given back"),
            Err(e) => tracing::info!(%doc, error = %e, "lease not given back; it ends by itself"),
        }
    }

    /// Renews every lease this hub holds, every third of their time to live, until the
    /// hub task is gone; a lease that cannot be renewed ends the term, and the hub task
    /// is told ([`ToHub::Lost`]).
    pub(crate) fn renew_in_background(&self, to_hub: mpsc::WeakSender<ToHub>) {
        let side = self.clone();
        let every = self.cluster.lease_ttl() / 3;
        // On the cluster's runtime: a long merge on the hub's cannot hold it up.
        self.cluster.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(to_hub) = to_hub.upgrade() else {
                    return;
                };
                let terms: Vec<(DocumentId, Term)> = side
                    .terms
                    .lock()
                    .map(|t| t.iter().map(|(d, t)| (*d, t.clone())).collect())
                    .unwrap_or_default();
                for (doc, term) in terms {
                    let renewed = {
                        let mut tenure = term.lock().await;
                        side.cluster.renew(&mut tenure).await
                    };
                    if let Err(e) = renewed {
                        // A term given back meanwhile (the list left memory) is not lost.
                        if side.forget_term(&doc, &term) {
                            side.ended(&doc, &e);
                            let _ = to_hub.send(ToHub::Lost(doc, lost_why(&e))).await;
                        }
                    }
                }
            }
        });
    }
}

/// Resolves once hub `holder` no longer holds list `doc` (a hub paused or cut from NATS
/// may keep its subscriptions a while, not its lease): looked at every third of a lease.
pub(crate) async fn until_moved(cluster: &Cluster, doc: DocumentId, holder: &str) {
    let every = cluster.lease_ttl() / 3;
    loop {
        tokio::time::sleep(every).await;
        match cluster.holder(doc_id(&doc)).await {
            Ok(Some((by, _))) if by == holder => {}
            Ok(now) => {
                tracing::debug!(%doc, holder, ?now, "the list's hub no longer holds it");
                return;
            }
            // NATS failing: whatever waits has a bound of its own.
            Err(_) => {}
        }
    }
}

/// List `doc` as the store holds it, as one snapshot: its last compaction, the
/// changes since, all of its events and keys.
async fn snapshot_of(store: &Store, doc: DocumentId) -> Result<Snapshot, ClusterError> {
    let id = doc_id(&doc);
    let snapshot = store
        .with_db(move |db| {
            let (document, heads, changes) = match db.load(id)? {
                Some(l) => (l.snapshot.unwrap_or_default(), l.snapshot_heads, l.changes),
                None => Default::default(),
            };
            let batch = Batch {
                changes: changes
                    .into_iter()
                    .map(ChangeRecord::from_bytes)
                    .collect::<Result<_, _>>()?,
                events: db
                    .all_events(id)?
                    .into_iter()
                    .map(|e| NewEvent::from_json(e.kind, e.json))
                    .collect::<Result<_, _>>()?,
                reported: db.reported(id)?,
                summary: None,
            };
            Ok(Snapshot {
                document,
                heads,
                batch,
            })
        })
        .await?;
    Ok(snapshot)
}

fn lost_why(e: &ClusterError) -> String {
    format!("{} ({})", e, e.code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holders_known_start_over_past_holders_known_max() {
        let doc = |i: usize| swarmtodo_core::hub::list_id(&format!("list-{i}")).ok();
        let fresh = std::time::Duration::from_secs(60);
        let mut holders = Holders::default();
        for i in 0..HOLDERS_KNOWN_MAX {
            holders.remember(doc(i).unwrap(), "hub-a");
        }
        assert_eq!(holders.0.len(), HOLDERS_KNOWN_MAX);
        // Told again of one it knows: nothing is forgotten.
        holders.remember(doc(0).unwrap(), "hub-b");
        assert_eq!(
            holders.get(&doc(0).unwrap(), fresh).as_deref(),
            Some("hub-b")
        );
        assert_eq!(holders.0.len(), HOLDERS_KNOWN_MAX);
        // One more: the memory starts over with it.
        holders.remember(doc(HOLDERS_KNOWN_MAX).unwrap(), "hub-c");
        assert_eq!(holders.0.len(), 1);
        assert_eq!(holders.get(&doc(1).unwrap(), fresh), None);
        let last = doc(HOLDERS_KNOWN_MAX).unwrap();
        assert_eq!(holders.get(&last, fresh).as_deref(), Some("hub-c"));
        // Not fresh any more, then forgotten.
        assert_eq!(holders.get(&last, std::time::Duration::ZERO), None);
        holders.forget(&last);
        assert!(holders.0.is_empty());
    }
}
