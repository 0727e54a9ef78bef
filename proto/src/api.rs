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

/// `POST /v1/lists/{name}/delegate`: hand task `task` of the list to agent `agent`, who
/// works it as a list of its own (`list`, made new): the task is the agent's, and its
/// status follows that list's from then on (all of its tasks completed or cancelled:
/// completed; one in progress: in progress; none in progress and one blocked: blocked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DelegateRequest {
    /// The task handed over.
    pub task: String,
    /// The agent (a subagent) that takes it.
    pub agent: String,
    /// The name of the new list; omitted: `{list}/{task}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<String>,
}

/// The answer to a delegation, once durable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DelegateAnswer {
    /// The list the task is in.
    pub parent: String,
    /// The task, as the delegation left it (owned by the agent).
    pub task: Task,
    /// The agent's list for it.
    pub list: String,
    /// The agent.
    pub agent: String,
    /// On a hub with tokens: a new `worker` token for the agent on its list (and to read
    /// the parent list); shown once, give it to the subagent. None without tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
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

/// How many tasks of a list stand at each status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskCounts {
    /// `pending` tasks.
    pub pending: u64,
    /// `in_progress` tasks.
    pub in_progress: u64,
    /// `completed` tasks.
    pub completed: u64,
    /// `cancelled` tasks.
    pub cancelled: u64,
    /// `blocked` tasks.
    pub blocked: u64,
}

/// One list in `GET /v1/lists`: as its last durable change left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSummary {
    /// The name the list is called by in the API (`null` for a list only ever reached
    /// by its automerge-repo document id, e.g. one a JS peer created).
    pub name: Option<String>,
    /// Its automerge-repo document id.
    pub document: String,
    /// Its version (`null` for a list stored by a hub older than the list index, until
    /// its next change).
    pub version: Option<Version>,
    /// Its tasks by status.
    pub tasks: TaskCounts,
}

/// The answer to `GET /v1/lists[?after=NAME]`: lists in order of their key (the name,
/// or the document id of a list without one), at most `LISTS_PAGE_MAX` per page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListsPage {
    /// The lists of this page.
    pub lists: Vec<ListSummary>,
    /// Where the next page starts (`?after=` this); `null` on the last page.
    pub next: Option<String>,
}

/// The answer to `GET /v1/lists/{name}/tasks/{id}/history[?limit=N]`: the changes that
/// touched the task, oldest first, each with who made it, when, why, and every field it
/// changed, from what to what (blame, from the Automerge history).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskHistory {
    /// The task.
    pub task: String,
    /// The latest `limit` of them (at most `HISTORY_ENTRIES_MAX`), oldest first.
    pub entries: Vec<HistoryEntry>,
    /// How many changes touched the task in all.
    pub total: u64,
}

/// One change to a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryEntry {
    /// The change (hex hash).
    pub change: String,
    /// The agent that made it, as the list records its actor (`null`: never recorded).
    pub agent: Option<String>,
    /// When, as its writer stamped it (ms since the Unix epoch).
    pub at_ms: i64,
    /// Its explanation (the change's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<String>,
    /// The fields it changed, as its writer saw the task just before and just after
    /// (`task`: the task was created or removed).
    pub fields: Vec<FieldChange>,
}

/// A field a change wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldChange {
    /// `content`, `active_form`, `status`, `priority`, `owner`, `blocked_by`,
    /// `position`, or `task`.
    pub field: String,
    /// Its value before (`null`: absent).
    pub before: serde_json::Value,
    /// Its value after (`null`: absent).
    pub after: serde_json::Value,
}
