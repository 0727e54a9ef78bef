//! A hub of a cluster and the cluster's directory (docs/DESIGN.md §10): the index of
//! every list of the cluster, which `GET /v1/lists` answers at any hub; the tokens any
//! hub made for delegated tasks, which every hub admits; and the links of delegated
//! tasks' lists, so that a task rolls up whichever hubs hold it and its list.
//!
//! The holder of a list writes its summary into the index whenever it stores one (at
//! most once a second per list), and the link of a delegated task's list with its
//! first commit; the hub that makes a token shares it (its SHA-256 and who it names,
//! never the token). Every hub watches all three from its start — the last value of
//! every key, then each new one: it keeps the index in memory, one entry a list of the
//! cluster, the tokens with those of its configuration, and tells its core of every
//! link and of every list's task counts (a parent held here takes the status its
//! sub-lists held elsewhere roll up to).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hyper::body::Bytes;
use serde::{Deserialize, Serialize};

use tokio::sync::{mpsc, watch};

use swarmtodo_cluster::limits::FOLLOW_RETRY;
use swarmtodo_cluster::{token_key, token_sha256, Bucket, Cluster, Keyed};
use swarmtodo_core::hub::{Input, Link, Summary};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::{ListSummary, ListsPage};
use swarmtodo_store::persist;

use crate::access::{delegated_identity, Access};
use crate::channel::ToHub;

/// Who a made token names, as the tokens' bucket holds it.
#[derive(Debug, Serialize, Deserialize)]
struct Made {
    agent: String,
    list: String,
    parent: String,
}

/// A delegated task's list's link, as the links' bucket holds it.
#[derive(Debug, Serialize, Deserialize)]
struct Linked {
    parent: String,
    task: String,
    agent: String,
    list: String,
}

/// A hub of a cluster's part of the cluster's directory, as its JSON API uses it.
#[derive(Debug, Clone)]
pub(crate) struct Directory {
    /// The cluster, where made tokens are shared.
    pub(crate) cluster: Cluster,
    /// The index of every list of the cluster.
    pub(crate) index: ListIndex,
}

/// The index of the cluster's lists, as this hub last heard it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListIndex {
    inner: Arc<RwLock<Index>>,
}

#[derive(Debug, Default)]
struct Index {
    /// By key: the name, or the document id of a list without one.
    by_key: BTreeMap<String, ListSummary>,
    /// Each list's key, by document id.
    key_of: BTreeMap<String, String>,
}

impl ListIndex {
    /// The lists after key `after`, at most `limit`, in order of their key.
    pub(crate) fn page(&self, after: Option<&str>, limit: usize) -> ListsPage {
        let index = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let range = match after {
            Some(after) => index
                .by_key
                .range::<str, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded)),
            None => index.by_key.range::<str, _>(..),
        };
        let mut lists: Vec<ListSummary> = range.take(limit + 1).map(|(_, s)| s.clone()).collect();
        let next = if lists.len() > limit {
            lists.truncate(limit);
            lists.last().map(key)
        } else {
            None
        };
        ListsPage { lists, next }
    }

    /// The list called `name`, as last heard.
    fn named(&self, name: &str) -> Option<ListSummary> {
        let index = self.inner.read().unwrap_or_else(|e| e.into_inner());
        index.by_key.get(name).cloned()
    }

    /// List `doc`'s summary is `summary` now (`None`: gone). A summary without a name
    /// keeps the name the list had.
    fn set(&self, doc: &str, summary: Option<ListSummary>) {
        let mut index = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let before = index
            .key_of
            .remove(doc)
            .and_then(|k| index.by_key.remove(&k));
        let Some(mut summary) = summary else {
            return;
        };
        if summary.name.is_none() {
            summary.name = before.and_then(|b| b.name);
        }
        let k = key(&summary);
        index.key_of.insert(doc.to_owned(), k.clone());
        index.by_key.insert(k, summary);
    }
}

/// A list's key in the index: its name, or its document id.
fn key(s: &ListSummary) -> String {
    s.name.clone().unwrap_or_else(|| s.document.clone())
}

/// Writes lists' summaries into the cluster's index off the hub task, so that no commit
/// waits on NATS for the index: the latest summary of each list waits here (one a list
/// at most) until a task of the cluster's runtime writes them, one writer at a time, so
/// a list's summaries land in order. A failure is logged: the index catches up at the
/// list's next summary.
#[derive(Debug, Clone)]
pub(crate) struct IndexWriter {
    cluster: Cluster,
    pending: Arc<std::sync::Mutex<BTreeMap<DocumentId, ListSummary>>>,
    /// Held while summaries are written.
    writing: Arc<tokio::sync::Mutex<()>>,
    wake: Arc<tokio::sync::Notify>,
}

impl IndexWriter {
    /// A writer for `cluster`'s index, its task started.
    pub(crate) fn start(cluster: &Cluster) -> IndexWriter {
        let writer = IndexWriter {
            cluster: cluster.clone(),
            pending: Arc::default(),
            writing: Arc::default(),
            wake: Arc::default(),
        };
        let w = writer.clone();
        cluster.spawn(async move {
            loop {
                w.wake.notified().await;
                w.drain().await;
            }
        });
        writer
    }

    /// List `doc`'s summary is `summary` now: it goes to the index soon.
    pub(crate) fn write(&self, doc: DocumentId, summary: &Summary) {
        let entry = ListSummary {
            name: summary.name.clone(),
            document: doc.to_string(),
            version: Some(summary.version.clone()),
            tasks: summary.tasks,
        };
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(doc, entry);
        self.wake.notify_one();
    }

    /// Writes every summary waiting (the hub stopping calls it: none is left behind).
    pub(crate) async fn drain(&self) {
        let _turn = self.writing.lock().await;
        let due = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for (doc, entry) in due {
            if let Err(e) = put(&self.cluster, Bucket::Lists, doc, &entry).await {
                tracing::warn!(%doc, error = e, "the list's summary did not reach the cluster's index");
            }
        }
    }
}

/// Writes the link of delegated task's list `doc` into the cluster's directory (a
/// failure is logged: the task rolls up only where the link is known).
pub(crate) async fn share_link(cluster: &Cluster, doc: DocumentId, link: &Link) {
    let linked = Linked {
        parent: link.parent.clone(),
        task: link.task.clone(),
        agent: link.agent.clone(),
        list: link.list.clone(),
    };
    if let Err(e) = put(cluster, Bucket::Links, doc, &linked).await {
        tracing::warn!(%doc, error = e, "a delegated list's link did not reach the cluster");
    }
}

/// Writes `value` at list `doc`'s key in `bucket`.
async fn put(
    cluster: &Cluster,
    bucket: Bucket,
    doc: DocumentId,
    value: &impl Serialize,
) -> Result<(), String> {
    let json = serde_json::to_vec(value).map_err(|e| e.to_string())?;
    cluster
        .directory_put(
            bucket,
            &persist::doc_id(&doc).to_string(),
            Bytes::from(json),
        )
        .await
        .map_err(|e| e.to_string())
}

/// Shares a token this hub made for `agent` on list `list` (delegated from `parent`)
/// with every hub of the cluster.
pub(crate) async fn share_token(
    cluster: &Cluster,
    sha256: [u8; 32],
    agent: &str,
    list: &str,
    parent: &str,
) -> Result<(), String> {
    let made = Made {
        agent: agent.to_owned(),
        list: list.to_owned(),
        parent: parent.to_owned(),
    };
    let json = serde_json::to_vec(&made).map_err(|e| e.to_string())?;
    cluster
        .directory_put(Bucket::Tokens, &token_key(&sha256), Bytes::from(json))
        .await
        .map_err(|e| e.to_string())
}

/// Watches the cluster's directory for as long as the hub runs: the index of lists into
/// `index`, the made tokens into `access` (a hub with tokens), the links and every
/// list's task counts to the hub task. A watch that ends is made again, and brings
/// every key again. What it returns says when every bucket was heard as it was.
pub(crate) fn watch(
    cluster: &Cluster,
    index: ListIndex,
    access: Arc<Access>,
    to_hub: mpsc::WeakSender<ToHub>,
) -> Heard {
    let mut heard = Heard::default();
    let (lists, links) = (index.clone(), index);
    let to_core = to_hub.clone();
    cluster.spawn(keep_watching(cluster.clone(), Bucket::Lists, heard.bucket(), move |k: Keyed| {
        let summary = k.value.and_then(|v| {
            serde_json::from_slice::<ListSummary>(&v)
                .map_err(|e| tracing::warn!(key = k.key, error = %e, "a list's summary in the index does not read"))
                .ok()
        });
        lists.set(&k.key, summary.clone());
        summary.and_then(|s| counts_of(&s)).map(|i| vec![i])
    }, to_core));
    let to_core = to_hub;
    cluster.spawn(keep_watching(cluster.clone(), Bucket::Links, heard.bucket(), move |k: Keyed| {
        let linked = serde_json::from_slice::<Linked>(&k.value?)
            .map_err(|e| tracing::warn!(key = k.key, error = %e, "a delegated list's link does not read"))
            .ok()?;
        // Its counts, if the index has them already, after it.
        let counts = links.named(&linked.list).and_then(|s| counts_of(&s));
        let link = Link {
            parent: linked.parent,
            task: linked.task,
            agent: linked.agent,
            list: linked.list,
        };
        Some(std::iter::once(Input::Links(vec![link])).chain(counts).collect())
    }, to_core.clone()));
    let Access::Tokens(tokens) = &*access else {
        return heard;
    };
    let tokens = tokens.clone();
    cluster.spawn(keep_watching(
        cluster.clone(),
        Bucket::Tokens,
        heard.bucket(),
        move |k: Keyed| {
            let (Some(sha), Some(value)) = (token_sha256(&k.key), k.value) else {
                return None;
            };
            match serde_json::from_slice::<Made>(&value) {
                Ok(m) => tokens.add_made(sha, delegated_identity(&m.agent, &m.list)),
                Err(e) => tracing::warn!(error = %e, "a made token in the cluster does not read"),
            }
            None
        },
        to_core,
    ));
    heard
}

/// Whether the hub has heard the cluster's directory as it was when the hub began to
/// watch it: every bucket watched brought the last value of each of its keys.
#[derive(Debug, Default)]
pub(crate) struct Heard {
    buckets: Vec<watch::Receiver<bool>>,
}

impl Heard {
    /// One more bucket to hear.
    fn bucket(&mut self) -> watch::Sender<bool> {
        let (heard, hearing) = watch::channel(false);
        self.buckets.push(hearing);
        heard
    }

    /// Waits until every bucket was heard, up to `wait`: false if one was not.
    pub(crate) async fn wait(mut self, wait: Duration) -> bool {
        let all = async {
            for b in &mut self.buckets {
                if b.wait_for(|heard| *heard).await.is_err() {
                    return false;
                }
            }
            true
        };
        tokio::time::timeout(wait, all).await.unwrap_or(false)
    }
}

/// What the core hears of a list's summary: its task counts.
fn counts_of(s: &ListSummary) -> Option<Input> {
    let doc = s.document.parse::<DocumentId>().ok()?;
    Some(Input::SubListCounts(doc, s.tasks))
}

/// Watches `bucket` until the hub stops: `each` takes every key written, and what it
/// returns goes to the core.
async fn keep_watching(
    cluster: Cluster,
    bucket: Bucket,
    heard: watch::Sender<bool>,
    mut each: impl FnMut(Keyed) -> Option<Vec<Input>>,
    to_hub: mpsc::WeakSender<ToHub>,
) {
    loop {
        match cluster.watch(bucket).await {
            Ok(mut w) => loop {
                // What the keys so far brought is in the index, the tokens or the hub
                // task's queue.
                if w.is_current() {
                    heard.send_replace(true);
                }
                let k = match w.next().await {
                    Some(Ok(k)) => k,
                    Some(Err(e)) => {
                        tracing::info!(bucket = bucket.name(), error = %e, "the cluster's directory: watched again");
                        break;
                    }
                    None => break,
                };
                for input in each(k).unwrap_or_default() {
                    let Some(to_hub) = to_hub.upgrade() else {
                        return;
                    };
                    if to_hub.send(ToHub::Input(input)).await.is_err() {
                        return;
                    }
                }
            },
            Err(e) => {
                tracing::info!(bucket = bucket.name(), error = %e, "the cluster's directory cannot be watched yet")
            }
        }
        tokio::time::sleep(FOLLOW_RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // In tests a panic is the failure report.

    use super::*;

    fn summary(name: Option<&str>, doc: &str, pending: u32) -> ListSummary {
        let mut s: ListSummary = serde_json::from_value(serde_json::json!({
            "name": name, "document": doc, "version": null,
            "tasks": {"pending": 0, "in_progress": 0, "completed": 0, "cancelled": 0, "blocked": 0}
        }))
        .unwrap();
        s.tasks.pending = pending.into();
        s
    }

    fn names(page: &ListsPage) -> Vec<String> {
        page.lists.iter().map(key).collect()
    }

    #[test]
    fn the_index_pages_by_key_and_keeps_a_list_s_name_and_last_summary() {
        let index = ListIndex::default();
        index.set("d1", Some(summary(Some("b"), "d1", 1)));
        index.set("d2", Some(summary(None, "d2", 1)));
        index.set("d3", Some(summary(Some("a"), "d3", 1)));
        // Named later; then a summary without its name keeps it.
        index.set("d2", Some(summary(Some("c"), "d2", 2)));
        index.set("d2", Some(summary(None, "d2", 3)));
        let first = index.page(None, 2);
        assert_eq!(names(&first), ["a", "b"]);
        assert_eq!(first.next.as_deref(), Some("b"));
        let second = index.page(first.next.as_deref(), 2);
        assert_eq!(names(&second), ["c"]);
        assert_eq!(second.next, None);
        assert_eq!(second.lists[0].tasks.pending, 3);
        index.set("d3", None);
        assert_eq!(names(&index.page(None, 10)), ["b", "c"]);
    }
}
