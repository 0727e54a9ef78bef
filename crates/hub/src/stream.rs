//! The resumable event stream of a list over Server-Sent Events
//! (`GET /v1/lists/{name}/events?from=SEQ`, or `Last-Event-ID`): first a `snapshot`,
//! then every event after the one named, in `seq` order, each once.
//!
//! No gap and no duplicate, across reconnects and slow readers: a reader subscribes to
//! the list's live events in the hub task ([`Streams`], fed after each durable commit),
//! so every event committed after that moment reaches it live and every event before is
//! in the store; it reads the store from where it resumes, then takes the live events
//! past the last one it sent. A reader that falls [`STREAM_BUFFERED_MAX`] events behind
//! the live stream goes back to the store from its last event. A stream silent for
//! [`STREAM_KEEPALIVE`] sends a comment line.

use std::collections::BTreeMap;
use std::convert::Infallible;

use http_body_util::StreamBody;
use hyper::body::{Bytes, Frame};
use tokio::sync::{broadcast, mpsc};

use crate::limits::{STREAM_BUFFERED_MAX, STREAM_KEEPALIVE, STREAM_PAGE_MAX};
use swarmtodo_core::hub::{Commit, Stored};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::{Event, Snapshot};
use swarmtodo_store::{persist, Store};

/// One event as a stream carries it: its `seq` and its SSE message (made once for every
/// reader).
pub(crate) type Live = (u64, Bytes);

/// The live events of every list some reader follows (kept by the hub task).
#[derive(Debug, Default)]
pub(crate) struct Streams {
    lists: BTreeMap<DocumentId, broadcast::Sender<Live>>,
}

impl Streams {
    /// A receiver of list `doc`'s events committed from now on.
    pub(crate) fn subscribe(&mut self, doc: DocumentId) -> broadcast::Receiver<Live> {
        // Lists nobody follows any more (readers gone, or a list that never existed)
        // go: the map holds at most the lists of the streams open.
        self.lists.retain(|_, tx| tx.receiver_count() > 0);
        self.lists
            .entry(doc)
            .or_insert_with(|| broadcast::channel(STREAM_BUFFERED_MAX).0)
            .subscribe()
    }

    /// The events of the durable ones of `commits` (the store's answers, in order), to
    /// their lists' readers; a list nobody follows any more is forgotten.
    pub(crate) fn publish(&mut self, commits: &[Commit], stored: &[Stored], at_ms: i64) {
        if self.lists.is_empty() {
            return;
        }
        for (commit, stored) in commits.iter().zip(stored) {
            let Stored::Durable(seqs) = stored else {
                continue;
            };
            let Some(tx) = self.lists.get(&commit.doc) else {
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
/// starting with `snapshot`; `live` was subscribed before the snapshot was read.
pub(crate) fn sse(
    store: Store,
    doc: DocumentId,
    from: u64,
    snapshot: Snapshot,
    live: broadcast::Receiver<Live>,
) -> SseBody {
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_PAGE_MAX);
    tokio::spawn(async move {
        if let Err(why) = feed(&store, doc, from, snapshot, live, &tx).await {
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
    store: &Store,
    doc: DocumentId,
    from: u64,
    snapshot: Snapshot,
    mut live: broadcast::Receiver<Live>,
    tx: &mpsc::Sender<Bytes>,
) -> Result<(), &'static str> {
    let gone = "the reader left";
    let json = serde_json::to_string(&snapshot).map_err(|_| "snapshot")?;
    tx.send(message("snapshot", None, &json))
        .await
        .map_err(|_| gone)?;
    let mut last = from;
    loop {
        // From the store, everything past `last` (in pages), then live.
        loop {
            let page = store
                .events_since(persist::doc_id(&doc), last, STREAM_PAGE_MAX)
                .await
                .map_err(|_| "the store failed")?;
            let n = page.len();
            for e in page {
                let json = stored_event_json(&doc, e.seq, &e.json);
                tx.send(message(&e.kind, Some(e.seq), &json))
                    .await
                    .map_err(|_| gone)?;
                last = e.seq;
            }
            if n < STREAM_PAGE_MAX {
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
                // subscribed): back to the store.
                Ok(_) => break,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::info!(%doc, last, missed, "an event stream fell behind the live events: it goes on from the store");
                    break;
                }
                Err(broadcast::error::RecvError::Closed) => return Err("the hub stopped"),
            }
        }
    }
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
