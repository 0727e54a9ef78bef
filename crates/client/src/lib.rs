//! The Rust client: a WebSocket connection to a hub speaking the automerge-repo sync
//! protocol, syncing local [`TodoList`] replicas.
//!
//! Two layers: [`Connection`] connects, handshakes and syncs a list until the hub has
//! acknowledged it; [`SyncedList`] keeps a list in sync in the background (reads and
//! writes are local and work offline, reconnection with backoff, snapshots on a tokio
//! `watch`, the hub's events — violations, conflicts, repairs, task changes — on a
//! tokio `broadcast`).
//!
//! ```no_run
//! # async fn run() -> Result<(), swarmtodo_client::ClientError> {
//! use automerge::ActorId;
//! use swarmtodo_client::{list_document_id, Connection};
//! use swarmtodo_core::model::{TodoList, WriteContext};
//! use swarmtodo_proto::{PatchOp, TaskPatch, WriteMode, WriteRequest};
//!
//! let mut conn = Connection::connect("ws://127.0.0.1:7700", "agent-1").await?;
//! let doc = list_document_id("swarm-42");
//! let mut list = TodoList::create(ActorId::random());
//! conn.sync(doc, &mut list).await?; // pull what the hub has
//! let req = WriteRequest {
//!     mode: WriteMode::Patch { ops: vec![PatchOp::Upsert { task: TaskPatch {
//!         id: Some("t1".into()), content: Some("Run the tests".into()), ..TaskPatch::default()
//!     }}]},
//!     expected_version: None,
//!     explanation: None,
//! };
//! list.write(&req, &WriteContext::new("agent-1", 0, 1)).expect("valid write");
//! conn.sync(doc, &mut list).await?; // push it; the hub's repairs come back
//! for event in conn.take_events() {
//!     println!("event {}: {:?}", event.seq, event.body);
//! }
//!
//! // Or keep a replica in sync in the background and follow it:
//! let live = swarmtodo_client::SyncedList::open("ws://127.0.0.1:7700", "agent-2", "swarm-42");
//! let mut snapshots = live.subscribe();
//! let mut events = live.events();
//! live.write(&req, 0).expect("valid write"); // local at once, synced when connected
//! snapshots.changed().await.ok();
//! if let Ok(event) = events.recv().await {
//!     println!("{:?}", event.body);
//! }
//! # Ok(()) }
//! ```

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use swarmtodo_core::model::{Merge, ModelError, TodoList};
pub use swarmtodo_proto::wire::list_document_id;
use swarmtodo_proto::wire::{self, DocumentId, PeerId, WireMessage};

pub mod http;
pub mod limits;
pub mod session;

use self::limits::{CLOSE_AFTER_ERROR_WAIT, NUDGES_MAX};
pub use self::limits::{
    CONNECT_TIMEOUT, EVENTS_BUFFERED_MAX, RECONNECT_BACKOFF_MAX, RECONNECT_BACKOFF_MIN,
    SYNC_ROUNDS_MAX, SYNC_SETTLE, SYNC_TIMEOUT,
};
use self::session::{FromHub, Session};

/// `url` asking the hub to push the events of `kinds`: `default` (what a replica cannot
/// see for itself: violations, conflicts, repairs, unblocked tasks, claims, expired
/// leases), `all`, `none`, or kinds separated by commas (`tasks_changed,violation`).
pub fn with_events(url: &str, kinds: &str) -> String {
    let sep = if url.contains('?') {
        "&"
    } else if url.ends_with('/') {
        "?"
    } else {
        "/?"
    };
    format!("{url}{sep}events={kinds}")
}

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The WebSocket failed.
    #[error("websocket: {0}")]
    WebSocket(Box<tokio_tungstenite::tungstenite::Error>),
    /// The hub did not answer in time.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// The hub sent something that is not the protocol.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The hub closed the connection.
    #[error("closed by the hub: {0}")]
    Closed(String),
    /// The replica refused what the hub sent.
    #[error("replica: {0}")]
    Model(#[from] ModelError),
}

impl From<tokio_tungstenite::tungstenite::Error> for ClientError {
    fn from(e: tokio_tungstenite::tungstenite::Error) -> Self {
        ClientError::WebSocket(Box::new(e))
    }
}

/// One connection to a hub.
#[derive(Debug)]
pub struct Connection {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// The protocol state: who we are, who the hub is, a sync state per document (kept
    /// across calls so a sync only sends what is new).
    session: Session,
    /// Events the hub pushed during [`Connection::sync`], not taken yet (the oldest are
    /// dropped past [`EVENTS_BUFFERED_MAX`]).
    events: std::collections::VecDeque<swarmtodo_proto::Event>,
}

impl Connection {
    /// Connects to `url` (`ws://host:port`) and joins as `peer_id`.
    pub async fn connect(url: &str, peer_id: &str) -> Result<Connection, ClientError> {
        let (mut ws, _) =
            tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(url))
                .await
                .map_err(|_| ClientError::Timeout("connect"))??;
        let peer_id = PeerId::new(peer_id)
            .map_err(|e| ClientError::Protocol(format!("invalid peer id: {e}")))?;
        let mut session = Session::new(peer_id);
        ws.send(Message::Binary(wire::encode(&session.join()).into()))
            .await?;
        let answer = tokio::time::timeout(CONNECT_TIMEOUT, next_message(&mut ws))
            .await
            .map_err(|_| ClientError::Timeout("handshake"))??;
        session.handshake(answer)?;
        Ok(Connection {
            ws,
            session,
            events: Default::default(),
        })
    }

    /// The hub's peer id.
    pub fn hub_peer_id(&self) -> &PeerId {
        self.session.hub().unwrap_or_else(|| self.session.peer_id())
    }

    /// Syncs `list` as document `doc` until the hub has acknowledged every local change
    /// (its heads equal ours) and has nothing more to say for [`SYNC_SETTLE`], or it
    /// says it has no such list and we have nothing to give. Fails after
    /// [`SYNC_TIMEOUT`]. Returns everything the hub's messages merged into the list.
    pub async fn sync(
        &mut self,
        doc: DocumentId,
        list: &mut TodoList,
    ) -> Result<Vec<Merge>, ClientError> {
        let mut merges = Vec::new();
        let deadline = tokio::time::Instant::now() + SYNC_TIMEOUT;
        let first = !self.session.knows(doc);
        for round in 0..SYNC_ROUNDS_MAX {
            let request = first && round == 0 && list.is_empty();
            self.send_sync(doc, list, request).await?;
            let settled = self.in_sync(doc, list);
            let wait = if settled {
                SYNC_SETTLE
            } else {
                deadline.saturating_duration_since(tokio::time::Instant::now())
            };
            let next = match tokio::time::timeout(wait, next_message(&mut self.ws)).await {
                Err(_) if settled => return Ok(merges),
                Err(_) => return Err(ClientError::Timeout("sync")),
                Ok(m) => m?,
            };
            match self.session.receive(doc, list, next)? {
                FromHub::Merged(merge) if !merge.is_empty() => merges.push(merge),
                FromHub::Events(events) => {
                    for e in events {
                        if self.events.len() >= EVENTS_BUFFERED_MAX {
                            self.events.pop_front();
                        }
                        self.events.push_back(e);
                    }
                }
                // The hub has no such list and we hold nothing to give it.
                FromHub::Unavailable if list.is_empty() => return Ok(merges),
                FromHub::Merged(_) | FromHub::Unavailable | FromHub::Other => {}
            }
        }
        Err(ClientError::Protocol(format!(
            "sync did not settle in {SYNC_ROUNDS_MAX} rounds"
        )))
    }

    /// The events the hub pushed while [`Connection::sync`] ran, oldest first: the kinds
    /// asked for on the URL ([`with_events`]; by default violations, conflicts, repairs,
    /// claims, unblocked tasks and expired leases).
    pub fn take_events(&mut self) -> Vec<swarmtodo_proto::Event> {
        self.events.drain(..).collect()
    }

    /// True when the hub's last word on `doc` was that it has exactly what `list` has:
    /// every local change is on the hub — and the hub answers only after its commit is
    /// durable, so this is the acknowledgement.
    pub fn in_sync(&self, doc: DocumentId, list: &TodoList) -> bool {
        self.session.in_sync(doc, list)
    }

    /// The next sync frame for `doc`, if `list` has anything to say (`request`: as the
    /// first message for a document we do not have yet).
    fn sync_frame(&mut self, doc: DocumentId, list: &TodoList, request: bool) -> Option<Message> {
        let msg = self.session.sync_message(doc, list, request)?;
        Some(Message::Binary(wire::encode(&msg).into()))
    }

    async fn send_sync(
        &mut self,
        doc: DocumentId,
        list: &TodoList,
        request: bool,
    ) -> Result<(), ClientError> {
        if let Some(frame) = self.sync_frame(doc, list, request) {
            self.ws.send(frame).await?;
        }
        Ok(())
    }

    /// `(our heads, the hub's last advertised heads)` for diagnostics.
    pub fn debug_state(&self, doc: DocumentId, list: &TodoList) -> String {
        self.session.debug_state(doc, list)
    }

    /// Says goodbye and closes.
    pub async fn close(mut self) -> Result<(), ClientError> {
        let leave = wire::encode(&self.session.leave());
        let _ = self.ws.send(Message::Binary(leave.into())).await;
        self.ws.close(None).await?;
        Ok(())
    }
}

async fn next_message(
    ws: &mut WebSocketStream<MaybeTlsStream<TcpStream>>,
) -> Result<WireMessage, ClientError> {
    loop {
        match ws.next().await {
            None => return Err(ClientError::Closed("connection ended".to_owned())),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(Message::Binary(b))) => {
                let m = wire::decode(&b).map_err(|e| ClientError::Protocol(e.to_string()))?;
                // The hub says why before it closes: the close's code and reason go
                // first, as in "1012 list_moved: …".
                if let WireMessage::Error { message, .. } = &m {
                    if let Ok(Some(code)) =
                        tokio::time::timeout(CLOSE_AFTER_ERROR_WAIT, closing(ws)).await
                    {
                        return Err(ClientError::Closed(format!("{code}: {message}")));
                    }
                }
                return Ok(m);
            }
            Some(Ok(Message::Close(frame))) => return Err(ClientError::Closed(closed(frame))),
            Some(Ok(_)) => {}
        }
    }
}

/// Reads up to the hub's close, skipping what comes before it: its code and reason,
/// if it closed with a frame.
async fn closing(ws: &mut WebSocketStream<MaybeTlsStream<TcpStream>>) -> Option<String> {
    loop {
        match ws.next().await {
            None | Some(Err(_)) => return None,
            Some(Ok(Message::Close(frame))) => return Some(closed(frame)),
            Some(Ok(_)) => {}
        }
    }
}

/// A close frame as "code reason".
fn closed(frame: Option<tokio_tungstenite::tungstenite::protocol::CloseFrame>) -> String {
    frame
        .map(|f| format!("{} {}", u16::from(f.code), f.reason))
        .unwrap_or_default()
}

impl Connection {
    /// Keeps `list` in sync as `doc` until `nudges` closes or the connection fails:
    /// sends what is new whenever a nudge arrives, and applies every message the hub
    /// pushes (other agents' writes, repairs), calling `changed` after each.
    async fn serve_list(
        &mut self,
        doc: DocumentId,
        list: &std::sync::Mutex<TodoList>,
        nudges: &mut tokio::sync::mpsc::Receiver<()>,
        changed: &(dyn Fn(&TodoList) + Send + Sync),
        event: &(dyn Fn(swarmtodo_proto::Event) + Send + Sync),
    ) -> Result<(), ClientError> {
        loop {
            let outgoing = self.sync_frame(doc, &*lock(list)?, false);
            if let Some(frame) = outgoing {
                self.ws.send(frame).await?;
            }
            tokio::select! {
                nudge = nudges.recv() => {
                    if nudge.is_none() {
                        return Ok(());
                    }
                }
                msg = next_message(&mut self.ws) => {
                    let msg = msg?;
                    let mut l = lock(list)?;
                    match self.session.receive(doc, &mut l, msg)? {
                        FromHub::Merged(merge) if !merge.is_empty() => changed(&l),
                        FromHub::Events(events) => events.into_iter().for_each(event),
                        FromHub::Merged(_) | FromHub::Unavailable | FromHub::Other => {}
                    }
                },
            }
        }
    }
}

/// A list kept in sync with a hub in the background: reads and writes are local (and
/// work offline); a task connects, reconnects with backoff, and syncs. Writes made while
/// the hub is away are sent when it is back.
#[derive(Debug)]
pub struct SyncedList {
    list: std::sync::Arc<std::sync::Mutex<TodoList>>,
    snapshots: tokio::sync::watch::Receiver<swarmtodo_proto::Snapshot>,
    /// Shared with the sync task: both local writes and the hub's pushes publish.
    publish: std::sync::Arc<tokio::sync::watch::Sender<swarmtodo_proto::Snapshot>>,
    nudge: tokio::sync::mpsc::Sender<()>,
    events: tokio::sync::broadcast::Sender<swarmtodo_proto::Event>,
    task: tokio::task::JoinHandle<()>,
    agent: String,
}

impl SyncedList {
    /// Starts syncing the list called `name` on the hub at `url`, as `agent`, with a new
    /// replica (a random actor).
    pub fn open(url: &str, agent: &str, name: &str) -> SyncedList {
        let list = TodoList::create(automerge::ActorId::random());
        SyncedList::with_list(url, agent, list_document_id(name), list)
    }

    /// Starts syncing `list` as document `doc`.
    pub fn with_list(url: &str, agent: &str, doc: DocumentId, list: TodoList) -> SyncedList {
        let (snap_tx, snapshots) = tokio::sync::watch::channel(list.read());
        let publish = std::sync::Arc::new(snap_tx);
        let snap_tx = publish.clone();
        let list = std::sync::Arc::new(std::sync::Mutex::new(list));
        let (nudge, mut nudges) = tokio::sync::mpsc::channel(NUDGES_MAX);
        let url = url.to_owned();
        let peer = format!("{agent}-{}", uuid::Uuid::from_u128(rand_u128()));
        let shared = list.clone();
        let (events, _) = tokio::sync::broadcast::channel(EVENTS_BUFFERED_MAX);
        let events_tx = events.clone();
        let task = tokio::spawn(async move {
            let changed = move |l: &TodoList| {
                let _ = snap_tx.send(l.read());
            };
            let event = move |e: swarmtodo_proto::Event| {
                // No subscriber: nobody to tell.
                let _ = events_tx.send(e);
            };
            let mut backoff = RECONNECT_BACKOFF_MIN;
            loop {
                match Connection::connect(&url, &peer).await {
                    Ok(mut conn) => {
                        backoff = RECONNECT_BACKOFF_MIN;
                        match conn
                            .serve_list(doc, &shared, &mut nudges, &changed, &event)
                            .await
                        {
                            Ok(()) => return,
                            Err(e) => tracing::info!(error = %e, "connection to the hub lost"),
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "hub unreachable"),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
            }
        });
        SyncedList {
            list,
            snapshots,
            publish,
            nudge,
            events,
            task,
            agent: agent.to_owned(),
        }
    }

    /// `todo_read` on the local replica.
    pub fn read(&self) -> swarmtodo_proto::Snapshot {
        self.snapshots.borrow().clone()
    }

    /// Snapshots as they change (local writes and what the hub pushes).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<swarmtodo_proto::Snapshot> {
        self.snapshots.clone()
    }

    /// The hub's events about this list (violations, conflicts, repairs, task changes)
    /// from now on, as it pushes them. A subscriber more than [`EVENTS_BUFFERED_MAX`]
    /// behind gets `Lagged` and misses the oldest.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<swarmtodo_proto::Event> {
        self.events.subscribe()
    }

    /// `todo_write` on the local replica (validated there), then synced in the background.
    pub fn write(
        &self,
        req: &swarmtodo_proto::WriteRequest,
        now_ms: i64,
    ) -> Result<swarmtodo_proto::WriteResult, swarmtodo_proto::ApiError> {
        let result = {
            let mut l = self.list.lock().map_err(|_| swarmtodo_proto::ApiError {
                code: swarmtodo_proto::ErrorCode::Internal,
                field: None,
                allowed: Vec::new(),
                message: "the replica's lock is poisoned; reopen the list".into(),
                current: None,
            })?;
            let ctx = swarmtodo_core::model::WriteContext::new(
                self.agent.clone(),
                now_ms,
                rand_u128() as u64,
            );
            let (result, _) = l.write(req, &ctx)?;
            result
        };
        // Full: a sync is already due and will carry this write too.
        let _ = self.nudge.try_send(());
        if result.changed {
            if let Ok(l) = self.list.lock() {
                // A write is visible to this agent's readers at once.
                let _ = self.publish.send(l.read());
            }
        }
        Ok(result)
    }

    /// Stops syncing.
    pub fn close(self) {
        self.task.abort();
    }
}

fn lock(
    list: &std::sync::Mutex<TodoList>,
) -> Result<std::sync::MutexGuard<'_, TodoList>, ClientError> {
    list.lock()
        .map_err(|_| ClientError::Protocol("list lock poisoned".into()))
}

/// Randomness for peer ids and generated task ids (the OS's, via automerge's actor ids).
fn rand_u128() -> u128 {
    let actor = automerge::ActorId::random();
    let mut b = [0u8; 16];
    let bytes = actor.to_bytes();
    b[..bytes.len().min(16)].copy_from_slice(&bytes[..bytes.len().min(16)]);
    u128::from_le_bytes(b)
}
