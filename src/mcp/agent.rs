//! The state of one agent's MCP session, shared by the handler, its tools and the
//! event follower.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Mutex;

use rmcp::{Peer, RoleServer};

use crate::client::http::Api;
use crate::proto::Snapshot;

/// The state of one agent's MCP session.
#[derive(Debug)]
pub(crate) struct Agent {
    pub(crate) api: Api,
    pub(crate) list: String,
    pub(crate) agent: String,
    /// The list as this agent last read it: the base of its whole-list payloads.
    pub(crate) last: Mutex<Option<Snapshot>>,
    /// Tasks this agent created (the only ones a whole-list payload that leaves them out
    /// removes).
    pub(crate) created: Mutex<BTreeSet<String>>,
    /// Resource URIs the client subscribed to.
    pub(crate) subscribed: Mutex<BTreeSet<String>>,
    /// The latest violations, conflicts and repairs, oldest first.
    pub(crate) recent: Mutex<VecDeque<serde_json::Value>>,
    /// The client, once it has called (notifications go to it).
    pub(crate) peer: Mutex<Option<Peer<RoleServer>>>,
    /// Woken when a call found the list: the event follower waiting to retry goes now.
    pub(crate) found: tokio::sync::Notify,
}

impl Agent {
    pub(crate) fn list_uri(&self) -> String {
        format!("swarmtodo://lists/{}", self.list)
    }

    pub(crate) fn violations_uri(&self) -> String {
        format!("swarmtodo://lists/{}/violations", self.list)
    }
}

/// The value behind `m` (a panic elsewhere does not make it unreadable).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
