//! What the checks gather for one violation ([`Finding`]), its key, and the helpers the
//! checks share: written values with their writers, lists cut for messages.

use std::collections::BTreeSet;

use automerge::ReadDoc;

use crate::model::{clip, field, OpKey, TodoList, TASK_ENTRY};
use crate::proto::{Rule, WrittenValue, TASK_ID_BYTES_MAX, VIOLATION_TASKS_MAX};

/// Tasks and values gathered for one violation.
pub(super) struct Finding {
    pub(super) key: String,
    pub(super) rule: Rule,
    pub(super) message: String,
    pub(super) tasks: BTreeSet<String>,
    pub(super) values: Vec<WrittenValue>,
    pub(super) repair: Option<String>,
    /// Changes involved beyond those that touched `tasks` (a change to the root).
    pub(super) changes: Vec<String>,
}

/// A violation's or conflict's key: its kind and a digest of everything that names it
/// (task ids, Automerge op ids). What a key names can be as large as the list (a
/// single-active violation over a thousand tasks); the digest keeps every key the same
/// short size, which the store and each event can hold.
pub(super) fn digest_key(kind: &str, names: &str) -> String {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(names.as_bytes());
    let hex: String = hash[..KEY_DIGEST_BYTES]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{kind}:{hex}")
}

/// Bytes of the SHA-256 digest a key keeps (128 bits: no two violations collide).
const KEY_DIGEST_BYTES: usize = 16;

/// `items` for a message: the first [`VIOLATION_TASKS_MAX`], then how many more.
pub(super) fn some_of<'a, S: AsRef<str> + ?Sized + 'a>(
    items: impl IntoIterator<Item = &'a S>,
    total: usize,
) -> String {
    let shown: Vec<&str> = items
        .into_iter()
        .take(VIOLATION_TASKS_MAX)
        .map(|s| clip(s.as_ref(), TASK_ID_BYTES_MAX))
        .collect();
    let more = total.saturating_sub(shown.len());
    let mut out = shown.join(", ");
    if more > 0 {
        out.push_str(&format!(" … and {more} more"));
    }
    out
}

/// The static name of a known field.
pub(super) fn field_name(f: &str) -> Option<&'static str> {
    field::ALL.iter().copied().find(|x| *x == f)
}

/// The current (winning) value of a field, with its writer.
pub(super) fn written(list: &TodoList, id: &str, f: &'static str) -> Option<WrittenValue> {
    written_with_key(list, id, f).map(|(w, _)| w)
}

pub(super) fn written_with_key(
    list: &TodoList,
    id: &str,
    f: &'static str,
) -> Option<(WrittenValue, OpKey)> {
    let obj = list.index().task_obj(list.doc(), id)?;
    let (value, exid) = list.doc().get(&obj, f).ok()??;
    let key = OpKey::of(&exid)?;
    Some((
        WrittenValue {
            task: id.to_owned(),
            field: f.to_owned(),
            value: crate::model::value_json(list.doc(), &value, &exid),
            agent: list.agent_of(&key.actor),
            op: key.render(),
        },
        key,
    ))
}

pub(super) const TASK_ENTRY_STATIC: &str = TASK_ENTRY;
