//! The materialised view of one list, kept up to date change by change.
//!
//! Reading a task from Automerge costs microseconds per field, and a diff of two versions
//! costs time proportional to the whole document, so neither may run on every merge.
//! Instead the index decodes the operations of the changes that were just applied, maps
//! each operation to the task and field it touches (by the object's place in the
//! document, which automerge keeps: `places.rs`), and re-reads only those tasks. Reads,
//! the order and the authority's lookups (in-progress tasks per owner, reverse
//! dependencies, counts) come from here.

use std::collections::{BTreeMap, BTreeSet};

use automerge::{legacy, ActorId, Automerge, Change, ObjId as ExId, ReadDoc};

use super::doc::{self, field, RawTask, SmolStr, TASK_ENTRY};
use super::places::{Places, Role};
use super::Status;
use crate::proto::Priority;

/// The statuses an entry keeps in a byte (their place here, plus one).
const STATUS_WORDS: [&str; 5] = [
    Status::ALL[0].as_str(),
    Status::ALL[1].as_str(),
    Status::ALL[2].as_str(),
    Status::ALL[3].as_str(),
    Status::ALL[4].as_str(),
];
/// The priorities an entry keeps in a byte.
const PRIORITY_WORDS: [&str; 3] = [
    Priority::ALL[0].as_str(),
    Priority::ALL[1].as_str(),
    Priority::ALL[2].as_str(),
];
/// The code of a value that is none of the words: kept in [`Entry::odd`].
const OTHER_WORD: u8 = u8::MAX;

/// A status or priority as a code: 0 absent, `i + 1` the `i`-th word, [`OTHER_WORD`]
/// anything else (returned, to keep aside).
fn word_code(value: Option<&SmolStr>, words: &[&str]) -> (u8, Option<SmolStr>) {
    let Some(v) = value else {
        return (0, None);
    };
    match words.iter().position(|w| *w == v.as_str()) {
        Some(i) => (u8::try_from(i + 1).unwrap_or(OTHER_WORD), None),
        None => (OTHER_WORD, Some(v.clone())),
    }
}

/// One task as the index keeps it: every field as stored, in few bytes. A status and a
/// priority the model knows are a byte each (any other value a foreign peer wrote sits
/// aside until the authority repairs it); its two texts share one allocation, its
/// misshapen fields are bits, its dependencies a boxed slice; its map in the document is
/// not kept ([`Index::task_obj`] looks it up). A hub holds this beside the document of
/// every list it has loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// `owner`, if present and a string.
    pub(crate) owner: Option<SmolStr>,
    /// `blocked_by` entries that are strings.
    pub(crate) blocked_by: Box<[SmolStr]>,
    /// The fractional position key.
    pub(crate) position: SmolStr,
    /// `content` then `active_form`, one after the other.
    texts: Box<str>,
    /// Where `active_form` starts in `texts`.
    split: u32,
    /// Bit 0: `content` is present; bit 1: `active_form` is.
    present: u8,
    /// Bit `i`: `field::ALL[i]` is misshapen.
    misshapen: u8,
    /// The status's code ([`word_code`] over [`STATUS_WORDS`]).
    status: u8,
    /// The priority's code ([`word_code`] over [`PRIORITY_WORDS`]).
    priority: u8,
    /// A status and a priority that are none of the words, as written.
    odd: Option<Box<[Option<SmolStr>; 2]>>,
}

impl Entry {
    fn of(raw: &RawTask) -> Entry {
        let content = raw.content.as_deref().unwrap_or_default();
        let active = raw.active_form.as_deref().unwrap_or_default();
        let mut texts = String::with_capacity(content.len() + active.len());
        texts.push_str(content);
        texts.push_str(active);
        let misshapen = field::ALL
            .iter()
            .enumerate()
            .filter(|(_, f)| raw.misshapen.contains(f))
            .fold(0u8, |bits, (i, _)| bits | 1 << i);
        let (status, odd_status) = word_code(raw.status.as_ref(), &STATUS_WORDS);
        let (priority, odd_priority) = word_code(raw.priority.as_ref(), &PRIORITY_WORDS);
        let odd = (odd_status.is_some() || odd_priority.is_some())
            .then(|| Box::new([odd_status, odd_priority]));
        Entry {
            status,
            priority,
            odd,
            owner: raw.owner.clone(),
            blocked_by: raw.blocked_by.clone().into_boxed_slice(),
            position: raw.position.clone(),
            texts: texts.into_boxed_str(),
            // Texts are bounded far below 4 GiB (TASK_TEXT_BYTES_MAX; a longer one read
            // from a foreign peer is cut by the authority's repair, not kept here whole).
            split: u32::try_from(content.len()).unwrap_or(u32::MAX),
            present: u8::from(raw.content.is_some()) | u8::from(raw.active_form.is_some()) << 1,
            misshapen,
        }
    }

    /// `status` as written.
    pub(crate) fn status(&self) -> Option<&str> {
        self.word(self.status, 0, &STATUS_WORDS)
    }

    /// `priority` as written.
    pub(crate) fn priority(&self) -> Option<&str> {
        self.word(self.priority, 1, &PRIORITY_WORDS)
    }

    fn word<'e>(&'e self, code: u8, slot: usize, words: &[&'static str]) -> Option<&'e str> {
        match code {
            0 => None,
            OTHER_WORD => self.odd.as_ref()?[slot].as_deref(),
            c => words.get(usize::from(c) - 1).copied(),
        }
    }

    /// The task as stored, whole.
    pub(crate) fn raw(&self) -> RawTask {
        let split = (self.split as usize).min(self.texts.len());
        let (content, active) = self.texts.split_at(split);
        let mut misshapen: Vec<&'static str> = field::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| self.misshapen & 1 << i != 0)
            .map(|(_, f)| *f)
            .collect();
        misshapen.sort_unstable();
        RawTask {
            content: (self.present & 1 != 0).then(|| content.into()),
            active_form: (self.present & 2 != 0).then(|| active.into()),
            status: self.status().map(SmolStr::new),
            priority: self.priority().map(SmolStr::new),
            owner: self.owner.clone(),
            blocked_by: self.blocked_by.to_vec(),
            position: self.position.clone(),
            misshapen,
        }
    }
}

/// What one applied change touched.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeInfo {
    /// The change itself (its hash, actor, message — the writer's explanation — and
    /// dependencies; and its bytes, for the store).
    pub change: Change,
    /// Tasks it touched, with the fields (`""` = the task entry itself).
    pub touched: BTreeMap<String, BTreeSet<String>>,
    /// Keys of the document's root it wrote (`tasks`, `agents`, or any other): only the
    /// list's first change and a lead may.
    pub root: BTreeSet<String>,
    /// Keys (actor ids, hex) of the `agents` map it wrote.
    pub agents: BTreeSet<String>,
}

impl ChangeInfo {
    /// Hex hash of the change.
    pub fn hash(&self) -> String {
        self.change.hash().to_string()
    }

    /// The change's actor.
    pub fn actor(&self) -> &ActorId {
        self.change.actor_id()
    }
}

/// How one task moved in a merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDelta {
    /// The task before the merge (absent: it did not exist).
    pub before: Option<RawTask>,
    /// The task after the merge (absent: it was removed).
    pub after: Option<RawTask>,
    /// Fields touched by any change of the merge.
    pub fields: BTreeSet<String>,
}

/// What a merge (or a local write) did to the list: the input of the authority.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Merge {
    /// The changes that were applied, in the order they were given.
    pub changes: Vec<ChangeInfo>,
    /// Every task touched, by id.
    pub tasks: BTreeMap<String, TaskDelta>,
    /// The list was re-indexed from scratch (its root maps were touched).
    pub rebuilt: bool,
    /// Changes that were refused and dropped: `(hex hash, why)`.
    pub rejected: Vec<(String, String)>,
}

impl Merge {
    /// True when nothing was applied.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Index {
    pub(crate) tasks_obj: Option<ExId>,
    pub(crate) agents_obj: Option<ExId>,
    pub(crate) tasks: BTreeMap<SmolStr, Entry>,
    /// Tasks whose stored status is `in_progress`, by owner (`None`: unowned).
    pub(crate) active: BTreeMap<Option<SmolStr>, BTreeSet<SmolStr>>,
    /// Reverse dependencies: task id → tasks whose `blocked_by` names it.
    pub(crate) dependents: BTreeMap<SmolStr, BTreeSet<SmolStr>>,
    /// Tasks by status as read (`Status` order: pending, in progress, completed,
    /// cancelled, blocked).
    pub(crate) counts: [u64; 5],
}

/// The slot of a stored status in [`Index::counts`].
fn count_slot(status: Option<&str>) -> usize {
    match super::normalize_status(status) {
        Status::Pending => 0,
        Status::InProgress => 1,
        Status::Completed => 2,
        Status::Cancelled => 3,
        Status::Blocked => 4,
    }
}

impl Index {
    /// Builds the index with one pass over the document (load time only).
    pub(crate) fn build(doc: &Automerge) -> Index {
        let mut index = Index {
            tasks_obj: doc::root_map(doc, doc::TASKS),
            agents_obj: doc::root_map(doc, doc::AGENTS),
            ..Index::default()
        };
        let Some(tasks) = index.tasks_obj.clone() else {
            return index;
        };
        let ids: Vec<String> = doc.keys(&tasks).collect();
        let mut entries = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(obj) = doc::task_obj(doc, &tasks, &id) {
                let raw = doc::read_task(doc, &obj);
                entries.push((SmolStr::from(id), Entry::of(&raw)));
            }
        }
        // Built in one piece from sorted entries, the tree's nodes are full; inserted
        // one by one in order, each node keeps about half of its room empty.
        for (id, e) in &entries {
            index.derive(id, e);
        }
        index.tasks = entries.into_iter().collect();
        index
    }

    /// The map of task `id` in `doc` (the winning one), if the index holds the task.
    pub(crate) fn task_obj(&self, doc: &Automerge, id: &str) -> Option<ExId> {
        if !self.tasks.contains_key(id) {
            return None;
        }
        doc::task_obj(doc, self.tasks_obj.as_ref()?, id)
    }

    /// Every task's order key, `(position, id)`, in no particular order. The list order
    /// is these keys sorted (ties broken by id); it is sorted when read rather than kept
    /// (a tree of the keys cost 50 bytes a task, a sort of 1,000 keys takes ≈40 µs).
    pub(crate) fn order_keys(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.tasks
            .iter()
            .map(|(id, e)| (e.position.as_str(), id.as_str()))
    }

    /// Task `id` whole, if the index holds it.
    pub(crate) fn full(&self, id: &str) -> Option<RawTask> {
        self.tasks.get(id).map(Entry::raw)
    }

    /// The tasks in list order, with their ids.
    pub(crate) fn ordered(&self) -> Vec<(&str, &Entry)> {
        let mut tasks: Vec<(&SmolStr, &Entry)> = self.tasks.iter().collect();
        tasks
            .sort_unstable_by(|(a_id, a), (b_id, b)| (&a.position, a_id).cmp(&(&b.position, b_id)));
        tasks.into_iter().map(|(id, e)| (id.as_str(), e)).collect()
    }

    /// Re-reads task `id` from the document and updates the derived maps. Returns the
    /// task as it was and as it is now.
    fn refresh(&mut self, doc: &Automerge, id: &str) -> (Option<RawTask>, Option<RawTask>) {
        let was = self.remove(id).map(|e| e.raw());
        let now = self
            .tasks_obj
            .as_ref()
            .and_then(|tasks| doc::task_obj(doc, tasks, id))
            .map(|obj| doc::read_task(doc, &obj));
        if let Some(raw) = &now {
            self.insert(id, Entry::of(raw));
        }
        (was, now)
    }

    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.tasks.remove(id)?;
        self.counts[count_slot(entry.status())] -= 1;
        if entry.status() == Some("in_progress") {
            if let Some(set) = self.active.get_mut(&entry.owner) {
                set.remove(id);
                if set.is_empty() {
                    self.active.remove(&entry.owner);
                }
            }
        }
        for dep in &entry.blocked_by {
            if let Some(set) = self.dependents.get_mut(dep) {
                set.remove(id);
                if set.is_empty() {
                    self.dependents.remove(dep);
                }
            }
        }
        Some(entry)
    }

    fn insert(&mut self, id: &str, entry: Entry) {
        self.derive(id, &entry);
        self.tasks.insert(id.into(), entry);
    }

    /// Counts task `id` and records it in the maps derived from its fields (its status,
    /// owner and dependencies).
    fn derive(&mut self, id: &str, raw: &Entry) {
        self.counts[count_slot(raw.status())] += 1;
        if raw.status() == Some("in_progress") {
            self.active
                .entry(raw.owner.clone())
                .or_default()
                .insert(id.into());
        }
        for dep in &raw.blocked_by {
            self.dependents
                .entry(dep.clone())
                .or_default()
                .insert(id.into());
        }
    }

    /// Folds freshly applied changes into the index and says what they touched.
    /// `changes` must all be applied to `doc` already.
    pub(crate) fn absorb(&mut self, doc: &Automerge, changes: &[Change]) -> Merge {
        let decoded: Vec<automerge::ExpandedChange> = changes.iter().map(Change::decode).collect();
        let mut rebuild = false;

        // What each change touched.
        let mut places = Places::new(doc, self.tasks_obj.as_ref(), self.agents_obj.as_ref());
        places.learn(&decoded);
        let mut infos = Vec::with_capacity(changes.len());
        let mut touched_all: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (change, ch) in changes.iter().zip(&decoded) {
            let mut touched: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            let mut root = BTreeSet::new();
            let mut agents = BTreeSet::new();
            for op in &ch.operations {
                let hit = match (places.role(&op.obj), &op.key) {
                    (None, legacy::Key::Map(k)) if matches!(op.obj, legacy::ObjectId::Root) => {
                        if k.as_str() == doc::TASKS || k.as_str() == doc::AGENTS {
                            rebuild = true;
                        }
                        root.insert(k.to_string());
                        None
                    }
                    (Some(Role::Agents), legacy::Key::Map(k)) => {
                        agents.insert(k.to_string());
                        None
                    }
                    (Some(Role::Tasks), legacy::Key::Map(k)) => {
                        Some((k.to_string(), TASK_ENTRY.to_owned()))
                    }
                    (Some(Role::Task(t)), legacy::Key::Map(k)) => {
                        Some((t.to_string(), k.to_string()))
                    }
                    (Some(Role::Field(t, f)), _) => Some((t.to_string(), f.to_string())),
                    _ => None,
                };
                if let Some((task, f)) = hit {
                    touched.entry(task).or_default().insert(f);
                }
            }
            for (t, fs) in &touched {
                touched_all
                    .entry(t.clone())
                    .or_default()
                    .extend(fs.iter().cloned());
            }
            infos.push(ChangeInfo {
                change: change.clone(),
                touched,
                root,
                agents,
            });
        }

        if rebuild {
            let mut was: BTreeMap<String, RawTask> = std::mem::take(&mut self.tasks)
                .into_iter()
                .map(|(id, e)| (id.to_string(), e.raw()))
                .collect();
            *self = Index::build(doc);
            let ids: BTreeSet<String> = was
                .keys()
                .cloned()
                .chain(self.tasks.keys().map(SmolStr::to_string))
                .collect();
            let tasks = ids
                .into_iter()
                .map(|id| {
                    let delta = TaskDelta {
                        before: was.remove(&id),
                        after: self.full(&id),
                        fields: field::ALL.iter().map(|f| (*f).to_owned()).collect(),
                    };
                    (id, delta)
                })
                .collect();
            return Merge {
                changes: infos,
                tasks,
                rebuilt: true,
                rejected: Vec::new(),
            };
        }

        let mut tasks = BTreeMap::new();
        for (id, fields) in touched_all {
            let (before, after) = self.refresh(doc, &id);
            tasks.insert(
                id,
                TaskDelta {
                    before,
                    after,
                    fields,
                },
            );
        }
        Merge {
            changes: infos,
            tasks,
            rebuilt: false,
            rejected: Vec::new(),
        }
    }
}
