//! The hub's runtime: a WebSocket listener and one task per connection, in front of the
//! hub task (`hub_task.rs`) that owns the [`HubCore`]. The bounds are in `limits.rs`
//! (re-exported here).
//!
//! Bounded everywhere: connections (a semaphore), frames and messages (tungstenite's
//! limits, set explicitly), the hub's input queue, and each connection's outbox (in
//! frames and in bytes). A peer whose outbox is full — it stopped reading — is closed
//! with 1008 `slow_reader`; it never grows the hub's memory or stalls the others.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{http, Message};

use swarmtodo_core::hub::{Close, ConnId, EventKinds, HubCore, Input};
use swarmtodo_proto::wire::{DocumentId, MESSAGE_BYTES_MAX};
use swarmtodo_store::Store;

pub use crate::access::{Access, Tokens};
use crate::channel::{Outbox, OutboxReader, ToHub};
use crate::hub_task::hub_task;
pub use crate::hub_task::ServeError;
pub use crate::limits::*;

/// Open connections per key (a remote address, a token).
type Counts<K> = Arc<std::sync::Mutex<std::collections::HashMap<K, usize>>>;

/// One connection counted under its key while it lives (released when dropped).
struct Slot<K: std::hash::Hash + Eq + Clone> {
    counts: Counts<K>,
    key: K,
}

impl<K: std::hash::Hash + Eq + Clone> Slot<K> {
    /// Counts one more connection under `key`, unless `max` are open already.
    fn take(counts: &Counts<K>, key: K, max: usize) -> Option<Slot<K>> {
        let mut map = counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(key.clone()).or_insert(0);
        if *n >= max {
            if *n == 0 {
                map.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(Slot {
            counts: counts.clone(),
            key,
        })
    }
}

impl<K: std::hash::Hash + Eq + Clone> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut map = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        .max_write_buffer_size(WRITE_BUFFER_BYTES_MAX)
        .max_message_size(Some(MESSAGE_BYTES_MAX))
        .max_frame_size(Some(FRAME_BYTES_MAX))
}

/// Serves `listener` until `shutdown` resolves: stops accepting, lets the hub task
/// finish what is queued (commits included), and closes every peer with 1001.
#[allow(clippy::too_many_arguments)] // The parts of a `Hub`, handed over once.
pub async fn run(
    listener: TcpListener,
    core: HubCore,
    store: Store,
    known: BTreeSet<DocumentId>,
    access: Access,
    limits: ConnLimits,
    cluster: Option<swarmtodo_cluster::Cluster>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    // The tokens the hub made for agents it delegated tasks to.
    if let Access::Tokens(tokens) = &access {
        let made = store
            .tokens()
            .await
            .map_err(|e| ServeError::Store(e.to_string()))?;
        for t in made {
            tokens.add_made(
                t.sha256,
                crate::access::delegated_identity(&t.agent, &t.list),
            );
        }
    }
    let access = Arc::new(access);
    // In a cluster: the index of every list (watched once the hub task runs).
    let directory = cluster.as_ref().map(|cluster| crate::directory::Directory {
        cluster: cluster.clone(),
        index: crate::directory::ListIndex::default(),
    });
    let limits = Arc::new(limits);
    let per_address: Counts<std::net::IpAddr> = Counts::default();
    let per_token: Counts<String> = Counts::default();
    let (to_hub, hub_rx) = mpsc::channel::<ToHub>(HUB_QUEUE_MAX);
    // The event streams and task histories read the lists' past themselves: from the
    // store, or in a cluster from the lists' logs.
    let events_store = store.clone();
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let past = match &cluster {
        Some(cluster) => crate::past::Past::Log(Box::new((cluster.clone(), metrics.clone()))),
        None => crate::past::Past::Store(store.clone()),
    };
    let history_reads = Arc::new(tokio::sync::Semaphore::new(
        crate::limits::HISTORY_READS_MAX,
    ));
    let mut hub = tokio::spawn(hub_task(
        core,
        store,
        known,
        hub_rx,
        to_hub.downgrade(),
        metrics.clone(),
        cluster,
    ));
    // The cluster's directory: the index, the tokens every hub made, links and counts
    // for the hub task; heard as it is now before the first connection is taken, so
    // that a hub that just started lists every list and admits every token.
    if let Some(d) = &directory {
        let heard = crate::directory::watch(
            &d.cluster,
            d.index.clone(),
            access.clone(),
            to_hub.downgrade(),
        );
        if !heard.wait(DIRECTORY_HEARD_WAIT_MAX).await {
            tracing::warn!(
                "the cluster's directory was not heard within {DIRECTORY_HEARD_WAIT_MAX:?}: serving; the index of lists and the tokens other hubs made come in as they are heard"
            );
        }
    }
    let permits = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let mut next_conn = 0u64;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            ended = &mut hub => {
                return match ended {
                    Ok(Err(e)) => Err(e),
                    Ok(Ok(())) => Ok(()),
                    Err(e) => Err(ServeError::HubTask(e.to_string())),
                };
            }
            accepted = listener.accept() => {
                let (stream, addr) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    tracing::warn!(%addr, "connection limit reached; refusing");
                    continue;
                };
                next_conn += 1;
                let id = ConnId(next_conn);
                // Over its address's bound, the upgrade is refused (HTTP 429, with the
                // reason) as soon as its request is read.
                let from = Slot::take(&per_address, addr.ip(), limits.per_address_max);
                if from.is_none() {
                    tracing::info!(%addr, "connections per address reached; refusing");
                }
                let conn = Conn {
                    id,
                    address: addr.ip(),
                    to_hub: to_hub.clone(),
                    access: access.clone(),
                    limits: limits.clone(),
                    per_token: per_token.clone(),
                };
                let store = events_store.clone();
                let past = past.clone();
                let directory = directory.clone();
                let metrics = metrics.clone();
                let history_reads = history_reads.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    match crate::http::is_http(&stream).await {
                        Some(true) => {
                            let api = crate::http::Api {
                                to_hub: conn.to_hub,
                                access: conn.access,
                                address: conn.address,
                                admitted: from.is_some(),
                                store,
                                past,
                                directory,
                                metrics,
                                history_reads,
                            };
                            let _counted = from;
                            crate::http::serve(stream, api).await;
                        }
                        Some(false) => serve_conn(conn, stream, from).await,
                        None => {}
                    }
                });
            }
        }
    }
    tracing::info!("shutting down: no new connections");
    let _ = to_hub.send(ToHub::Shutdown).await;
    drop(to_hub);
    // Connection tasks hold senders too; the hub task ends when they are all gone.
    match tokio::time::timeout(SHUTDOWN_GRACE, hub).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(ServeError::HubTask(e.to_string())),
        Err(_) => {
            tracing::warn!("peers did not leave within the grace period");
            Ok(())
        }
    }
}

/// What a connection's task needs of the server.
struct Conn {
    id: ConnId,
    address: std::net::IpAddr,
    to_hub: mpsc::Sender<ToHub>,
    access: Arc<Access>,
    limits: Arc<ConnLimits>,
    per_token: Counts<String>,
}

/// An HTTP refusal of a WebSocket upgrade: the status, and a body of a stable reason
/// code, a colon and what to do.
fn refusal(
    status: http::StatusCode,
    reason: &str,
    message: &str,
) -> http::Response<Option<String>> {
    let mut refusal = http::Response::new(Some(format!("{reason}: {message}")));
    *refusal.status_mut() = status;
    refusal
}

/// Serves one connection; `from` is its place under its address's bound (none: over
/// it, and the upgrade is refused).
async fn serve_conn(conn: Conn, stream: TcpStream, from: Option<Slot<std::net::IpAddr>>) {
    let Conn {
        id,
        address,
        to_hub,
        access,
        limits,
        per_token,
    } = conn;
    let _ = stream.set_nodelay(true);
    let mut who = None;
    let mut token_slot = None;
    let mut events = EventKinds::DEFAULT;
    // The signature is tungstenite's (`Callback`): its error is the HTTP response.
    #[allow(clippy::result_large_err)]
    let admit = |req: &http::Request<()>, resp: http::Response<()>| {
        if from.is_none() {
            let message = format!(
                "the hub allows {} connections from one address at once, and yours has them open: close one, or reconnect later",
                limits.per_address_max
            );
            return Err(refusal(
                http::StatusCode::TOO_MANY_REQUESTS,
                "connections_per_address",
                &message,
            ));
        }
        if let Some(asked) = req
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .find_map(|kv| kv.strip_prefix("events="))
        {
            match EventKinds::parse(&asked.replace("%2C", ",").replace("%2c", ",")) {
                Ok(kinds) => events = kinds,
                Err(why) => {
                    return Err(refusal(
                        http::StatusCode::BAD_REQUEST,
                        "events_invalid",
                        &why,
                    ));
                }
            }
        }
        match access.admit(req.uri()) {
            Ok(None) => Ok(resp),
            Ok(Some((token, identity))) => {
                let Some(slot) = Slot::take(&per_token, token, limits.per_token_max) else {
                    tracing::info!(conn = id.0, agent = %identity.agent, "connections per token reached; refusing");
                    let message = format!(
                        "the hub allows {} connections with one token at once, and yours has them open: close one, or reconnect later",
                        limits.per_token_max
                    );
                    return Err(refusal(
                        http::StatusCode::TOO_MANY_REQUESTS,
                        "connections_per_token",
                        &message,
                    ));
                };
                token_slot = Some(slot);
                who = Some(identity);
                Ok(resp)
            }
            Err(why) => {
                tracing::info!(conn = id.0, why, "connection refused");
                let mut refusal = http::Response::new(Some(why.to_owned()));
                *refusal.status_mut() = http::StatusCode::UNAUTHORIZED;
                Err(refusal)
            }
        }
    };
    let ws = match tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_tungstenite::accept_hdr_async_with_config(stream, admit, Some(ws_config())),
    )
    .await
    {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => {
            tracing::debug!(conn = id.0, error = %e, "websocket handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(conn = id.0, "websocket handshake timed out");
            return;
        }
    };
    // Counted under its address and token while it lives.
    let _counted = (from, token_slot);
    let (mut sink, mut stream) = ws.split();
    let (outbox, reader) = Outbox::new();
    let OutboxReader {
        frames: mut out_rx,
        close: mut close_rx,
        queued_bytes,
    } = reader;
    if to_hub
        .send(ToHub::Open {
            id,
            outbox,
            who,
            address,
            events,
        })
        .await
        .is_err()
    {
        return;
    }
    let mut writer = tokio::spawn(async move {
        let close = loop {
            tokio::select! {
                biased;
                close = &mut close_rx => break close.ok(),
                frame = out_rx.recv() => {
                    let Some(bytes) = frame else { break None };
                    // The frames already queued go out with it, in one write to the
                    // socket (a write's sync message and its events, say): one system
                    // call per peer instead of one per frame.
                    let mut frames = vec![bytes];
                    while frames.len() < WRITE_COALESCE_FRAMES_MAX {
                        match out_rx.try_recv() {
                            Ok(bytes) => frames.push(bytes),
                            Err(_) => break,
                        }
                    }
                    for bytes in &frames {
                        queued_bytes.fetch_sub(bytes.len(), Ordering::Relaxed);
                    }
                    let write = async {
                        for bytes in frames {
                            sink.feed(Message::Binary(bytes.into())).await?;
                        }
                        sink.flush().await
                    };
                    // A peer that stops reading blocks this write; a close must still
                    // get through, so the write races it.
                    tokio::select! {
                        sent = write => {
                            if let Err(e) = sent {
                                tracing::info!(conn = id.0, error = %e, "write to the peer failed: closing");
                                break None;
                            }
                        }
                        close = &mut close_rx => break close.ok(),
                    }
                }
            }
        };
        if let Some(close) = close {
            // Frames still queued are dropped (the peer is going, and a slow reader
            // would never take them); the error message saying why goes first, within a
            // bound, then the close frame.
            let _ = tokio::time::timeout(CLOSE_FLUSH_TIMEOUT, async {
                if let Some(message) = close.message {
                    let error = swarmtodo_proto::wire::WireMessage::Error {
                        sender_id: None,
                        target_id: None,
                        message,
                    };
                    let bytes = swarmtodo_proto::wire::encode(&error);
                    if sink.send(Message::Binary(bytes.into())).await.is_err() {
                        return;
                    }
                }
                let frame = CloseFrame {
                    code: CloseCode::from(close.code),
                    reason: close.reason.into(),
                };
                let _ = sink.send(Message::Close(Some(frame))).await;
            })
            .await;
        }
        let _ = tokio::time::timeout(CLOSE_FLUSH_TIMEOUT, sink.close()).await;
    });
    // Token bucket for the frame rate.
    let mut tokens = f64::from(FRAMES_BURST_MAX);
    let mut last = tokio::time::Instant::now();
    let mut writer_done = false;
    let kick = |code: u16, reason: &str, message: String| {
        ToHub::Kick(
            id,
            Close {
                code,
                reason: reason.to_owned(),
                message: Some(message),
            },
        )
    };
    // Until its first message (which must be `join`: anything else closes it in the
    // core), the connection has JOIN_TIMEOUT from the upgrade; pings do not extend it.
    let join_by = tokio::time::Instant::now() + limits.join_timeout;
    let mut joining = true;
    loop {
        let wait = if joining {
            join_by.saturating_duration_since(tokio::time::Instant::now())
        } else {
            IDLE_TIMEOUT
        };
        let next = tokio::select! {
            next = tokio::time::timeout(wait, stream.next()) => next,
            // The hub closed us (or the peer's socket failed): stop reading too, so the
            // socket and its buffers are released now, not at the idle timeout.
            _ = &mut writer => {
                writer_done = true;
                break;
            }
        };
        let frame = match next {
            Err(_) if joining => {
                tracing::info!(conn = id.0, "join timeout");
                let _ = to_hub
                    .send(kick(
                        1008,
                        "join_timeout",
                        format!(
                            "no join within {} ms of the upgrade: send join as soon as the WebSocket is open",
                            limits.join_timeout.as_millis()
                        ),
                    ))
                    .await;
                break;
            }
            Err(_) => {
                tracing::debug!(conn = id.0, "idle timeout");
                let _ = to_hub
                    .send(kick(
                        1001,
                        "idle_timeout",
                        "nothing received for too long: reconnect".to_owned(),
                    ))
                    .await;
                break;
            }
            Ok(None) => break,
            Ok(Some(Err(tokio_tungstenite::tungstenite::Error::Capacity(e)))) => {
                tracing::info!(conn = id.0, error = %e, "message over the size limit");
                let _ = to_hub
                    .send(kick(
                        1009,
                        "message_too_large",
                        format!("over the size limit ({e}): send smaller messages"),
                    ))
                    .await;
                break;
            }
            Ok(Some(Err(e))) => {
                tracing::debug!(conn = id.0, error = %e, "read failed");
                break;
            }
            Ok(Some(Ok(m))) => m,
        };
        let now = tokio::time::Instant::now();
        tokens = (tokens
            + now.duration_since(last).as_secs_f64() * f64::from(FRAMES_PER_SECOND_MAX))
        .min(f64::from(FRAMES_BURST_MAX));
        last = now;
        if tokens < 1.0 {
            tracing::info!(conn = id.0, "frame rate limit exceeded");
            let _ = to_hub
                .send(kick(
                    1008,
                    "rate_limit",
                    "more frames per second than allowed: slow down".to_owned(),
                ))
                .await;
            break;
        }
        tokens -= 1.0;
        if matches!(frame, Message::Binary(_) | Message::Text(_)) {
            joining = false;
        }
        match frame {
            Message::Binary(b) => {
                if to_hub
                    .send(ToHub::Input(Input::Frame(id, b.to_vec())))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            Message::Close(_) => break,
            // Text frames are not part of the protocol: the core rejects this byte.
            Message::Text(_) => {
                let bytes = b"\xff".to_vec();
                let _ = to_hub.send(ToHub::Input(Input::Frame(id, bytes))).await;
            }
            // Pings are answered by tungstenite.
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
        }
    }
    let _ = to_hub.send(ToHub::Input(Input::Disconnected(id))).await;
    if !writer_done
        && tokio::time::timeout(CLOSE_FLUSH_TIMEOUT * 2, &mut writer)
            .await
            .is_err()
    {
        writer.abort();
    }
}
