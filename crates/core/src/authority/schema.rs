//! Rule 1, the schema: every task's fields well-formed and within the limits, the entry
//! itself a map, and the list within its size.

use automerge::ReadDoc;

use super::findings::{digest_key, some_of, written, Finding, TASK_ENTRY_STATIC};
use super::policy::Action;
use super::repair::Repair;
use super::Authority;
use crate::model::{
    clip, clip_written, field, normalize_priority, normalize_status, status_alias, FieldValue,
    Merge, OpKey, SmolStr, TaskDelta, TodoList, TASK_ENTRY,
};
use crate::proto::{
    Priority, Rule, Status, WrittenValue, AGENT_ID_BYTES_MAX, BLOCKED_BY_COUNT_MAX, LIST_TASKS_MAX,
    TASK_ID_BYTES_MAX, TASK_TEXT_BYTES_MAX,
};

impl Authority {
    pub(super) fn check_schema(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let fixing = self.policy.schema == Action::Repair;
        for (id, delta) in &merge.tasks {
            let shown = clip(id, TASK_ID_BYTES_MAX);
            let Some(raw) = &delta.after else {
                self.check_entry_shape(list, id, delta, findings, repair);
                continue;
            };
            // A finding about field `f` (TASK_ENTRY: the task itself), keyed by the
            // operation that wrote its value; `fix` is what the repair writes.
            let mut bad = |f: &'static str, msg: String, fix: Option<(FieldValue, String)>| {
                let w = (f != TASK_ENTRY).then(|| written(list, id, f)).flatten();
                let op = match &w {
                    Some(w) => w.op.clone(),
                    None if f == TASK_ENTRY => list
                        .index()
                        .task_obj(list.doc(), id)
                        .and_then(|obj| OpKey::of(&obj))
                        .map(|k| k.render())
                        .unwrap_or_default(),
                    None => String::new(),
                };
                let key = digest_key("schema", &format!("{id}:{f}:{op}"));
                let fix = fix.filter(|_| fixing);
                if let Some((value, _)) = &fix {
                    if !self.reported.contains(&key) {
                        repair.set(id, f, value.clone());
                    }
                }
                findings.push(Finding {
                    key,
                    rule: Rule::Schema,
                    message: msg,
                    tasks: [id.clone()].into(),
                    values: w.into_iter().collect(),
                    repair: fix.map(|(_, how)| how),
                    changes: Vec::new(),
                });
            };
            let str_fix = |f: &str, v: &str| {
                (
                    FieldValue::Str(Some(v.to_owned())),
                    format!("set {shown}.{f} to {v:?}"),
                )
            };
            if id.len() > TASK_ID_BYTES_MAX {
                // No request can name such a task: it goes (its content is in the event).
                bad(
                    TASK_ENTRY,
                    format!(
                        "task id {shown:?}… is {} bytes, more than the {TASK_ID_BYTES_MAX} allowed",
                        id.len()
                    ),
                    Some((
                        FieldValue::Task(None),
                        format!("removed the task with the {}-byte id", id.len()),
                    )),
                );
                continue;
            }
            match raw.status.as_deref() {
                Some(s) if s.parse::<Status>().is_ok() => {}
                other => {
                    let to = other
                        .and_then(status_alias)
                        .unwrap_or(normalize_status(None));
                    bad(
                        field::STATUS,
                        format!(
                            "task {shown:?} has status {:?}; allowed: {}",
                            other.map(|o| clip(o, TASK_ID_BYTES_MAX)),
                            Status::allowed().join(", ")
                        ),
                        Some(str_fix(field::STATUS, to.as_str())),
                    );
                }
            }
            match raw.priority.as_deref() {
                Some(p) if p.parse::<Priority>().is_ok() => {}
                other => bad(
                    field::PRIORITY,
                    format!(
                        "task {shown:?} has priority {:?}; allowed: {}",
                        other.map(|o| clip(o, TASK_ID_BYTES_MAX)),
                        Priority::allowed().join(", ")
                    ),
                    Some(str_fix(field::PRIORITY, normalize_priority(other).as_str())),
                ),
            }
            if raw.content.as_deref().is_none_or(|c| c.trim().is_empty()) {
                bad(
                    field::CONTENT,
                    format!(
                        "task {shown:?} has no content; the writer should say what the task is"
                    ),
                    None,
                );
            }
            // Limits `todo_write` enforces hold for sync peers too: texts are cut to
            // the limit, an owner over it names no agent and is removed, dependencies
            // past the most a task may name are dropped.
            for (f, text) in [
                (field::CONTENT, &raw.content),
                (field::ACTIVE_FORM, &raw.active_form),
            ] {
                let Some(text) = text.as_deref().filter(|t| t.len() > TASK_TEXT_BYTES_MAX) else {
                    continue;
                };
                bad(
                    f,
                    format!(
                        "task {shown:?} has a {f} of {} bytes, more than the {TASK_TEXT_BYTES_MAX} allowed",
                        text.len()
                    ),
                    Some((
                        FieldValue::Str(Some(clip(text, TASK_TEXT_BYTES_MAX).to_owned())),
                        format!("cut {shown}.{f} to {TASK_TEXT_BYTES_MAX} bytes"),
                    )),
                );
            }
            if let Some(owner) = raw
                .owner
                .as_deref()
                .filter(|o| o.len() > AGENT_ID_BYTES_MAX)
            {
                bad(
                    field::OWNER,
                    format!(
                        "task {shown:?} has an owner of {} bytes, more than the {AGENT_ID_BYTES_MAX} an agent id may have",
                        owner.len()
                    ),
                    Some((FieldValue::Str(None), format!("removed {shown}.owner"))),
                );
            }
            let misshapen = |f: &str| raw.misshapen.contains(&f);
            if raw.blocked_by.len() > BLOCKED_BY_COUNT_MAX || misshapen(field::BLOCKED_BY) {
                let kept: Vec<String> = raw
                    .blocked_by
                    .iter()
                    .take(BLOCKED_BY_COUNT_MAX)
                    .map(SmolStr::to_string)
                    .collect();
                bad(
                    field::BLOCKED_BY,
                    format!(
                        "task {shown:?} has a blocked_by that is not a list of at most {BLOCKED_BY_COUNT_MAX} task ids"
                    ),
                    Some((
                        FieldValue::List(kept),
                        format!("rewrote {shown}.blocked_by as a list of its first {BLOCKED_BY_COUNT_MAX} ids"),
                    )),
                );
            }
            for f in [field::ACTIVE_FORM, field::OWNER] {
                if misshapen(f) {
                    bad(
                        f,
                        format!("task {shown:?} has a {f} that is not a string"),
                        Some((FieldValue::Str(None), format!("removed {shown}.{f}"))),
                    );
                }
            }
        }
        self.check_list_size(list, merge, findings, repair);
    }

    /// A task entry that is not a map (a string, a list, a number): no task reads it,
    /// and it hides the task it replaced. The task as it was is put back, or the entry
    /// removed.
    fn check_entry_shape(
        &self,
        list: &TodoList,
        id: &str,
        delta: &TaskDelta,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let index = list.index();
        let Some(tasks) = &index.tasks_obj else {
            return;
        };
        let Ok(Some((value, exid))) = list.doc().get(tasks, id) else {
            return;
        };
        let op = OpKey::of(&exid).map(|k| k.render()).unwrap_or_default();
        let key = digest_key("schema", &format!("{id}:entry:{op}"));
        let shown = clip(id, TASK_ID_BYTES_MAX);
        let fixing = self.policy.schema == Action::Repair;
        if fixing && !self.reported.contains(&key) {
            repair.set(
                id,
                TASK_ENTRY_STATIC,
                FieldValue::Task(delta.before.clone()),
            );
        }
        findings.push(Finding {
            key,
            rule: Rule::Schema,
            message: format!("task {shown:?} is not a task map but {value}"),
            tasks: [id.to_owned()].into(),
            values: vec![clip_written(WrittenValue {
                task: id.to_owned(),
                field: "task".to_owned(),
                value: crate::model::value_json(list.doc(), &value, &exid),
                agent: OpKey::of(&exid).and_then(|k| list.agent_of(&k.actor)),
                op,
            })],
            repair: fixing.then(|| match delta.before {
                Some(_) => format!("put back task {shown:?} as it was"),
                None => format!("removed the entry {shown:?}"),
            }),
            changes: Vec::new(),
        });
    }

    /// More tasks than `LIST_TASKS_MAX` after a merge that made tasks: the newest (in
    /// Automerge's order of the operations that made them, the same on every replica)
    /// past the limit are removed.
    fn check_list_size(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let index = list.index();
        let made = merge
            .tasks
            .values()
            .any(|d| d.before.is_none() && d.after.is_some());
        if !made || index.tasks.len() <= LIST_TASKS_MAX {
            return;
        }
        let mut by_age: Vec<(OpKey, &SmolStr)> = index
            .tasks
            .keys()
            .filter_map(|id| Some((OpKey::of(&index.task_obj(list.doc(), id)?)?, id)))
            .collect();
        by_age.sort();
        let over = &by_age[LIST_TASKS_MAX.min(by_age.len())..];
        let names: Vec<String> = over
            .iter()
            .map(|(k, id)| format!("{id}={}", k.render()))
            .collect();
        let key = digest_key("schema", &format!("list_size:{}", names.join(",")));
        let fixing = self.policy.schema == Action::Repair;
        if fixing && !self.reported.contains(&key) {
            for (_, id) in over {
                repair.set(id, TASK_ENTRY_STATIC, FieldValue::Task(None));
            }
        }
        findings.push(Finding {
            key,
            rule: Rule::Schema,
            message: format!(
                "the list holds {} tasks, more than the {LIST_TASKS_MAX} allowed",
                index.tasks.len()
            ),
            tasks: over.iter().map(|(_, id)| id.to_string()).collect(),
            values: Vec::new(),
            repair: fixing.then(|| {
                format!(
                    "removed the {} newest tasks: {}",
                    over.len(),
                    some_of(over.iter().map(|(_, id)| *id), over.len())
                )
            }),
            changes: Vec::new(),
        });
    }
}
