//! Rule 3: dependencies name existing tasks and form no cycle.

use std::collections::BTreeSet;

use super::findings::{digest_key, some_of, written, Finding};
use super::policy::Action;
use super::repair::Repair;
use super::Authority;
use crate::model::{
    clip, field, normalize_status, FieldValue, Merge, SmolStr, TodoList, TASK_ENTRY,
};
use crate::proto::{Rule, Status, TASK_ID_BYTES_MAX, VIOLATION_TASKS_MAX};

impl Authority {
    pub(super) fn check_dependencies(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let index = list.index();
        let fixing = self.policy.dependencies == Action::Repair;
        // Touched tasks and every task that names one of them.
        let mut subjects: BTreeSet<&str> = merge.tasks.keys().map(String::as_str).collect();
        for id in merge.tasks.keys() {
            if let Some(ds) = index.dependents.get(id.as_str()) {
                subjects.extend(ds.iter().map(SmolStr::as_str));
            }
        }
        for id in subjects {
            let Some(entry) = index.tasks.get(id) else {
                continue;
            };
            let raw = entry;
            let missing: Vec<&str> = raw
                .blocked_by
                .iter()
                .map(SmolStr::as_str)
                .filter(|d| !index.tasks.contains_key(*d) || *d == id)
                .collect();
            if !missing.is_empty() {
                let deps_value = written(list, id, field::BLOCKED_BY);
                let deps_op = deps_value
                    .as_ref()
                    .map(|w| w.op.clone())
                    .unwrap_or_default();
                let key = digest_key(
                    "dependencies",
                    &format!("missing:{id}:{missing:?}:{deps_op}"),
                );
                let kept: Vec<String> = raw
                    .blocked_by
                    .iter()
                    .filter(|d| !missing.contains(&d.as_str()))
                    .map(SmolStr::to_string)
                    .collect();
                if fixing && !self.reported.contains(&key) {
                    repair.set(id, field::BLOCKED_BY, FieldValue::List(kept));
                }
                findings.push(Finding {
                    key,
                    rule: Rule::Dependencies,
                    message: format!(
                        "task {:?} is blocked by {}, which are not tasks of this list (or itself)",
                        clip(id, TASK_ID_BYTES_MAX),
                        some_of(missing.iter().copied(), missing.len())
                    ),
                    tasks: [id.to_owned()].into(),
                    values: deps_value.into_iter().collect(),
                    repair: fixing.then(|| {
                        format!(
                            "dropped {} from {}.blocked_by",
                            some_of(missing.iter().copied(), missing.len()),
                            clip(id, TASK_ID_BYTES_MAX)
                        )
                    }),
                    changes: Vec::new(),
                });
            }
            if normalize_status(raw.status()) == Status::Completed {
                for dep in &raw.blocked_by {
                    let Some(d) = index.tasks.get(dep.as_str()) else {
                        continue;
                    };
                    if !normalize_status(d.status()).is_open() {
                        continue;
                    }
                    let status = written(list, id, field::STATUS);
                    let op = status.as_ref().map(|w| w.op.clone()).unwrap_or_default();
                    let dep_status = written(list, dep, field::STATUS);
                    let dep_op = dep_status
                        .as_ref()
                        .map(|w| w.op.clone())
                        .unwrap_or_default();
                    findings.push(Finding {
                        key: digest_key("dependencies", &format!("open:{id}:{op}:{dep}:{dep_op}")),
                        rule: Rule::Dependencies,
                        message: format!(
                            "task {id:?} is completed while {dep:?}, which it depends on, is still open"
                        ),
                        tasks: [id.to_owned(), dep.to_string()].into(),
                        values: status.into_iter().chain(dep_status).collect(),
                        repair: None,
                        changes: Vec::new(),
                    });
                }
            }
        }
        // Cycles: only a change to a task's dependencies (or a new task) can close one,
        // and any cycle it closes runs through that task. One walk from all of them,
        // each task visited once (Tarjan's strongly connected components): linear in the
        // tasks reachable from what changed, never once per task of a chain.
        let starts: Vec<&String> = merge
            .tasks
            .iter()
            .filter(|(_, d)| {
                merge.rebuilt
                    || d.fields.contains(field::BLOCKED_BY)
                    || d.fields.contains(TASK_ENTRY)
            })
            .map(|(id, _)| id)
            .collect();
        let (cycles, visited) = find_cycles(list, &starts);
        self.dependency_visits
            .set(self.dependency_visits.get() + visited);
        for cycle in cycles {
            let mut members: Vec<String> = cycle[..cycle.len() - 1].to_vec();
            members.sort();
            let ops: Vec<String> = members
                .iter()
                .filter_map(|t| written(list, t, field::BLOCKED_BY))
                .map(|w| w.op)
                .collect();
            let key = digest_key(
                "dependencies",
                &format!("cycle:{}:{}", members.join(","), ops.join(",")),
            );
            // Break at the greatest id: drop its edge to its successor in the cycle.
            let breaker = members.last().cloned().unwrap_or_default();
            let next = cycle
                .windows(2)
                .find(|w| w[0] == breaker)
                .map(|w| w[1].clone());
            let how = next.as_ref().filter(|_| fixing).map(|n| {
                format!(
                    "removed {:?} from {}.blocked_by to break the cycle",
                    clip(n, TASK_ID_BYTES_MAX),
                    clip(&breaker, TASK_ID_BYTES_MAX)
                )
            });
            if let (true, Some(n), Some(b)) = (fixing, &next, index.tasks.get(breaker.as_str())) {
                if !self.reported.contains(&key) {
                    let kept = b
                        .blocked_by
                        .iter()
                        .filter(|d| d.as_str() != n.as_str())
                        .map(SmolStr::to_string)
                        .collect();
                    repair.set(&breaker, field::BLOCKED_BY, FieldValue::List(kept));
                }
            }
            findings.push(Finding {
                key,
                rule: Rule::Dependencies,
                message: format!(
                    "dependency cycle of {} tasks: {}",
                    cycle.len() - 1,
                    cycle
                        .iter()
                        .take(VIOLATION_TASKS_MAX)
                        .map(|t| clip(t, TASK_ID_BYTES_MAX))
                        .collect::<Vec<_>>()
                        .join(" → ")
                ),
                values: members
                    .iter()
                    .take(VIOLATION_TASKS_MAX)
                    .filter_map(|t| written(list, t, field::BLOCKED_BY))
                    .collect(),
                tasks: members.into_iter().collect(),
                repair: how,
                changes: Vec::new(),
            });
        }
    }
}

/// The dependency cycles among the tasks reachable from `starts` (see
/// [`crate::model::deps::cycles`]), and how many tasks the walk visited. A task naming
/// itself is a missing dependency, not a cycle.
pub(super) fn find_cycles(list: &TodoList, starts: &[&String]) -> (Vec<Vec<String>>, usize) {
    let index = list.index();
    let deps = |id: &str| -> Vec<&str> {
        index
            .tasks
            .get(id)
            .map(|e| {
                e.blocked_by
                    .iter()
                    .filter(|d| d.as_str() != id && index.tasks.contains_key(d.as_str()))
                    .map(SmolStr::as_str)
                    .collect()
            })
            .unwrap_or_default()
    };
    crate::model::deps::cycles(starts.iter().map(|s| s.as_str()), deps)
}
