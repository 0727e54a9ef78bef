//! Raw WebSocket peers that misbehave on purpose: a rogue's bad frames (each on a
//! connection of its own, answered with a close code) and slow readers (a peer that asks
//! for a list again and again and never reads, until the hub drops it).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::hub::wire::{self, DocumentId, PeerId, PeerMetadata, WireMessage};
use crate::sim::scenario::Action;

/// How long one bad frame's connection may take to be closed by the hub.
pub const BAD_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// The slow reader's socket receive buffer, bytes (the kernel may round it up): small,
/// so that the hub's side fills soon.
pub const SLOW_READER_RCVBUF_BYTES: u32 = 4 * 1024;
/// Pause between the slow reader's requests: 500 a second, half the hub's frame rate
/// limit, so that what closes it is its not reading, not its sending.
pub const SLOW_READER_INTERVAL: Duration = Duration::from_millis(2);
/// Most requests one slow reader sends.
pub const SLOW_READER_REQUESTS_MAX: u64 = 10_000;
/// After its last request, how long the slow reader waits for the hub to drop it.
pub const SLOW_READER_CLOSE_WAIT: Duration = Duration::from_secs(15);
/// How often the waiting slow reader probes whether the hub dropped it.
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
        supported_protocol_versions: Some(vec![crate::hub::core::PROTOCOL_VERSION.to_owned()]),
        peer_metadata: Some(PeerMetadata {
            storage_id: None,
            is_ephemeral: true,
        }),
    })
}

/// Sends one bad frame (`what`, with `noise` as its random bytes) on a new connection to
/// `url` and returns the close code the hub answered with (None: the connection ended
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

/// What became of one slow reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SlowReaderOutcome {
    /// Requests it sent (each answered by the hub with the whole list).
    pub requests: u64,
    /// The hub dropped it (its sends started failing).
    pub closed: bool,
    /// Milliseconds from its first request to being dropped.
    pub closed_after_ms: Option<u64>,
    /// It could not even join (the hub was down).
    pub no_hub: bool,
}

/// A peer that joins, requests the list `doc`, and keeps asking for it as a client that
/// lost its data would (a sync message with no heads: the hub answers with the whole
/// list each time) — and never reads. Its receive buffer is small; the hub's outbox for
/// it fills, and the hub must drop it (1008 `slow_reader`; the close frame itself
/// cannot reach a peer that does not read, so being dropped is seen as sends failing).
pub(crate) async fn slow_reader(url: &str, peer: &str, doc: DocumentId) -> SlowReaderOutcome {
    let mut out = SlowReaderOutcome {
        requests: 0,
        closed: false,
        closed_after_ms: None,
        no_hub: true,
    };
    let Some(mut ws) = slow_connect(url).await else {
        return out;
    };
    let Ok(peer) = PeerId::new(peer) else {
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
    out.no_hub = false;
    let reset = {
        // An empty document's first message: no heads, so the hub resets what it
        // believes sent and answers with everything.
        use automerge::sync::SyncDoc;
        let doc = automerge::Automerge::new();
        let mut state = automerge::sync::State::new();
        doc.generate_sync_message(&mut state)
            .map(|m| m.encode())
            .unwrap_or_default()
    };
    let started = Instant::now();
    let frame = |request: bool| {
        let (document_id, sender_id, target_id, data) =
            (doc, peer.clone(), hub.clone(), reset.clone());
        let msg = if request {
            WireMessage::Request {
                document_id,
                sender_id,
                target_id,
                data,
            }
        } else {
            WireMessage::Sync {
                document_id,
                sender_id,
                target_id,
                data,
            }
        };
        Message::Binary(wire::encode(&msg).into())
    };
    let mut closed = false;
    while out.requests < SLOW_READER_REQUESTS_MAX {
        if ws.send(frame(out.requests == 0)).await.is_err() {
            closed = true;
            break;
        }
        out.requests += 1;
        tokio::time::sleep(SLOW_READER_INTERVAL).await;
    }
    let deadline = Instant::now() + SLOW_READER_CLOSE_WAIT;
    while !closed && Instant::now() < deadline {
        tokio::time::sleep(SLOW_READER_PROBE).await;
        closed = ws.send(frame(false)).await.is_err();
    }
    if closed {
        out.closed = true;
        out.closed_after_ms =
            Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
    }
    out
}

/// A WebSocket client on a socket with a small receive buffer.
async fn slow_connect(
    url: &str,
) -> Option<tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>> {
    let addr: SocketAddr = url.strip_prefix("ws://")?.parse().ok()?;
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .ok()?;
    socket.set_recv_buffer_size(SLOW_READER_RCVBUF_BYTES).ok()?;
    let stream = socket.connect(addr).await.ok()?;
    let (ws, _) = tokio_tungstenite::client_async(url, stream).await.ok()?;
    Some(ws)
}
