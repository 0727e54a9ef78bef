//! Concurrent writes to one field: reported once each, with the value that won.

use std::collections::BTreeSet;

use automerge::{ObjId as ExId, ReadDoc};

use super::findings::{digest_key, field_name};
use super::repair::Repair;
use super::Authority;
use crate::model::{clip, clip_written, FieldValue, Merge, OpKey, TodoList, TASK_ENTRY};
use crate::proto::{Conflict, Version, WrittenValue, TASK_ID_BYTES_MAX, VIOLATION_TASKS_MAX};

impl Authority {
    /// Rule 5. Also: when the winning value is one of this authority's own repairs and
    /// an agent wrote another value concurrently (a write the authority had not seen when
    /// it repaired), the agent's value is written back. A repair only fixes a violation;
    /// it must not overrule an agent that moved on, and this makes the end state the same
    /// whether or not the authority saw the violation in between.
    pub(super) fn check_conflicts(
        &mut self,
        list: &TodoList,
        merge: &Merge,
        version: &dyn Fn() -> Version,
        repair: &mut Repair,
    ) -> Vec<Conflict> {
        let mut out = Vec::new();
        let index = list.index();
        let doc = list.doc();
        for (id, delta) in &merge.tasks {
            for f in &delta.fields {
                let (obj, key): (Option<ExId>, &str) = if f == TASK_ENTRY {
                    (index.tasks_obj.clone(), id.as_str())
                } else {
                    match field_name(f) {
                        Some(name) => (index.task_obj(doc, id), name),
                        None => continue,
                    }
                };
                let Some(obj) = obj else { continue };
                let Ok(all) = doc.get_all(&obj, key) else {
                    continue;
                };
                if all.len() < 2 {
                    continue;
                }
                let Ok(Some((_, winner_id))) = doc.get(&obj, key) else {
                    continue;
                };
                let field_label = if f == TASK_ENTRY { "task" } else { key };
                let values: Vec<WrittenValue> = all
                    .iter()
                    .map(|(v, exid)| WrittenValue {
                        task: id.clone(),
                        field: field_label.to_owned(),
                        value: crate::model::value_json(doc, v, exid),
                        agent: OpKey::of(exid).and_then(|k| list.agent_of(&k.actor)),
                        op: OpKey::of(exid).map(|k| k.render()).unwrap_or_default(),
                    })
                    .collect();
                let winner_op = OpKey::of(&winner_id)
                    .map(|k| k.render())
                    .unwrap_or_default();
                let Some(winner) = values.iter().find(|v| v.op == winner_op).cloned() else {
                    continue;
                };
                let mut ops: Vec<&str> = values.iter().map(|v| v.op.as_str()).collect();
                ops.sort();
                let key = digest_key("conflict", &format!("{id}:{field_label}:{}", ops.join(",")));
                if !self.reported.insert(key.clone()) {
                    continue;
                }
                if f != TASK_ENTRY && winner.agent.as_deref() == Some(self.agent.as_str()) {
                    let yield_to = all
                        .iter()
                        .zip(&values)
                        .filter(|(_, w)| w.agent.as_deref() != Some(self.agent.as_str()))
                        .filter_map(|((_, exid), w)| OpKey::of(exid).map(|k| (k, w)))
                        .max_by(|a, b| a.0.cmp(&b.0))
                        .map(|(_, w)| w.clone());
                    if let (Some(w), Some(name)) = (yield_to, field_name(f)) {
                        let value = match &w.value {
                            serde_json::Value::String(s) => Some(FieldValue::Str(Some(s.clone()))),
                            serde_json::Value::Array(items) => Some(FieldValue::List(
                                items
                                    .iter()
                                    .filter_map(|i| i.as_str().map(str::to_owned))
                                    .collect(),
                            )),
                            _ => None,
                        };
                        if let Some(value) = value {
                            repair.set(id, name, value);
                            let shown = clip_written(w.clone());
                            repair.notes.push(format!(
                                "{}.{name}: kept {}'s concurrent {} over the authority's repair",
                                shown.task,
                                shown.agent.as_deref().unwrap_or("an agent"),
                                shown.value
                            ));
                        }
                    }
                }
                let agents: BTreeSet<String> =
                    values.iter().filter_map(|v| v.agent.clone()).collect();
                // The winner last, then as many of the others as an event lists.
                let others = values.len().saturating_sub(1).min(VIOLATION_TASKS_MAX - 1);
                let values: Vec<WrittenValue> = values
                    .into_iter()
                    .filter(|v| v.op != winner.op)
                    .take(others)
                    .chain([winner.clone()])
                    .map(clip_written)
                    .collect();
                out.push(Conflict {
                    key,
                    task: clip(id, TASK_ID_BYTES_MAX).to_owned(),
                    field: field_label.to_owned(),
                    values,
                    winner: clip_written(winner),
                    agents: agents.into_iter().take(VIOLATION_TASKS_MAX).collect(),
                    version: version(),
                });
            }
        }
        out
    }
}
