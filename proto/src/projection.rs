//! A list as other tools show plans: an ACP `session/update` plan, the Codex exec JSONL
//! `todo_list` item, a Markdown checklist. Each keeps what its format can say and puts
//! the rest where the format allows: ACP in `_meta`, Codex and Markdown in the text.
//!
//! ```
//! use swarmtodo_proto::{projection, Snapshot};
//! let list: Snapshot = serde_json::from_str(
//!     r#"{"version":"0","tasks":[{"id":"t1","content":"Run the tests","status":"cancelled"}]}"#,
//! ).unwrap();
//! assert_eq!(projection::markdown(&list), "- [ ] ~~Run the tests~~ (cancelled)\n");
//! ```

use serde_json::{json, Value};

use crate::{EventBody, Priority, Snapshot, Status, Task};

/// The key under `_meta` that holds what ACP cannot say.
pub const ACP_META_KEY: &str = "swarmtodo";

/// ACP's status for a task: `pending`, `in_progress` or `completed` (a cancelled task is
/// done with, a blocked one waits: their own status is in `_meta`).
fn acp_status(s: Status) -> &'static str {
    match s {
        Status::Pending | Status::Blocked => "pending",
        Status::InProgress => "in_progress",
        Status::Completed | Status::Cancelled => "completed",
    }
}

/// One ACP plan entry: content, priority, status, and in `_meta.swarmtodo` the task's id,
/// its own status, and its owner, active form and dependencies where it has them.
pub fn acp_entry(task: &Task) -> Value {
    let mut meta = json!({"id": task.id, "status": task.status.as_str()});
    if let Some(owner) = &task.owner {
        meta["owner"] = json!(owner);
    }
    if let Some(active) = &task.active_form {
        meta["active_form"] = json!(active);
    }
    if !task.blocked_by.is_empty() {
        meta["blocked_by"] = json!(task.blocked_by);
    }
    json!({
        "content": task.content,
        "priority": task.priority.as_str(),
        "status": acp_status(task.status),
        "_meta": {ACP_META_KEY: meta},
    })
}

/// The list as an ACP `session/update` notification (JSON-RPC) of session `session`: a
/// `plan` update with every task, in order (ACP clients replace the whole plan with each
/// update); the list's version in the plan's `_meta`.
pub fn acp_session_update(list: &Snapshot, session: &str) -> Value {
    let entries: Vec<Value> = list.tasks.iter().map(acp_entry).collect();
    json!({
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": session,
            "update": {
                "sessionUpdate": "plan",
                "entries": entries,
                "_meta": {ACP_META_KEY: {"version": list.version}},
            },
        },
    })
}

/// The Codex exec JSONL `todo_list` item of a list: one `{text, completed}` per task. A
/// cancelled task counts as done and says so in its text; blocked, in progress with its
/// owner, and dependencies are said in the text too (the item has no other field).
pub fn codex_item(id: &str, list: &Snapshot) -> Value {
    let items: Vec<Value> = list
        .tasks
        .iter()
        .map(|t| {
            let done = matches!(t.status, Status::Completed | Status::Cancelled);
            json!({"text": codex_text(t, &waits_for(list, t)), "completed": done})
        })
        .collect();
    json!({"id": id, "type": "todo_list", "items": items})
}

/// The dependencies of `t` still open in `list` (the ones it waits for now).
fn waits_for<'a>(list: &'a Snapshot, t: &'a Task) -> Vec<&'a str> {
    if !t.status.is_open() {
        return Vec::new();
    }
    t.blocked_by
        .iter()
        .filter(|d| {
            list.tasks
                .iter()
                .find(|o| &o.id == *d)
                .is_some_and(|o| o.status.is_open())
        })
        .map(String::as_str)
        .collect()
}

fn codex_text(t: &Task, waits: &[&str]) -> String {
    let mut text = t.content.clone();
    match t.status {
        Status::Cancelled => text.push_str(" (cancelled)"),
        Status::Blocked => text.push_str(" (blocked)"),
        Status::InProgress => match &t.owner {
            Some(o) => text.push_str(&format!(" (in progress: {o})")),
            None => text.push_str(" (in progress)"),
        },
        Status::Pending | Status::Completed => {}
    }
    if !waits.is_empty() {
        text.push_str(&format!(" (waits for {})", waits.join(", ")));
    }
    text
}

/// The Codex exec JSONL lifecycle of one `todo_list` item over the versions of a list:
/// `item.started` for the first, `item.updated` for each one that shows differently,
/// `item.completed` at the end (as Codex does when its turn ends).
#[derive(Debug, Clone)]
pub struct CodexTodoList {
    id: String,
    last: Option<Value>,
}

impl CodexTodoList {
    /// The lifecycle of the item with this id (Codex numbers its items `item_N`).
    pub fn new(id: impl Into<String>) -> CodexTodoList {
        CodexTodoList {
            id: id.into(),
            last: None,
        }
    }

    /// The line for the list at its next version: `item.started` the first time,
    /// `item.updated` when the item differs from the last one, else none.
    pub fn next(&mut self, list: &Snapshot) -> Option<Value> {
        let item = codex_item(&self.id, list);
        let kind = match &self.last {
            None => "item.started",
            Some(last) if *last == item => return None,
            Some(_) => "item.updated",
        };
        self.last = Some(item.clone());
        Some(json!({"type": kind, "item": item}))
    }

    /// The `item.completed` line with the last version, if it started.
    pub fn finish(self) -> Option<Value> {
        self.last
            .map(|item| json!({"type": "item.completed", "item": item}))
    }
}

/// The list as a Markdown checklist for chat surfaces: completed checked, cancelled
/// struck, in progress bold with its owner and active form, blocked and dependencies
/// it still waits for said, high and low priority marked; one line per task, in order.
pub fn markdown(list: &Snapshot) -> String {
    let mut out = String::new();
    for t in &list.tasks {
        let check = if t.status == Status::Completed {
            "x"
        } else {
            " "
        };
        let content = escape(&t.content);
        let text = match t.status {
            Status::Cancelled => format!("~~{content}~~ (cancelled)"),
            Status::InProgress => {
                let mut s = format!("**{content}**");
                let mut notes = Vec::new();
                if let Some(o) = &t.owner {
                    notes.push(format!("@{}", escape(o)));
                }
                if let Some(a) = &t.active_form {
                    notes.push(escape(a));
                }
                if notes.is_empty() {
                    s.push_str(" (in progress)");
                } else {
                    s.push_str(&format!(" (in progress: {})", notes.join(", ")));
                }
                s
            }
            Status::Blocked => format!("{content} (blocked)"),
            Status::Pending | Status::Completed => content,
        };
        let mut line = format!("- [{check}] {text}");
        match t.priority {
            Priority::High => line.push_str(" — high priority"),
            Priority::Low => line.push_str(" — low priority"),
            Priority::Medium => {}
        }
        let waits = waits_for(list, t);
        if !waits.is_empty() {
            let deps: Vec<String> = waits.iter().map(|d| format!("`{d}`")).collect();
            line.push_str(&format!(" — waits for {}", deps.join(", ")));
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Markdown's inline markers in a task's text, escaped (a task's text is the agent's,
/// not markup).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | '*' | '_' | '~' | '`' | '[' | ']' | '<' | '>') {
            out.push('\\');
        }
        out.push(if c == '\n' { ' ' } else { c });
    }
    out
}

/// `list` after a `tasks_changed` event: changed tasks replaced where they are, new ones
/// at the end, removed ones gone (the event does not carry positions: a task moved keeps
/// its place here until the next full read). Other events leave it as it is.
pub fn apply(list: &mut Snapshot, event: &EventBody) {
    let EventBody::TasksChanged { tasks, .. } = event else {
        return;
    };
    for change in tasks {
        let at = list.tasks.iter().position(|t| t.id == change.task);
        match (&change.after, at) {
            (Some(after), Some(i)) => list.tasks[i] = after.clone(),
            (Some(after), None) => list.tasks.push(after.clone()),
            (None, Some(i)) => {
                list.tasks.remove(i);
            }
            (None, None) => {}
        }
    }
}
