//! How a stored task reads: statuses and priorities as a snapshot shows them, the typed
//! task a stored one reads as, and values clipped to the model's limits.

use super::{field, RawTask, SmolStr};
use crate::proto::{
    Priority, Status, Task, AGENT_ID_BYTES_MAX, BLOCKED_BY_COUNT_MAX, EVENT_VALUE_BYTES_MAX,
    TASK_ID_BYTES_MAX, TASK_TEXT_BYTES_MAX,
};

/// Reads a status as a snapshot shows it: a valid value as is; a common misspelling
/// (`done`, `in-progress`, `canceled`, …) as what it clearly means; anything else as
/// `pending`. The authority's schema repair makes the same choice, so a replica's read
/// already shows what the repair will write.
pub fn normalize_status(raw: Option<&str>) -> Status {
    let Some(raw) = raw else {
        return Status::Pending;
    };
    if let Ok(s) = raw.parse() {
        return s;
    }
    status_alias(raw).unwrap_or(Status::Pending)
}

/// The status a known misspelling means, if it is one.
pub fn status_alias(raw: &str) -> Option<Status> {
    let s = raw.trim().to_ascii_lowercase().replace(['-', ' '], "_");
    match s.as_str() {
        "pending" | "todo" | "to_do" | "open" | "not_started" | "new" => Some(Status::Pending),
        "in_progress" | "inprogress" | "active" | "doing" | "started" | "running" => {
            Some(Status::InProgress)
        }
        "completed" | "complete" | "done" | "finished" | "closed" => Some(Status::Completed),
        "cancelled" | "canceled" | "dropped" | "abandoned" => Some(Status::Cancelled),
        "blocked" | "waiting" | "on_hold" => Some(Status::Blocked),
        _ => None,
    }
}

/// Reads a priority as a snapshot shows it: valid as is, anything else `medium`.
pub fn normalize_priority(raw: Option<&str>) -> Priority {
    let Some(raw) = raw else {
        return Priority::default();
    };
    raw.parse()
        .or_else(|()| raw.trim().to_ascii_lowercase().parse())
        .unwrap_or_default()
}

/// The typed task a stored one reads as.
///
/// What a sync peer stored past the model's limits (the authority repairs it, but
/// reads and events can come first) is cut to them: ids to [`TASK_ID_BYTES_MAX`], texts
/// to [`TASK_TEXT_BYTES_MAX`], owners to [`AGENT_ID_BYTES_MAX`], dependencies to
/// [`BLOCKED_BY_COUNT_MAX`], so that a task always reads and renders at a bounded size.
pub fn normalize(id: &str, raw: &RawTask) -> Task {
    let text = |s: &Option<SmolStr>| {
        s.as_deref()
            .map(|s| clip(s, TASK_TEXT_BYTES_MAX).to_owned())
    };
    Task {
        id: clip(id, TASK_ID_BYTES_MAX).to_owned(),
        content: text(&raw.content).unwrap_or_default(),
        active_form: text(&raw.active_form),
        status: normalize_status(raw.status.as_deref()),
        priority: normalize_priority(raw.priority.as_deref()),
        owner: raw
            .owner
            .as_deref()
            .map(|o| clip(o, AGENT_ID_BYTES_MAX).to_owned()),
        blocked_by: raw
            .blocked_by
            .iter()
            .take(BLOCKED_BY_COUNT_MAX)
            .map(|d| clip(d, TASK_ID_BYTES_MAX).to_owned())
            .collect(),
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A written value as an event quotes it: strings cut to [`EVENT_VALUE_BYTES_MAX`],
/// lists to [`BLOCKED_BY_COUNT_MAX`] entries of at most [`TASK_ID_BYTES_MAX`], the
/// task id and agent to their limits.
pub fn clip_written(mut w: crate::proto::WrittenValue) -> crate::proto::WrittenValue {
    use serde_json::Value;
    let text = |s: &str, max: usize| {
        let cut = clip(s, max);
        if cut.len() < s.len() {
            format!("{cut}…")
        } else {
            cut.to_owned()
        }
    };
    w.value = match w.value {
        Value::String(s) => Value::String(text(&s, EVENT_VALUE_BYTES_MAX)),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .take(BLOCKED_BY_COUNT_MAX)
                .map(|i| match i {
                    Value::String(s) => Value::String(text(&s, TASK_ID_BYTES_MAX)),
                    other => other,
                })
                .collect(),
        ),
        Value::Object(mut task) => {
            if let Some(Value::String(c)) = task.get_mut(field::CONTENT) {
                *c = text(c, EVENT_VALUE_BYTES_MAX);
            }
            Value::Object(task)
        }
        other => other,
    };
    w.task = text(&w.task, TASK_ID_BYTES_MAX);
    w.agent = w.agent.map(|a| text(&a, AGENT_ID_BYTES_MAX));
    w
}
