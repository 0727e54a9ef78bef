//! What connections and the hub task exchange: the inputs a connection queues for the
//! hub task ([`ToHub`]) and the hub task's handle on a connection's writer ([`Outbox`]),
//! bounded in frames and bytes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::limits::{
    OUTBOX_BYTES_MAX, OUTBOX_FRAMES_MAX, RELAY_OUTBOX_BYTES_MAX, RELAY_OUTBOX_FRAMES_MAX,
};
use swarmtodo_cluster::ClusterError;
use swarmtodo_core::hub::{
    Answer, Call, Caller, Close, ConnId, EventKinds, Identity, Input, StoredList,
};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::ApiError;
use swarmtodo_store::StoreError;

/// What the hub task receives.
#[derive(Debug)]
pub(crate) enum ToHub {
    /// A connection opened.
    Open {
        /// The connection.
        id: ConnId,
        /// Its writer.
        outbox: Outbox,
        /// Who its token says it is.
        who: Option<Identity>,
        /// Where it comes from.
        address: std::net::IpAddr,
        /// The kinds of event it asked to be pushed (`?events=`).
        events: EventKinds,
    },
    /// An input for the core.
    Input(Input),
    /// Close a connection for a reason found outside the core (rate, size, idleness):
    /// an `error` message, then the close frame.
    Kick(ConnId, Close),
    /// A list the core asked for (`Effects::loads`), loaded from the store by a task of
    /// its own (the hub task goes on meanwhile; the frames for it wait in the core).
    Loaded(DocumentId, Box<Result<Option<StoredList>, StoreError>>),
    /// In a cluster: a list the core asked for that this hub cannot act for (another
    /// hub holds it, or NATS failed), and why.
    Unavailable(DocumentId, Unavailable),
    /// In a cluster: a list this hub held and no longer holds (its lease could not be
    /// renewed), and why.
    Lost(DocumentId, String),
    /// A list's document rebuilt from its snapshot by the rebuilding thread (a
    /// compaction asked for it), for [`swarmtodo_core::hub::HubCore::rebuilt`].
    Rebuilt(DocumentId, Box<swarmtodo_core::model::Rebuilt>),
    /// A call of the JSON API, answered on `reply` (a write once it is durable).
    Call {
        /// Who calls.
        caller: Caller,
        /// The list's name.
        list: String,
        /// What it asks.
        call: Call,
        /// Where the answer goes.
        reply: oneshot::Sender<Result<Answer, ApiError>>,
        /// Forwarded by another hub of the cluster (which is not forwarded again).
        forwarded: bool,
    },
    /// A reader follows list `list`'s events from now on.
    Subscribe {
        /// The list.
        list: DocumentId,
        /// Where its receiver goes.
        reply: oneshot::Sender<crate::stream::Subscription>,
    },
    /// Stop: everything queued before this is handled (and committed) first; then every
    /// peer is closed with 1001.
    Shutdown,
}

/// Why this hub cannot act for a list, and the hub that does, if one does.
#[derive(Debug)]
pub(crate) struct Unavailable {
    /// What failed, to tell peers and callers.
    pub(crate) why: String,
    /// The list's authority (another hub holds its lease).
    pub(crate) holder: Option<String>,
}

impl From<ClusterError> for Unavailable {
    fn from(e: ClusterError) -> Unavailable {
        let holder = match &e {
            ClusterError::LeaseHeld { by, .. } => Some(by.clone()),
            _ => None,
        };
        Unavailable {
            why: e.to_string(),
            holder,
        }
    }
}

impl From<String> for Unavailable {
    fn from(why: String) -> Unavailable {
        Unavailable { why, holder: None }
    }
}

/// The hub's handle on one connection's writer.
#[derive(Debug)]
pub(crate) struct Outbox {
    /// Frames to send, bounded by [`OUTBOX_FRAMES_MAX`].
    pub(crate) frames: mpsc::Sender<Vec<u8>>,
    /// Closes the connection with a code; separate from `frames` so that a full outbox
    /// can still be closed.
    pub(crate) close: oneshot::Sender<Close>,
    /// Bytes in `frames` not yet written to the socket (the writer subtracts).
    pub(crate) queued_bytes: Arc<AtomicUsize>,
}

/// The writer's side of an [`Outbox`]: the frames queued, the close, and the bytes
/// queued (the writer subtracts what it takes).
pub(crate) struct OutboxReader {
    pub(crate) frames: mpsc::Receiver<Vec<u8>>,
    pub(crate) close: oneshot::Receiver<Close>,
    pub(crate) queued_bytes: Arc<AtomicUsize>,
}

impl Outbox {
    /// An outbox of [`OUTBOX_FRAMES_MAX`] frames, and its writer's side.
    pub(crate) fn new() -> (Outbox, OutboxReader) {
        let (frames, frames_rx) = mpsc::channel::<Vec<u8>>(OUTBOX_FRAMES_MAX);
        let (close, close_rx) = oneshot::channel::<Close>();
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let reader = OutboxReader {
            frames: frames_rx,
            close: close_rx,
            queued_bytes: queued_bytes.clone(),
        };
        let outbox = Outbox {
            frames,
            close,
            queued_bytes,
        };
        (outbox, reader)
    }

    pub(crate) fn close(self, close: Close) {
        let _ = self.close.send(close);
    }

    /// Queues a frame; `Err(true)` when the peer is too far behind (frames, or
    /// [`OUTBOX_BYTES_MAX`] queued already), `Err(false)` when its connection is gone.
    pub(crate) fn push(&self, frame: Vec<u8>) -> Result<(), bool> {
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
    pub(crate) fn offer(&self, frame: Vec<u8>) -> bool {
        let queued_frames = OUTBOX_FRAMES_MAX.saturating_sub(self.frames.capacity());
        if self.queued_bytes.load(Ordering::Relaxed) + frame.len() > RELAY_OUTBOX_BYTES_MAX
            || queued_frames >= RELAY_OUTBOX_FRAMES_MAX
        {
            return false;
        }
        self.push(frame).is_ok()
    }
}
