//! Rule 4, ownership: who may write which task fields, and the root and `agents` map
//! the lead's alone.

use std::collections::BTreeSet;

use super::findings::{digest_key, field_name, some_of, written, Finding};
use super::policy::{Action, Role};
use super::repair::{restore_before, Repair};
use super::Authority;
use crate::model::{clip, field, Merge, SmolStr, TodoList};
use crate::proto::{Rule, AGENT_ID_BYTES_MAX, TASK_ID_BYTES_MAX};

impl Authority {
    pub(super) fn check_ownership(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        for change in &merge.changes {
            let (agent, role) = self.identity_of_change(list, change);
            if role == Role::Lead {
                continue;
            }
            let who = agent
                .as_deref()
                .map(|a| clip(a, AGENT_ID_BYTES_MAX).to_owned())
                .unwrap_or_else(|| change.actor().to_hex_string());
            for (id, fields) in &change.touched {
                let shown = clip(id, TASK_ID_BYTES_MAX);
                let delta = merge.tasks.get(id);
                let before_owner = delta
                    .and_then(|d| d.before.as_ref())
                    .and_then(|r| r.owner.clone());
                let after_owner = delta
                    .and_then(|d| d.after.as_ref())
                    .and_then(|r| r.owner.clone());
                let mine = |o: &Option<SmolStr>| o.is_none() || o.as_deref() == agent.as_deref();
                let allowed = role == Role::Worker
                    && mine(&before_owner)
                    && (!fields.contains(field::OWNER) || mine(&after_owner));
                if allowed {
                    continue;
                }
                let key = digest_key("ownership", &format!("{}:{id}", change.hash()));
                let fixing = self.policy.ownership == Action::Repair;
                if fixing && !self.reported.contains(&key) {
                    restore_before(list, change, id, fields, repair);
                }
                findings.push(Finding {
                    key,
                    rule: Rule::Ownership,
                    message: format!(
                        "{who} ({role:?}) changed task {shown:?} owned by {}",
                        before_owner
                            .as_deref()
                            .map_or("nobody", |o| clip(o, AGENT_ID_BYTES_MAX))
                    ),
                    tasks: [id.clone()].into(),
                    values: fields
                        .iter()
                        .filter_map(|f| field_name(f).and_then(|f| written(list, id, f)))
                        .collect(),
                    repair: fixing.then(|| {
                        format!(
                            "restored {shown}'s {} as they were before {who}'s change",
                            some_of(fields, fields.len())
                        )
                    }),
                    changes: Vec::new(),
                });
            }
        }
    }

    /// Rule 4 for the document's root: the root's keys and the `agents` map are the
    /// lead's. Another role's change that deletes or replaces `tasks` or `agents`, or
    /// adds a root key, is reverted: the map is written back as it was, with every
    /// write it got since (a replaced map stays in the document). An `agents` entry may
    /// be written only by its own actor and only with the agent that actor is (its
    /// token's, or the one it registered first); any other is put back.
    pub(super) fn check_root(
        &self,
        list: &TodoList,
        merge: &Merge,
        findings: &mut Vec<Finding>,
        repair: &mut Repair,
    ) {
        let own = list.doc().get_actor();
        let fixing = self.policy.ownership == Action::Repair;
        for change in &merge.changes {
            if change.root.is_empty() && change.agents.is_empty() {
                continue;
            }
            if change.actor() == own || TodoList::is_first_change(&change.change) {
                continue;
            }
            let (agent, role) = self.identity_of_change(list, change);
            if role == Role::Lead {
                continue;
            }
            let who = clip(
                &agent
                    .clone()
                    .unwrap_or_else(|| change.actor().to_hex_string()),
                AGENT_ID_BYTES_MAX,
            )
            .to_owned();
            let deps = change.change.deps();
            if !change.root.is_empty() {
                let keys = some_of(&change.root, change.root.len());
                let key = digest_key("ownership", &format!("root:{}", change.hash()));
                if fixing && !self.reported.contains(&key) {
                    for k in &change.root {
                        if let Some(v) = list.root_before(k, deps) {
                            repair.roots.entry(k.clone()).or_insert(v);
                        }
                    }
                }
                // The tasks the change made disappear (or appear), bounded by the event.
                let tasks = merge
                    .tasks
                    .iter()
                    .filter(|(_, d)| d.before != d.after)
                    .map(|(id, _)| id.clone())
                    .collect();
                findings.push(Finding {
                    key,
                    rule: Rule::Ownership,
                    message: format!(
                        "{who} ({role:?}) wrote the list's root ({keys}): only a lead may"
                    ),
                    tasks,
                    values: Vec::new(),
                    repair: fixing
                        .then(|| format!("put back {keys} as they were before {who}'s change")),
                    changes: vec![change.hash()],
                });
            }
            let mine = change.actor().to_hex_string();
            let expected = self
                .bound
                .get(change.actor())
                .map(|(a, _)| a.clone())
                .or_else(|| list.agent_at(change.actor(), deps));
            for k in &change.agents {
                let now = list.agent_of_hex(k);
                let allowed = *k == mine
                    && expected
                        .as_ref()
                        .is_none_or(|e| now.as_deref() == Some(e.as_str()));
                if allowed {
                    continue;
                }
                let key = digest_key("ownership", &format!("agents:{}:{k}", change.hash()));
                let before = list.agent_hex_at(k, deps);
                if fixing && !self.reported.contains(&key) {
                    repair.agents.entry(k.clone()).or_insert(before.clone());
                }
                findings.push(Finding {
                    key,
                    rule: Rule::Ownership,
                    message: format!(
                        "{who} ({role:?}) registered actor {} as {:?}: an agent registers only itself, as itself",
                        clip(k, 64),
                        now.as_deref().map(|a| clip(a, AGENT_ID_BYTES_MAX))
                    ),
                    tasks: BTreeSet::new(),
                    values: Vec::new(),
                    repair: fixing.then(|| {
                        format!(
                            "put back actor {}'s registration ({:?})",
                            clip(k, 64),
                            before.as_deref().map(|a| clip(a, AGENT_ID_BYTES_MAX))
                        )
                    }),
                    changes: vec![change.hash()],
                });
            }
        }
    }
}
