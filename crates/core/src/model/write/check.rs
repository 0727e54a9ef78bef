//! Checks of a write: each task's fields against the model's limits, and the whole plan
//! (sizes, dependencies, one task in progress) before anything is committed.

use std::collections::BTreeSet;

use super::err;
use super::Plan;
use crate::model::index::Index;
use crate::model::SmolStr;
use crate::proto::{
    ApiError, ErrorCode, Status, TaskPatch, AGENT_ID_BYTES_MAX, BLOCKED_BY_COUNT_MAX,
    LIST_TASKS_MAX, TASK_ID_BYTES_MAX, TASK_TEXT_BYTES_MAX,
};

fn check_id(id: &str, at: &str) -> Result<(), ApiError> {
    if id.trim().is_empty() {
        return Err(err(
            ErrorCode::MissingField,
            at,
            "task id is empty: give a non-empty id, or omit it to have one generated",
        ));
    }
    if id.len() > TASK_ID_BYTES_MAX {
        return Err(err(
            ErrorCode::LimitExceeded,
            at,
            format!(
                "task id is {} bytes; the limit is {TASK_ID_BYTES_MAX}",
                id.len()
            ),
        ));
    }
    if id.chars().any(char::is_control) {
        return Err(err(
            ErrorCode::InvalidValue,
            at,
            "task id contains control characters",
        ));
    }
    Ok(())
}

fn check_text(text: &str, at: &str, required: bool) -> Result<(), ApiError> {
    if required && text.trim().is_empty() {
        return Err(err(
            ErrorCode::MissingField,
            at,
            "content is empty: say what the task is, imperatively (\"Run the tests\")",
        ));
    }
    if text.len() > TASK_TEXT_BYTES_MAX {
        return Err(err(
            ErrorCode::LimitExceeded,
            at,
            format!(
                "text is {} bytes; the limit is {TASK_TEXT_BYTES_MAX}",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// Field-level checks of one patch, independent of the list.
pub(super) fn check_patch(p: &TaskPatch, at: &str) -> Result<(), ApiError> {
    if let Some(id) = &p.id {
        check_id(id, &format!("{at}.id"))?;
    }
    if let Some(c) = &p.content {
        check_text(c, &format!("{at}.content"), true)?;
    }
    if let Some(Some(a)) = &p.active_form {
        check_text(a, &format!("{at}.active_form"), false)?;
    }
    if let Some(Some(o)) = &p.owner {
        let f = format!("{at}.owner");
        if o.trim().is_empty() {
            return Err(err(
                ErrorCode::MissingField,
                f,
                "owner is empty: give an agent id, or null to release the task",
            ));
        }
        if o.len() > AGENT_ID_BYTES_MAX {
            return Err(err(
                ErrorCode::LimitExceeded,
                f,
                format!(
                    "owner is {} bytes; the limit is {AGENT_ID_BYTES_MAX}",
                    o.len()
                ),
            ));
        }
    }
    if let Some(deps) = &p.blocked_by {
        let f = format!("{at}.blocked_by");
        if deps.len() > BLOCKED_BY_COUNT_MAX {
            return Err(err(
                ErrorCode::LimitExceeded,
                f,
                format!(
                    "{} dependencies; the limit is {BLOCKED_BY_COUNT_MAX}",
                    deps.len()
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for (i, d) in deps.iter().enumerate() {
            check_id(d, &format!("{f}[{i}]"))?;
            if !seen.insert(d) {
                return Err(err(
                    ErrorCode::DuplicateId,
                    format!("{f}[{i}]"),
                    format!("dependency {d:?} is named twice"),
                ));
            }
        }
    }
    Ok(())
}

/// Whether task `id` exists once `plan` is applied to `index`.
pub(super) fn exists(index: &Index, plan: &Plan, id: &str) -> bool {
    match plan.changed.get(id) {
        Some(d) => d.is_some(),
        None => index.tasks.contains_key(id),
    }
}

/// Whole-plan checks: list size, dependencies, one in-progress task per owner.
pub(super) fn validate(index: &Index, plan: &Plan) -> Result<(), ApiError> {
    let created = plan
        .changed
        .iter()
        .filter(|(id, d)| d.is_some() && !index.tasks.contains_key(id.as_str()))
        .count();
    let total = index.tasks.len() + created;
    if total > LIST_TASKS_MAX {
        return Err(err(
            ErrorCode::LimitExceeded,
            "tasks",
            format!("the list would hold {total} tasks; the limit is {LIST_TASKS_MAX}"),
        ));
    }
    // A cycle can only close through a task this write changes: one walk from all of
    // them, each task visited once.
    let deps = |id: &str| -> Vec<&str> {
        let named: Vec<&str> = match plan.changed.get(id) {
            Some(Some(d)) => d.task.blocked_by.iter().map(String::as_str).collect(),
            Some(None) => Vec::new(),
            None => index.tasks.get(id).map_or_else(Vec::new, |e| {
                e.blocked_by.iter().map(SmolStr::as_str).collect()
            }),
        };
        named
            .into_iter()
            .filter(|dep| *dep != id && exists(index, plan, dep))
            .collect()
    };
    let changed = plan
        .changed
        .iter()
        .filter(|(_, d)| d.is_some())
        .map(|(id, _)| id.as_str());
    if let Some(cycle) = crate::model::deps::cycles(changed, deps).0.first() {
        let at = cycle
            .iter()
            .find(|t| plan.changed.contains_key(*t))
            .unwrap_or(&cycle[0]);
        return Err(err(
            ErrorCode::InvalidDependency,
            format!("task {at}.blocked_by"),
            format!(
                "dependencies would form a cycle of {} tasks: {}",
                cycle.len() - 1,
                cycle
                    .iter()
                    .take(crate::proto::VIOLATION_TASKS_MAX)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(" → ")
            ),
        ));
    }
    for (id, d) in &plan.changed {
        let Some(d) = d else { continue };
        for dep in &d.task.blocked_by {
            if dep == id || !exists(index, plan, dep) {
                return Err(err(
                    ErrorCode::InvalidDependency,
                    format!("task {id}.blocked_by"),
                    if dep == id {
                        format!("task {id:?} cannot depend on itself")
                    } else {
                        format!("task {id:?} depends on {dep:?}, which is not in the list")
                    },
                ));
            }
        }
        // Only a write that starts a task (or hands a started task to another owner)
        // is refused; a list that is already over the limit after a merge stays
        // editable, and the authority reports it.
        let already_active = index.tasks.get(id.as_str()).is_some_and(|e| {
            e.status() == Some(Status::InProgress.as_str())
                && e.owner.as_deref() == d.task.owner.as_deref()
        });
        if d.task.status == Status::InProgress && !already_active {
            let owner = &d.task.owner;
            let others: Vec<String> = index
                .active
                .get(&owner.as_deref().map(SmolStr::from))
                .into_iter()
                .flatten()
                .filter(|t| t.as_str() != id && !plan.changed.contains_key(t.as_str()))
                .map(SmolStr::to_string)
                .chain(
                    plan.changed
                        .iter()
                        .filter(|(t, o)| {
                            *t != id
                                && o.as_ref().is_some_and(|o| {
                                    o.task.status == Status::InProgress && o.task.owner == *owner
                                })
                        })
                        .map(|(t, _)| t.clone()),
                )
                .collect();
            if let Some(other) = others.first() {
                let who = owner.as_deref().unwrap_or("(no owner)");
                return Err(err(
                    ErrorCode::SecondInProgress,
                    format!("task {id}.status"),
                    format!(
                        "{who} already has task {other:?} in_progress: complete or pause it first (one in_progress task per owner)"
                    ),
                ));
            }
        }
    }
    Ok(())
}
