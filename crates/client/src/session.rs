//! The client's side of the protocol without I/O: what a client sends a hub, and what
//! a message from the hub means for a list. [`Connection`](crate::Connection) runs it
//! over a WebSocket; the simulator runs it over its simulated network, so simulated
//! agents speak exactly what real clients do.
//!
//! ```
//! use swarmtodo_client::session::{FromHub, Session};
//! use swarmtodo_core::model::TodoList;
//! use swarmtodo_proto::wire::{list_document_id, PeerId, WireMessage};
//!
//! let mut session = Session::new(PeerId::new("agent-1").unwrap());
//! let join = session.join(); // send it, then hand the answer to `handshake`
//! assert!(matches!(join, WireMessage::Join { .. }));
//! session.handshake(WireMessage::Peer {
//!     sender_id: PeerId::new("hub").unwrap(),
//!     target_id: PeerId::new("agent-1").unwrap(),
//!     selected_protocol_version: "1".into(),
//!     peer_metadata: None,
//! }).unwrap();
//! let doc = list_document_id("swarm-42");
//! let mut list = TodoList::create(automerge::ActorId::random());
//! // The first message for a list the client does not have yet is a request.
//! let first = session.sync_message(doc, &list, true).unwrap();
//! assert!(matches!(first, WireMessage::Request { .. }));
//! assert!(!session.in_sync(doc, &list));
//! ```

use std::collections::BTreeMap;

use automerge::sync;
use swarmtodo_core::model::{Merge, TodoList};
use swarmtodo_core::syncmsg;
use swarmtodo_proto::wire::{DocumentId, PeerId, PeerMetadata, WireMessage};
use swarmtodo_proto::Event;

use crate::ClientError;

/// What a message from the hub meant for the list it was handed with.
#[derive(Debug)]
pub enum FromHub {
    /// A sync message for the list, validated and merged (the merge may be empty).
    Merged(Merge),
    /// Events the hub pushed (violations, conflicts, repairs, task changes).
    Events(Vec<Event>),
    /// The hub has no such list.
    Unavailable,
    /// A message about another document, or one a client has nothing to do with.
    Other,
}

/// One client's protocol state with one hub: who it is, who the hub is, and a sync
/// state per document.
#[derive(Debug)]
pub struct Session {
    peer_id: PeerId,
    hub: Option<PeerId>,
    states: BTreeMap<DocumentId, sync::State>,
}

impl Session {
    /// A session for the peer `peer_id`, not joined yet.
    pub fn new(peer_id: PeerId) -> Session {
        Session {
            peer_id,
            hub: None,
            states: BTreeMap::new(),
        }
    }

    /// This peer's id.
    pub fn peer_id(&self) -> &PeerId {
        &self.peer_id
    }

    /// The hub's peer id, once [`Session::handshake`] has taken its answer.
    pub fn hub(&self) -> Option<&PeerId> {
        self.hub.as_ref()
    }

    /// The first message: `join`, offering the protocol version the hub speaks.
    pub fn join(&self) -> WireMessage {
        WireMessage::Join {
            sender_id: self.peer_id.clone(),
            supported_protocol_versions: Some(vec![
                swarmtodo_proto::wire::PROTOCOL_VERSION.to_owned()
            ]),
            peer_metadata: Some(PeerMetadata {
                storage_id: None,
                is_ephemeral: true,
            }),
        }
    }

    /// Takes the hub's answer to `join`: its `peer` message, or the error it closes with.
    pub fn handshake(&mut self, answer: WireMessage) -> Result<(), ClientError> {
        match answer {
            WireMessage::Peer { sender_id, .. } => {
                self.hub = Some(sender_id);
                Ok(())
            }
            WireMessage::Error { message, .. } => Err(ClientError::Closed(message)),
            other => Err(ClientError::Protocol(format!(
                "expected peer, got {}",
                other.type_name()
            ))),
        }
    }

    /// Whether this session has synced `doc` before (it keeps a sync state for it).
    pub fn knows(&self, doc: DocumentId) -> bool {
        self.states.contains_key(&doc)
    }

    /// The next sync message for `doc`, if `list` has anything to say. `request`: as
    /// the first message for a document the client does not have yet (the hub then
    /// answers `doc-unavailable` if it has none either). `None` before the handshake.
    pub fn sync_message(
        &mut self,
        doc: DocumentId,
        list: &TodoList,
        request: bool,
    ) -> Option<WireMessage> {
        let target_id = self.hub.clone()?;
        let state = self.states.entry(doc).or_default();
        let data = list.generate_sync_message(state)?.encode();
        let (document_id, sender_id) = (doc, self.peer_id.clone());
        Some(if request {
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
        })
    }

    /// What `msg` from the hub means for `list` (the document `doc`): a sync message is
    /// validated as any peer's would be and merged; events are read only from the hub's
    /// own event session; an `error` is the hub closing the connection.
    pub fn receive(
        &mut self,
        doc: DocumentId,
        list: &mut TodoList,
        msg: WireMessage,
    ) -> Result<FromHub, ClientError> {
        match msg {
            WireMessage::Sync {
                document_id, data, ..
            } if document_id == doc => {
                let checked = syncmsg::validate(&data, &syncmsg::Limits::default())
                    .map_err(|e| ClientError::Protocol(format!("bad sync message: {e}")))?;
                let state = self.states.entry(doc).or_default();
                Ok(FromHub::Merged(
                    list.receive_sync_message(state, checked.into_message())?,
                ))
            }
            WireMessage::Ephemeral {
                sender_id,
                session_id,
                data,
                ..
            } => {
                let Some(hub) = &self.hub else {
                    return Ok(FromHub::Other);
                };
                Ok(FromHub::Events(swarmtodo_core::hub::events_of(
                    hub,
                    &sender_id,
                    &session_id,
                    &data,
                )))
            }
            WireMessage::DocUnavailable { document_id, .. } if document_id == doc => {
                Ok(FromHub::Unavailable)
            }
            WireMessage::Error { message, .. } => Err(ClientError::Closed(message)),
            _ => Ok(FromHub::Other),
        }
    }

    /// True when the hub's last word on `doc` was that it has exactly what `list` has:
    /// every local change is on the hub — and the hub answers only after its commit is
    /// durable, so this is the acknowledgement. False before the hub said anything.
    pub fn in_sync(&self, doc: DocumentId, list: &TodoList) -> bool {
        let Some(mut theirs) = self.state(doc).and_then(|s| s.their_heads.clone()) else {
            return false;
        };
        theirs.sort();
        let mut ours = list.heads();
        ours.sort();
        ours == theirs
    }

    /// The sync state of `doc` (what the hub last said it has, what was last sent), for
    /// diagnostics and progress checks.
    pub fn state(&self, doc: DocumentId) -> Option<&sync::State> {
        self.states.get(&doc)
    }

    /// Forgets what was last sent for `doc`, so that the next
    /// [`Session::sync_message`] goes out even with nothing new: this client's heads
    /// again (a keepalive, or a nudge after a message was lost).
    pub fn resend(&mut self, doc: DocumentId) {
        if let Some(s) = self.states.get_mut(&doc) {
            s.last_sent_heads.clear();
        }
    }

    /// `(our heads, the hub's last advertised heads)` for diagnostics.
    pub fn debug_state(&self, doc: DocumentId, list: &TodoList) -> String {
        let theirs = self.states.get(&doc).map(|s| s.their_heads.clone());
        format!("ours {:?}, theirs {:?}", list.heads(), theirs)
    }

    /// The last message: `leave`.
    pub fn leave(&self) -> WireMessage {
        WireMessage::Leave {
            sender_id: self.peer_id.clone(),
        }
    }
}
