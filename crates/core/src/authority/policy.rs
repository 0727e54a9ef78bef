//! A list's policy (per rule: report or repair) and the roles of its agents.

use std::collections::BTreeMap;

/// What to do about a rule's violations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Emit the event; leave the state.
    Report,
    /// Emit the event and repair.
    Repair,
}

/// Whether "one task in progress" counts per owner or for the whole list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveScope {
    /// At most one `in_progress` per owner (unowned tasks share one bucket).
    PerOwner,
    /// At most one `in_progress` in the list.
    PerList,
}

/// A list's policy: per rule, report or repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Invalid status or priority: repair to what it means (`done` → `completed`) or
    /// the default; empty content can only be reported.
    pub schema: Action,
    /// A second `in_progress`: repair keeps the one set last (Automerge's order of the
    /// status writes) and sets the others back to `pending`.
    pub single_active: Action,
    /// Per owner or per list.
    pub single_active_scope: ActiveScope,
    /// Missing dependency, cycle, completed before its dependency: repair drops missing
    /// ids and breaks a cycle at its greatest task id; completed-before-open is reported.
    pub dependencies: Action,
    /// A worker changed a task it does not own: repair restores the fields it wrote to
    /// their values before that change.
    pub ownership: Action,
    /// How long an agent may be gone (no connection syncing the list, no API call)
    /// before its tasks in progress are dealt with by `lease`; `None`: no lease.
    pub lease_ms: Option<i64>,
    /// An agent gone past `lease_ms`: repair releases its tasks in progress (pending,
    /// unowned); report only names them.
    pub lease: Action,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            schema: Action::Repair,
            single_active: Action::Repair,
            single_active_scope: ActiveScope::PerOwner,
            dependencies: Action::Report,
            ownership: Action::Repair,
            lease_ms: None,
            lease: Action::Repair,
        }
    }
}

/// An agent's role on a list (docs/DESIGN.md §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads and writes everything.
    Lead,
    /// Changes only tasks it owns or claims.
    Worker,
    /// Reads only.
    Observer,
}

/// Roles by agent id, with a default for agents not named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roles {
    /// Named agents.
    pub by_agent: BTreeMap<String, Role>,
    /// Everyone else (and changes whose actor never said which agent it is).
    pub default: Role,
}

impl Default for Roles {
    fn default() -> Self {
        Roles {
            by_agent: BTreeMap::new(),
            default: Role::Lead,
        }
    }
}

impl Roles {
    /// The role of `agent`.
    pub fn of(&self, agent: Option<&str>) -> Role {
        agent
            .and_then(|a| self.by_agent.get(a))
            .copied()
            .unwrap_or(self.default)
    }
}
