//! The tools of `swarmtodo mcp`: their names, descriptions and input schemas, and what
//! a call does. A payload that does not fit its schema, and every refusal of the hub,
//! is a tool error that says what is allowed.

// A call's failure is its answer (a tool error), carried as the Err: one per call.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool};
use rmcp::ErrorData as McpError;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::agent::{lock, Agent};
use super::shapes::{
    self, Claim, Delegate, NoArguments, OpenCodeWrite, TaskCreate, TaskGet, TaskUpdate,
    TaskUpdateStatus, TodoWrite, UpdatePlan, Vocabulary, WriteTodos,
};
use crate::client::http::HttpError;
use crate::proto::{
    projection, ErrorCode, PatchOp, Snapshot, Status, TaskPatch, WriteAnswer, WriteMode,
    WriteRequest,
};

/// What the server tells the client about using a shared list.
pub(crate) const INSTRUCTIONS: &str = "This server is one agent's door to a todo list shared with other agents, kept by a swarmtodo hub. \
Other agents read and write the same list at the same time. Claim a task (todo_claim, or TaskUpdate to in_progress) before working on it: \
the hub gives each task to one agent only. Keep one task in progress at a time, mark it completed as soon as it is done, \
and cancel a task that will not be done rather than deleting it. Whole-list tools (TodoWrite, update_plan, todowrite, write_todos) \
change only what you changed since you last read the list: tasks other agents added or changed are kept.";

const SHARED: &str = " The list is shared with other agents: what you send changes only what you changed since you last read it; tasks other agents added are kept, and a task of another agent you leave out stays. Claim before you work, keep one task in progress, complete it at once, cancel rather than delete.";

fn schema<T: JsonSchema>() -> Arc<JsonObject> {
    let schema = schemars::schema_for!(T);
    let mut object = match serde_json::to_value(schema) {
        Ok(Value::Object(o)) => o,
        _ => JsonObject::new(),
    };
    object.remove("$schema");
    object.remove("title");
    Arc::new(object)
}

/// Every tool.
pub(crate) fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "todo_read",
            "Read the shared todo list: every task in order with its id, status, priority, owner and dependencies, and the list's version. Read before you write.",
            schema::<NoArguments>(),
        ),
        Tool::new(
            "todo_write",
            "Write to the shared todo list (swarmtodo's own typed request). mode \"patch\": ops upsert {task}, remove {id}, move {id, after}. mode \"replace\": the whole list as you want it, against base_version (the version you read): tasks others added since are kept. expected_version refuses the write if the list moved. explanation says why. Statuses: pending, in_progress, completed, cancelled, blocked; priorities: high, medium, low.",
            schema::<WriteRequest>(),
        ),
        Tool::new(
            "todo_claim",
            "Claim a task: the hub gives it to you, in_progress, and to no one else. Without task, the first ready one (pending, unowned, every dependency completed; by priority, then position). Claim before you start work.",
            schema::<Claim>(),
        ),
        Tool::new(
            "todo_delegate",
            "Hand a task to a subagent, who works it as a list of its own: the task becomes the subagent's, and its status follows that list (all of its tasks completed or cancelled: completed; one in progress: in progress). The answer names the new list and, on a hub with tokens, a worker token for the subagent: start its swarmtodo MCP server with that list and token. Leads only.",
            schema::<Delegate>(),
        ),
        Tool::new(
            "TodoWrite",
            format!("Update the todo list (Claude Code's TodoWrite payload: todos with content, status pending|in_progress|completed, activeForm, optional id).{SHARED}"),
            schema::<TodoWrite>(),
        ),
        Tool::new(
            "TaskCreate",
            "Create a task in the shared list (Claude Code's TaskCreate: subject, description, optional activeForm). It starts pending, with no owner; claim it with TaskUpdate status in_progress. The description is recorded with the change that creates the task (TaskGet shows it).",
            schema::<TaskCreate>(),
        ),
        Tool::new(
            "TaskUpdate",
            "Update a task (Claude Code's TaskUpdate: taskId; subject, activeForm, status pending|in_progress|completed|deleted, owner, addBlocks, addBlockedBy). status in_progress on a task without an owner claims it for you, atomically: if another agent got it first you are told. Prefer completing or cancelling to deleted.",
            schema::<TaskUpdate>(),
        ),
        Tool::new(
            "TaskList",
            "List the tasks of the shared list (Claude Code's TaskList): id, subject, status, owner, and the open tasks each waits for. A pending task with no owner and nothing to wait for is ready to claim.",
            schema::<NoArguments>(),
        ),
        Tool::new(
            "TaskGet",
            "Get one task of the shared list by id (Claude Code's TaskGet).",
            schema::<TaskGet>(),
        ),
        Tool::new(
            "update_plan",
            format!("Update the plan (Codex's update_plan payload: optional explanation, plan of steps with status pending|in_progress|completed).{SHARED}"),
            schema::<UpdatePlan>(),
        ),
        Tool::new(
            "todowrite",
            format!("Update the todo list (OpenCode's todowrite payload: todos with content, status pending|in_progress|completed|cancelled, priority high|medium|low, id).{SHARED}"),
            schema::<OpenCodeWrite>(),
        ),
        Tool::new(
            "write_todos",
            format!("Update the todo list (Gemini CLI's write_todos payload: todos with description and status pending|in_progress|completed|cancelled).{SHARED}"),
            schema::<WriteTodos>(),
        ),
    ]
}

/// What a tool call failed with, as the tool's answer.
fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

fn hub_error(e: HttpError) -> CallToolResult {
    match e {
        HttpError::Api(api) => {
            let code = serde_json::to_value(api.code).unwrap_or_default();
            let mut text = format!("{}: {}", code.as_str().unwrap_or("error"), api.message);
            if let Some(field) = &api.field {
                text.push_str(&format!(" (field {field}"));
                if !api.allowed.is_empty() {
                    text.push_str(&format!("; allowed: {}", api.allowed.join(", ")));
                }
                text.push(')');
            }
            let mut result = tool_error(text);
            result.structured_content = Some(json!({"error": api}));
            result
        }
        HttpError::Transport(why) => tool_error(format!(
            "the hub could not be reached ({why}); nothing was written"
        )),
    }
}

/// The arguments of `tool` as `T`, or a tool error naming what is wrong and allowed.
fn arguments<T: DeserializeOwned>(tool: &str, arguments: Value) -> Result<T, CallToolResult> {
    serde_path_to_error::deserialize::<_, T>(arguments).map_err(|e| {
        let at = match e.path().to_string() {
            p if p == "." => String::new(),
            p => format!(" at {p}"),
        };
        tool_error(format!(
            "{tool}: invalid arguments{at}: {}. Nothing was written; send what the tool's input schema says.",
            e.inner()
        ))
    })
}

/// The list now, remembered as what this agent last read.
pub(crate) async fn read(agent: &Agent) -> Result<Snapshot, String> {
    let list = match agent.api.read(&agent.list, None).await {
        Err(HttpError::Api(e)) if e.code == ErrorCode::UnknownList => {
            agent.api.create(&agent.list).await
        }
        other => other,
    }
    .map_err(|e| e.to_string())?;
    *lock(&agent.last) = Some(list.clone());
    agent.found.notify_one();
    Ok(list)
}

/// The base of a whole-list payload: what this agent last read (read now if never).
async fn base(agent: &Agent) -> Result<Snapshot, HttpError> {
    let last = lock(&agent.last).clone();
    match last {
        Some(l) => Ok(l),
        None => read(agent).await.map_err(HttpError::Transport),
    }
}

/// Sends a write; remembers the list it answers and the tasks it created.
async fn write(agent: &Agent, request: &WriteRequest) -> Result<WriteAnswer, HttpError> {
    let body = serde_json::to_string(request).map_err(|e| HttpError::Transport(e.to_string()))?;
    let answer = match agent.api.write(&agent.list, &body).await {
        Err(HttpError::Api(e)) if e.code == ErrorCode::UnknownList => {
            agent.api.create(&agent.list).await?;
            agent.api.write(&agent.list, &body).await?
        }
        other => other?,
    };
    *lock(&agent.last) = Some(answer.snapshot.clone());
    lock(&agent.created).extend(answer.result.created.iter().cloned());
    agent.found.notify_one();
    Ok(answer)
}

/// The answer to a write: what it did and the list as it is now, as a checklist and as
/// JSON.
fn written(answer: &WriteAnswer, what: &str) -> CallToolResult {
    let r = &answer.result;
    let text = format!(
        "{what}: {} created, {} updated, {} removed; version {}.\n{}",
        r.created.len(),
        r.updated.len(),
        r.removed.len(),
        r.version,
        projection::markdown(&answer.snapshot)
    );
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = serde_json::to_value(answer).ok();
    result
}

fn listed(list: &Snapshot) -> CallToolResult {
    let text = format!("version {}\n{}", list.version, projection::markdown(list));
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = serde_json::to_value(list).ok();
    result
}

/// Calls tool `name` with `args`.
pub(crate) async fn call(
    agent: &Agent,
    name: &str,
    args: Value,
) -> Result<CallToolResult, McpError> {
    let result = match name {
        "todo_read" => run_read(agent, args).await,
        "todo_write" => run_todo_write(agent, args).await,
        "todo_claim" => run_claim(agent, args).await,
        "todo_delegate" => run_delegate(agent, args).await,
        "TodoWrite" => {
            run_whole(agent, "TodoWrite", args, |p: TodoWrite| {
                (p.items(), Vocabulary::ThreeStates, None)
            })
            .await
        }
        "update_plan" => {
            run_whole(agent, "update_plan", args, |p: UpdatePlan| {
                let explanation = p.explanation.clone();
                (p.items(), Vocabulary::ThreeStates, explanation)
            })
            .await
        }
        "todowrite" => {
            run_whole(agent, "todowrite", args, |p: OpenCodeWrite| {
                (p.items(), Vocabulary::WithCancelled, None)
            })
            .await
        }
        "write_todos" => {
            run_whole(agent, "write_todos", args, |p: WriteTodos| {
                (p.items(), Vocabulary::WithCancelled, None)
            })
            .await
        }
        "TaskCreate" => run_task_create(agent, args).await,
        "TaskUpdate" => run_task_update(agent, args).await,
        "TaskList" => run_task_list(agent, args).await,
        "TaskGet" => run_task_get(agent, args).await,
        other => {
            let names: Vec<String> = tools().iter().map(|t| t.name.to_string()).collect();
            return Err(McpError::invalid_params(
                format!("no tool {other:?}; the tools are {}", names.join(", ")),
                None,
            ));
        }
    };
    Ok(result.unwrap_or_else(|e| e))
}

type Outcome = Result<CallToolResult, CallToolResult>;

async fn run_read(agent: &Agent, args: Value) -> Outcome {
    arguments::<NoArguments>("todo_read", args)?;
    let list = read(agent).await.map_err(tool_error)?;
    Ok(listed(&list))
}

async fn run_todo_write(agent: &Agent, args: Value) -> Outcome {
    let request = crate::proto::parse_write_request(&args.to_string())
        .map_err(|e| hub_error(HttpError::Api(e)))?;
    let answer = write(agent, &request).await.map_err(hub_error)?;
    Ok(written(&answer, "written"))
}

async fn run_claim(agent: &Agent, args: Value) -> Outcome {
    let claim: Claim = arguments("todo_claim", args)?;
    let answer = agent
        .api
        .claim(&agent.list, claim.task.as_deref())
        .await
        .map_err(hub_error)?;
    let text = format!(
        "You hold task {} now, in progress: {}",
        answer.task.id, answer.task.content
    );
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = serde_json::to_value(&answer).ok();
    // The list moved: read it again before the next whole-list payload.
    let _ = read(agent).await;
    Ok(result)
}

async fn run_delegate(agent: &Agent, args: Value) -> Outcome {
    let d: Delegate = arguments("todo_delegate", args)?;
    let answer = agent
        .api
        .delegate(&agent.list, &d.task, &d.agent, d.list.as_deref())
        .await
        .map_err(hub_error)?;
    let mut text = format!(
        "Task {} is {}'s now, worked as list {:?}; its status follows that list. Start the subagent's server with `swarmtodo mcp --list {:?} --agent {:?}`",
        answer.task.id, answer.agent, answer.list, answer.list, answer.agent
    );
    match &answer.token {
        Some(t) => text.push_str(&format!(" and SWARMTODO_TOKEN={t} (shown once).")),
        None => text.push('.'),
    }
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = serde_json::to_value(&answer).ok();
    let _ = read(agent).await;
    Ok(result)
}

async fn run_whole<P: DeserializeOwned>(
    agent: &Agent,
    tool: &str,
    args: Value,
    items: impl FnOnce(P) -> (Vec<shapes::Item>, Vocabulary, Option<String>),
) -> Outcome {
    let payload: P = arguments(tool, args)?;
    let (items, vocabulary, explanation) = items(payload);
    let base = base(agent).await.map_err(hub_error)?;
    let created = lock(&agent.created).clone();
    let request = shapes::whole_write(
        &agent.agent,
        &base,
        &items,
        vocabulary,
        &created,
        explanation,
    );
    let answer = write(agent, &request).await.map_err(hub_error)?;
    Ok(written(&answer, "The list is updated"))
}

async fn run_task_create(agent: &Agent, args: Value) -> Outcome {
    let create: TaskCreate = arguments("TaskCreate", args)?;
    let request = WriteRequest {
        mode: WriteMode::Patch {
            ops: vec![PatchOp::Upsert {
                task: TaskPatch {
                    content: Some(create.subject.clone()),
                    active_form: create.active_form.map(Some),
                    ..TaskPatch::default()
                },
            }],
        },
        expected_version: None,
        explanation: Some(create.description),
    };
    let answer = write(agent, &request).await.map_err(hub_error)?;
    let id = answer.result.created.first().cloned().unwrap_or_default();
    let mut result = CallToolResult::success(vec![ContentBlock::text(format!(
        "Task #{id} created successfully: {}",
        create.subject
    ))]);
    result.structured_content = Some(json!({"task": {"id": id, "subject": create.subject}}));
    Ok(result)
}

async fn run_task_update(agent: &Agent, args: Value) -> Outcome {
    let update: TaskUpdate = arguments("TaskUpdate", args)?;
    let list = read(agent).await.map_err(tool_error)?;
    let current = list.tasks.iter().find(|t| t.id == update.task_id).cloned();
    let mut notes = Vec::new();
    // In progress on a task nobody holds is a claim: decided by the hub, one agent only.
    let claims = update.status == Some(TaskUpdateStatus::InProgress)
        && update.owner.is_none()
        && current
            .as_ref()
            .is_some_and(|t| t.owner.is_none() && t.status != Status::InProgress);
    let mut rest = update.clone();
    if claims {
        let claimed = agent
            .api
            .claim(&agent.list, Some(&update.task_id))
            .await
            .map_err(hub_error)?;
        notes.push(format!(
            "claimed task #{} for {}",
            claimed.task.id, agent.agent
        ));
        rest.status = None;
    }
    let list = if claims {
        read(agent).await.map_err(tool_error)?
    } else {
        list
    };
    let ops = shapes::task_update_ops(&list, &rest);
    if !ops.is_empty() {
        let request = WriteRequest {
            mode: WriteMode::Patch { ops },
            expected_version: None,
            explanation: update.description.clone(),
        };
        write(agent, &request).await.map_err(hub_error)?;
    }
    notes.push(format!("Updated task #{}", update.task_id));
    let now = lock(&agent.last).clone();
    let task = now
        .as_ref()
        .and_then(|l| l.tasks.iter().find(|t| t.id == update.task_id).cloned());
    let mut result = CallToolResult::success(vec![ContentBlock::text(notes.join("; "))]);
    result.structured_content = Some(json!({"task": task}));
    Ok(result)
}

async fn run_task_list(agent: &Agent, args: Value) -> Outcome {
    arguments::<NoArguments>("TaskList", args)?;
    let list = read(agent).await.map_err(tool_error)?;
    let open: std::collections::BTreeSet<&str> = list
        .tasks
        .iter()
        .filter(|t| t.status != Status::Completed && t.status != Status::Cancelled)
        .map(|t| t.id.as_str())
        .collect();
    let tasks: Vec<Value> = list
        .tasks
        .iter()
        .map(|t| {
            let blocked_by: Vec<&String> = t
                .blocked_by
                .iter()
                .filter(|d| open.contains(d.as_str()))
                .collect();
            json!({
                "id": t.id,
                "subject": t.content,
                "status": t.status.as_str(),
                "owner": t.owner,
                "blockedBy": blocked_by,
            })
        })
        .collect();
    let mut text = String::new();
    for t in &tasks {
        text.push_str(&format!(
            "#{} [{}] {}{}{}\n",
            t["id"].as_str().unwrap_or(""),
            t["status"].as_str().unwrap_or(""),
            t["subject"].as_str().unwrap_or(""),
            t["owner"]
                .as_str()
                .map(|o| format!(" (owner: {o})"))
                .unwrap_or_default(),
            match t["blockedBy"].as_array() {
                Some(b) if !b.is_empty() => format!(
                    " (blocked by {})",
                    b.iter()
                        .filter_map(Value::as_str)
                        .map(|d| format!("#{d}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => String::new(),
            }
        ));
    }
    if text.is_empty() {
        text.push_str("No tasks.\n");
    }
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(json!({"tasks": tasks}));
    Ok(result)
}

async fn run_task_get(agent: &Agent, args: Value) -> Outcome {
    let get: TaskGet = arguments("TaskGet", args)?;
    let list = read(agent).await.map_err(tool_error)?;
    let Some(t) = list.tasks.iter().find(|t| t.id == get.task_id) else {
        let ids: Vec<&str> = list.tasks.iter().map(|t| t.id.as_str()).collect();
        return Err(tool_error(format!(
            "no task {:?} in the list; its tasks are {}",
            get.task_id,
            ids.join(", ")
        )));
    };
    // A task's description is the explanation its creating change was written with
    // (TaskCreate writes it there); none when its history is longer than one read holds.
    let description = match agent.api.history(&agent.list, &t.id, None).await {
        Ok(h) if h.total as usize == h.entries.len() => {
            h.entries.first().and_then(|e| e.explanation.clone())
        }
        _ => None,
    };
    let task = json!({
        "id": t.id,
        "subject": t.content,
        "description": description,
        "activeForm": t.active_form,
        "status": t.status.as_str(),
        "priority": t.priority.as_str(),
        "owner": t.owner,
        "blockedBy": t.blocked_by,
    });
    let mut result = CallToolResult::success(vec![ContentBlock::text(
        serde_json::to_string_pretty(&task).unwrap_or_default(),
    )]);
    result.structured_content = Some(json!({"task": task}));
    Ok(result)
}
