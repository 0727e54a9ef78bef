//! The hub's runtime: a WebSocket listener, one task per connection, and one hub task
//! that owns the [`HubCore`] and performs its effects with the one driver the simulator
//! uses too (`swarmtodo_store::drive`): commit, then send, then close.
//!
//! Bounded everywhere: connections (a semaphore), frames and messages (tungstenite's
//! limits, set explicitly), the hub's input queue, and each connection's outbox (in
//! frames and in bytes). A peer whose outbox is full — it stopped reading — is closed
//! with 1008 `slow_reader`; it never grows the hub's memory or stalls the others.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{http, Message};

use automerge::ActorId;
use swarmtodo_core::hub::{
    Close, Commit, Compaction, ConnId, Effects, HubCore, Identity, Input, Stored, StoredList,
};
use swarmtodo_proto::wire::{DocumentId, MESSAGE_BYTES_MAX};
use swarmtodo_store::drive::{self, Io};
use swarmtodo_store::{Store, StoreError};

/// Most connections served at once.
pub const CONNECTIONS_MAX: usize = 10_000;
/// Frames queued for one connection before it counts as a slow reader and is closed.
pub const OUTBOX_FRAMES_MAX: usize = 256;
/// Bytes queued for one connection before it counts as a slow reader and is closed
/// (besides tungstenite's own write buffer). A frame is refused only when this much is
/// queued already, so that one message larger than the bound (a single large change;
/// sync messages carry at most `SYNC_CHANGES_BYTES_MAX` of changes) still goes out:
/// what one stalled peer can pin is this plus one message (`MESSAGE_BYTES_MAX`).
pub const OUTBOX_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Bytes queued for a connection past which relayed `ephemeral` messages to it are
/// dropped instead of queued (`Effects::relays`): a quarter of [`OUTBOX_BYTES_MAX`], so
/// that a flood of relays never makes an honest receiver a slow reader, and its sync
/// messages and events always have room.
pub const RELAY_OUTBOX_BYTES_MAX: usize = OUTBOX_BYTES_MAX / 4;
/// Frames queued for a connection past which relays to it are dropped: a quarter of
/// [`OUTBOX_FRAMES_MAX`], for the same reason.
pub const RELAY_OUTBOX_FRAMES_MAX: usize = OUTBOX_FRAMES_MAX / 4;
/// Inputs queued for the hub task (connections wait when it is full).
pub const HUB_QUEUE_MAX: usize = 4_096;
/// Largest WebSocket frame accepted.
pub const FRAME_BYTES_MAX: usize = 1024 * 1024;
/// Most frames the hub merges before it answers (frames already queued when it turns
/// to the queue; it never waits for more).
pub const BATCH_FRAMES_MAX: usize = 256;
/// Frames a connection's writer takes from its outbox for one write to the socket.
pub const WRITE_COALESCE_FRAMES_MAX: usize = 64;
/// WebSocket read buffer per connection (tungstenite grows it on demand up to a message).
pub const READ_BUFFER_BYTES: usize = 4 * 1024;
/// WebSocket write buffer per connection before a flush.
pub const WRITE_BUFFER_BYTES: usize = 4 * 1024;
/// Most bytes tungstenite may hold unsent for one connection. A message larger than
/// this cannot be sent: the connection is closed (logged "write to the peer failed").
/// A peer far behind gets what it lacks over several sync messages, each with at most
/// `SYNC_CHANGES_BYTES_MAX` of changes (see ARCHITECTURE.md), well under this.
pub const WRITE_BUFFER_BYTES_MAX: usize = 8 * 1024 * 1024;
/// A connection must finish the WebSocket handshake within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection that sends nothing for this long is closed (clients ping).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// A connection whose WebSocket upgrade is done must send `join` (its first message)
/// within this, or it is closed with `join_timeout`: an upgraded connection that never
/// joins costs a connection slot, a socket and two tasks, and without a bound a peer
/// could hold every slot (`CONNECTIONS_MAX`) with upgrades that never join. Clients
/// join as soon as the upgrade is done.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections open at once from one remote IP address (upgrades in progress
/// included). One address cannot hold every slot (`CONNECTIONS_MAX`) and lock the
/// others out. Above what one machine's swarm opens: the live 1,000-agent simulation and
/// the side-by-side bench open about 1,000 loopback connections at once.
pub const CONNECTIONS_PER_ADDRESS_MAX: usize = 4_096;
/// Most connections open at once with one token (one agent: its sessions, each syncing
/// any number of lists over one connection). A leaked or hostile token cannot hold
/// every slot.
pub const CONNECTIONS_PER_TOKEN_MAX: usize = 256;
/// How long a closing connection may take to flush its last frames and close.
pub const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// How long shutdown waits for queued work and peers to leave.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Frames per second one connection may send on average …
pub const FRAMES_PER_SECOND_MAX: u32 = 1_000;
/// … with bursts up to this many.
pub const FRAMES_BURST_MAX: u32 = 2_000;

const _: () = assert!(FRAME_BYTES_MAX <= MESSAGE_BYTES_MAX);
const _: () = assert!(WRITE_BUFFER_BYTES < WRITE_BUFFER_BYTES_MAX);

/// The bounds on connections, configurable (`[limits]` of the `serve --config` file)
/// so that tests can use small ones; the defaults are the named constants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    /// See [`JOIN_TIMEOUT`].
    pub join_timeout: Duration,
    /// See [`CONNECTIONS_PER_ADDRESS_MAX`].
    pub per_address_max: usize,
    /// See [`CONNECTIONS_PER_TOKEN_MAX`].
    pub per_token_max: usize,
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            join_timeout: JOIN_TIMEOUT,
            per_address_max: CONNECTIONS_PER_ADDRESS_MAX,
            per_token_max: CONNECTIONS_PER_TOKEN_MAX,
        }
    }
}

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

/// What the hub task receives.
#[derive(Debug)]
enum ToHub {
    /// A connection opened, with its outbox, who its token says it is and where it
    /// comes from.
    Open(ConnId, Outbox, Option<Identity>, std::net::IpAddr),
    /// An input for the core.
    Input(Input),
    /// Close a connection for a reason found outside the core (rate, size, idleness):
    /// an `error` message, then the close frame.
    Kick(ConnId, Close),
    /// A list the core asked for (`Effects::loads`), loaded from the store by a task of
    /// its own (the hub task goes on meanwhile; the frames for it wait in the core).
    Loaded(
        DocumentId,
        Box<Result<Option<swarmtodo_core::hub::StoredList>, swarmtodo_store::StoreError>>,
    ),
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
    /// Bytes in `frames` not yet written to the socket (the writer subtracts).
    queued_bytes: Arc<AtomicUsize>,
}

impl Outbox {
    fn close(self, close: Close) {
        let _ = self.close.send(close);
    }

    /// Queues a frame; `Err(true)` when the peer is too far behind (frames, or
    /// [`OUTBOX_BYTES_MAX`] queued already), `Err(false)` when its connection is gone.
    fn push(&self, frame: Vec<u8>) -> Result<(), bool> {
        let n = frame.len();
        if self.queued_bytes.load(Ordering::Relaxed) >= OUTBOX_BYTES_MAX {
            return Err(true);
        }
        self.queued_bytes.fetch_add(n, Ordering::Relaxed);
        if let Err(e) = self.frames.try_send(frame) {
            self.queued_bytes.fetch_sub(n, Ordering::Relaxed);
            return Err(matches!(e, mpsc::error::TrySendError::Full(_)));
        }
        Ok(())
    }

    /// Queues a relayed frame unless the peer already has [`RELAY_OUTBOX_BYTES_MAX`] or
    /// [`RELAY_OUTBOX_FRAMES_MAX`] queued; false when it was dropped. A relay never
    /// makes its receiver a slow reader.
    fn offer(&self, frame: Vec<u8>) -> bool {
        let queued_frames = OUTBOX_FRAMES_MAX.saturating_sub(self.frames.capacity());
        if self.queued_bytes.load(Ordering::Relaxed) + frame.len() > RELAY_OUTBOX_BYTES_MAX
            || queued_frames >= RELAY_OUTBOX_FRAMES_MAX
        {
            return false;
        }
        self.push(frame).is_ok()
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
    access: Access,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let access = Arc::new(access);
    let limits = Arc::new(limits);
    let per_address: Counts<std::net::IpAddr> = Counts::default();
    let per_token: Counts<String> = Counts::default();
    let (to_hub, hub_rx) = mpsc::channel::<ToHub>(HUB_QUEUE_MAX);
    let mut hub = tokio::spawn(hub_task(core, store, known, hub_rx, to_hub.downgrade()));
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
                tokio::spawn(async move {
                    let _permit = permit;
                    serve_conn(conn, stream, from).await;
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

/// Who may connect (docs/DESIGN.md §7).
#[derive(Debug, Clone, Default)]
pub enum Access {
    /// Anyone who can reach the socket (the default: loopback only).
    #[default]
    Open,
    /// Only connections whose URL carries a known `?token=`; each acts as the token's
    /// identity.
    Tokens(BTreeMap<String, Identity>),
}

impl Access {
    /// The token and identity for a WebSocket upgrade request's URI, or the HTTP
    /// refusal.
    fn admit(&self, uri: &http::Uri) -> Result<Option<(String, Identity)>, &'static str> {
        let Access::Tokens(tokens) = self else {
            return Ok(None);
        };
        let token = uri
            .query()
            .unwrap_or("")
            .split('&')
            .find_map(|kv| kv.strip_prefix("token="));
        match token {
            None => Err("this hub needs a token: connect to ws://HOST:PORT/?token=YOUR_TOKEN"),
            Some(t) => tokens
                .get(t)
                .map(|who| Some((t.to_owned(), who.clone())))
                .ok_or("unknown token: ask the hub's operator for yours"),
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
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(OUTBOX_FRAMES_MAX);
    let (close_tx, mut close_rx) = oneshot::channel::<Close>();
    let queued_bytes = Arc::new(AtomicUsize::new(0));
    let outbox = Outbox {
        frames: out_tx,
        close: close_tx,
        queued_bytes: queued_bytes.clone(),
    };
    if to_hub
        .send(ToHub::Open(id, outbox, who, address))
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

async fn hub_task(
    mut core: HubCore,
    store: Store,
    known: BTreeSet<DocumentId>,
    mut rx: mpsc::Receiver<ToHub>,
    loaded_to: mpsc::WeakSender<ToHub>,
) -> Result<(), ServeError> {
    let mut out = Relay {
        store,
        known,
        outboxes: BTreeMap::new(),
        loaded_to,
    };
    // A message taken from the queue while gathering a batch, handled next.
    let mut stashed: Option<ToHub> = None;
    // Lists dropped from memory since the freed heap was last given back.
    let mut dropped = 0usize;
    loop {
        // What a busy moment deferred goes out before the hub idles: when nothing
        // waits, even after the connections had their turn to read (this task runs
        // again before they do otherwise, and would always find the queue empty).
        let deferred = core.deferred();
        if deferred && stashed.is_none() && rx.is_empty() {
            tokio::task::yield_now().await;
        }
        if deferred && stashed.is_none() && rx.is_empty() {
            let fx = core.handle(now_ms(), Input::Tick);
            perform(&mut core, &mut out, fx).await?;
        }
        let msg = match stashed.take() {
            Some(m) => m,
            None => match rx.recv().await {
                Some(m) => m,
                None => break,
            },
        };
        let input = match msg {
            ToHub::Open(id, outbox, who, address) => {
                out.outboxes.insert(id, outbox);
                let fx = core.handle_batch(
                    now_ms(),
                    [Input::Connected(id), Input::Address(id, address)],
                );
                perform(&mut core, &mut out, fx).await?;
                match who {
                    Some(who) => Input::Identified(id, who),
                    None => continue,
                }
            }
            ToHub::Input(i) => i,
            ToHub::Kick(id, close) => {
                if let Some(outbox) = out.outboxes.remove(&id) {
                    outbox.close(close);
                }
                continue;
            }
            ToHub::Loaded(doc, loaded) => {
                let loaded = (*loaded).map_err(|e| ServeError::Store(e.to_string()))?;
                tracing::debug!(%doc, found = loaded.is_some(), "list loaded for a peer");
                let held = core.doc_count();
                let fx = core.loaded(now_ms(), doc, loaded);
                perform(&mut core, &mut out, fx).await?;
                dropped += held.saturating_sub(core.doc_count());
                continue;
            }
            ToHub::Shutdown => break,
        };
        if let Input::Disconnected(id) = &input {
            out.outboxes.remove(id);
        }
        let started = std::time::Instant::now();
        let held = core.doc_count();
        let fx = match input {
            // Frames already waiting are handled together: one answer per list and peer
            // for all of them (under load, one fan-out per batch, not per write).
            Input::Frame(..) => {
                let mut batch = vec![input];
                while batch.len() < BATCH_FRAMES_MAX {
                    match rx.try_recv() {
                        Ok(ToHub::Input(frame @ Input::Frame(..))) => batch.push(frame),
                        Ok(other) => {
                            stashed = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                // More input waiting: the hub is behind, and a list's news may go out
                // with a later batch's (one fan-out for several).
                let more_waiting = stashed.is_some() || !rx.is_empty();
                core.handle_batch_deferring(now_ms(), batch, more_waiting)
            }
            other => core.handle(now_ms(), other),
        };
        let handled = started.elapsed();
        let commits = fx.commits.len();
        let sends = fx.sends.len();
        let bulk = !fx.compactions.is_empty()
            || fx.commits.iter().map(|c| c.changes.len()).sum::<usize>() >= TRIM_AFTER_CHANGES;
        let performed = perform(&mut core, &mut out, fx).await;
        dropped += held.saturating_sub(core.doc_count());
        if bulk || dropped >= TRIM_AFTER_LISTS_DROPPED {
            dropped = 0;
            give_back_freed_memory();
        }
        if commits > 0 {
            tracing::debug!(
                handle_us = handled.as_micros() as u64,
                perform_us = (started.elapsed() - handled).as_micros() as u64,
                commits,
                sends,
                "merge relayed"
            );
        }
        if let Err(e) = performed {
            for (_, outbox) in std::mem::take(&mut out.outboxes) {
                outbox.close(Close {
                    code: 1011,
                    reason: "store_failed".to_owned(),
                    message: Some("the hub could not store a change and stopped".to_owned()),
                });
            }
            return Err(e);
        }
    }
    for (_, outbox) in out.outboxes {
        outbox.close(Close {
            code: 1001,
            reason: "shutdown".to_owned(),
            message: None,
        });
    }
    Ok(())
}

/// Changes merged in one batch after which the hub hands the memory it freed back to
/// the system (see [`give_back_freed_memory`]).
pub const TRIM_AFTER_CHANGES: usize = 1_000;

/// Lists dropped from memory (their last peer left) after which the hub hands the
/// memory it freed back to the system: glibc keeps the freed lists' heap in its arenas
/// otherwise, and a hub whose peers came and went would keep the RSS of its busiest
/// moment. A trim costs a few milliseconds; a list costs tens of KiB at least.
pub const TRIM_AFTER_LISTS_DROPPED: usize = 64;

/// Returns freed heap memory to the system. A first sync of a long history allocates
/// several times the list's size for a moment (the changes decoded, the merge's report,
/// the commit), and glibc keeps freed memory in its arenas: without this, a hub that
/// was given ten 10,000-change lists kept 5 MiB more per list resident than its lists
/// hold. Called after such a batch and after a snapshot (whose rebuild frees the old
/// document); it walks the heap, a few milliseconds at most.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases free memory of the allocator's own arenas;
        // it has no preconditions.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// What the hub task performs the core's effects with (the driver's [`Io`]): the
/// store, the lists it holds, and the connections' outboxes.
struct Relay {
    store: Store,
    known: BTreeSet<DocumentId>,
    outboxes: BTreeMap<ConnId, Outbox>,
    /// Where a list loaded for the core is sent ([`ToHub::Loaded`]).
    loaded_to: mpsc::WeakSender<ToHub>,
}

/// Performs `fx` with the one driver (`swarmtodo_store::drive::perform`).
async fn perform(core: &mut HubCore, out: &mut Relay, fx: Effects) -> Result<(), ServeError> {
    drive::perform(core, out, fx)
        .await
        .map_err(|e| ServeError::Store(e.to_string()))
}

impl Io for Relay {
    fn now_ms(&self) -> i64 {
        now_ms()
    }

    /// All the merges of a batch go to disk in one transaction.
    async fn commit(&mut self, commits: &[Commit], at_ms: i64) -> Result<Vec<Stored>, StoreError> {
        let results =
            swarmtodo_store::persist::commit_all(&self.store, &mut self.known, commits, at_ms)
                .await?;
        Ok(results
            .into_iter()
            .map(|r| match r {
                Ok(seqs) => Stored::Durable(seqs),
                Err(e) => Stored::Refused(e.to_string()),
            })
            .collect())
    }

    async fn compact(&mut self, c: Compaction) {
        // A failed compaction loses nothing (the changes stay); log and go on.
        if let Err(e) = self
            .store
            .compact(
                swarmtodo_store::persist::doc_id(&c.doc),
                c.snapshot,
                c.heads,
            )
            .await
        {
            tracing::warn!(doc = %c.doc, error = %e, "compaction failed");
        }
    }

    /// Each load is a task of its own, queued at the store after the batch's commits,
    /// whose result comes back to the hub task as [`ToHub::Loaded`] (a large list takes
    /// a while to rebuild, and the other peers must not wait for it).
    async fn load(
        &mut self,
        doc: DocumentId,
        actor: ActorId,
    ) -> Result<Option<Option<StoredList>>, StoreError> {
        if let Some(to_hub) = self.loaded_to.upgrade() {
            let store = self.store.clone();
            tokio::spawn(async move {
                let loaded = swarmtodo_store::persist::load(&store, doc, actor).await;
                let _ = to_hub.send(ToHub::Loaded(doc, Box::new(loaded))).await;
            });
        }
        Ok(None)
    }

    fn send(&mut self, c: ConnId, frame: Vec<u8>) -> bool {
        let Some(outbox) = self.outboxes.get(&c) else {
            return true;
        };
        let Err(full) = outbox.push(frame) else {
            return true;
        };
        if let Some(outbox) = self.outboxes.remove(&c) {
            if full {
                tracing::info!(conn = c.0, "outbox full: closing a slow reader");
                outbox.close(Close {
                    code: 1008,
                    reason: "slow_reader".to_owned(),
                    message: None,
                });
            }
        }
        false
    }

    fn relay(&mut self, c: ConnId, frame: Vec<u8>) {
        if let Some(outbox) = self.outboxes.get(&c) {
            if !outbox.offer(frame) {
                tracing::trace!(conn = c.0, "relay dropped for a peer that is behind");
            }
        }
    }

    fn close(&mut self, c: ConnId, close: Close) {
        if let Some(outbox) = self.outboxes.remove(&c) {
            outbox.close(close);
        }
    }
}
