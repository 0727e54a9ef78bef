//! The resumable event stream of a list over Server-Sent Events
//! (`GET /v1/lists/{name}/events?from=SEQ`, or `Last-Event-ID`): first a `snapshot`,
//! then every event after the one named, in `seq` order, each once.
//!
//! No gap and no duplicate, across reconnects and slow readers: a reader subscribes to
//! the list's live events ([`Streams`]), so every event after that moment reaches it
//! live and every event before is in the list's past ([`Past`]); it reads the past from
//! where it resumes, then takes the live events past the last one it sent. A reader
//! that falls [`STREAM_BUFFERED_MAX`] events behind the live stream goes back to the
//! past from its last event. A stream silent for [`STREAM_KEEPALIVE`] sends a comment
//! line.
//!
//! A hub alone feeds the live events after each durable commit, and its store is the
//! past. A hub of a cluster feeds them from the list's log, followed while some reader
//! follows the list (`swarmtodo_cluster::Follow`), and the log is the past: a reader
//! at any hub sees every event of the list, whichever hub holds it, across failovers.
//! The follower keeps the list's last [`STREAM_RECENT_MAX`] events ([`Recent`]): a
//! reader that resumes within them — every reader reconnecting after a failover — reads
//! its past from memory, not the whole log.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::StreamBody;
use hyper::body::{Bytes, Frame};
use tokio::sync::{broadcast, mpsc};

use swarmtodo_cluster::limits::FOLLOW_RETRY;
use swarmtodo_cluster::Cluster;
use swarmtodo_core::hub::{Commit, Stored};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::{Event, Snapshot};
use swarmtodo_store::{persist, StoredEvent};

use crate::limits::{STREAM_BUFFERED_MAX, STREAM_KEEPALIVE, STREAM_PAGE_MAX, STREAM_RECENT_MAX};
use crate::past::Past;

/// One event as a stream carries it: its `seq` and its SSE message (made once for every
/// reader).
pub(crate) type Live = (u64, Bytes);

/// A reader's hold on one list's live events.
#[derive(Debug)]
pub(crate) struct Subscription {
    /// The events committed from when it subscribed on.
    pub(crate) live: broadcast::Receiver<Live>,
    /// In a cluster: the last events of the list, as its follower read them.
    pub(crate) recent: Option<Recent>,
}

impl Subscription {
    /// The `seq` of list `doc`'s last event: as the follower of its log read it, or
    /// from `past`.
    pub(crate) async fn last_seq(&self, past: &Past, doc: DocumentId) -> Result<u64, String> {
        match self.recent.as_ref().and_then(Recent::last_seq) {
            Some(last) => Ok(last),
            None => past.last_event_seq(doc).await,
        }
    }
}

/// The live events of every list some reader follows (kept by the hub task).
#[derive(Debug, Default)]
pub(crate) struct Streams {
    lists: BTreeMap<DocumentId, (broadcast::Sender<Live>, Option<Recent>)>,
    /// In a cluster: the cluster whose logs feed the live events.
    logs: Option<Cluster>,
}

/// In a cluster: the last [`STREAM_RECENT_MAX`] events of a list its log's follower
/// read (shared by the follower, which keeps them, and the list's readers). It is
/// filled before the events go out live, so a reader that subscribed, then found its
/// past here, misses none that came after.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recent {
    inner: Arc<Mutex<Window>>,
}

#[derive(Debug, Default)]
struct Window {
    /// The follower read the log once at least: what follows means something.
    read: bool,
    /// The last events read, in `seq` order, at most [`STREAM_RECENT_MAX`].
    events: VecDeque<StoredEvent>,
    /// The `seq` of the last event read (0: none).
    last: u64,
}

impl Recent {
    /// The events after `last`, if those are all here (`None`: read the past).
    pub(crate) fn after(&self, last: u64) -> Option<Vec<StoredEvent>> {
        let w = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let first = w.events.front().map_or(w.last + 1, |e| e.seq);
        (w.read && last + 1 >= first)
            .then(|| w.events.iter().filter(|e| e.seq > last).cloned().collect())
    }

    /// The `seq` of the list's last event, once the follower read the log.
    pub(crate) fn last_seq(&self) -> Option<u64> {
        let w = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        w.read.then_some(w.last)
    }

    /// Keeps `events`, read next from the log.
    fn keep(&self, events: &[StoredEvent]) {
        let mut w = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        w.read = true;
        let skip = events.len().saturating_sub(STREAM_RECENT_MAX);
        for e in &events[skip..] {
            w.last = e.seq;
            w.events.push_back(e.clone());
        }
        while w.events.len() > STREAM_RECENT_MAX {
            w.events.pop_front();
        }
    }
}

impl Streams {
    /// The live events of a hub alone (fed by [`Streams::publish`]), or of a hub of
    /// `cluster` (fed from the lists' logs).
    pub(crate) fn new(cluster: Option<Cluster>) -> Streams {
        Streams {
            lists: BTreeMap::new(),
            logs: cluster,
        }
    }

    /// A hold on list `doc`'s events committed from now on.
    pub(crate) fn subscribe(&mut self, doc: DocumentId) -> Subscription {
        // Lists nobody follows any more (readers gone, or a list that never existed)
        // go: the map holds at most the lists of the streams open. (A log's follower
        // sees its readers gone and ends.)
        self.lists.retain(|_, (tx, _)| tx.receiver_count() > 0);
        let logs = &self.logs;
        let (tx, recent) = self.lists.entry(doc).or_insert_with(|| {
            let tx = broadcast::channel(STREAM_BUFFERED_MAX).0;
            let recent = logs.as_ref().map(|cluster| {
                let recent = Recent::default();
                cluster.spawn(follow_log(cluster.clone(), doc, tx.clone(), recent.clone()));
                recent
            });
            (tx, recent)
        });
        Subscription {
            live: tx.subscribe(),
            recent: recent.clone(),
        }
    }

    /// The events of the durable ones of `commits` (the store's answers, in order), to
    /// their lists' readers; a list nobody follows any more is forgotten.
    /// (In a cluster the logs feed them: nothing to do.)
    pub(crate) fn publish(&mut self, commits: &[Commit], stored: &[Stored], at_ms: i64) {
        if self.lists.is_empty() || self.logs.is_some() {
            return;
        }
        for (commit, stored) in commits.iter().zip(stored) {
            let Stored::Durable(seqs) = stored else {
                continue;
            };
            let Some((tx, _)) = self.lists.get(&commit.doc) else {
                continue;
            };
            if tx.receiver_count() == 0 {
                self.lists.remove(&commit.doc);
                continue;
            }
            for (body, &seq) in commit.events.iter().zip(seqs) {
                let event = Event {
                    seq,
                    list: commit.doc.to_string(),
                    at_ms,
                    body: body.clone(),
                };
                if let Ok(json) = serde_json::to_string(&event) {
                    let _ = tx.send((seq, message(persist::kind(body), Some(seq), &json)));
                }
            }
        }
    }
}

/// An SSE body fed by a task of its own, which ends when the reader goes away.
pub(crate) type SseBody =
    StreamBody<futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

/// The stream of list `doc` for a reader that has seen every event up to `from`,
/// starting with `snapshot`; `subscribed` before the snapshot was read.
pub(crate) fn sse(
    past: Past,
    doc: DocumentId,
    from: u64,
    snapshot: Snapshot,
    subscribed: Subscription,
) -> SseBody {
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_PAGE_MAX);
    tokio::spawn(async move {
        if let Err(why) = feed(&past, doc, from, snapshot, subscribed, &tx).await {
            tracing::debug!(%doc, why, "event stream ended");
        }
    });
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|bytes| (Ok(Frame::data(bytes)), rx))
    });
    StreamBody::new(Box::pin(frames))
}

/// One SSE message.
fn message(kind: &str, id: Option<u64>, json: &str) -> Bytes {
    let mut m = String::with_capacity(json.len() + 40);
    if let Some(id) = id {
        m.push_str(&format!("id: {id}\n"));
    }
    m.push_str(&format!("event: {kind}\ndata: {json}\n\n"));
    Bytes::from(m)
}

async fn feed(
    past: &Past,
    doc: DocumentId,
    from: u64,
    snapshot: Snapshot,
    subscribed: Subscription,
    tx: &mpsc::Sender<Bytes>,
) -> Result<(), &'static str> {
    let Subscription { mut live, recent } = subscribed;
    let gone = "the reader left";
    let json = serde_json::to_string(&snapshot).map_err(|_| "snapshot")?;
    tx.send(message("snapshot", None, &json))
        .await
        .map_err(|_| gone)?;
    let mut last = from;
    loop {
        // From the past, everything after `last` (in pages), then live.
        loop {
            let kept = recent.as_ref().and_then(|r| r.after(last));
            let (page, more) = match kept {
                Some(kept) => (kept, false),
                None => past.events_after(doc, last).await.map_err(|why| {
                    tracing::info!(%doc, why, "an event stream could not read the list's past");
                    "the list's past could not be read"
                })?,
            };
            for e in page {
                let json = stored_event_json(&doc, e.seq, &e.json);
                tx.send(message(&e.kind, Some(e.seq), &json))
                    .await
                    .map_err(|_| gone)?;
                last = e.seq;
            }
            if !more {
                break;
            }
        }
        loop {
            let Ok(next) = tokio::time::timeout(STREAM_KEEPALIVE, live.recv()).await else {
                tx.send(Bytes::from_static(b": keep-alive\n\n"))
                    .await
                    .map_err(|_| gone)?;
                continue;
            };
            match next {
                Ok((seq, _)) if seq <= last => {}
                Ok((seq, message)) if seq == last + 1 => {
                    tx.send(message).await.map_err(|_| gone)?;
                    last = seq;
                }
                // A gap (an event it has not seen yet was committed before it
                // subscribed): back to the past.
                Ok(_) => break,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::info!(%doc, last, missed, "an event stream fell behind the live events: it goes on from the list's past");
                    break;
                }
                Err(broadcast::error::RecvError::Closed) => return Err("the hub stopped"),
            }
        }
    }
}

/// In a cluster: feeds `tx` with list `doc`'s events as its log takes them, until no
/// reader is left (noticed within [`STREAM_KEEPALIVE`]), keeping the last of them in
/// `recent` first. Of the events the log held when it started, only the last goes out:
/// a reader that read its past before that one sees the gap and reads its past again;
/// one that read it after sees nothing new.
async fn follow_log(
    cluster: Cluster,
    doc: DocumentId,
    tx: broadcast::Sender<Live>,
    recent: Recent,
) {
    let send = |e: StoredEvent| {
        let json = stored_event_json(&doc, e.seq, &e.json);
        let _ = tx.send((e.seq, message(&e.kind, Some(e.seq), &json)));
    };
    let mut follow = loop {
        match cluster.follow(persist::doc_id(&doc)).await {
            Ok(follow) => break follow,
            Err(e) => tracing::info!(%doc, error = %e, "the list's log cannot be followed yet"),
        }
        if tx.receiver_count() == 0 {
            return;
        }
        tokio::time::sleep(FOLLOW_RETRY).await;
    };
    // The first read takes what the log holds now, without waiting.
    let mut first = true;
    while tx.receiver_count() > 0 {
        let wait = if first {
            Duration::ZERO
        } else {
            STREAM_KEEPALIVE
        };
        match follow.next(wait).await {
            Ok(events) if first => {
                first = false;
                recent.keep(&events);
                if let Some(last) = events.into_iter().last() {
                    send(last);
                }
            }
            Ok(events) => {
                recent.keep(&events);
                events.into_iter().for_each(send);
            }
            Err(e) => {
                tracing::info!(%doc, error = %e, "the list's log could not be read: again in a moment");
                tokio::time::sleep(FOLLOW_RETRY).await;
            }
        }
    }
    tracing::debug!(%doc, "no reader follows the list's log any more");
}

/// A stored event's JSON (`at_ms` and the body) as an [`Event`]: with its `seq` and list.
fn stored_event_json(doc: &DocumentId, seq: u64, stored: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(stored) {
        Ok(serde_json::Value::Object(mut o)) => {
            o.insert("seq".into(), seq.into());
            o.insert("list".into(), doc.to_string().into());
            serde_json::Value::Object(o).to_string()
        }
        _ => stored.to_owned(),
    }
}
