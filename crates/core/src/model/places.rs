//! Where an operation lands in a list: the task and field of the object it names.
//!
//! The index needs, for every operation of a merge, the task (and field) it touches.
//! Automerge already keeps every object's parent and key, so nothing is copied here: the
//! objects a batch makes are learned from its `Make` operations, any other is found by a
//! walk up the document, and both are forgotten when the batch is done.

use std::collections::{HashMap, HashSet};

use automerge::{legacy, Automerge, ObjId as ExId, ObjType, Prop, ReadDoc};

use super::doc::{OpKey, SmolStr};

/// What an object of the document is, as far as the list is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Role {
    /// The root `tasks` map.
    Tasks,
    /// The root `agents` map.
    Agents,
    /// The map of one task (the entry may have lost a conflict: it is still the task).
    Task(SmolStr),
    /// An object (Text, List) holding one field of a task.
    Field(SmolStr, SmolStr),
}

/// The roles of the objects one batch of operations names, found from the document:
/// automerge keeps every object's parent and key (`ReadDoc::parents`), so the list
/// keeps no table of its own (one was 180 bytes a task) and pays a walk up the
/// document — two or three steps — once per object a merge touches.
pub(super) struct Places<'a> {
    doc: &'a Automerge,
    tasks: Option<&'a ExId>,
    agents: Option<&'a ExId>,
    known: HashMap<OpKey, Option<Role>>,
}

impl<'a> Places<'a> {
    /// For `doc`, whose root `tasks` and `agents` maps are these.
    pub(super) fn new(
        doc: &'a Automerge,
        tasks: Option<&'a ExId>,
        agents: Option<&'a ExId>,
    ) -> Self {
        Places {
            doc,
            tasks,
            agents,
            known: HashMap::new(),
        }
    }

    /// Learns the roles of the objects `changes` make from their `Make` operations, until
    /// nothing new appears (an object can be made inside another made in the same batch,
    /// in any order): a list's first sync makes thousands of task maps, and looking each
    /// up in the document costs far more than reading its role off the operation.
    pub(super) fn learn(&mut self, changes: &[automerge::ExpandedChange]) {
        let made_here: HashSet<OpKey> = changes
            .iter()
            .flat_map(|ch| {
                ch.operations
                    .iter()
                    .enumerate()
                    .filter(|(_, op)| matches!(op.action, legacy::OpType::Make(_)))
                    .map(|(i, _)| made_key(ch, i))
            })
            .collect();
        loop {
            let mut learned = false;
            for ch in changes {
                for (i, op) in ch.operations.iter().enumerate() {
                    let legacy::OpType::Make(obj_type) = op.action else {
                        continue;
                    };
                    let made = made_key(ch, i);
                    if self.known.contains_key(&made) {
                        continue;
                    }
                    // A parent made by this batch, not learned yet: next round.
                    if let legacy::ObjectId::Id(id) = &op.obj {
                        let key = op_key(id);
                        if !self.known.contains_key(&key) && made_here.contains(&key) {
                            continue;
                        }
                    }
                    let parent = self.role(&op.obj);
                    let role = match (parent, &op.key) {
                        (Some(Role::Tasks), legacy::Key::Map(k)) if obj_type == ObjType::Map => {
                            Some(Role::Task(k.as_str().into()))
                        }
                        (Some(Role::Task(t)), legacy::Key::Map(k)) => {
                            Some(Role::Field(t, k.as_str().into()))
                        }
                        (Some(Role::Field(t, f)), _) => Some(Role::Field(t, f)),
                        _ => None,
                    };
                    self.known.insert(made, role);
                    learned = true;
                }
            }
            if !learned {
                break;
            }
        }
    }

    /// The role of the object an operation names (`None`: the root, or an object
    /// outside the list's two maps).
    pub(super) fn role(&mut self, obj: &legacy::ObjectId) -> Option<Role> {
        let legacy::ObjectId::Id(op) = obj else {
            return None;
        };
        let key = op_key(op);
        if let Some(role) = self.known.get(&key) {
            return role.clone();
        }
        // The actor's index in the document is not known here: automerge looks the
        // actor up when the index it is given does not match.
        let exid = ExId::Id(key.counter, key.actor.clone(), usize::MAX);
        let role = self.find(&exid);
        self.known.insert(key, role.clone());
        role
    }

    fn find(&self, obj: &ExId) -> Option<Role> {
        if Some(obj) == self.tasks {
            return Some(Role::Tasks);
        }
        if Some(obj) == self.agents {
            return Some(Role::Agents);
        }
        let tasks = self.tasks?;
        // From the object up: `(parent, the object's key in it)`, its type.
        let mut path: Vec<(ExId, Prop, ObjType)> = Vec::new();
        for parent in self.doc.parents(obj).ok()? {
            path.push((parent.obj, parent.prop, parent.typ));
        }
        // From the root down: the `tasks` map, the task's map, the field.
        path.reverse();
        let (under_tasks, Prop::Map(id), _) = path.get(1)? else {
            return None;
        };
        if under_tasks != tasks {
            return None;
        }
        match path.get(2) {
            // The object is under `tasks` itself: a task if it is a map.
            None => (self.doc.object_type(obj).ok()? == ObjType::Map)
                .then(|| Role::Task(id.as_str().into())),
            Some((_, Prop::Map(f), ObjType::Map)) => {
                Some(Role::Field(id.as_str().into(), f.as_str().into()))
            }
            Some(_) => None,
        }
    }
}

/// The object the `i`-th operation of `ch` makes (its id: the change's first counter
/// plus `i`, the change's actor).
fn made_key(ch: &automerge::ExpandedChange, i: usize) -> OpKey {
    OpKey {
        counter: u64::from(ch.start_op) + i as u64,
        actor: ch.actor_id.clone(),
    }
}

/// An operation id of a decoded change as a key.
fn op_key(id: &legacy::OpId) -> OpKey {
    OpKey {
        counter: id.counter(),
        actor: id.actor().clone(),
    }
}
