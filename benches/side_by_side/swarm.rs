//! The load generator's agents: one task per agent, one WebSocket each, automerge-repo
//! framing, the thin peer's sync; and the seeding peer (stock automerge, whole list).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::sync::{self, ChunkList, Message, MessageFlags, MessageVersion, SyncDoc};
use automerge::{Automerge, ChangeHash};
use futures_util::{SinkExt, StreamExt};
use swarmtodo::hub::wire::{self, DocumentId, PeerId, PeerMetadata, WireMessage};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::peer::Peer;
use crate::seed::Seed;
use crate::servers::Kind;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long connecting and the handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long seeding a list may take.
const SEED_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest frame the generator accepts.
const FRAME_BYTES_MAX: usize = 64 * 1024 * 1024;

/// What the coordinator tells an agent.
#[derive(Debug)]
pub(crate) enum Cmd {
    /// Write the next status of your task and send it.
    Write,
    /// Only note when frames arrive; handle them on `Release`.
    Hold,
    /// Handle what arrived, and everything from now on.
    Release,
}

/// What an agent tells the coordinator.
#[derive(Debug)]
pub(crate) enum Ev {
    /// The agent is in step with the server for the first time.
    Synced(usize),
    /// A sync frame arrived while holding.
    Arrived(usize),
    /// A write left.
    Sent(ChangeHash, Instant),
    /// A change reached the agent (the frame's arrival time).
    Got(usize, ChangeHash, Instant),
    /// The server acknowledged a write (sent at, acknowledged at).
    Acked(usize, ChangeHash, Instant, Instant),
    /// Something the protocol does not allow, or the connection ended.
    Failed(usize, String),
}

/// Bytes the generator sent and received.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) frames_in: AtomicU64,
}

impl Wire {
    pub(crate) fn total(&self) -> (u64, u64, u64) {
        (
            self.bytes_in.load(Ordering::Relaxed),
            self.bytes_out.load(Ordering::Relaxed),
            self.frames_in.load(Ordering::Relaxed),
        )
    }
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(FRAME_BYTES_MAX))
        .max_frame_size(Some(FRAME_BYTES_MAX))
}

/// Connects and, for protocol servers, joins; returns the server's peer id.
async fn connect(url: &str, me: &PeerId, kind: Kind) -> anyhow::Result<(Ws, Option<PeerId>)> {
    let (mut ws, _) = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_tungstenite::connect_async_with_config(url, Some(ws_config()), true),
    )
    .await
    .map_err(|_| anyhow::anyhow!("connect timed out"))??;
    if !kind.speaks_protocol() {
        return Ok((ws, None));
    }
    let join = WireMessage::Join {
        sender_id: me.clone(),
        supported_protocol_versions: Some(vec!["1".to_owned()]),
        peer_metadata: Some(PeerMetadata {
            storage_id: None,
            is_ephemeral: true,
        }),
    };
    ws.send(WsMessage::Binary(wire::encode(&join).into()))
        .await?;
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    loop {
        let frame = tokio::time::timeout_at(deadline, ws.next())
            .await
            .map_err(|_| anyhow::anyhow!("no answer to join"))?
            .ok_or_else(|| anyhow::anyhow!("closed during the handshake"))??;
        if let WsMessage::Binary(b) = frame {
            match wire::decode(&b)? {
                WireMessage::Peer { sender_id, .. } => return Ok((ws, Some(sender_id))),
                WireMessage::Error { message, .. } => anyhow::bail!("refused: {message}"),
                _ => {}
            }
        }
    }
}

fn sync_frame(me: &PeerId, server: &PeerId, doc: DocumentId, data: Vec<u8>) -> WsMessage {
    WsMessage::Binary(
        wire::encode(&WireMessage::Sync {
            sender_id: me.clone(),
            target_id: server.clone(),
            document_id: doc,
            data,
        })
        .into(),
    )
}

/// Gives the server the whole list as document `doc`: a stock automerge peer syncing
/// until the server's heads are the list's.
pub(crate) async fn seed_list(
    url: &str,
    kind: Kind,
    seed: &Seed,
    doc: DocumentId,
) -> anyhow::Result<Seeder> {
    let me = PeerId::new(format!("seeder-{doc}")).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (mut ws, server) = connect(url, &me, kind).await?;
    let server = server.ok_or_else(|| anyhow::anyhow!("seeding needs a protocol server"))?;
    let mut am: Automerge = seed.doc.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut state = sync::State::new();
    let mut ours = am.get_heads();
    ours.sort();
    let deadline = tokio::time::Instant::now() + SEED_TIMEOUT;
    loop {
        if let Some(m) = am.generate_sync_message(&mut state) {
            ws.send(sync_frame(&me, &server, doc, m.encode())).await?;
        }
        let mut theirs = state.their_heads.clone().unwrap_or_default();
        theirs.sort();
        if theirs == ours {
            break;
        }
        let frame = tokio::time::timeout_at(deadline, ws.next())
            .await
            .map_err(|_| anyhow::anyhow!("seeding {doc} timed out"))?
            .ok_or_else(|| anyhow::anyhow!("closed while seeding"))??;
        if let WsMessage::Binary(b) = frame {
            match wire::decode(&b)? {
                WireMessage::Sync {
                    document_id, data, ..
                } if document_id == doc => {
                    am.receive_sync_message(&mut state, Message::decode(&data)?)?;
                    ours = am.get_heads();
                    ours.sort();
                }
                WireMessage::Error { message, .. } => anyhow::bail!("refused: {message}"),
                _ => {}
            }
        }
    }
    Ok(Seeder(ws))
}

/// The connection that seeded a list, held open while a measure needs the list in the
/// server's memory (the hub lets a list no peer syncs leave memory, and the next peer's
/// arrival loads it again: its memory would count against connections).
pub(crate) struct Seeder(Ws);

impl Seeder {
    pub(crate) async fn close(mut self) {
        let _ = self.0.close(None).await;
    }
}

/// One connected agent, as the coordinator holds it.
pub(crate) struct Agent {
    pub(crate) cmds: mpsc::UnboundedSender<Cmd>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects agent `i` and starts its task.
pub(crate) async fn start_agent(
    i: usize,
    url: &str,
    kind: Kind,
    seed: Arc<Seed>,
    doc: DocumentId,
    events: mpsc::UnboundedSender<Ev>,
    wire_count: Arc<Wire>,
) -> anyhow::Result<Agent> {
    let me = PeerId::new(format!("bench-agent-{i}")).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (ws, server) = connect(url, &me, kind).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut a = AgentTask {
        i,
        me,
        server,
        doc,
        peer: Peer::new(seed, i),
        events,
        wire: wire_count,
        synced: false,
        hold: false,
        held: Vec::new(),
    };
    let task = tokio::spawn(async move {
        if let Err(e) = a.run(ws, rx).await {
            let _ = a.events.send(Ev::Failed(a.i, e.to_string()));
        }
    });
    Ok(Agent { cmds: tx, task })
}

struct AgentTask {
    i: usize,
    me: PeerId,
    server: Option<PeerId>,
    doc: DocumentId,
    peer: Peer,
    events: mpsc::UnboundedSender<Ev>,
    wire: Arc<Wire>,
    synced: bool,
    hold: bool,
    held: Vec<(Instant, tokio_tungstenite::tungstenite::Bytes)>,
}

impl AgentTask {
    async fn run(
        &mut self,
        mut ws: Ws,
        mut cmds: mpsc::UnboundedReceiver<Cmd>,
    ) -> anyhow::Result<()> {
        if let Some(server) = &self.server {
            let hello = sync_frame(&self.me, server, self.doc, self.peer.hello());
            self.send(&mut ws, hello).await?;
        } else {
            self.synced = true;
            let _ = self.events.send(Ev::Synced(self.i));
        }
        loop {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    None => return Ok(()),
                    Some(Cmd::Hold) => self.hold = true,
                    Some(Cmd::Release) => {
                        self.hold = false;
                        for (at, frame) in std::mem::take(&mut self.held) {
                            self.handle(&mut ws, &frame, at).await?;
                        }
                    }
                    Some(Cmd::Write) => self.write(&mut ws).await?,
                },
                frame = ws.next() => {
                    let at = Instant::now();
                    match frame {
                        None => anyhow::bail!("the server closed the connection"),
                        Some(Err(e)) => anyhow::bail!("connection failed: {e}"),
                        Some(Ok(WsMessage::Binary(b))) => {
                            self.wire.bytes_in.fetch_add(b.len() as u64, Ordering::Relaxed);
                            self.wire.frames_in.fetch_add(1, Ordering::Relaxed);
                            if self.hold {
                                // Only the envelope: the frame is handled on release.
                                if matches!(wire::decode(&b), Ok(WireMessage::Sync { .. })) {
                                    let _ = self.events.send(Ev::Arrived(self.i));
                                }
                                self.held.push((at, b));
                            } else {
                                self.handle(&mut ws, &b, at).await?;
                            }
                        }
                        Some(Ok(WsMessage::Close(c))) => anyhow::bail!("closed by the server: {c:?}"),
                        Some(Ok(_)) => {}
                    }
                }
            }
        }
    }

    async fn send(&self, ws: &mut Ws, m: WsMessage) -> anyhow::Result<()> {
        self.wire
            .bytes_out
            .fetch_add(m.len() as u64, Ordering::Relaxed);
        ws.send(m).await?;
        Ok(())
    }

    async fn write(&mut self, ws: &mut Ws) -> anyhow::Result<()> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let hash = self.peer.write(now_ms);
        let data = match &self.server {
            Some(_) => match self.peer.generate() {
                Some(m) => m.encode(),
                None => anyhow::bail!("a write produced no sync message"),
            },
            // The ceiling: the same change in a sync message of the same shape.
            None => {
                let mut flags = MessageFlags::new();
                flags.set(MessageFlags::SUPPORTS_SYNC_RESET);
                Message {
                    heads: self.peer.heads().to_vec(),
                    need: Vec::new(),
                    have: Vec::new(),
                    changes: ChunkList::from(vec![self.peer.own_bytes(&hash)]),
                    flags: Some(flags),
                    version: MessageVersion::V1,
                }
                .encode()
            }
        };
        let to = self
            .server
            .clone()
            .unwrap_or_else(|| PeerId::new("raw").expect("a valid peer id"));
        let at = Instant::now();
        self.send(ws, sync_frame(&self.me, &to, self.doc, data))
            .await?;
        self.peer.mark_sent(at);
        let _ = self.events.send(Ev::Sent(hash, at));
        Ok(())
    }

    async fn handle(&mut self, ws: &mut Ws, frame: &[u8], at: Instant) -> anyhow::Result<()> {
        let msg = match wire::decode(frame)? {
            WireMessage::Sync {
                document_id, data, ..
            } if document_id == self.doc => Message::decode(&data)?,
            WireMessage::Error { message, .. } => anyhow::bail!("server error: {message}"),
            WireMessage::DocUnavailable { .. } => anyhow::bail!("the server has no such list"),
            _ => return Ok(()),
        };
        if self.server.is_none() {
            for chunk in msg.changes.iter() {
                for c in swarmtodo::model::chunk_changes(chunk).map_err(|e| anyhow::anyhow!(e))? {
                    let _ = self.events.send(Ev::Got(self.i, c.hash(), at));
                }
            }
            return Ok(());
        }
        let got = self.peer.receive(msg)?;
        for h in got.new {
            let _ = self.events.send(Ev::Got(self.i, h, at));
        }
        for (h, sent) in got.acked {
            let _ = self.events.send(Ev::Acked(self.i, h, sent, at));
        }
        if let Some(m) = self.peer.generate() {
            let server = self.server.clone().expect("a protocol server");
            self.send(ws, sync_frame(&self.me, &server, self.doc, m.encode()))
                .await?;
            self.peer.mark_sent(Instant::now());
        }
        if !self.synced && self.peer.in_sync() {
            self.synced = true;
            let _ = self.events.send(Ev::Synced(self.i));
        }
        Ok(())
    }
}
