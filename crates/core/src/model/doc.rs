//! The document layout (docs/DESIGN.md §3) and reading it.
//!
//! ```text
//! root
//! ├── tasks:  Map  task id → Map { content, active_form?, status, priority,
//! │                               owner?, blocked_by: List<string>, position }
//! └── agents: Map  actor id (hex) → agent id
//! ```
//!
//! Every field is a register: a scalar string (what Rust writes) or a Text object (what
//! JS automerge writes by default); both read the same. `position` is a fractional index
//! key; the list's order is `(position, id)`.

use std::collections::BTreeMap;

pub use smol_str::SmolStr;

use automerge::{
    ActorId, ChangeHash, ObjId as ExId, ObjType, ReadDoc, ScalarValue, ScalarValueRef, Value,
    ValueRef,
};

/// Root key of the task map.
pub(crate) const TASKS: &str = "tasks";
/// Root key of the actor → agent map.
pub(crate) const AGENTS: &str = "agents";

/// Field names inside a task map (the document layout of docs/DESIGN.md §3).
pub mod field {
    /// The task's text.
    pub const CONTENT: &str = "content";
    /// The text shown while the task is in progress.
    pub const ACTIVE_FORM: &str = "active_form";
    /// The status (`pending`, `in_progress`, …).
    pub const STATUS: &str = "status";
    /// The priority.
    pub const PRIORITY: &str = "priority";
    /// The agent that owns the task.
    pub const OWNER: &str = "owner";
    /// The ids of the tasks this one waits for.
    pub const BLOCKED_BY: &str = "blocked_by";
    /// The fractional position key that orders the list.
    pub const POSITION: &str = "position";
    /// Every field, in a fixed order.
    pub const ALL: [&str; 7] = [
        CONTENT,
        ACTIVE_FORM,
        STATUS,
        PRIORITY,
        OWNER,
        BLOCKED_BY,
        POSITION,
    ];
}

/// Pseudo-field naming the task entry itself (creation, removal, concurrent creation).
pub(crate) const TASK_ENTRY: &str = "";

/// The actor of the list's first change. Every creator of a list makes the very same
/// first change (this actor, time 0, the two root maps), so two agents that create one
/// list at the same moment end with one root, not two conflicting ones. Never used for
/// anything else.
pub(crate) const ROOT_ACTOR: [u8; 16] = *b"swarmtodo\0root\0\0";

/// An object or operation id independent of the document's actor table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct OpKey {
    pub(crate) counter: u64,
    pub(crate) actor: ActorId,
}

impl OpKey {
    pub(crate) fn of(id: &ExId) -> Option<OpKey> {
        match id {
            ExId::Root => None,
            ExId::Id(counter, actor, _) => Some(OpKey {
                counter: *counter,
                actor: actor.clone(),
            }),
        }
    }

    /// Automerge's order of concurrent values: counter, then actor. The greatest wins.
    pub(crate) fn render(&self) -> String {
        format!("{}@{}", self.counter, self.actor.to_hex_string())
    }
}

/// A task as stored, before any validation: a JS peer (or a bug) can write anything.
/// Its strings are [`SmolStr`]s: up to 23 bytes inline (ids, statuses, priorities,
/// owners, positions), so the index of a list holds a task in one or two allocations
/// instead of seven — each a small piece that glibc scatters over the heap's free holes
/// and that keeps a page resident (see `crates/core/src/model/index.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawTask {
    /// `content`, if it is a string.
    pub content: Option<SmolStr>,
    /// `active_form`, if present and a string.
    pub active_form: Option<SmolStr>,
    /// `status` as written.
    pub status: Option<SmolStr>,
    /// `priority` as written.
    pub priority: Option<SmolStr>,
    /// `owner`, if present and a string.
    pub owner: Option<SmolStr>,
    /// `blocked_by` entries that are strings.
    pub blocked_by: Vec<SmolStr>,
    /// The fractional position key.
    pub position: SmolStr,
    /// Fields stored in a shape the model does not read: a `blocked_by` that is a
    /// string (read as a list of that one id) or holds entries that are not strings, a
    /// text field that is a number, a list or a map (read as absent). The authority
    /// reports and repairs them (schema).
    pub misshapen: Vec<&'static str>,
}

/// Reads a string register: a scalar string or a Text object.
pub(crate) fn read_string<R: ReadDoc>(doc: &R, obj: &ExId, key: &str) -> Option<String> {
    match doc.get(obj, key).ok()?? {
        (Value::Scalar(s), _) => match s.as_ref() {
            ScalarValue::Str(s) => Some(s.to_string()),
            _ => None,
        },
        (Value::Object(ObjType::Text), id) => doc.text(&id).ok(),
        (Value::Object(_), _) => None,
    }
}

/// Renders any value as JSON, for events (strings and Text objects alike).
pub(crate) fn value_json<R: ReadDoc>(doc: &R, value: &Value<'_>, id: &ExId) -> serde_json::Value {
    match value {
        Value::Scalar(s) => match s.as_ref() {
            ScalarValue::Str(s) => serde_json::Value::String(s.to_string()),
            ScalarValue::Int(i) => (*i).into(),
            ScalarValue::Uint(u) => (*u).into(),
            ScalarValue::F64(f) => serde_json::Number::from_f64(*f)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            ScalarValue::Boolean(b) => (*b).into(),
            ScalarValue::Null => serde_json::Value::Null,
            other => serde_json::Value::String(other.to_string()),
        },
        Value::Object(ObjType::Text) => doc
            .text(id)
            .map(serde_json::Value::String)
            .unwrap_or(serde_json::Value::Null),
        Value::Object(ObjType::List) => serde_json::Value::Array(
            read_string_list(doc, id)
                .into_iter()
                .map(serde_json::Value::String)
                .collect(),
        ),
        Value::Object(ObjType::Map) if doc.get(id, field::CONTENT).ok().flatten().is_some() => {
            serde_json::json!({ "content": read_string(doc, id, field::CONTENT) })
        }
        Value::Object(t) => serde_json::Value::String(format!("<{t}>")),
    }
}

/// A document read as it is now or as it was at some heads: automerge's `*_at` reads,
/// which need no copy of the document (`Automerge::fork_at` rebuilds one: the
/// authority's repairs read one task before the change that broke it, and a fork for
/// that was a tenth of a `rogue-agent` run).
#[derive(Debug)]
pub(crate) struct View<'a, R> {
    doc: &'a R,
    at: Option<&'a [ChangeHash]>,
}

impl<R> Clone for View<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R> Copy for View<'_, R> {}

impl<'a, R: ReadDoc> View<'a, R> {
    /// The document as it is.
    pub(crate) fn now(doc: &'a R) -> Self {
        View { doc, at: None }
    }

    /// The document as it was at `heads`.
    pub(crate) fn at(doc: &'a R, heads: &'a [ChangeHash]) -> Self {
        View {
            doc,
            at: Some(heads),
        }
    }

    fn get(self, obj: &ExId, key: &str) -> Option<(Value<'a>, ExId)> {
        match self.at {
            None => self.doc.get(obj, key),
            Some(h) => self.doc.get_at(obj, key, h),
        }
        .ok()?
    }

    fn text(self, obj: &ExId) -> Option<String> {
        match self.at {
            None => self.doc.text(obj),
            Some(h) => self.doc.text_at(obj, h),
        }
        .ok()
    }

    fn map_range(self, obj: &ExId) -> automerge::iter::MapRange<'a> {
        match self.at {
            None => self.doc.map_range(obj, ..),
            Some(h) => self.doc.map_range_at(obj, .., h),
        }
    }

    fn list_range(self, obj: &ExId) -> automerge::iter::ListRange<'a> {
        match self.at {
            None => self.doc.list_range(obj, ..),
            Some(h) => self.doc.list_range_at(obj, .., h),
        }
    }
}

/// Reads a list of strings (scalar or Text entries); other entries are skipped.
pub(crate) fn read_string_list<R: ReadDoc>(doc: &R, list: &ExId) -> Vec<String> {
    string_list_in(View::now(doc), list)
        .into_iter()
        .map(String::from)
        .collect()
}

fn string_list_in<R: ReadDoc>(view: View<'_, R>, list: &ExId) -> Vec<SmolStr> {
    let mut out = Vec::new();
    for item in view.list_range(list) {
        match &item.value {
            ValueRef::Scalar(ScalarValueRef::Str(s)) => out.push(SmolStr::new(s)),
            ValueRef::Object(ObjType::Text) => {
                if let Some(t) = view.text(&item.id()) {
                    out.push(t.into());
                }
            }
            ValueRef::Scalar(_) | ValueRef::Object(_) => {}
        }
    }
    out
}

/// Reads one task map.
pub(crate) fn read_task<R: ReadDoc>(doc: &R, obj: &ExId) -> RawTask {
    task_in(View::now(doc), obj)
}

/// Reads task `id` as the list's index would (the winning `tasks` map, the winning entry
/// in it) in `view`.
pub(crate) fn read_task_by_id<R: ReadDoc>(view: View<'_, R>, id: &str) -> Option<RawTask> {
    let tasks = map_in(view, &automerge::ROOT, TASKS)?;
    entry_in(view, &tasks, id)
}

/// Every task as the list's index would read it, by id, in `view`.
pub(crate) fn read_tasks<R: ReadDoc>(view: View<'_, R>) -> BTreeMap<String, RawTask> {
    match map_in(view, &automerge::ROOT, TASKS) {
        Some(tasks) => tasks_of(view, &tasks),
        None => BTreeMap::new(),
    }
}

/// Every task of the task map `tasks` (the root's, or one a writer replaced), by id.
pub(crate) fn tasks_of<R: ReadDoc>(view: View<'_, R>, tasks: &ExId) -> BTreeMap<String, RawTask> {
    // One pass over the task map: each winning entry with its object (a `get` per id
    // walks the map again).
    view.map_range(tasks)
        .filter(|item| matches!(item.value, ValueRef::Object(ObjType::Map)))
        .map(|item| (item.key.to_string(), task_in(view, &item.id())))
        .collect()
}

/// Every string entry of the agent map `agents` (actor hex → agent id).
pub(crate) fn agents_of<R: ReadDoc>(view: View<'_, R>, agents: &ExId) -> BTreeMap<String, String> {
    view.map_range(agents)
        .filter_map(|item| {
            let agent = match &item.value {
                ValueRef::Scalar(ScalarValueRef::Str(s)) => s.to_string(),
                ValueRef::Object(ObjType::Text) => view.text(&item.id())?,
                _ => return None,
            };
            Some((item.key.to_string(), agent))
        })
        .collect()
}

/// The `agents` entry under key `hex` (an actor id) in `view`.
pub(crate) fn agent_in<R: ReadDoc>(view: View<'_, R>, hex: &str) -> Option<String> {
    let agents = map_in(view, &automerge::ROOT, AGENTS)?;
    match view.get(&agents, hex)? {
        (Value::Scalar(s), _) => match s.as_ref() {
            ScalarValue::Str(s) => Some(s.to_string()),
            _ => None,
        },
        (Value::Object(ObjType::Text), id) => view.text(&id),
        (Value::Object(_), _) => None,
    }
}

/// The map under root key `key` in `view`, if the winning value is a map.
pub(crate) fn root_map_in<R: ReadDoc>(view: View<'_, R>, key: &str) -> Option<ExId> {
    map_in(view, &automerge::ROOT, key)
}

/// Task `id` of the `tasks` map, if its winning entry is a map.
fn entry_in<R: ReadDoc>(view: View<'_, R>, tasks: &ExId, id: &str) -> Option<RawTask> {
    Some(task_in(view, &map_in(view, tasks, id)?))
}

fn task_in<R: ReadDoc>(view: View<'_, R>, obj: &ExId) -> RawTask {
    // One pass over the task map (one `get` per field costs several times more).
    let mut raw = RawTask::default();
    for item in view.map_range(obj) {
        let text = match &item.value {
            ValueRef::Scalar(ScalarValueRef::Str(s)) => Some(SmolStr::new(s)),
            ValueRef::Object(ObjType::Text) => view.text(&item.id()).map(SmolStr::from),
            ValueRef::Object(ObjType::List) if item.key == field::BLOCKED_BY => {
                raw.blocked_by = string_list_in(view, &item.id());
                if view.list_range(&item.id()).count() != raw.blocked_by.len() {
                    raw.misshapen.push(field::BLOCKED_BY);
                }
                continue;
            }
            ValueRef::Scalar(_) | ValueRef::Object(_) => None,
        };
        if item.key == field::BLOCKED_BY {
            // A string names one dependency: read it as one, so that no check misses
            // it, and have it repaired into a list.
            raw.blocked_by = text.into_iter().collect();
            raw.misshapen.push(field::BLOCKED_BY);
            continue;
        }
        let known = field::ALL.contains(&item.key.as_ref());
        if text.is_none() && known {
            if let Some(f) = field::ALL.iter().find(|f| **f == item.key.as_ref()) {
                raw.misshapen.push(f);
            }
        }
        let slot = match item.key.as_ref() {
            field::CONTENT => &mut raw.content,
            field::ACTIVE_FORM => &mut raw.active_form,
            field::STATUS => &mut raw.status,
            field::PRIORITY => &mut raw.priority,
            field::OWNER => &mut raw.owner,
            field::POSITION => {
                raw.position = text.unwrap_or_default();
                continue;
            }
            _ => continue,
        };
        *slot = text;
    }
    // In one order whatever the map's (the index keeps them as bits).
    raw.misshapen.sort_unstable();
    raw
}

/// The map stored under `key` in `obj`, if the winning value is a map.
fn map_in<R: ReadDoc>(view: View<'_, R>, obj: &ExId, key: &str) -> Option<ExId> {
    match view.get(obj, key)? {
        (Value::Object(ObjType::Map), id) => Some(id),
        _ => None,
    }
}

/// The task map object of `id`, if the entry is a map.
pub(crate) fn task_obj<R: ReadDoc>(doc: &R, tasks: &ExId, id: &str) -> Option<ExId> {
    map_in(View::now(doc), tasks, id)
}

/// A root map (`tasks` or `agents`), if present.
pub(crate) fn root_map<R: ReadDoc>(doc: &R, key: &str) -> Option<ExId> {
    map_in(View::now(doc), &automerge::ROOT, key)
}

/// The agent an actor registered as, if any.
pub(crate) fn agent_of<R: ReadDoc>(
    doc: &R,
    agents: Option<&ExId>,
    actor: &ActorId,
) -> Option<String> {
    read_string(doc, agents?, &actor.to_hex_string())
}

/// Renders heads as a [`Version`](crate::model::Version): base58 hashes, sorted,
/// joined by `.`; `"0"` for no heads.
pub(crate) fn render_heads(heads: &[ChangeHash]) -> String {
    if heads.is_empty() {
        return "0".to_owned();
    }
    let mut parts: Vec<String> = heads
        .iter()
        .map(|h| bs58::encode(h.as_ref()).into_string())
        .collect();
    parts.sort();
    parts.join(".")
}

/// Parses a rendered version back into heads; `None` if it is not well-formed.
pub(crate) fn parse_heads(version: &str) -> Option<Vec<ChangeHash>> {
    if version == "0" {
        return Some(Vec::new());
    }
    version
        .split('.')
        .map(|part| {
            let bytes = bs58::decode(part).into_vec().ok()?;
            ChangeHash::try_from(bytes.as_slice()).ok()
        })
        .collect()
}
