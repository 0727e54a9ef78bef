//! The Rust client: a WebSocket connection to a hub speaking the automerge-repo sync
//! protocol, syncing local [`TodoList`] replicas.
//!
//! This is the first, minimal layer: connect and handshake, then sync one list until
//! both sides are quiet. Reconnection with backoff and subscriptions come on top of it.
//!
//! ```no_run
//! # async fn run() -> Result<(), swarmtodo::client::ClientError> {
//! use automerge::ActorId;
//! use swarmtodo::client::{list_document_id, Connection};
//! use swarmtodo::model::{TodoList, WriteContext};
//! use swarmtodo::proto::{PatchOp, TaskPatch, WriteMode, WriteRequest};
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
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use automerge::sync;
use futures_util::{SinkExt, StreamExt};
use sha2::Digest;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::hub::syncmsg;
use crate::hub::wire::{self, DocumentId, PeerId, PeerMetadata, WireMessage};
use crate::model::{Merge, ModelError, TodoList};

/// Once in sync, how long a sync waits for trailing messages (a repair) before it
/// returns.
pub const SYNC_SETTLE: Duration = Duration::from_millis(50);
/// How long a sync may take before it fails.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the connection and handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most round trips one [`Connection::sync`] makes before giving up.
pub const SYNC_ROUNDS_MAX: usize = 10_000;

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The WebSocket failed.
    #[error("websocket: {0}")]
    WebSocket(#[from] tokio_tungstenite::tungstenite::Error),
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

/// The automerge-repo document id of the list called `name`: the first 16 bytes of
/// SHA-256("swarmtodo list\0" + name). Every peer computes the same id, so two agents
/// creating one list at the same moment end with one document (and, since the first
/// change of a list is the same everywhere, with one root).
pub fn list_document_id(name: &str) -> DocumentId {
    let mut h = sha2::Sha256::new();
    h.update(b"swarmtodo list\0");
    h.update(name.as_bytes());
    let digest = h.finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    DocumentId::from_bytes(id)
}

/// One connection to a hub.
#[derive(Debug)]
pub struct Connection {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    peer_id: PeerId,
    hub: PeerId,
    /// Sync state per document, kept across calls so a sync only sends what is new.
    states: BTreeMap<DocumentId, sync::State>,
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
        let join = WireMessage::Join {
            sender_id: peer_id.clone(),
            supported_protocol_versions: Some(vec![crate::hub::core::PROTOCOL_VERSION.to_owned()]),
            peer_metadata: Some(PeerMetadata {
                storage_id: None,
                is_ephemeral: true,
            }),
        };
        ws.send(Message::Binary(wire::encode(&join).into())).await?;
        let msg = tokio::time::timeout(CONNECT_TIMEOUT, next_message(&mut ws))
            .await
            .map_err(|_| ClientError::Timeout("handshake"))??;
        let hub = match msg {
            WireMessage::Peer { sender_id, .. } => sender_id,
            WireMessage::Error { message, .. } => return Err(ClientError::Closed(message)),
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected peer, got {}",
                    other.type_name()
                )))
            }
        };
        Ok(Connection {
            ws,
            peer_id,
            hub,
            states: BTreeMap::new(),
        })
    }

    /// The hub's peer id.
    pub fn hub_peer_id(&self) -> &PeerId {
        &self.hub
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
        let first = !self.states.contains_key(&doc);
        for round in 0..SYNC_ROUNDS_MAX {
            let state = self.states.entry(doc).or_default();
            if let Some(m) = list.generate_sync_message(state) {
                let data = m.encode();
                let msg = if first && round == 0 && list.is_empty() {
                    WireMessage::Request {
                        document_id: doc,
                        sender_id: self.peer_id.clone(),
                        target_id: self.hub.clone(),
                        data,
                    }
                } else {
                    WireMessage::Sync {
                        document_id: doc,
                        sender_id: self.peer_id.clone(),
                        target_id: self.hub.clone(),
                        data,
                    }
                };
                self.ws
                    .send(Message::Binary(wire::encode(&msg).into()))
                    .await?;
            }
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
            match next {
                WireMessage::Sync {
                    document_id, data, ..
                } if document_id == doc => {
                    let checked = syncmsg::validate(&data, &syncmsg::Limits::default())
                        .map_err(|e| ClientError::Protocol(format!("bad sync message: {e}")))?;
                    let state = self.states.entry(doc).or_default();
                    let merge = list.receive_sync_message(state, checked.into_message())?;
                    if !merge.is_empty() {
                        merges.push(merge);
                    }
                }
                // The hub has no such list and we hold nothing to give it.
                WireMessage::DocUnavailable { document_id, .. }
                    if document_id == doc && list.is_empty() =>
                {
                    return Ok(merges);
                }
                WireMessage::Error { message, .. } => return Err(ClientError::Closed(message)),
                _ => {}
            }
        }
        Err(ClientError::Protocol(format!(
            "sync did not settle in {SYNC_ROUNDS_MAX} rounds"
        )))
    }

    /// True when the hub's last word on `doc` was that it has exactly what `list` has:
    /// every local change is on the hub — and the hub answers only after its commit is
    /// durable, so this is the acknowledgement.
    pub fn in_sync(&self, doc: DocumentId, list: &TodoList) -> bool {
        let Some(state) = self.states.get(&doc) else {
            return false;
        };
        let mut ours = list.heads();
        ours.sort();
        let mut theirs = state.their_heads.clone().unwrap_or_default();
        theirs.sort();
        ours == theirs
    }

    /// `(our heads, the hub's last advertised heads)` for diagnostics.
    pub fn debug_state(&self, doc: DocumentId, list: &TodoList) -> String {
        let theirs = self.states.get(&doc).map(|s| s.their_heads.clone());
        format!("ours {:?}, theirs {:?}", list.heads(), theirs)
    }

    /// Says goodbye and closes.
    pub async fn close(mut self) -> Result<(), ClientError> {
        let leave = WireMessage::Leave {
            sender_id: self.peer_id.clone(),
        };
        let _ = self
            .ws
            .send(Message::Binary(wire::encode(&leave).into()))
            .await;
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
                return wire::decode(&b).map_err(|e| ClientError::Protocol(e.to_string()))
            }
            Some(Ok(Message::Close(frame))) => {
                return Err(ClientError::Closed(
                    frame
                        .map(|f| format!("{} {}", u16::from(f.code), f.reason))
                        .unwrap_or_default(),
                ))
            }
            Some(Ok(_)) => {}
        }
    }
}
