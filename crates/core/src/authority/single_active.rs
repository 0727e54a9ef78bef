//! Rule 2: at most one task in progress, per owner or for the whole list.

use std::collections::BTreeSet;

use super::findings::{digest_key, some_of, written_with_key, Finding};
use super::policy::{Action, ActiveScope};
use super::repair::Repair;
use super::Authority;
use crate::model::{clip, field, FieldValue, Merge, OpKey, SmolStr, TodoList};
use crate::proto::{Rule, Status, WrittenValue, AGENT_ID_BYTES_MAX, TASK_ID_BYTES_MAX};

impl Authority {
    pub(super) fn check_single_active(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let index = list.index();
        // Buckets the merge could have overfilled: owners of touched in-progress tasks.
        let mut buckets: BTreeSet<Option<SmolStr>> = BTreeSet::new();
        for delta in merge.tasks.values() {
            if let Some(raw) = &delta.after {
                if raw.status.as_deref() == Some(Status::InProgress.as_str()) {
                    buckets.insert(raw.owner.clone());
                }
            }
        }
        let groups: Vec<(String, BTreeSet<String>)> = match self.policy.single_active_scope {
            ActiveScope::PerOwner => buckets
                .into_iter()
                .filter_map(|b| {
                    let set = index
                        .active
                        .get(&b)?
                        .iter()
                        .map(SmolStr::to_string)
                        .collect();
                    Some((b.map_or_else(|| "(no owner)".to_owned(), String::from), set))
                })
                .collect(),
            ActiveScope::PerList if !buckets.is_empty() => {
                vec![(
                    "(list)".to_owned(),
                    index
                        .active
                        .values()
                        .flatten()
                        .map(SmolStr::to_string)
                        .collect(),
                )]
            }
            ActiveScope::PerList => Vec::new(),
        };
        for (who, set) in groups {
            if set.len() < 2 {
                continue;
            }
            let values: Vec<(OpKey, WrittenValue)> = set
                .iter()
                .filter_map(|t| {
                    let (w, k) = written_with_key(list, t, field::STATUS)?;
                    Some((k, w))
                })
                .collect();
            // Keep the in-progress status written last in Automerge's order of
            // operations (counter, then actor): the same choice on every replica.
            let keep = values
                .iter()
                .max_by(|a, b| a.0.cmp(&b.0))
                .map(|(_, w)| w.task.clone());
            let ops: Vec<String> = values
                .iter()
                .map(|(_, w)| format!("{}={}", w.task, w.op))
                .collect();
            let key = digest_key("single_active", &format!("{who}:{}", ops.join(",")));
            let fixing = self.policy.single_active == Action::Repair && keep.is_some();
            let how = keep.as_ref().filter(|_| fixing).map(|k| {
                let others = set.iter().filter(|t| *t != k);
                format!(
                    "kept {:?} in_progress, set {} back to pending",
                    clip(k, TASK_ID_BYTES_MAX),
                    some_of(others, set.len() - 1)
                )
            });
            if fixing && !self.reported.contains(&key) {
                for t in set.iter().filter(|t| Some(*t) != keep.as_ref()) {
                    repair.set(
                        t,
                        field::STATUS,
                        FieldValue::Str(Some(Status::Pending.as_str().to_owned())),
                    );
                }
            }
            findings.push(Finding {
                key,
                rule: Rule::SingleActive,
                message: format!(
                    "{} has {} tasks in_progress ({}); at most one is allowed",
                    clip(&who, AGENT_ID_BYTES_MAX),
                    set.len(),
                    some_of(&set, set.len())
                ),
                tasks: set,
                values: values.into_iter().map(|(_, w)| w).collect(),
                repair: how,
                changes: Vec::new(),
            });
        }
    }
}
