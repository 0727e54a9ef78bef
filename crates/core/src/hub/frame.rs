//! One frame from a connection: decoded, checked against its state, dispatched.

use super::budget::Verdict;
use super::limits::{
    EPHEMERAL_BURST_BYTES, EPHEMERAL_BURST_MESSAGES, EPHEMERAL_BYTES_PER_SECOND,
    EPHEMERAL_MESSAGES_PER_SECOND, LOAD_WAITING_AS_SENT_BYTES_MAX, LOAD_WAITING_BYTES_MAX,
};
use super::{Close, Conn, ConnId, ConnState, Effects, HubCore, EVENTS_SESSION, PROTOCOL_VERSION};
use crate::proto::wire::{self, PeerMetadata, WireMessage};
use crate::syncmsg;

impl HubCore {
    pub(super) fn frame(&mut self, now_ms: i64, c: ConnId, bytes: &[u8], fx: &mut Effects) {
        let Some(conn) = self.conns.get(&c) else {
            return;
        };
        let msg = match wire::decode(bytes) {
            Ok(m) => m,
            Err(e) => {
                let code = if e.code() == "message_too_large" {
                    1009
                } else {
                    1002
                };
                return self.fail(c, code, e.code(), format!("bad message: {e}"), fx);
            }
        };
        let remote = match (&conn.state, msg) {
            (
                ConnState::Handshake,
                WireMessage::Join {
                    sender_id,
                    supported_protocol_versions,
                    ..
                },
            ) => {
                // Absent: an old client, which speaks "1".
                let speaks = supported_protocol_versions
                    .as_ref()
                    .is_none_or(|vs| vs.iter().any(|v| v == PROTOCOL_VERSION));
                if !speaks {
                    return self.fail(
                        c,
                        1002,
                        "protocol_version",
                        format!(
                            "no supported protocol version in {supported_protocol_versions:?}; this hub speaks {PROTOCOL_VERSION:?}"
                        ),
                        fx,
                    );
                }
                let reply = WireMessage::Peer {
                    sender_id: self.config.peer_id.clone(),
                    selected_protocol_version: PROTOCOL_VERSION.to_owned(),
                    target_id: sender_id.clone(),
                    peer_metadata: Some(PeerMetadata {
                        storage_id: None,
                        is_ephemeral: false,
                    }),
                };
                fx.sends.push((c, wire::encode(&reply)));
                if let Some(conn) = self.conns.get_mut(&c) {
                    conn.state = ConnState::Ready(sender_id);
                }
                return;
            }
            (ConnState::Handshake, _) => {
                return self.fail(c, 1002, "handshake", "send join first".to_owned(), fx)
            }
            (ConnState::Ready(remote), msg) => (remote.clone(), msg),
        };
        let (remote, msg) = remote;
        // A peer speaks only as itself: a relay carries the connection's own peer id,
        // and a frame that names another sender (the hub's, another peer's) is refused.
        if let Some(claimed) = msg.sender_id().filter(|s| **s != remote) {
            return self.fail(
                c,
                1008,
                "sender_mismatch",
                format!(
                    "this connection joined as {remote:?} but sent a message as {claimed:?}: send every message with your own peer id"
                ),
                fx,
            );
        }
        // A frame for a stored list not in memory waits for it to load (a sync or
        // request starts the load; an ephemeral message is only relayed to the list's
        // peers, so it waits only behind a load under way, to keep its order).
        let target = match &msg {
            WireMessage::Request { document_id, .. } | WireMessage::Sync { document_id, .. } => {
                Some((*document_id, true))
            }
            WireMessage::Ephemeral { document_id, .. } => Some((*document_id, false)),
            _ => None,
        };
        if let Some((doc, syncs)) = target {
            let loading = self.waiting.contains_key(&doc) || self.calls.contains_key(&doc);
            if !self.docs.contains_key(&doc) && (loading || syncs && self.maybe_stored(&doc)) {
                let waiting = self.waiting.entry(doc).or_default();
                if !loading {
                    fx.loads.push(doc);
                }
                // Many peers joining at once (a swarm after a restart) each send a
                // Bloom filter of the whole list: past LOAD_WAITING_AS_SENT_BYTES_MAX, a
                // message without changes waits as its heads alone (`syncmsg::summed_up`).
                let held = if waiting.1 + bytes.len() > LOAD_WAITING_AS_SENT_BYTES_MAX {
                    summed_up_frame(&msg, &self.config.sync_limits)
                } else {
                    None
                }
                .unwrap_or_else(|| bytes.to_vec());
                if waiting.1 + held.len() > LOAD_WAITING_BYTES_MAX {
                    return self.fail(
                        c,
                        1013,
                        "list_loading",
                        "the list is being loaded and too much waits for it already: reconnect in a moment".to_owned(),
                        fx,
                    );
                }
                waiting.1 += held.len();
                waiting.0.push((c, held));
                return;
            }
        }
        match msg {
            WireMessage::Request {
                document_id, data, ..
            } => self.sync(now_ms, c, &remote, document_id, &data, true, fx),
            WireMessage::Sync {
                document_id, data, ..
            } => self.sync(now_ms, c, &remote, document_id, &data, false, fx),
            WireMessage::Leave { .. } => fx.closes.push((
                c,
                Close {
                    code: 1000,
                    reason: "leave".to_owned(),
                    message: None,
                },
            )),
            WireMessage::Ephemeral {
                document_id,
                count,
                session_id,
                data,
                ..
            } => {
                // Only the hub speaks in its event session: a peer's message there would
                // pass for the hub's events.
                if session_id == EVENTS_SESSION {
                    return self.fail(
                        c,
                        1008,
                        "events_session",
                        format!(
                            "only the hub sends in the {EVENTS_SESSION:?} session: use a session id of your own"
                        ),
                        fx,
                    );
                }
                // Relayed only from a peer that syncs the list and may write it.
                let Some(conn) = self.conns.get(&c) else {
                    return;
                };
                if !conn.docs.contains(&document_id) {
                    fx.sends.push((
                        c,
                        wire::encode(&WireMessage::Error {
                            sender_id: Some(self.config.peer_id.clone()),
                            target_id: Some(remote),
                            message: format!(
                                "ephemeral_not_syncing: your ephemeral message for {document_id} was not relayed: sync the list (request or sync it) before sending to its peers"
                            ),
                        }),
                    ));
                    return;
                }
                let observer = conn.identity.as_ref().is_some_and(|who| {
                    who.role_in(&document_id) == crate::authority::Role::Observer
                });
                if observer {
                    return self.fail(
                        c,
                        1008,
                        "read_only",
                        "this token is an observer's: it may read lists, not send to their peers"
                            .to_owned(),
                        fx,
                    );
                }
                // Each sender's relays are rate-limited before the fan-out.
                let verdict = match self.conns.get_mut(&c) {
                    Some(conn) => conn.relay.take(now_ms, data.len()),
                    None => return,
                };
                match verdict {
                    Verdict::Pass => {}
                    Verdict::Drop => {
                        tracing::debug!(conn = c.0, "ephemeral message over the rate: dropped");
                        return;
                    }
                    Verdict::Close => {
                        return self.fail(
                            c,
                            1008,
                            "ephemeral_rate",
                            format!(
                                "more ephemeral messages than the hub relays ({EPHEMERAL_MESSAGES_PER_SECOND}/s, {} KiB/s on average, bursts of {EPHEMERAL_BURST_MESSAGES} or {} KiB): send fewer or smaller ones, and reconnect later",
                                EPHEMERAL_BYTES_PER_SECOND / 1024,
                                EPHEMERAL_BURST_BYTES / 1024
                            ),
                            fx,
                        );
                    }
                }
                // Relayed as is to the others syncing the list; never stored.
                if let Some(doc) = self.docs.get(&document_id) {
                    // Encoded once for every other peer (the target id is cut out).
                    let m = WireMessage::Ephemeral {
                        target_id: remote.clone(),
                        sender_id: remote,
                        count,
                        session_id,
                        document_id,
                        data,
                    };
                    let Some(each) = wire::ToEach::new(&m) else {
                        return;
                    };
                    for (&other, _) in doc.peers.iter().filter(|(o, _)| **o != c) {
                        if let Some(Conn {
                            state: ConnState::Ready(target),
                            ..
                        }) = self.conns.get(&other)
                        {
                            fx.relays.push((other, each.to(target)));
                        }
                    }
                }
            }
            WireMessage::Join { .. } | WireMessage::Peer { .. } => {
                self.fail(c, 1002, "handshake", "the handshake is over".to_owned(), fx)
            }
            WireMessage::Error { message, .. } => {
                tracing::warn!(conn = c.0, %message, "peer reported an error");
            }
            WireMessage::DocUnavailable { .. }
            | WireMessage::RemoteSubscriptionChange { .. }
            | WireMessage::RemoteHeadsChanged { .. } => {}
        }
    }
}

/// A `sync` or `request` frame without changes, its sync message summed up by its heads
/// ([`syncmsg::summed_up`]): `None` for any other frame, or one no smaller.
fn summed_up_frame(msg: &WireMessage, limits: &syncmsg::Limits) -> Option<Vec<u8>> {
    let out = match msg {
        WireMessage::Sync {
            sender_id,
            target_id,
            document_id,
            data,
        } => WireMessage::Sync {
            sender_id: sender_id.clone(),
            target_id: target_id.clone(),
            document_id: *document_id,
            data: syncmsg::summed_up(data, limits)?,
        },
        WireMessage::Request {
            sender_id,
            target_id,
            document_id,
            data,
        } => WireMessage::Request {
            sender_id: sender_id.clone(),
            target_id: target_id.clone(),
            document_id: *document_id,
            data: syncmsg::summed_up(data, limits)?,
        },
        _ => return None,
    };
    Some(wire::encode(&out))
}
