//! `todo_write` on a replica (docs/DESIGN.md §5): validate the whole request against the
//! list, build the resulting tasks as a draft, and only then commit the fields that
//! differ as one Automerge change. An invalid write changes nothing.
//!
//! `plan` builds the draft, `check` validates it, `commit` writes what differs.

mod check;
mod commit;
mod plan;

use std::collections::BTreeMap;

use automerge::AutomergeError;

use crate::model::{write, Merge, TodoList};
use crate::proto::{ApiError, ErrorCode, Task, WriteMode, WriteRequest, WriteResult};

pub(crate) use self::commit::{plan_is_noop, register_agent, write_task};
pub(crate) use self::plan::plan;

/// Who writes, when, and the seed for generated task ids. The model reads no clock and
/// no OS randomness: the caller passes both.
#[derive(Debug, Clone)]
pub struct WriteContext {
    /// The writing agent's id (recorded against the replica's actor in the list).
    pub agent: String,
    /// Milliseconds since the Unix epoch, stamped on the change.
    pub now_ms: i64,
    /// Seed for ids of tasks created without one.
    pub id_seed: u64,
}

impl WriteContext {
    /// A context for `agent` at `now_ms`, with `id_seed` for generated ids.
    pub fn new(agent: impl Into<String>, now_ms: i64, id_seed: u64) -> Self {
        WriteContext {
            agent: agent.into(),
            now_ms,
            id_seed,
        }
    }
}

/// A task as the write wants it, including its position key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Desired {
    pub(crate) task: Task,
    pub(crate) position: String,
}

/// The outcome of planning: every task whose stored form must change.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// id → desired task (None: remove).
    pub(crate) changed: BTreeMap<String, Option<Desired>>,
    pub(crate) created: Vec<String>,
    pub(crate) removed: Vec<String>,
}

fn err(code: ErrorCode, field: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError {
        code,
        field: Some(field.into()),
        allowed: Vec::new(),
        message: message.into(),
        current: None,
    }
}

impl TodoList {
    /// `todo_write`: validates the whole request, then commits what differs as one
    /// change. An invalid request changes nothing. Returns the result and what the
    /// change touched (empty when the write asked for what was already there).
    pub fn write(
        &mut self,
        req: &WriteRequest,
        ctx: &WriteContext,
    ) -> Result<(WriteResult, Merge), ApiError> {
        if let Some(expected) = &req.expected_version {
            let current = self.version();
            if *expected != current {
                return Err(ApiError {
                    code: ErrorCode::StaleVersion,
                    field: Some("expected_version".into()),
                    allowed: Vec::new(),
                    message: format!(
                        "the list moved on from {expected} to {current}: re-read it (the current list is attached) and send the write again"
                    ),
                    current: Some(Box::new(self.read())),
                });
            }
        }
        let base = match &req.mode {
            WriteMode::Replace {
                base_version: Some(v),
                ..
            } if *v != self.version() => Some(self.base_tasks(v)?),
            _ => None,
        };
        let plan = write::plan(&self.index, req, ctx, base.as_ref())?;
        let version = self.version();
        if write::plan_is_noop(&self.index, &plan) {
            return Ok((
                WriteResult {
                    version,
                    changed: false,
                    created: Vec::new(),
                    updated: Vec::new(),
                    removed: Vec::new(),
                },
                Merge::default(),
            ));
        }
        let merge = self
            .commit(&plan, ctx, req.explanation.as_deref())
            .map_err(internal)?;
        let created: Vec<String> = plan.created.clone();
        let updated: Vec<String> = merge
            .tasks
            .iter()
            .filter(|(id, d)| d.before.is_some() && d.after.is_some() && !created.contains(id))
            .map(|(id, _)| id.clone())
            .collect();
        Ok((
            WriteResult {
                version: self.version(),
                changed: true,
                created,
                updated,
                removed: plan.removed.clone(),
            },
            merge,
        ))
    }
}

fn internal(e: AutomergeError) -> ApiError {
    ApiError {
        code: ErrorCode::Internal,
        field: None,
        allowed: Vec::new(),
        message: format!("the write could not be committed ({e}); nothing changed, try again"),
        current: None,
    }
}
