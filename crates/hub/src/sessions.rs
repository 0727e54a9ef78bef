//! Sync peers across a cluster (docs/DESIGN.md §10): a peer that connects to a hub which
//! is not its list's authority is carried to the hub that is. Its frames go there over
//! NATS as they come, the authority's answers come back the same way, and the authority
//! treats the peer as one of its own connections: it checks every frame against the
//! peer's identity (as the carrying hub admitted it), merges, judges and repairs, and
//! sends only what it repaired — so no peer, wherever it connects, receives a change
//! the authority did not judge.
//!
//! A session is named `<carrying hub>/<its process>-<its connection>` (a hub restarted
//! under its id numbers its connections anew: the process part keeps the names of its
//! sessions apart from its former process's); its messages go to the other hub's
//! session subject. The carrying hub sends `open` (who the peer is), `frame`,
//! `alive` (every third of a lease) and `close` (the peer left); the authority sends
//! `frame`, `alive` (every third of a lease) and `close` (with why). The carrying hub
//! closes the peer with 1012 `list_moved` once the authority no longer holds the list;
//! the authority lets a session go once its carrying hub has been silent for
//! [`SESSION_SILENT_MAX`] leases, and says so with 1012 `list_moved` too (the peer
//! reconnects if its hub wakes up).
//!
//! Each side numbers what it sends. NATS keeps nothing for a hub that is away, so a
//! hub cut from NATS for less than that silence misses messages; a sync that missed a
//! frame would wait for it forever. A gap ends the session instead: the carrying hub
//! closes its peer with 1012 `session_lost`, and the peer reconnects and syncs afresh.
//!
//! A connection is carried whole, and only while it syncs nothing on the carrying hub
//! (`HubCore::hand_over`); frames it sends later for other lists go to the same hub.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use swarmtodo_cluster::{Cluster, SessionMessage};
use swarmtodo_core::hub::{Close, ConnId, EventKinds, Handover, Identity, Input};
use swarmtodo_proto::wire::{self, DocumentId, PeerId, WireMessage, PROTOCOL_VERSION};

use crate::channel::{Outbox, OutboxReader, ToHub};
use crate::cluster::until_moved;
use crate::limits::{OUTBOX_FRAMES_MAX, SESSION_SILENT_MAX};

/// The first connection number of peers carried here from other hubs (the listener
/// numbers its own from 1).
const CARRIED_CONN_FIRST: u64 = 1 << 62;

/// True for a connection of a peer another hub carried here: it is never carried on
/// to a third hub (when this hub loses the list, the carrying hub carries the peer to
/// the new holder itself).
pub(crate) fn carried_here(conn: ConnId) -> bool {
    conn.0 >= CARRIED_CONN_FIRST
}

/// Who a carried peer is, sent with `open`.
#[derive(Debug, Serialize, Deserialize)]
struct Opened {
    peer: String,
    identity: Option<Identity>,
    address: Option<std::net::IpAddr>,
    events: EventKinds,
}

/// What the hub task hands a carried connection's session: what its peer sent.
#[derive(Debug)]
pub(crate) enum FromPeer {
    /// A frame.
    Frame(Vec<u8>),
    /// The peer left.
    Gone,
    /// Close the peer (too fast, too large, idle) for this reason.
    Kick(Close),
}

/// What the authority sent a session carried from here.
#[derive(Debug)]
enum FromHolder {
    Frame(Vec<u8>),
    Close(Close),
    /// Some of its messages were lost on the way.
    Lost,
}

/// Where each session's messages go on this hub, and the number of the message that
/// comes next from the other hub.
#[derive(Debug)]
enum Route {
    /// A peer of this hub, carried to another: to its session's task.
    Carried {
        tx: mpsc::Sender<FromHolder>,
        next: u64,
    },
    /// A peer of another hub, carried here: its connection in this hub's core, and when
    /// its hub was last heard from.
    Held {
        conn: ConnId,
        heard: Instant,
        next: u64,
    },
}

/// True when message `m` is the one that comes next in its session (`next`), which
/// then counts it. A message without a number (from a hub that does not number them)
/// is taken as it comes.
fn in_order(next: &mut u64, m: &SessionMessage) -> bool {
    if m.seq == 0 {
        return true;
    }
    if m.seq != *next {
        return false;
    }
    *next += 1;
    true
}

/// One side of a session: its messages to the other hub, numbered in the order sent.
struct Outgoing {
    cluster: Cluster,
    to: String,
    session: String,
    sent: u64,
}

impl Outgoing {
    fn new(cluster: &Cluster, to: &str, session: &str) -> Outgoing {
        Outgoing {
            cluster: cluster.clone(),
            to: to.to_owned(),
            session: session.to_owned(),
            sent: 0,
        }
    }

    /// Sends message `op`. A failure is logged and its number stays spent: the other
    /// hub sees the gap at the next message (every `alive` at the latest).
    async fn send(&mut self, op: &str, body: &[u8]) {
        self.sent += 1;
        let sent = self
            .cluster
            .session_send(&self.to, &self.session, op, self.sent, body)
            .await;
        if let Err(e) = sent {
            tracing::info!(session = self.session, op, error = %e, "a carried session's message was not sent");
        }
    }
}

/// The sessions of this hub, both ways.
#[derive(Debug, Clone)]
pub(crate) struct Sessions {
    cluster: Cluster,
    routes: Arc<Mutex<BTreeMap<String, Route>>>,
    next_conn: Arc<AtomicU64>,
    /// This process, among the processes that ran under this hub's id.
    process: String,
}

impl Sessions {
    /// Receives the sessions' messages sent to this hub and routes them, on the
    /// cluster's runtime, until the hub task is gone.
    pub(crate) fn serve(cluster: Cluster, to_hub: mpsc::WeakSender<ToHub>) -> Sessions {
        let sessions = Sessions {
            cluster: cluster.clone(),
            routes: Arc::default(),
            next_conn: Arc::new(AtomicU64::new(CARRIED_CONN_FIRST)),
            process: automerge::ActorId::random().to_hex_string()[..8].to_owned(),
        };
        let me = sessions.clone();
        cluster.spawn(async move {
            let mut messages = match me.cluster.sessions().await {
                Ok(m) => m,
                Err(e) => {
                    tracing::error!(error = %e, "no sync peers can be carried to or from other hubs");
                    return;
                }
            };
            let every = me.cluster.lease_ttl();
            let mut sweep = tokio::time::interval(every);
            loop {
                let m = tokio::select! {
                    m = messages.next() => m,
                    _ = sweep.tick() => {
                        let Some(to_hub) = to_hub.upgrade() else { return };
                        me.let_silent_go(&to_hub).await;
                        continue;
                    }
                };
                let Some(m) = m else { return };
                let Some(to_hub) = to_hub.upgrade() else {
                    return;
                };
                me.route(m, &to_hub).await;
            }
        });
        sessions
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Route>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn route(&self, m: SessionMessage, to_hub: &mpsc::Sender<ToHub>) {
        if m.op == "open" {
            return self.open(m, to_hub).await;
        }
        let input = {
            let mut routes = self.lock();
            match routes.get_mut(&m.session) {
                Some(Route::Carried { tx, next }) => {
                    let got = if !in_order(next, &m) {
                        tracing::info!(session = m.session, expected = *next, got = m.seq, "messages from the list's hub were lost on the way: its peer reconnects");
                        Some(FromHolder::Lost)
                    } else {
                        match m.op.as_str() {
                            "frame" => Some(FromHolder::Frame(m.body)),
                            "alive" => None,
                            _ => Some(FromHolder::Close(
                                serde_json::from_slice(&m.body).unwrap_or_else(|_| {
                                    close(
                                        1012,
                                        "list_moved",
                                        "the hub holding the list closed: reconnect",
                                    )
                                }),
                            )),
                        }
                    };
                    // A session too far behind, or missing messages, loses its route:
                    // its task closes the peer.
                    if let Some(got) = got {
                        let lost = matches!(got, FromHolder::Lost);
                        if tx.try_send(got).is_err() || lost {
                            routes.remove(&m.session);
                        }
                    }
                    None
                }
                Some(Route::Held { conn, heard, next }) => {
                    *heard = Instant::now();
                    let conn = *conn;
                    if !in_order(next, &m) {
                        tracing::info!(session = m.session, expected = *next, got = m.seq, "messages from a carried peer's hub were lost on the way: letting the peer go");
                        routes.remove(&m.session);
                        Some(Input::Disconnected(conn))
                    } else {
                        match m.op.as_str() {
                            "frame" => Some(Input::Frame(conn, m.body)),
                            "close" => {
                                routes.remove(&m.session);
                                Some(Input::Disconnected(conn))
                            }
                            _ => None,
                        }
                    }
                }
                None => {
                    // A session this hub does not know — opened with this hub's former
                    // process (same id, restarted), or let go — whose carrying hub
                    // still sends: it closes its peer, which reconnects and is carried
                    // anew (`until_moved` sees no move: the holder's id is the same).
                    let carrier = m.session.split_once('/').map(|(hub, _)| hub.to_owned());
                    if let Some(carrier) = carrier.filter(|c| c != self.cluster.hub()) {
                        if matches!(m.op.as_str(), "frame" | "alive") {
                            let cluster = self.cluster.clone();
                            let close = close(
                                1012,
                                "list_moved",
                                "the list's hub restarted since you were carried there: reconnect",
                            );
                            let body = serde_json::to_vec(&close).unwrap_or_default();
                            self.cluster.spawn(async move {
                                let _ = cluster
                                    .session_send(&carrier, &m.session, "close", 0, &body)
                                    .await;
                            });
                        }
                    }
                    None
                }
            }
        };
        if let Some(input) = input {
            let _ = to_hub.send(ToHub::Input(input)).await;
        }
    }

    /// A peer of another hub carried here: a connection of this hub's own, whose
    /// frames go back to that hub.
    async fn open(&self, m: SessionMessage, to_hub: &mpsc::Sender<ToHub>) {
        let Some((from, _)) = m.session.split_once('/') else {
            return;
        };
        let (opened, peer) = match serde_json::from_slice::<Opened>(&m.body)
            .map_err(|e| e.to_string())
            .and_then(|o| {
                PeerId::new(o.peer.clone())
                    .map(|p| (o, p))
                    .map_err(|e| e.to_string())
            }) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(session = m.session, error = %e, "a carried peer's opening does not decode");
                return;
            }
        };
        let conn = ConnId(self.next_conn.fetch_add(1, Ordering::Relaxed));
        let (outbox, reader) = Outbox::new();
        let OutboxReader {
            frames: mut frames_rx,
            close: mut close_rx,
            queued_bytes,
        } = reader;
        self.lock().insert(
            m.session.clone(),
            Route::Held {
                conn,
                heard: Instant::now(),
                next: m.seq.saturating_add(1),
            },
        );
        // What the core sends the connection goes back to the carrying hub; its first
        // frame answers the `join` below, which that hub answered itself. An `alive`
        // every third of a lease lets that hub see a frame lost on the way even when
        // nothing follows it.
        let mut out = Outgoing::new(&self.cluster, from, &m.session);
        let every = self.cluster.lease_ttl() / 3;
        let me = self.clone();
        self.cluster.spawn(async move {
            let mut first = true;
            let mut alive = tokio::time::interval(every);
            let closed = loop {
                tokio::select! {
                    biased;
                    c = &mut close_rx => break c.ok(),
                    f = frames_rx.recv() => {
                        let Some(f) = f else { break None };
                        queued_bytes.fetch_sub(f.len(), Ordering::Relaxed);
                        if std::mem::take(&mut first) {
                            continue;
                        }
                        out.send("frame", &f).await;
                    }
                    _ = alive.tick() => out.send("alive", &[]).await,
                }
            };
            // Closed by the core, or let go without a word (its hub was silent past
            // SESSION_SILENT_MAX, or this hub's task ended): the carrying hub closes its
            // peer, which reconnects and is carried anew.
            let close = closed.unwrap_or_else(|| {
                close(
                    1012,
                    "list_moved",
                    "the list's hub let this carried session go: reconnect",
                )
            });
            let body = serde_json::to_vec(&close).unwrap_or_default();
            out.send("close", &body).await;
            me.lock().remove(&out.session);
        });
        let join = wire::encode(&WireMessage::Join {
            sender_id: peer,
            supported_protocol_versions: Some(vec![PROTOCOL_VERSION.to_owned()]),
            peer_metadata: None,
        });
        let address = opened
            .address
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        tracing::debug!(
            session = m.session,
            conn = conn.0,
            "a peer of another hub carried here"
        );
        let _ = to_hub
            .send(ToHub::Open {
                id: conn,
                outbox,
                who: opened.identity,
                address,
                events: opened.events,
            })
            .await;
        let _ = to_hub.send(ToHub::Input(Input::Frame(conn, join))).await;
    }

    /// Lets go the carried peers whose hubs have been silent too long (a hub killed, or
    /// cut from NATS, never says its peers left).
    async fn let_silent_go(&self, to_hub: &mpsc::Sender<ToHub>) {
        let silent_max = self.cluster.lease_ttl() * SESSION_SILENT_MAX;
        let gone: Vec<ConnId> = {
            let mut routes = self.lock();
            let mut gone = Vec::new();
            routes.retain(|_, r| match r {
                Route::Held { conn, heard, .. } if heard.elapsed() > silent_max => {
                    gone.push(*conn);
                    false
                }
                _ => true,
            });
            gone
        };
        for conn in gone {
            tracing::info!(
                conn = conn.0,
                "a carried peer's hub went silent: letting it go"
            );
            let _ = to_hub.send(ToHub::Input(Input::Disconnected(conn))).await;
        }
    }

    /// Carries `handed` (a peer of list `doc`, held by hub `holder`) there, its
    /// `outbox` with it; returns where the hub task sends what the peer sends next.
    pub(crate) fn carry(
        &self,
        doc: DocumentId,
        holder: String,
        handed: Handover,
        outbox: Outbox,
    ) -> mpsc::Sender<FromPeer> {
        let (to_session, mut from_peer) = mpsc::channel::<FromPeer>(OUTBOX_FRAMES_MAX);
        let (to_me, mut from_holder) = mpsc::channel::<FromHolder>(OUTBOX_FRAMES_MAX);
        let session = format!("{}/{}-{}", self.cluster.hub(), self.process, handed.conn.0);
        self.lock()
            .insert(session.clone(), Route::Carried { tx: to_me, next: 1 });
        let me = self.clone();
        self.cluster.spawn(async move {
            let cluster = &me.cluster;
            let opened = Opened {
                peer: handed.peer.to_string(),
                identity: handed.identity,
                address: handed.address,
                events: handed.events,
            };
            let mut out = Outgoing::new(cluster, &holder, &session);
            tracing::debug!(session, holder, %doc, "a peer carried to the list's hub");
            out.send("open", &serde_json::to_vec(&opened).unwrap_or_default())
                .await;
            for f in handed.frames {
                out.send("frame", &f).await;
            }
            let moved = until_moved(cluster, doc, &holder);
            tokio::pin!(moved);
            let mut alive = tokio::time::interval(cluster.lease_ttl() / 3);
            let ended: Option<Close> = loop {
                tokio::select! {
                    got = from_holder.recv() => match got {
                        Some(FromHolder::Frame(f)) => match outbox.push(f) {
                            Ok(()) => {}
                            Err(true) => {
                                tracing::info!(session, "a carried peer's outbox is full: closing a slow reader");
                                break Some(close(1008, "slow_reader", ""));
                            }
                            Err(false) => break None,
                        },
                        Some(FromHolder::Close(c)) => {
                            tracing::debug!(session, code = c.code, reason = c.reason, "the list's hub closed a carried peer");
                            outbox.close(c);
                            me.lock().remove(&session);
                            return;
                        }
                        Some(FromHolder::Lost) => break Some(close(
                            1012,
                            "session_lost",
                            "messages between this hub and the list's hub were lost on the way: reconnect",
                        )),
                        // Its route is gone: it fell too far behind.
                        None => {
                            tracing::info!(session, "a carried peer fell too far behind its hub's messages: closing a slow reader");
                            break Some(close(1008, "slow_reader", ""));
                        }
                    },
                    got = from_peer.recv() => match got {
                        Some(FromPeer::Frame(f)) => out.send("frame", &f).await,
                        Some(FromPeer::Kick(c)) => break Some(c),
                        Some(FromPeer::Gone) => break None,
                        // The hub task let go of it (it fell behind, or the hub stops).
                        None => break Some(close(
                            1013,
                            "list_elsewhere",
                            "this hub stopped carrying you to the list's hub: reconnect",
                        )),
                    },
                    () = &mut moved => break Some(close(
                        1012,
                        "list_moved",
                        &format!("hub {holder}, which this hub carried you to, no longer holds the list: reconnect"),
                    )),
                    _ = alive.tick() => out.send("alive", &[]).await,
                }
            };
            if let Some(c) = ended {
                outbox.close(c);
            }
            out.send("close", &[]).await;
            me.lock().remove(&session);
        });
        to_session
    }
}

fn close(code: u16, reason: &str, message: &str) -> Close {
    Close {
        code,
        reason: reason.to_owned(),
        message: (!message.is_empty()).then(|| message.to_owned()),
    }
}
