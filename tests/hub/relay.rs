//! What the hub relays between peers (`ephemeral` messages) against a real `swarmtodo
//! serve`: raw WebSocket peers as attackers, a raw listener that records everything it
//! is sent, and the Rust client against a hostile hub.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::common::*;
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::hub::core::EVENTS_SESSION;
use swarmtodo::hub::wire::{self, DocumentId, PeerId, WireMessage};
use swarmtodo::model::TodoList;

const LEAD: &str = LEAD_TOKEN;
const WORKER: &str = WORKER_TOKEN;
const OBSERVER: &str = OBSERVER_TOKEN;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Bound on every step of a raw peer.
const WAIT: Duration = Duration::from_secs(10);

fn peer_id(s: &str) -> PeerId {
    PeerId::new(s).unwrap()
}

/// A hub started with [`TOKENS_CONFIG`] in its own scratch folder.
fn hub_with_tokens(name: &str) -> (HubProc, Scratch) {
    hub_with_config(name, TOKENS_CONFIG)
}

/// A raw connection that has joined as `name`; returns it and the hub's peer id.
async fn joined(url: &str, name: &str) -> (Ws, PeerId) {
    let (mut ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .expect("connect timed out")
        .expect("connect");
    let join = wire::encode(&WireMessage::Join {
        sender_id: peer_id(name),
        supported_protocol_versions: Some(vec!["1".into()]),
        peer_metadata: None,
    });
    ws.send(Message::Binary(join.into())).await.unwrap();
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.expect("join") {
            Some(Ok(Message::Binary(b))) => match wire::decode(&b).unwrap() {
                WireMessage::Peer { sender_id, .. } => return (ws, sender_id),
                other => panic!("expected peer, got {other:?}"),
            },
            Some(Ok(_)) => {}
            other => panic!("handshake failed: {other:?}"),
        }
    }
}

/// A V1 sync message with no heads and an empty Bloom filter: "send me everything".
const SEND_ME_EVERYTHING: [u8; 7] = [0x42, 0, 0, 1, 0, 0, 0];

/// Asks for list `doc`: from now on the connection syncs it.
async fn request(ws: &mut Ws, me: &str, hub: &PeerId, doc: DocumentId) {
    let f = wire::encode(&WireMessage::Request {
        sender_id: peer_id(me),
        target_id: hub.clone(),
        document_id: doc,
        data: SEND_ME_EVERYTHING.to_vec(),
    });
    ws.send(Message::Binary(f.into())).await.unwrap();
}

fn ephemeral(
    sender: &PeerId,
    hub: &PeerId,
    doc: DocumentId,
    session: &str,
    data: &[u8],
) -> Message {
    Message::Binary(
        wire::encode(&WireMessage::Ephemeral {
            sender_id: sender.clone(),
            target_id: hub.clone(),
            document_id: doc,
            count: 1,
            session_id: session.to_owned(),
            data: data.to_vec(),
        })
        .into(),
    )
}

/// What a raw peer received: ephemeral messages (sender, session), `error` messages,
/// and the close frame (code, reason), if one came.
#[derive(Debug, Default)]
struct Heard {
    ephemerals: Vec<(String, String)>,
    errors: Vec<String>,
    close: Option<(u16, String)>,
    /// The stream ended without a close frame (the hub dropped the connection).
    ended: bool,
}

/// Reads `ws` for `for_at_most` or until it is closed.
async fn listen(ws: &mut Ws, for_at_most: Duration) -> Heard {
    let mut heard = Heard::default();
    let deadline = tokio::time::Instant::now() + for_at_most;
    while let Ok(next) = tokio::time::timeout_at(deadline, ws.next()).await {
        match next {
            Some(Ok(Message::Binary(b))) => match wire::decode(&b).unwrap() {
                WireMessage::Ephemeral {
                    sender_id,
                    session_id,
                    ..
                } => heard.ephemerals.push((sender_id.to_string(), session_id)),
                WireMessage::Error { message, .. } => heard.errors.push(message),
                _ => {}
            },
            Some(Ok(Message::Close(f))) => {
                heard.close = f.map(|f| (u16::from(f.code), f.reason.to_string()));
                break;
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => {
                heard.ended = true;
                break;
            }
        }
    }
    heard
}

/// The data of a hub event (`repaired`, with `note`), as the hub sends it.
fn event_data(seq: u64, note: &str) -> Vec<u8> {
    let event = swarmtodo::proto::Event {
        seq,
        list: "x".into(),
        at_ms: 0,
        body: swarmtodo::proto::EventBody::Repaired {
            change: "0".repeat(64),
            notes: vec![note.to_owned()],
        },
    };
    minicbor::to_vec(serde_json::to_string(&event).unwrap().as_str()).unwrap()
}

/// Only the hub speaks in its event session; no peer speaks as another; ephemeral
/// messages are relayed only from peers that sync the list and may write it. A raw
/// listener on the list hears only the one honest relay, with its true sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_hub_speaks_for_the_hub_and_only_writers_of_a_list_relay_to_it() {
    let (hub, _dir) = hub_with_tokens("relay-speak");
    let doc = list_document_id("relayed");
    let mut lead = planned();
    let mut c_lead = Connection::connect(&with_token(&hub.url, LEAD), "lead")
        .await
        .unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();
    let (mut listener, hub_id) = joined(&with_token(&hub.url, OBSERVER), "listener").await;
    request(&mut listener, "listener", &hub_id, doc).await;
    let lead_id = peer_id("lead");
    tokio::time::sleep(Duration::from_millis(200)).await;

    // (name, token, syncs the list, sender it claims, session, expected close reason).
    let attacks: [(&str, &str, bool, &PeerId, &str, &str); 5] = [
        (
            "m-hub",
            WORKER,
            true,
            &hub_id,
            "presence",
            "sender_mismatch",
        ),
        (
            "m-other",
            WORKER,
            true,
            &lead_id,
            "presence",
            "sender_mismatch",
        ),
        (
            "m-events",
            WORKER,
            true,
            &peer_id("m-events"),
            EVENTS_SESSION,
            "events_session",
        ),
        (
            "m-events-hub",
            WORKER,
            false,
            &hub_id,
            EVENTS_SESSION,
            "sender_mismatch",
        ),
        (
            "m-observer",
            OBSERVER,
            true,
            &peer_id("m-observer"),
            "presence",
            "read_only",
        ),
    ];
    for (name, token, syncs, sender, session, reason) in attacks {
        let (mut ws, hub_id) = joined(&with_token(&hub.url, token), name).await;
        if syncs {
            request(&mut ws, name, &hub_id, doc).await;
        }
        ws.send(ephemeral(
            sender,
            &hub_id,
            doc,
            session,
            &event_data(99, "wendy is fired"),
        ))
        .await
        .unwrap();
        let heard = listen(&mut ws, Duration::from_secs(3)).await;
        assert_eq!(
            heard.close.as_ref().map(|(c, r)| (*c, r.as_str())),
            Some((1008, reason)),
            "{name}: {heard:?}"
        );
        assert!(!heard.errors.is_empty(), "{name} is told why: {heard:?}");
    }
    // A worker that does not sync the list: its message goes nowhere, and it is told.
    let (mut bystander, hub_id) = joined(&with_token(&hub.url, WORKER), "bystander").await;
    bystander
        .send(ephemeral(
            &peer_id("bystander"),
            &hub_id,
            doc,
            "presence",
            b"hi",
        ))
        .await
        .unwrap();
    let heard = listen(&mut bystander, Duration::from_millis(500)).await;
    assert!(
        heard
            .errors
            .iter()
            .any(|e| e.contains("ephemeral_not_syncing")),
        "{heard:?}"
    );
    // A worker that syncs the list: relayed, as itself.
    let (mut honest, hub_id) = joined(&with_token(&hub.url, WORKER), "honest").await;
    request(&mut honest, "honest", &hub_id, doc).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    honest
        .send(ephemeral(
            &peer_id("honest"),
            &hub_id,
            doc,
            "presence",
            b"hi",
        ))
        .await
        .unwrap();

    let heard = listen(&mut listener, Duration::from_secs(1)).await;
    assert_eq!(
        heard.ephemerals,
        vec![("honest".to_owned(), "presence".to_owned())],
        "the listener hears the honest relay only: {heard:?}"
    );
    drop(hub);
}

/// The Rust client takes events only from its hub: a hostile hub that forwards an
/// `ephemeral` message in the event session from another sender (as a relay would)
/// gets only its own events taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_takes_events_only_from_its_hub() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let doc = list_document_id("hostile");
    let hub_id = peer_id("the-hub");
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
        let send = |m: WireMessage| Message::Binary(wire::encode(&m).into());
        let mut client = None;
        while let Some(Ok(msg)) = ws.next().await {
            let Message::Binary(b) = msg else { continue };
            match wire::decode(&b).unwrap() {
                WireMessage::Join { sender_id, .. } => {
                    client = Some(sender_id.clone());
                    ws.send(send(WireMessage::Peer {
                        sender_id: hub_id.clone(),
                        selected_protocol_version: "1".into(),
                        target_id: sender_id,
                        peer_metadata: None,
                    }))
                    .await
                    .unwrap();
                }
                WireMessage::Request { .. } | WireMessage::Sync { .. } => {
                    let to = client.clone().unwrap();
                    for (n, sender) in [(1, "mallory"), (2, "the-hub")] {
                        ws.send(send(WireMessage::Ephemeral {
                            sender_id: peer_id(sender),
                            target_id: to.clone(),
                            document_id: doc,
                            count: n,
                            session_id: EVENTS_SESSION.to_owned(),
                            data: event_data(n, sender),
                        }))
                        .await
                        .unwrap();
                    }
                    ws.send(send(WireMessage::DocUnavailable {
                        sender_id: hub_id.clone(),
                        target_id: to,
                        document_id: doc,
                    }))
                    .await
                    .unwrap();
                }
                _ => {}
            }
        }
    });
    let mut c = Connection::connect(&url, "me").await.unwrap();
    let mut list = TodoList::create(actor(9));
    c.sync(doc, &mut list).await.unwrap();
    let seqs: Vec<u64> = c.take_events().iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![2], "only the hub's event is taken");
    drop(c);
    server.abort();
}

/// Ephemeral messages one flooding connection sends per round (as in the reported
/// attack: ≈3,000 of 4 KiB in 0.1 s, then it reconnects and does it again).
const FLOOD_MESSAGES: usize = 3_000;
/// Size of each flooded message.
const FLOOD_BYTES: usize = 4 * 1024;
/// Rounds of the flood (new connections each).
const FLOOD_ROUNDS: usize = 10;
/// Flooding connections at once in a round: their relays together are more than a
/// receiver's outbox holds, whatever each one's own budget.
const FLOODERS: usize = 8;
/// Honest peers of the list that do not read while the flood goes on (agents between
/// two syncs).
const IDLE_PEERS: usize = 4;

/// One flooding connection: join, sync the list, send the messages as fast as the socket
/// takes them until the hub closes the connection. Returns how many went out and how
/// the hub ended it.
async fn flood_round(url: String, doc: DocumentId, me: String) -> (usize, Heard) {
    let url = url.as_str();
    let (mut ws, hub_id) = joined(url, &me).await;
    request(&mut ws, &me, &hub_id, doc).await;
    let payload = vec![0x42u8; FLOOD_BYTES];
    let mut sent = 0;
    for _ in 0..FLOOD_MESSAGES {
        let m = ephemeral(&peer_id(&me), &hub_id, doc, "cursor", &payload);
        match tokio::time::timeout(WAIT, ws.send(m)).await {
            Ok(Ok(())) => sent += 1,
            // The hub closed the connection under it.
            _ => break,
        }
    }
    let heard = listen(&mut ws, WAIT).await;
    (sent, heard)
}

/// A peer floods a shared list with ephemeral messages, reconnecting and repeating,
/// while an honest agent writes and others sit between syncs: no honest peer loses its
/// connection, the honest writer's syncs keep working during the flood, and the
/// flooder is told `ephemeral_rate`. Prints the honest edit latency during the flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_flood_costs_no_honest_peer_its_connection() {
    let dir = scratch("relay-flood");
    let hub = HubProc::start(&dir.join("hub.db"));
    let doc = list_document_id("flooded");
    let mut lead = planned();
    let mut c_lead = Connection::connect(&hub.url, "lead").await.unwrap();
    c_lead.sync(doc, &mut lead).await.unwrap();
    let mut idle = Vec::new();
    for i in 0..IDLE_PEERS {
        let mut l = TodoList::create(actor(20 + i as u8));
        let mut c = Connection::connect(&hub.url, &format!("idle-{i}"))
            .await
            .unwrap();
        c.sync(doc, &mut l).await.unwrap();
        idle.push((c, l));
    }
    // Honest latency before the flood.
    let mut quiet = Vec::new();
    for n in 0..5 {
        write(
            &mut lead,
            "lead",
            patch(vec![upsert(task(&format!("q{n}"), "Quiet"))]),
        );
        let t = std::time::Instant::now();
        c_lead.sync(doc, &mut lead).await.unwrap();
        quiet.push(t.elapsed());
    }

    let url = hub.url.clone();
    let flood = tokio::spawn(async move {
        let mut rounds = Vec::new();
        for round in 0..FLOOD_ROUNDS {
            let at_once: Vec<_> = (0..FLOODERS)
                .map(|i| {
                    tokio::spawn(flood_round(
                        url.clone(),
                        doc,
                        format!("flooder-{round}-{i}"),
                    ))
                })
                .collect();
            for f in at_once {
                rounds.push(f.await.unwrap());
            }
        }
        rounds
    });
    // The honest writer writes and syncs while the flood goes on; if the hub drops it,
    // it reconnects (as an agent would), and the latency includes that.
    let mut during = Vec::new();
    let mut lost = Vec::new();
    let mut n = 0;
    while !flood.is_finished() {
        write(
            &mut lead,
            "lead",
            patch(vec![upsert(task(&format!("f{n}"), "Flooded"))]),
        );
        let t = std::time::Instant::now();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), c_lead.sync(doc, &mut lead)).await {
                Ok(Ok(_)) => break,
                other => {
                    lost.push(format!("{other:?}"));
                    c_lead = Connection::connect(&hub.url, &format!("lead-{n}"))
                        .await
                        .unwrap();
                }
            }
        }
        during.push(t.elapsed());
        n += 1;
    }
    let rounds = flood.await.unwrap();
    during.sort();
    quiet.sort();
    eprintln!(
        "flood: {FLOOD_ROUNDS} rounds of {FLOODERS} connections sending {FLOOD_MESSAGES} x {} KiB ephemeral messages; honest edit latency quiet median {:?}, during the flood median {:?} max {:?} over {} edits; the flooders sent {} messages and were closed with {:?}",
        FLOOD_BYTES / 1024,
        quiet[quiet.len() / 2],
        during[during.len() / 2],
        during.last().unwrap(),
        during.len(),
        rounds.iter().map(|(s, _)| s).sum::<usize>(),
        rounds
            .iter()
            .fold(std::collections::BTreeMap::new(), |mut m, (_, h)| {
                *m.entry(h.close.clone()).or_insert(0) += 1;
                m
            })
    );
    assert!(
        lost.is_empty(),
        "the honest writer lost its connection during the flood: {lost:?}"
    );

    // Every idle honest peer still has its connection and gets every write.
    for (i, (c, l)) in idle.iter_mut().enumerate() {
        tokio::time::timeout(Duration::from_secs(30), c.sync(doc, l))
            .await
            .expect("an idle peer's sync finishes")
            .unwrap_or_else(|e| panic!("idle peer {i} lost its connection to the flood: {e}"));
        assert_eq!(
            l.read().tasks.len(),
            lead.read().tasks.len(),
            "idle peer {i}"
        );
    }
    // Each flooder is cut off: closed for its ephemeral rate, or for its frame rate when
    // its frames outran the hub's reading of them (or the close frame was lost in the
    // flood it was still sending).
    for (sent, heard) in &rounds {
        let reason = heard.close.as_ref().map(|(c, r)| (*c, r.as_str()));
        assert!(
            matches!(
                reason,
                Some((1008, "ephemeral_rate")) | Some((1008, "rate_limit"))
            ) || (reason.is_none() && heard.ended),
            "the flooder is told (after {sent} messages): {:?} {:?}",
            heard.close,
            heard.errors
        );
    }
    assert!(
        rounds
            .iter()
            .any(|(_, h)| h.close.as_ref().is_some_and(|(_, r)| r == "ephemeral_rate")),
        "the ephemeral budget closes flooders"
    );
    drop(hub);
}
