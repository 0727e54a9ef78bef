//! The hub's runtime: a WebSocket listener, one task per connection, and one hub task
//! that owns the [`HubCore`] and performs its effects (commit, then send, then close).
//!
//! Bounded everywhere: connections (a semaphore), frames and messages (tungstenite's
//! limits, set explicitly), the hub's input queue, and each connection's outbox. A peer
//! whose outbox is full — it stopped reading — is closed with 1008 `slow_reader`; it
//! never grows the hub's memory or stalls the others.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;

use super::core::{Close, ConnId, Effects, HubCore, Input};
use super::wire::{DocumentId, MESSAGE_BYTES_MAX};
use crate::store::Store;

/// Most connections served at once.
pub const CONNECTIONS_MAX: usize = 10_000;
/// Frames queued for one connection before it counts as a slow reader and is closed.
pub const OUTBOX_FRAMES_MAX: usize = 256;
/// Inputs queued for the hub task (connections wait when it is full).
pub const HUB_QUEUE_MAX: usize = 4_096;
/// Largest WebSocket frame accepted.
pub const FRAME_BYTES_MAX: usize = 1024 * 1024;
/// WebSocket read buffer per connection (tungstenite grows it on demand up to a message).
pub const READ_BUFFER_BYTES: usize = 4 * 1024;
/// WebSocket write buffer per connection before a flush.
pub const WRITE_BUFFER_BYTES: usize = 4 * 1024;
/// Most bytes tungstenite may hold unsent for one connection.
pub const WRITE_BUFFER_BYTES_MAX: usize = 8 * 1024 * 1024;
/// A connection must finish the WebSocket handshake within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection that sends nothing for this long is closed (clients ping).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long shutdown waits for queued work and peers to leave.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Frames per second one connection may send on average …
pub const FRAMES_PER_SECOND_MAX: u32 = 1_000;
/// … with bursts up to this many.
pub const FRAMES_BURST_MAX: u32 = 2_000;

const _: () = assert!(FRAME_BYTES_MAX <= MESSAGE_BYTES_MAX);
const _: () = assert!(WRITE_BUFFER_BYTES < WRITE_BUFFER_BYTES_MAX);

/// What the hub task receives.
#[derive(Debug)]
enum ToHub {
    /// A connection opened, with its outbox.
    Open(ConnId, Outbox),
    /// An input for the core.
    Input(Input),
    /// Stop: everything queued before this is handled (and committed) first; then every
    /// peer is closed with 1001.
    Shutdown,
}

/// The hub's handle on one connection's writer.
#[derive(Debug)]
struct Outbox {
    /// Frames to send, bounded by [`OUTBOX_FRAMES_MAX`].
    frames: mpsc::Sender<Vec<u8>>,
    /// Closes the connection with a code; separate from `frames` so that a full outbox
    /// can still be closed.
    close: oneshot::Sender<Close>,
}

impl Outbox {
    fn close(self, close: Close) {
        let _ = self.close.send(close);
    }
}

/// The hub failed in a way that must stop it (a commit that is not durable).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store refused a commit: nothing of it was relayed, and the hub stopped.
    #[error("store: {0}")]
    Store(String),
    /// The hub task ended abnormally (a panic outside a list's merge).
    #[error("hub task: {0}")]
    HubTask(String),
    /// Accepting failed.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
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
pub async fn run(
    listener: TcpListener,
    core: HubCore,
    store: Store,
    known: BTreeSet<DocumentId>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let (to_hub, hub_rx) = mpsc::channel::<ToHub>(HUB_QUEUE_MAX);
    let mut hub = tokio::spawn(hub_task(core, store, known, hub_rx));
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
                let to_hub = to_hub.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    serve_conn(id, stream, to_hub).await;
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

async fn serve_conn(id: ConnId, stream: TcpStream, to_hub: mpsc::Sender<ToHub>) {
    let _ = stream.set_nodelay(true);
    let ws = match tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_tungstenite::accept_async_with_config(stream, Some(ws_config())),
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
    let (mut sink, mut stream) = ws.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(OUTBOX_FRAMES_MAX);
    let (close_tx, mut close_rx) = oneshot::channel::<Close>();
    let outbox = Outbox {
        frames: out_tx,
        close: close_tx,
    };
    if to_hub.send(ToHub::Open(id, outbox)).await.is_err() {
        return;
    }
    let writer = tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                close = &mut close_rx => {
                    if let Ok(close) = close {
                        let frame = CloseFrame {
                            code: CloseCode::from(close.code),
                            reason: close.reason.into(),
                        };
                        let _ = sink.send(Message::Close(Some(frame))).await;
                    }
                    break;
                }
                frame = out_rx.recv() => {
                    let Some(bytes) = frame else { break };
                    if sink.send(Message::Binary(bytes.into())).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = sink.close().await;
    });
    // Token bucket for the frame rate.
    let mut tokens = f64::from(FRAMES_BURST_MAX);
    let mut last = tokio::time::Instant::now();
    loop {
        let next = tokio::time::timeout(IDLE_TIMEOUT, stream.next()).await;
        let frame = match next {
            Err(_) => {
                tracing::debug!(conn = id.0, "idle timeout");
                break;
            }
            Ok(None) => break,
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
            break;
        }
        tokens -= 1.0;
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
            // Pings are answered by tungstenite; text frames are not part of the protocol.
            Message::Text(_) => {
                let bytes = b"\xff".to_vec(); // Not CBOR of a message: the core rejects it.
                let _ = to_hub.send(ToHub::Input(Input::Frame(id, bytes))).await;
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
        }
    }
    let _ = to_hub.send(ToHub::Input(Input::Disconnected(id))).await;
    let _ = writer.await;
}

async fn hub_task(
    mut core: HubCore,
    store: Store,
    mut known: BTreeSet<DocumentId>,
    mut rx: mpsc::Receiver<ToHub>,
) -> Result<(), ServeError> {
    let mut outboxes: BTreeMap<ConnId, Outbox> = BTreeMap::new();
    while let Some(msg) = rx.recv().await {
        let input = match msg {
            ToHub::Open(id, outbox) => {
                outboxes.insert(id, outbox);
                Input::Connected(id)
            }
            ToHub::Input(i) => i,
            ToHub::Shutdown => break,
        };
        if let Input::Disconnected(id) = &input {
            outboxes.remove(id);
        }
        let fx = core.handle(now_ms(), input);
        if let Err(e) = perform(&mut core, &store, &mut known, &mut outboxes, fx).await {
            for (_, outbox) in std::mem::take(&mut outboxes) {
                outbox.close(Close {
                    code: 1011,
                    reason: "store_failed".to_owned(),
                });
            }
            return Err(e);
        }
    }
    for (_, outbox) in outboxes {
        outbox.close(Close {
            code: 1001,
            reason: "shutdown".to_owned(),
        });
    }
    Ok(())
}

async fn perform(
    core: &mut HubCore,
    store: &Store,
    known: &mut BTreeSet<DocumentId>,
    outboxes: &mut BTreeMap<ConnId, Outbox>,
    fx: Effects,
) -> Result<(), ServeError> {
    // Durable first: nothing is relayed before it is on disk. A commit that fails stops
    // the hub: what is not durable must not be relayed or acknowledged.
    for commit in fx.commits {
        super::persist::commit(store, known, commit, now_ms())
            .await
            .map_err(|e| ServeError::Store(e.to_string()))?;
    }
    for doc in fx.reloads {
        super::persist::reload(store, core, doc)
            .await
            .map_err(|e| ServeError::Store(e.to_string()))?;
    }
    for c in fx.compactions {
        // A failed compaction loses nothing (the changes stay); log and go on.
        if let Err(e) = store
            .compact(super::persist::doc_id(&c.doc), c.snapshot, c.heads)
            .await
        {
            tracing::warn!(doc = %c.doc, error = %e, "compaction failed");
        }
    }
    let mut slow = Vec::new();
    for (id, frame) in fx.sends {
        let Some(outbox) = outboxes.get(&id) else {
            continue;
        };
        if outbox.frames.try_send(frame).is_err() {
            slow.push(id);
        }
    }
    for (id, close) in fx.closes {
        if let Some(outbox) = outboxes.remove(&id) {
            outbox.close(close);
        }
    }
    for id in slow {
        if let Some(outbox) = outboxes.remove(&id) {
            tracing::info!(conn = id.0, "outbox full: closing a slow reader");
            outbox.close(Close {
                code: 1008,
                reason: "slow_reader".to_owned(),
            });
        }
        let _ = core.handle(now_ms(), Input::Disconnected(id));
    }
    Ok(())
}
