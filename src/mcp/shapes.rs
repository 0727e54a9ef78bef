//! The payloads of the todo tools models already know, exactly as their own tools take
//! them, and how each becomes a change of the shared list without losing what other
//! agents did.
//!
//! A whole-list payload (Claude Code `TodoWrite`, Codex `update_plan`, OpenCode
//! `todowrite`, Gemini CLI `write_todos`) is a `todo_write` replace against the version
//! this agent last read ([`whole_write`]): each item matches a task by id where it has
//! one, else by content; a field is written only where the item differs from what the
//! agent read, *in the tool's own terms* (a tool without `cancelled` that echoes a task
//! someone cancelled as `completed` changes nothing); tasks others added since are kept
//! by the hub; a task the agent read and left out is removed only if this agent created
//! it — another agent's task is never deleted by a snapshot that omits it.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::Deserialize;

use crate::proto::{Priority, Snapshot, Status, Task, TaskPatch, WriteMode, WriteRequest};

/// The statuses a tool's vocabulary has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vocabulary {
    /// pending, in_progress, completed (Claude Code `TodoWrite`, Codex `update_plan`).
    ThreeStates,
    /// pending, in_progress, completed, cancelled (OpenCode, Gemini CLI).
    WithCancelled,
}

impl Vocabulary {
    /// How a task's status reads in this vocabulary (blocked waits: pending; without
    /// `cancelled`, a cancelled task is done with: completed).
    pub fn project(self, s: Status) -> Status {
        match (self, s) {
            (_, Status::Blocked) => Status::Pending,
            (Vocabulary::ThreeStates, Status::Cancelled) => Status::Completed,
            (_, s) => s,
        }
    }
}

/// A status as these tools spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ThreeStatus {
    /// Not started.
    Pending,
    /// Being worked on.
    InProgress,
    /// Done.
    Completed,
}

impl From<ThreeStatus> for Status {
    fn from(s: ThreeStatus) -> Status {
        match s {
            ThreeStatus::Pending => Status::Pending,
            ThreeStatus::InProgress => Status::InProgress,
            ThreeStatus::Completed => Status::Completed,
        }
    }
}

/// A status of the tools that can cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FourStatus {
    /// Not started.
    Pending,
    /// Being worked on.
    InProgress,
    /// Done.
    Completed,
    /// Will not be done.
    Cancelled,
}

impl From<FourStatus> for Status {
    fn from(s: FourStatus) -> Status {
        match s {
            FourStatus::Pending => Status::Pending,
            FourStatus::InProgress => Status::InProgress,
            FourStatus::Completed => Status::Completed,
            FourStatus::Cancelled => Status::Cancelled,
        }
    }
}

/// Claude Code `TodoWrite`: the agent's whole todo list.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TodoWrite {
    /// The updated todo list.
    pub todos: Vec<ClaudeTodo>,
}

/// One item of `TodoWrite`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaudeTodo {
    /// What to do, imperative: "Run the tests".
    pub content: String,
    /// Where it stands.
    pub status: ThreeStatus,
    /// What is being done, present continuous: "Running the tests".
    #[serde(rename = "activeForm")]
    pub active_form: String,
    /// The task's id, where the item has one.
    #[serde(default)]
    pub id: Option<String>,
}

/// Codex `update_plan`: the plan, whole.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdatePlan {
    /// Why the plan changed.
    #[serde(default)]
    pub explanation: Option<String>,
    /// The steps, in order.
    pub plan: Vec<PlanStep>,
}

/// One step of `update_plan`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanStep {
    /// The step.
    pub step: String,
    /// Where it stands.
    pub status: ThreeStatus,
}

/// OpenCode `todowrite`: the todo list, whole.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenCodeWrite {
    /// The updated todo list.
    pub todos: Vec<OpenCodeTodo>,
}

/// One item of `todowrite`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenCodeTodo {
    /// Brief description of the task.
    pub content: String,
    /// Where it stands.
    pub status: FourStatus,
    /// How much it matters.
    pub priority: Priority,
    /// The task's id.
    #[serde(default)]
    pub id: Option<String>,
}

/// Gemini CLI `write_todos`: the todo list, whole.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteTodos {
    /// The complete list of todo items; it replaces the existing list.
    pub todos: Vec<GeminiTodo>,
}

/// One item of `write_todos`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GeminiTodo {
    /// What to do.
    pub description: String,
    /// Where it stands.
    pub status: FourStatus,
}

/// One item of any whole-list payload, in swarmtodo's terms: what the tool said of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The task's id, when the payload gives one.
    pub id: Option<String>,
    /// Its content.
    pub content: String,
    /// Its status, in the tool's vocabulary.
    pub status: Status,
    /// Its active form, when the tool has one.
    pub active_form: Option<String>,
    /// Its priority, when the tool has one.
    pub priority: Option<Priority>,
}

impl TodoWrite {
    /// The items.
    pub fn items(&self) -> Vec<Item> {
        self.todos
            .iter()
            .map(|t| Item {
                id: t.id.clone(),
                content: t.content.clone(),
                status: t.status.into(),
                active_form: Some(t.active_form.clone()),
                priority: None,
            })
            .collect()
    }
}

impl UpdatePlan {
    /// The items.
    pub fn items(&self) -> Vec<Item> {
        self.plan
            .iter()
            .map(|s| Item {
                id: None,
                content: s.step.clone(),
                status: s.status.into(),
                active_form: None,
                priority: None,
            })
            .collect()
    }
}

impl OpenCodeWrite {
    /// The items.
    pub fn items(&self) -> Vec<Item> {
        self.todos
            .iter()
            .map(|t| Item {
                id: t.id.clone(),
                content: t.content.clone(),
                status: t.status.into(),
                active_form: None,
                priority: Some(t.priority),
            })
            .collect()
    }
}

impl WriteTodos {
    /// The items.
    pub fn items(&self) -> Vec<Item> {
        self.todos
            .iter()
            .map(|t| Item {
                id: None,
                content: t.description.clone(),
                status: t.status.into(),
                active_form: None,
                priority: None,
            })
            .collect()
    }
}

/// The `todo_write` of agent `agent`'s whole-list payload `items` (in vocabulary
/// `vocabulary`) made against `base`, what this agent last read; `created` are the tasks
/// this agent created (the only ones a payload that leaves them out removes). A task the
/// agent puts in progress that nobody holds becomes the agent's (one task in progress per
/// owner holds for it as for every agent).
pub fn whole_write(
    agent: &str,
    base: &Snapshot,
    items: &[Item],
    vocabulary: Vocabulary,
    created: &BTreeSet<String>,
    explanation: Option<String>,
) -> WriteRequest {
    // Match items to the base: by id, then by content among the tasks not matched yet.
    let mut matched: Vec<Option<&Task>> = items
        .iter()
        .map(|i| {
            i.id.as_ref()
                .and_then(|id| base.tasks.iter().find(|t| &t.id == id))
        })
        .collect();
    let mut taken: BTreeSet<&str> = matched.iter().flatten().map(|t| t.id.as_str()).collect();
    for (i, item) in items.iter().enumerate() {
        if matched[i].is_some() || item.id.is_some() {
            continue;
        }
        if let Some(t) = base
            .tasks
            .iter()
            .find(|t| t.content == item.content && !taken.contains(t.id.as_str()))
        {
            taken.insert(t.id.as_str());
            matched[i] = Some(t);
        }
    }
    let patches: Vec<TaskPatch> = items
        .iter()
        .zip(&matched)
        .map(|(item, base_task)| match base_task {
            Some(b) => TaskPatch {
                id: Some(b.id.clone()),
                content: (item.content != b.content).then(|| item.content.clone()),
                active_form: item
                    .active_form
                    .clone()
                    .filter(|a| b.active_form.as_ref() != Some(a))
                    .map(Some),
                status: (item.status != vocabulary.project(b.status)).then_some(item.status),
                priority: item.priority.filter(|p| *p != b.priority),
                owner: (item.status == Status::InProgress
                    && b.status != Status::InProgress
                    && b.owner.is_none())
                .then(|| Some(agent.to_owned())),
                blocked_by: None,
            },
            None => TaskPatch {
                id: item.id.clone(),
                content: Some(item.content.clone()),
                active_form: item.active_form.clone().map(Some),
                status: Some(item.status),
                priority: item.priority,
                owner: (item.status == Status::InProgress).then(|| Some(agent.to_owned())),
                blocked_by: None,
            },
        })
        .collect();
    // Tasks read and left out: another's stay where they were (an id-only entry changes
    // nothing), this agent's own go.
    let mut tasks = Vec::with_capacity(patches.len());
    let mut placed = vec![false; patches.len()];
    for t in &base.tasks {
        if let Some(i) = matched.iter().position(|m| m.is_some_and(|m| m.id == t.id)) {
            // Everything of the payload up to this matched item, in the payload's order.
            for j in 0..=i {
                if !placed[j] {
                    placed[j] = true;
                    tasks.push(patches[j].clone());
                }
            }
        } else if !taken.contains(t.id.as_str()) && !created.contains(&t.id) {
            tasks.push(TaskPatch {
                id: Some(t.id.clone()),
                ..TaskPatch::default()
            });
        }
    }
    for (j, p) in patches.into_iter().enumerate() {
        if !placed[j] {
            tasks.push(p);
        }
    }
    WriteRequest {
        mode: WriteMode::Replace {
            tasks,
            base_version: Some(base.version.clone()),
        },
        expected_version: None,
        explanation,
    }
}

/// Claude Code `TaskCreate`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskCreate {
    /// A brief title, imperative: "Fix the login bug".
    pub subject: String,
    /// What needs to be done, in detail.
    pub description: String,
    /// Present continuous, shown while in progress: "Fixing the login bug".
    #[serde(default, rename = "activeForm")]
    pub active_form: Option<String>,
    /// Arbitrary metadata (accepted; swarmtodo does not store it).
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A status `TaskUpdate` takes: the three, and `deleted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskUpdateStatus {
    /// Not started.
    Pending,
    /// Being worked on (claims the task when it has no owner).
    InProgress,
    /// Done.
    Completed,
    /// Remove the task.
    Deleted,
}

/// Claude Code `TaskUpdate`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskUpdate {
    /// The task.
    #[serde(rename = "taskId")]
    pub task_id: String,
    /// New title.
    #[serde(default)]
    pub subject: Option<String>,
    /// New description (accepted; swarmtodo keeps a task's title only).
    #[serde(default)]
    pub description: Option<String>,
    /// New present-continuous form.
    #[serde(default, rename = "activeForm")]
    pub active_form: Option<String>,
    /// New status; `deleted` removes the task.
    #[serde(default)]
    pub status: Option<TaskUpdateStatus>,
    /// New owner (an agent's name).
    #[serde(default)]
    pub owner: Option<String>,
    /// Tasks that cannot start until this one completes.
    #[serde(default, rename = "addBlocks")]
    pub add_blocks: Option<Vec<String>>,
    /// Tasks that must complete before this one can start.
    #[serde(default, rename = "addBlockedBy")]
    pub add_blocked_by: Option<Vec<String>>,
    /// Arbitrary metadata (accepted; swarmtodo does not store it).
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Claude Code `TaskGet`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskGet {
    /// The task.
    #[serde(rename = "taskId")]
    pub task_id: String,
}

/// A tool without arguments (`TaskList`, `todo_read`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArguments {}

/// `todo_claim`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// The task to claim; absent: the hub picks the first ready one (pending, unowned,
    /// every dependency completed; by priority, then position).
    #[serde(default)]
    pub task: Option<String>,
}

/// `todo_delegate`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Delegate {
    /// The task to hand over.
    pub task: String,
    /// The subagent that takes it.
    pub agent: String,
    /// The name of the subagent's new list (default `LIST/TASK`).
    #[serde(default)]
    pub list: Option<String>,
}

/// The patch ops of a `TaskUpdate` on `list` (which holds the task), apart from a claim:
/// `None` when it changes nothing.
pub fn task_update_ops(list: &Snapshot, u: &TaskUpdate) -> Vec<crate::proto::PatchOp> {
    use crate::proto::PatchOp;
    if u.status == Some(TaskUpdateStatus::Deleted) {
        return vec![PatchOp::Remove {
            id: u.task_id.clone(),
        }];
    }
    let current = list.tasks.iter().find(|t| t.id == u.task_id);
    let mut ops = Vec::new();
    let mut patch = TaskPatch {
        id: Some(u.task_id.clone()),
        content: u.subject.clone(),
        active_form: u.active_form.clone().map(Some),
        status: u.status.and_then(|s| match s {
            TaskUpdateStatus::Pending => Some(Status::Pending),
            TaskUpdateStatus::InProgress => Some(Status::InProgress),
            TaskUpdateStatus::Completed => Some(Status::Completed),
            TaskUpdateStatus::Deleted => None,
        }),
        owner: u.owner.clone().map(Some),
        ..TaskPatch::default()
    };
    if let Some(add) = &u.add_blocked_by {
        let mut deps = current.map(|t| t.blocked_by.clone()).unwrap_or_default();
        for d in add {
            if !deps.contains(d) {
                deps.push(d.clone());
            }
        }
        patch.blocked_by = Some(deps);
    }
    if patch
        != (TaskPatch {
            id: Some(u.task_id.clone()),
            ..TaskPatch::default()
        })
    {
        ops.push(PatchOp::Upsert { task: patch });
    }
    for other in u.add_blocks.iter().flatten() {
        let Some(t) = list.tasks.iter().find(|t| &t.id == other) else {
            // Unknown here: the hub refuses the upsert of a new task without content,
            // naming it.
            ops.push(PatchOp::Upsert {
                task: TaskPatch {
                    id: Some(other.clone()),
                    blocked_by: Some(vec![u.task_id.clone()]),
                    ..TaskPatch::default()
                },
            });
            continue;
        };
        if !t.blocked_by.contains(&u.task_id) {
            let mut deps = t.blocked_by.clone();
            deps.push(u.task_id.clone());
            ops.push(PatchOp::Upsert {
                task: TaskPatch {
                    id: Some(other.clone()),
                    blocked_by: Some(deps),
                    ..TaskPatch::default()
                },
            });
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Version;

    fn task(id: &str, content: &str, status: Status) -> Task {
        Task {
            id: id.into(),
            content: content.into(),
            active_form: None,
            status,
            priority: Priority::Medium,
            owner: None,
            blocked_by: vec![],
        }
    }

    fn item(content: &str, status: Status) -> Item {
        Item {
            id: None,
            content: content.into(),
            status,
            active_form: None,
            priority: None,
        }
    }

    fn replace(w: &WriteRequest) -> (&Vec<TaskPatch>, &Option<Version>) {
        match &w.mode {
            WriteMode::Replace {
                tasks,
                base_version,
            } => (tasks, base_version),
            WriteMode::Patch { .. } => panic!("a whole-list payload is a replace"),
        }
    }

    #[test]
    fn a_whole_list_payload_writes_only_what_the_agent_changed_in_its_own_terms() {
        let base = Snapshot {
            version: Version("v1".into()),
            tasks: vec![
                task("a", "Write the parser", Status::Pending),
                task("b", "Review the parser", Status::Cancelled),
                task("c", "Lead's task", Status::InProgress),
                task("mine", "My old step", Status::Pending),
            ],
        };
        let created: BTreeSet<String> = ["mine".to_owned()].into();
        // Codex echoes b as completed (it has no cancelled), sets a in progress, leaves
        // out c (another's) and its own old step, and adds a step.
        let items = vec![
            item("Write the parser", Status::InProgress),
            item("Review the parser", Status::Completed),
            item("Ship it", Status::Pending),
        ];
        let w = whole_write("me", &base, &items, Vocabulary::ThreeStates, &created, None);
        let (tasks, base_version) = replace(&w);
        assert_eq!(base_version.as_ref(), Some(&Version("v1".into())));
        let ids: Vec<Option<&str>> = tasks.iter().map(|t| t.id.as_deref()).collect();
        assert_eq!(ids, [Some("a"), Some("b"), Some("c"), None]);
        assert_eq!(tasks[0].status, Some(Status::InProgress));
        assert_eq!(
            tasks[0].owner,
            Some(Some("me".into())),
            "in progress: the agent's"
        );
        assert_eq!(tasks[0].content, None, "unchanged content is not written");
        assert_eq!(
            tasks[1],
            TaskPatch {
                id: Some("b".into()),
                ..TaskPatch::default()
            },
            "cancelled read as completed in a three-state tool: nothing to write"
        );
        assert_eq!(
            tasks[2].status, None,
            "another agent's task is kept as it is"
        );
        assert_eq!(tasks[3].content.as_deref(), Some("Ship it"));
        // With cancelled in the vocabulary, completed is a change.
        let w = whole_write(
            "me",
            &base,
            &items,
            Vocabulary::WithCancelled,
            &created,
            None,
        );
        assert_eq!(replace(&w).0[1].status, Some(Status::Completed));
    }

    #[test]
    fn ids_match_before_contents_and_a_content_matches_once() {
        let base = Snapshot {
            version: Version("v".into()),
            tasks: vec![
                task("x", "Same", Status::Pending),
                task("y", "Same", Status::Pending),
            ],
        };
        let mut by_id = item("Renamed", Status::Pending);
        by_id.id = Some("y".into());
        let items = vec![
            by_id,
            item("Same", Status::Completed),
            item("Same", Status::Pending),
        ];
        let w = whole_write(
            "me",
            &base,
            &items,
            Vocabulary::ThreeStates,
            &BTreeSet::new(),
            None,
        );
        let tasks = replace(&w).0;
        // In the payload's order: y (by id, renamed), then x (by content).
        assert_eq!(tasks[0].id.as_deref(), Some("y"));
        assert_eq!(tasks[0].content.as_deref(), Some("Renamed"));
        assert_eq!(tasks[1].id.as_deref(), Some("x"));
        assert_eq!(tasks[1].status, Some(Status::Completed));
        assert_eq!(tasks[2].id, None, "the second \"Same\" is new: x is taken");
    }

    #[test]
    fn every_foreign_payload_is_refused_when_misshapen() {
        assert!(serde_json::from_str::<TodoWrite>(
            r#"{"todos":[{"content":"a","status":"done","activeForm":"A"}]}"#
        )
        .is_err());
        assert!(serde_json::from_str::<TodoWrite>(
            r#"{"todos":[{"content":"a","status":"pending"}]}"#
        )
        .is_err());
        assert!(serde_json::from_str::<UpdatePlan>(
            r#"{"plan":[{"step":"a","status":"cancelled"}]}"#
        )
        .is_err());
        assert!(serde_json::from_str::<OpenCodeWrite>(
            r#"{"todos":[{"content":"a","status":"pending","priority":"urgent"}]}"#
        )
        .is_err());
        assert!(serde_json::from_str::<WriteTodos>(
            r#"{"todos":[{"description":"a","status":"pending","extra":1}]}"#
        )
        .is_err());
        let ok: WriteTodos =
            serde_json::from_str(r#"{"todos":[{"description":"a","status":"cancelled"}]}"#)
                .unwrap();
        assert_eq!(ok.items()[0].status, Status::Cancelled);
    }

    #[test]
    fn task_update_adds_dependencies_both_ways_and_deleted_removes() {
        let mut b = task("b", "B", Status::Pending);
        b.blocked_by = vec!["z".into()];
        let list = Snapshot {
            version: Version("v".into()),
            tasks: vec![task("a", "A", Status::Pending), b],
        };
        let u: TaskUpdate = serde_json::from_str(
            r#"{"taskId":"a","addBlockedBy":["q"],"addBlocks":["b"],"owner":"w1"}"#,
        )
        .unwrap();
        let ops = task_update_ops(&list, &u);
        let json = serde_json::to_value(&ops).unwrap();
        assert_eq!(json[0]["task"]["blocked_by"], serde_json::json!(["q"]));
        assert_eq!(json[0]["task"]["owner"], "w1");
        assert_eq!(json[1]["task"]["blocked_by"], serde_json::json!(["z", "a"]));
        let d: TaskUpdate = serde_json::from_str(r#"{"taskId":"a","status":"deleted"}"#).unwrap();
        assert_eq!(
            serde_json::to_value(task_update_ops(&list, &d)).unwrap(),
            serde_json::json!([{"op": "remove", "id": "a"}])
        );
    }
}
