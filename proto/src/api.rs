//! The JSON API's bodies beyond `todo_write` itself (docs/DESIGN.md §5): a claim, and
//! the answers that carry the list as a durable write left it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Snapshot, Task, Version, WriteResult};

/// `POST /v1/lists/{name}/claim`: give the agent the task named, or the first ready one
/// (pending, unowned, every task it is blocked by completed; by priority, then list
/// order), owned by it and `in_progress`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The agent that takes the task. With a token it is the token's agent (and may be
    /// omitted); without one it is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The task to claim; omitted: the first ready one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

/// The answer to a `todo_write`, once it is durable: what the write did and the list
/// as it stands after it (and after any repair of the authority).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteAnswer {
    /// What the write did.
    pub result: WriteResult,
    /// The list after it.
    pub snapshot: Snapshot,
}

/// The answer to a wait (`GET /v1/lists/{name}/wait?version=V&timeout_ms=T`): whether
/// every agent syncing the list has acknowledged version `V`, and who has not yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitAnswer {
    /// The version waited for.
    pub version: Version,
    /// Every agent connected to the list holds it (true at once when none is).
    pub acknowledged: bool,
    /// The agents (or, without a token, automerge-repo peer ids) that did not by the
    /// timeout, sorted.
    pub pending: Vec<String>,
}

/// The answer to a claim, once it is durable: the task as claimed and the list's
/// version after the claim (read the list for the rest: a claim answers in a size that
/// does not grow with the list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimAnswer {
    /// The task now owned by the agent, `in_progress`.
    pub task: Task,
    /// The list's version after the claim.
    pub version: Version,
}
