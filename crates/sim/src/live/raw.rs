//! Raw WebSocket peers that misbehave on purpose: a rogue's bad frames (each on a
//! connection of its own, answered with a close code) and slow readers (a peer that asks
//! for a list and never reads again, until the hub drops it). Each connects with a token
//! of the run's configuration, like any agent: the hub refuses the upgrade without one.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use automerge::ActorId;

use super::access::authed;
use crate::outcome::SlowReaderOutcome;
use crate::rng::Rng;
use crate::scenario::Action;
use swarmtodo_client::{list_document_id, Connection};
use swarmtodo_core::model::{TodoList, WriteContext};
use swarmtodo_proto::wire::{self, DocumentId, PeerId, PeerMetadata, WireMessage};
use swarmtodo_proto::{PatchOp, TaskPatch, WriteMode, WriteRequest, TASK_TEXT_BYTES_MAX};

/// How long one bad frame's connection may take to be closed by the hub.
pub const BAD_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// The slow reader's socket receive buffer, bytes (the kernel may round it up): small,
/// so that the hub's side fills soon.
pub const SLOW_READER_RCVBUF_BYTES: u32 = 4 * 1024;
/// Tasks of the longest text in each write on the slow reader's list: about 128 KiB a
/// write, so that a few dozen fill the hub's outbox for it (2 MiB) and the sockets.
pub const SLOW_READER_WRITE_TASKS: usize = 32;
/// Most writes on the slow reader's list before giving up on the hub dropping it.
pub const SLOW_READER_WRITES_MAX: u64 = 400;
/// After the last write, how long the slow reader waits for the hub to drop it (the hub
/// gives a closing peer a few seconds to take its close frame).
pub const SLOW_READER_CLOSE_WAIT: Duration = Duration::from_secs(15);
/// How often the waiting slow reader pings to learn whether the hub dropped it.
const SLOW_READER_PROBE: Duration = Duration::from_millis(100);

/// The close codes that are right for a bad frame.
pub(crate) fn expected_codes(action: Action) -> &'static [u16] {
    match action {
        Action::GarbageFrame => &[1002],
        Action::InvalidSync => &[1008],
        _ => &[1009],
    }
}

fn join(peer: &PeerId) -> Vec<u8> {
    wire::encode(&WireMessage::Join {
        sender_id: peer.clone(),
        supported_protocol_versions: Some(vec![swarmtodo_core::hub::PROTOCOL_VERSION.to_owned()]),
        peer_metadata: Some(PeerMetadata {
            storage_id: None,
            is_ephemeral: true,
        }),
    })
}

/// Sends one bad frame (`what`, with `noise` as its random bytes) on a new connection to
/// `url` (carrying the sender's token) and returns the close code the hub answered with (None: the connection ended
/// without one, or in time).
pub(crate) async fn bad_frame(
    url: &str,
    peer: &str,
    doc: DocumentId,
    what: Action,
    noise: Vec<u8>,
) -> Option<u16> {
    tokio::time::timeout(
        BAD_FRAME_TIMEOUT,
        bad_frame_inner(url, peer, doc, what, noise),
    )
    .await
    .ok()
    .flatten()
}

async fn bad_frame_inner(
    url: &str,
    peer: &str,
    doc: DocumentId,
    what: Action,
    noise: Vec<u8>,
) -> Option<u16> {
    let (ws, _) = tokio_tungstenite::connect_async(url).await.ok()?;
    let (mut sink, mut stream) = ws.split();
    let peer = PeerId::new(peer).ok()?;
    let frames = match what {
        Action::GarbageFrame => {
            // 0xFF opens no CBOR item: never a message, whatever follows.
            let mut b = vec![0xFF];
            b.extend(noise);
            vec![b]
        }
        Action::InvalidSync => {
            sink.send(Message::Binary(join(&peer).into())).await.ok()?;
            let hub = match next_wire(&mut stream).await? {
                WireMessage::Peer { sender_id, .. } => sender_id,
                _ => return None,
            };
            let mut data = vec![0x00];
            data.extend(noise);
            vec![wire::encode(&WireMessage::Sync {
                document_id: doc,
                sender_id: peer,
                target_id: hub,
                data,
            })]
        }
        _ => vec![vec![0u8; wire::MESSAGE_BYTES_MAX + 1]],
    };
    // The hub may stop reading before a large frame is through: send and read at once.
    let send = async move {
        for f in frames {
            if sink.send(Message::Binary(f.into())).await.is_err() {
                break;
            }
        }
        // Keep our side open until the hub closes it.
        std::future::pending::<()>().await;
    };
    let read = async move {
        loop {
            match stream.next().await {
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return None,
            }
        }
    };
    tokio::select! {
        code = read => code,
        () = send => None,
    }
}

async fn next_wire<S>(stream: &mut S) -> Option<WireMessage>
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        match stream.next().await? {
            Ok(Message::Binary(b)) => return wire::decode(&b).ok(),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// The tokens of a slow reader and of the writer beside it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlowTokens<'a> {
    /// The writer's: it may write the slow readers' lists.
    pub(crate) writer: &'a str,
    /// The slow reader's: it may read.
    pub(crate) reader: &'a str,
}

/// A slow reader on a list of its own (`name`, which no agent syncs): a well-behaved
/// client creates the list, the slow reader joins asking for every kind of event,
/// requests it — and never reads again,
/// on a socket with a small receive buffer. The client then writes big tasks (each write
/// relayed to the slow reader) until the hub's outbox for the slow reader is full and
/// the hub drops it (1008 `slow_reader`; the close frame cannot reach a peer that does
/// not read, so being dropped shows as its pings failing). The writer's every write must
/// still be acknowledged. `seed` makes the tasks' text; `url` is the hub's, without a
/// token.
pub(crate) async fn slow_reader(
    url: &str,
    tokens: SlowTokens<'_>,
    name: &str,
    seed: u64,
) -> SlowReaderOutcome {
    let mut out = SlowReaderOutcome {
        writes: 0,
        closed: false,
        closed_after_ms: None,
        writer_failures: 0,
        no_hub: true,
    };
    let doc = list_document_id(name);
    let mut rng = Rng::new(seed);
    let mut list = TodoList::create(ActorId::from(rng.bytes16()));
    let writer_url = authed(url, tokens.writer);
    let Ok(mut writer) = Connection::connect(&writer_url, &format!("{name}-writer")).await else {
        return out;
    };
    // The list exists on the hub before the slow reader asks for it.
    if !big_write(&mut writer, doc, &mut list, &mut rng, 1).await {
        return out;
    }
    let Some(mut ws) = slow_connect(url, tokens.reader).await else {
        return out;
    };
    let Ok(peer) = PeerId::new(format!("{name}-reader")) else {
        return out;
    };
    if ws.send(Message::Binary(join(&peer).into())).await.is_err() {
        return out;
    }
    // The answer to `join` is read; nothing after it ever is.
    let hub = match tokio::time::timeout(BAD_FRAME_TIMEOUT, next_wire(&mut ws)).await {
        Ok(Some(WireMessage::Peer { sender_id, .. })) => sender_id,
        _ => return out,
    };
    let request = {
        // An empty document's first message: the hub answers with the whole list.
        use automerge::sync::SyncDoc;
        let doc = automerge::Automerge::new();
        let mut state = automerge::sync::State::new();
        doc.generate_sync_message(&mut state)
            .map(|m| m.encode())
            .unwrap_or_default()
    };
    let msg = WireMessage::Request {
        document_id: doc,
        sender_id: peer,
        target_id: hub,
        data: request,
    };
    if ws
        .send(Message::Binary(wire::encode(&msg).into()))
        .await
        .is_err()
    {
        return out;
    }
    out.no_hub = false;
    let started = Instant::now();
    // A ping costs the hub no sync work; it fails once the hub has dropped us.
    let mut dropped = false;
    while out.writes < SLOW_READER_WRITES_MAX && !dropped {
        if !big_write(
            &mut writer,
            doc,
            &mut list,
            &mut rng,
            SLOW_READER_WRITE_TASKS,
        )
        .await
        {
            out.writer_failures += 1;
        }
        out.writes += 1;
        dropped = ws.send(Message::Ping(Vec::new().into())).await.is_err();
    }
    let deadline = Instant::now() + SLOW_READER_CLOSE_WAIT;
    while !dropped && Instant::now() < deadline {
        tokio::time::sleep(SLOW_READER_PROBE).await;
        dropped = ws.send(Message::Ping(Vec::new().into())).await.is_err();
    }
    if dropped {
        out.closed = true;
        out.closed_after_ms =
            Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
    }
    let _ = writer.close().await;
    out
}

/// The writer's write: `tasks` tasks of the longest text allowed, fresh each time; then a
/// sync. True when the hub acknowledged it.
async fn big_write(
    conn: &mut Connection,
    doc: DocumentId,
    list: &mut TodoList,
    rng: &mut Rng,
    tasks: usize,
) -> bool {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ";
    let ops = (0..tasks)
        .map(|i| {
            let text: String = (0..TASK_TEXT_BYTES_MAX)
                .map(|_| char::from(ALPHABET[rng.index(ALPHABET.len())]))
                .collect();
            PatchOp::Upsert {
                task: TaskPatch {
                    id: Some(format!("big-{i}")),
                    content: Some(text),
                    ..TaskPatch::default()
                },
            }
        })
        .collect();
    let req = WriteRequest {
        mode: WriteMode::Patch { ops },
        expected_version: None,
        explanation: None,
    };
    let ctx = WriteContext::new("slow-reader-writer", 0, rng.next_u64());
    if list.write(&req, &ctx).is_err() {
        return false;
    }
    match tokio::time::timeout(BAD_FRAME_TIMEOUT, conn.sync(doc, list)).await {
        Ok(Ok(_)) => conn.in_sync(doc, list),
        _ => false,
    }
}

/// A WebSocket client on a socket with a small receive buffer, to `url` (the hub's,
/// `ws://ADDR`) with `token`.
async fn slow_connect(
    url: &str,
    token: &str,
) -> Option<tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>> {
    let addr: SocketAddr = url.strip_prefix("ws://")?.parse().ok()?;
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .ok()?;
    socket.set_recv_buffer_size(SLOW_READER_RCVBUF_BYTES).ok()?;
    let stream = socket.connect(addr).await.ok()?;
    // Every kind of event: a peer that asked for them all and never reads is the one a
    // hub must drop (one with the default kinds gets little beyond the sync messages the
    // hub holds back for a peer that does not acknowledge them).
    let url = swarmtodo_client::with_events(&authed(url, token), "all");
    let (ws, _) = tokio_tungstenite::client_async(url, stream).await.ok()?;
    Some(ws)
}
