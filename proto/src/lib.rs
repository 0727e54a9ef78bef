//! Wire types of swarmtodo: the task model, snapshots, `todo_write` requests and
//! results, typed errors and events.
//!
//! These types are the one schema every client reads (docs/DESIGN.md §3, §5, §6). They are
//! plain data: serde with `deny_unknown_fields`, so that a misspelt field is an error and
//! not silently dropped, and `schemars`, so that `proto/schema/*.json` is generated from
//! them (see [`schemas`]).
//!
//! ```
//! use swarmtodo_proto::{Status, Task};
//! let task: Task = serde_json::from_str(
//!     r#"{"id":"t1","content":"Run the tests","status":"in_progress"}"#,
//! ).unwrap();
//! assert_eq!(task.status, Status::InProgress);
//! assert!(serde_json::from_str::<Task>(r#"{"id":"t1","content":"x","status":"done"}"#).is_err());
//! ```

mod api;
pub mod limits;
pub mod projection;
mod request;
pub mod wire;

pub use self::api::{
    ClaimAnswer, ClaimRequest, DelegateAnswer, DelegateRequest, FieldChange, HistoryEntry,
    ListSummary, ListsPage, TaskCounts, TaskHistory, WaitAnswer, WriteAnswer,
};
pub use self::request::as_json as write_request_as_json;
pub use self::request::parse_write_request;

pub use self::limits::{
    AGENT_ID_BYTES_MAX, BLOCKED_BY_COUNT_MAX, EVENT_VALUE_BYTES_MAX, EXPLANATION_BYTES_MAX,
    HISTORY_ENTRIES_MAX, LISTS_PAGE_MAX, LIST_NAME_BYTES_MAX, LIST_TASKS_MAX,
    TASKS_CHANGED_HASHES_MAX, TASK_ID_BYTES_MAX, TASK_TEXT_BYTES_MAX, VIOLATION_TASKS_MAX,
    WRITE_OPS_MAX,
};

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a task stands.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Not started.
    Pending,
    /// Being worked on (at most one per owner, docs/DESIGN.md §4 rule 2).
    InProgress,
    /// Done.
    Completed,
    /// Will not be done.
    Cancelled,
    /// Waiting on something outside the list.
    Blocked,
}

impl Status {
    /// Every value, in the order they are documented.
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::InProgress,
        Status::Completed,
        Status::Cancelled,
        Status::Blocked,
    ];

    /// The wire spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Cancelled => "cancelled",
            Status::Blocked => "blocked",
        }
    }

    /// Open tasks still have work left: everything but `completed` and `cancelled`.
    pub fn is_open(self) -> bool {
        !matches!(self, Status::Completed | Status::Cancelled)
    }

    /// The allowed spellings, for error messages.
    pub fn allowed() -> Vec<&'static str> {
        Status::ALL.iter().map(|s| s.as_str()).collect()
    }
}

impl FromStr for Status {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Status::ALL
            .iter()
            .copied()
            .find(|v| v.as_str() == s)
            .ok_or(())
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How much a task matters.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Do first.
    High,
    /// The default.
    #[default]
    Medium,
    /// Do last.
    Low,
}

impl Priority {
    /// Every value.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Medium, Priority::Low];

    /// The wire spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Medium => "medium",
            Priority::Low => "low",
        }
    }

    /// The allowed spellings, for error messages.
    pub fn allowed() -> Vec<&'static str> {
        Priority::ALL.iter().map(|s| s.as_str()).collect()
    }
}

impl FromStr for Priority {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Priority::ALL
            .iter()
            .copied()
            .find(|v| v.as_str() == s)
            .ok_or(())
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One task of a list, as every client reads it (docs/DESIGN.md §3). The order of a list is
/// the order of its snapshot's `tasks`; the position key itself is internal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Stable id, unique in the list.
    pub id: String,
    /// Imperative form, non-empty: "Run the tests".
    pub content: String,
    /// Present-continuous label for spinners: "Running the tests".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_form: Option<String>,
    /// Where the task stands.
    pub status: Status,
    /// How much it matters.
    #[serde(default)]
    pub priority: Priority,
    /// Agent id that holds the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Ids of tasks in the same list this one waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_by: Vec<String>,
}

/// A list's version: its Automerge heads, each base58-encoded, sorted, joined by `.`.
/// The empty list (no change at all) is `"0"`.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct Version(pub String);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A list at one version: its tasks in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// The version this snapshot shows.
    pub version: Version,
    /// The tasks, in list order.
    pub tasks: Vec<Task>,
}

/// Changes to one existing or new task in a `patch` write. Absent fields keep their
/// value (or take the default for a new task); `null` clears an optional field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskPatch {
    /// The task to change or create. Omit to create a task with a generated id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// New content (required when the task is new).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New active form; `null` clears it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "double_option"
    )]
    #[schemars(with = "Option<String>")]
    pub active_form: Option<Option<String>>,
    /// New status (a new task defaults to `pending`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// New priority (a new task defaults to `medium`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// New owner; `null` releases the task.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "double_option"
    )]
    #[schemars(with = "Option<String>")]
    pub owner: Option<Option<String>>,
    /// New dependency list (replaces the old one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<Vec<String>>,
}

fn double_option<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// One operation of a `patch` write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum PatchOp {
    /// Create the task or change the given fields of it. A new task goes to the end
    /// unless `after` says otherwise.
    Upsert {
        /// The fields to set.
        task: TaskPatch,
    },
    /// Remove the task.
    Remove {
        /// The task to remove.
        id: String,
    },
    /// Move the task right after `after`, or to the front when `after` is absent.
    Move {
        /// The task to move.
        id: String,
        /// The task it should follow; absent: first.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
    },
}

/// What a `todo_write` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum WriteMode {
    /// The desired whole list, applied as a diff against `base_version`: tasks the writer
    /// saw there and left out are removed; tasks others added since are kept.
    Replace {
        /// The list as the writer wants it, in order.
        tasks: Vec<TaskPatch>,
        /// The version the writer last read. Absent: the current version (plain replace).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base_version: Option<Version>,
    },
    /// Single-task operations, applied in order.
    Patch {
        /// The operations.
        ops: Vec<PatchOp>,
    },
}

/// A `todo_write` request (docs/DESIGN.md §5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteRequest {
    /// Replace or patch.
    #[serde(flatten)]
    pub mode: WriteMode,
    /// Compare-and-set: refuse the write unless the list is still at this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_version: Option<Version>,
    /// Why: recorded with the change and on the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<String>,
}

/// What a successful `todo_write` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteResult {
    /// The version after the write (unchanged when `changed` is false).
    pub version: Version,
    /// False when the write asked for what was already there.
    pub changed: bool,
    /// Tasks created, in request order.
    pub created: Vec<String>,
    /// Tasks whose fields or position changed.
    pub updated: Vec<String>,
    /// Tasks removed.
    pub removed: Vec<String>,
}

/// Stable error codes of `todo_write` / `todo_read`. A client branches on these, never
/// on the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// A field has a value outside the allowed set or shape.
    InvalidValue,
    /// A required field is missing or empty.
    MissingField,
    /// The same task id appears twice in one write.
    DuplicateId,
    /// The write would leave two tasks `in_progress` for one owner.
    SecondInProgress,
    /// `expected_version` no longer matches: re-read and retry.
    StaleVersion,
    /// The version named is not known to this replica.
    UnknownVersion,
    /// The write names a task that is not in the list.
    UnknownTask,
    /// A limit was exceeded (sizes, counts).
    LimitExceeded,
    /// A dependency names an unknown task or makes a cycle.
    InvalidDependency,
    /// The replica failed to commit a valid write; nothing changed, retry.
    Internal,
    /// No list has this name: create it first (`PUT /v1/lists/{name}`).
    UnknownList,
    /// A claim found no ready task (pending, unowned, every dependency completed).
    NothingReady,
    /// A claim named a task another agent holds, or one that is not pending.
    Conflict,
    /// The caller's role does not allow this (an observer writes, a worker claims for
    /// another agent).
    Forbidden,
    /// A token is missing or unknown.
    Unauthorized,
    /// No such path in the API.
    NotFound,
    /// The path does not take this method (the `allowed` field lists the ones it takes).
    MethodNotAllowed,
    /// In a cluster: the hub holding the list could not be reached, lost it meanwhile,
    /// or the list is changing hands (the message names the hub): retry.
    ListElsewhere,
}

/// An error a client can act on: a stable code, the field it concerns, the allowed
/// values where a set applies, and a message that says what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiError {
    /// Stable code.
    pub code: ErrorCode,
    /// Path of the offending field, e.g. `ops[2].task.status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The allowed values, when the field takes one of a set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed: Vec<String>,
    /// Human-readable: what went wrong and what to do.
    pub message: String,
    /// On `stale_version`: the current list, so the client can retry without a read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<Box<Snapshot>>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.code)?;
        if let Some(field) = &self.field {
            write!(f, " at {field}")?;
        }
        write!(f, ": {}", self.message)?;
        if !self.allowed.is_empty() {
            write!(f, " (allowed: {})", self.allowed.join(", "))?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

/// The invariants the authority checks (docs/DESIGN.md §4).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// Status and priority are valid values; content is non-empty.
    Schema,
    /// At most one `in_progress` per owner (or per list, by policy).
    SingleActive,
    /// `blocked_by` names existing tasks, has no cycle, and no completed task waits on an
    /// open one.
    Dependencies,
    /// A worker changes only tasks it owns or claims.
    Ownership,
}

impl Rule {
    /// Every rule.
    pub const ALL: [Rule; 4] = [
        Rule::Schema,
        Rule::SingleActive,
        Rule::Dependencies,
        Rule::Ownership,
    ];
}

/// What the authority did about a violation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Resolution {
    /// Reported only; the list keeps the state.
    Reported,
    /// Repaired with an ordinary change of the authority's.
    Repaired {
        /// What the repair did, for people.
        how: String,
    },
}

/// A field value as written by one agent, in a violation or conflict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WrittenValue {
    /// The task.
    pub task: String,
    /// The field.
    pub field: String,
    /// The value (JSON).
    pub value: serde_json::Value,
    /// The agent that wrote it, when the list knows the writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The Automerge operation that wrote it (`counter@actor`).
    pub op: String,
}

/// An invariant broken by a merge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Violation {
    /// Stable key: the same violation always has the same key, so it is reported once.
    pub key: String,
    /// The rule.
    pub rule: Rule,
    /// What is wrong, for people.
    pub message: String,
    /// The tasks involved, sorted: the first [`VIOLATION_TASKS_MAX`] of them.
    pub tasks: Vec<String>,
    /// How many tasks are involved (more than `tasks` lists when over
    /// [`VIOLATION_TASKS_MAX`]).
    #[serde(default)]
    pub tasks_total: u64,
    /// The agents involved, sorted (at most [`VIOLATION_TASKS_MAX`]).
    pub agents: Vec<String>,
    /// The changes involved (hex hashes), sorted (at most [`VIOLATION_TASKS_MAX`]).
    pub changes: Vec<String>,
    /// The values involved (of the tasks listed; at most [`VIOLATION_TASKS_MAX`]).
    pub values: Vec<WrittenValue>,
    /// The list's version when the violation was detected.
    pub version: Version,
    /// Reported or repaired.
    pub resolution: Resolution,
}

/// Concurrent writes to the same field of the same task (docs/DESIGN.md §4 rule 5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conflict {
    /// Stable key, as for violations.
    pub key: String,
    /// The task.
    pub task: String,
    /// The field.
    pub field: String,
    /// Every concurrent value, in Automerge's order (the winner last).
    pub values: Vec<WrittenValue>,
    /// The value that won.
    pub winner: WrittenValue,
    /// The agents involved, sorted.
    pub agents: Vec<String>,
    /// The list's version when the conflict was detected.
    pub version: Version,
}

/// One task's change in a `tasks_changed` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskChange {
    /// The task.
    pub task: String,
    /// The fields written (`task` for the entry itself: created or removed).
    pub fields: Vec<String>,
    /// The task before (absent: created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Task>,
    /// The task after (absent: removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Task>,
}

/// What happened to a list (docs/DESIGN.md §6). Every client reads this one schema.
///
/// Not `deny_unknown_fields`: it is flattened into [`Event`] (serde would refuse the
/// event's own fields), and readers of the hub's output should accept fields a newer
/// hub adds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventBody {
    /// Tasks were written (by agents, or by the authority's repair).
    TasksChanged {
        /// The agents whose changes these are, sorted.
        agents: Vec<String>,
        /// The changes (hex hashes): at most [`TASKS_CHANGED_HASHES_MAX`], the last ones
        /// of the merge, so that a merge of a whole history (a list's first sync) still
        /// makes an event the store can keep.
        changes: Vec<String>,
        /// The tasks, sorted by id.
        tasks: Vec<TaskChange>,
    },
    /// An invariant was broken.
    Violation(Violation),
    /// Concurrent writes to one field.
    Conflict(Conflict),
    /// The authority repaired the list with a change of its own.
    Repaired {
        /// The repair change (hex hash).
        change: String,
        /// What it did.
        notes: Vec<String>,
    },
    /// A pending task's last open dependency was completed (or removed): it is ready to
    /// claim.
    Unblocked {
        /// The task now ready.
        task: String,
        /// The dependency whose completion made it so.
        by: String,
    },
    /// The hub gave a task to an agent that claimed it (`POST …/claim`): it is the
    /// agent's, `in_progress` (its `tasks_changed` says the same with every field).
    Claimed {
        /// The task.
        task: String,
        /// The agent that holds it now.
        agent: String,
    },
    /// An agent arrived on the list: its first connection syncing it, or its first API
    /// call on it (since it last left).
    AgentJoined {
        /// The agent (a token's agent, a caller's name, or a sync peer's id).
        agent: String,
    },
    /// An agent left the list: no connection syncing it and no API call for the list's
    /// lease, or for the hub's presence window without one.
    AgentLeft {
        /// The agent.
        agent: String,
    },
    /// An agent gone longer than the list's lease held tasks in progress.
    LeaseExpired {
        /// The agent.
        agent: String,
        /// Its tasks in progress, sorted by id (at most [`VIOLATION_TASKS_MAX`]).
        tasks: Vec<String>,
        /// How many there were.
        tasks_total: u64,
        /// They were released (pending, unowned) by a change of the hub; false: only
        /// reported (policy `report`).
        released: bool,
    },
    /// A task of list `parent` was handed to `agent`, who works it as list `sub_list`
    /// (the same event on both lists).
    Delegated {
        /// The list the task is in.
        parent: String,
        /// The task.
        task: String,
        /// The agent's list for it.
        sub_list: String,
        /// The agent.
        agent: String,
    },
    /// A delegated task took the status its list rolls up to (on the parent list).
    RolledUp {
        /// The task.
        task: String,
        /// The list it was delegated as.
        sub_list: String,
        /// Its status now.
        status: Status,
    },
}

/// Every event kind, as the `kind` field names it (the order of [`EventBody::kind_index`]).
pub const EVENT_KINDS: [&str; 11] = [
    "tasks_changed",
    "violation",
    "conflict",
    "repaired",
    "unblocked",
    "claimed",
    "agent_joined",
    "agent_left",
    "lease_expired",
    "delegated",
    "rolled_up",
];

impl EventBody {
    /// Its `kind` field.
    pub fn kind(&self) -> &'static str {
        EVENT_KINDS[self.kind_index()]
    }

    /// Its kind's place in [`EVENT_KINDS`].
    pub fn kind_index(&self) -> usize {
        match self {
            EventBody::TasksChanged { .. } => 0,
            EventBody::Violation(_) => 1,
            EventBody::Conflict(_) => 2,
            EventBody::Repaired { .. } => 3,
            EventBody::Unblocked { .. } => 4,
            EventBody::Claimed { .. } => 5,
            EventBody::AgentJoined { .. } => 6,
            EventBody::AgentLeft { .. } => 7,
            EventBody::LeaseExpired { .. } => 8,
            EventBody::Delegated { .. } => 9,
            EventBody::RolledUp { .. } => 10,
        }
    }
}

/// An event with its place in the list's stream. (Not `deny_unknown_fields`: serde
/// cannot combine it with the flattened body.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Event {
    /// Per list, strictly increasing from 1, no gaps: resume from any `seq`.
    pub seq: u64,
    /// The list (its automerge-repo document id).
    pub list: String,
    /// When the hub recorded it (ms since the Unix epoch).
    pub at_ms: i64,
    /// What happened.
    #[serde(flatten)]
    pub body: EventBody,
}

/// A schema as the text of its file in `proto/schema/`: pretty JSON with every object's
/// keys sorted, whatever order serde_json keeps in this build (a dependency that turns
/// on its `preserve_order` changes that order, not the files).
pub fn schema_text(schema: &schemars::Schema) -> String {
    fn sorted(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(o) => {
                let mut entries: Vec<(String, serde_json::Value)> = o.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(
                    entries.into_iter().map(|(k, v)| (k, sorted(v))).collect(),
                )
            }
            serde_json::Value::Array(a) => {
                serde_json::Value::Array(a.into_iter().map(sorted).collect())
            }
            other => other,
        }
    }
    let value = serde_json::to_value(schema).unwrap_or_default();
    serde_json::to_string_pretty(&sorted(value)).unwrap_or_default() + "\n"
}

/// Every JSON schema of the wire types, by file name, for `proto/schema/`.
pub fn schemas() -> Vec<(&'static str, schemars::Schema)> {
    vec![
        ("task.json", schemars::schema_for!(Task)),
        ("snapshot.json", schemars::schema_for!(Snapshot)),
        ("write_request.json", schemars::schema_for!(WriteRequest)),
        ("write_result.json", schemars::schema_for!(WriteResult)),
        ("api_error.json", schemars::schema_for!(ApiError)),
        ("write_answer.json", schemars::schema_for!(WriteAnswer)),
        ("claim_request.json", schemars::schema_for!(ClaimRequest)),
        ("claim_answer.json", schemars::schema_for!(ClaimAnswer)),
        (
            "delegate_request.json",
            schemars::schema_for!(DelegateRequest),
        ),
        (
            "delegate_answer.json",
            schemars::schema_for!(DelegateAnswer),
        ),
        ("wait_answer.json", schemars::schema_for!(WaitAnswer)),
        ("lists_page.json", schemars::schema_for!(ListsPage)),
        ("task_history.json", schemars::schema_for!(TaskHistory)),
        ("violation.json", schemars::schema_for!(Violation)),
        ("conflict.json", schemars::schema_for!(Conflict)),
        ("event.json", schemars::schema_for!(Event)),
    ]
}
