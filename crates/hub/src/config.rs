//! The hub's configuration file (`swarmtodo serve --config FILE`, TOML).
//!
//! ```toml
//! listen = "127.0.0.1:7700"     # command line and SWARMTODO_LISTEN win over this
//! data = "swarmtodo.db"         # command line and SWARMTODO_DATA win over this
//! log = "info"                  # SWARMTODO_LOG wins over this
//!
//! [policy]                      # per rule: "report" or "repair"
//! schema = "repair"
//! single_active = "repair"
//! single_active_scope = "per_owner"   # or "per_list"
//! dependencies = "report"
//! ownership = "repair"
//! lease_ms = 120000             # an agent gone this long (no connection, no call) …
//! lease = "release"             # … has its tasks in progress released, or "report"
//!
//! [roles]                       # agent id → "lead" | "worker" | "observer"
//! default = "lead"
//! agents = { "sub-a" = "worker" }
//!
//! [[tokens]]                    # with tokens, every connection must carry one:
//! token = "s3cret-lead-0123456789"  # ws://host:port/?token=s3cret-lead-0123456789
//! agent = "lead"
//! role = "lead"
//! lists = { "swarm-42" = "observer" }  # per-list roles override `role`
//!
//! [limits]                      # each absent: the named constant of `hub::server`
//! join_timeout_ms = 10000       # JOIN_TIMEOUT
//! connections_per_address_max = 4096   # CONNECTIONS_PER_ADDRESS_MAX
//! connections_per_token_max = 256      # CONNECTIONS_PER_TOKEN_MAX
//! list_creations_burst = 100           # hub::core::LIST_CREATIONS_BURST
//! list_creations_per_minute = 60       # hub::core::LIST_CREATIONS_PER_MINUTE
//!
//! [cluster]                     # one of many hubs on NATS JetStream (docs/DESIGN.md §10)
//! nats = "nats://127.0.0.1:4222"   # several: comma-separated; --nats wins over this
//! hub_id = "hub-1"              # unique in the cluster; --hub-id wins; default: random
//! replicas = 1                  # 3 on a three-server NATS cluster
//! lease_ms = 5000               # the same on every hub of the cluster
//! rollup_after_commits = 1000   # cluster::LOG_ROLLUP_AFTER_COMMITS
//! ```
//!
//! A token's agent and role are vouched for by the hub: the changes a connection
//! brings count as its agent's, whatever agent id their actor registered in the list.
//!
//! Unknown keys are refused, and every error names the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use swarmtodo_core::authority::{Action, ActiveScope, Policy, Role, Roles};
use swarmtodo_core::hub::Identity;

/// Longest token accepted (bytes).
pub const TOKEN_BYTES_MAX: usize = 256;
/// Shortest token accepted (bytes): shorter ones are guessable.
pub const TOKEN_BYTES_MIN: usize = 16;

/// A configuration file, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    pub listen: Option<SocketAddr>,
    /// SQLite file.
    pub data: Option<PathBuf>,
    /// Log filter (`tracing` env-filter syntax).
    pub log: Option<String>,
    /// The authority's policy.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// Agents' roles.
    #[serde(default)]
    pub roles: RolesConfig,
    /// Access tokens; none: no authentication (loopback only).
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    /// Bounds on connections and lists.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// One of many hubs on NATS JetStream.
    #[serde(default)]
    pub cluster: ClusterConfig,
}

/// `[cluster]`: absent, the hub is alone with its store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The NATS server(s): `nats://host:port`, comma-separated.
    pub nats: Option<String>,
    /// This hub's id in the cluster (letters, digits, `-`, `_`).
    pub hub_id: Option<String>,
    /// Copies NATS keeps of the log and the leases: 1 or 3.
    pub replicas: Option<usize>,
    /// A lease's time to live, in milliseconds.
    pub lease_ms: Option<u64>,
    /// Commits a list's log takes after its last snapshot before it is rolled up.
    pub rollup_after_commits: Option<u64>,
}

impl ClusterConfig {
    /// The cluster to join, if any: `nats` (the command line's) wins over the file's,
    /// as does `hub_id`; a hub without an id gets a random one.
    pub fn resolve(
        &self,
        nats: Option<String>,
        hub_id: Option<String>,
    ) -> Option<swarmtodo_cluster::ClusterConfig> {
        let url = nats.or_else(|| self.nats.clone())?;
        let hub = hub_id
            .or_else(|| self.hub_id.clone())
            .unwrap_or_else(|| format!("hub-{}", automerge::ActorId::random().to_hex_string()));
        let mut c = swarmtodo_cluster::ClusterConfig::new(url, hub);
        if let Some(r) = self.replicas {
            c.replicas = r;
        }
        if let Some(ms) = self.lease_ms {
            c.lease_ttl = std::time::Duration::from_millis(ms);
        }
        if let Some(n) = self.rollup_after_commits {
            c.rollup_after_commits = n;
        }
        Some(c)
    }
}

/// `[limits]`: each absent key keeps its named constant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// `JOIN_TIMEOUT`, in milliseconds.
    pub join_timeout_ms: Option<u64>,
    /// `CONNECTIONS_PER_ADDRESS_MAX`.
    pub connections_per_address_max: Option<usize>,
    /// `CONNECTIONS_PER_TOKEN_MAX`.
    pub connections_per_token_max: Option<usize>,
    /// `LIST_CREATIONS_BURST`.
    pub list_creations_burst: Option<u32>,
    /// `LIST_CREATIONS_PER_MINUTE`.
    pub list_creations_per_minute: Option<u32>,
}

/// `[policy]`: per rule, `report` or `repair` (absent: the default policy's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Invalid status, priority or content.
    pub schema: Option<ActionName>,
    /// A second task in progress.
    pub single_active: Option<ActionName>,
    /// `per_owner` or `per_list`.
    pub single_active_scope: Option<ScopeName>,
    /// Missing dependency, cycle, completed before its dependency.
    pub dependencies: Option<ActionName>,
    /// A worker changing a task it does not own.
    pub ownership: Option<ActionName>,
    /// How long an agent may be gone before its lease expires (absent: no lease).
    pub lease_ms: Option<u32>,
    /// What an expired lease does to the agent's tasks in progress.
    pub lease: Option<LeaseName>,
}

/// The shortest lease a list may have, in ms.
pub const LEASE_MS_MIN: i64 = 1_000;

/// `release` or `report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseName {
    /// Back to `pending`, unowned, by a change of the hub's.
    Release,
    /// An event only.
    Report,
}

/// `report` or `repair`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionName {
    /// Emit the event only.
    Report,
    /// Emit the event and repair.
    Repair,
}

/// `per_owner` or `per_list`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeName {
    /// One task in progress per owner.
    PerOwner,
    /// One task in progress per list.
    PerList,
}

/// `lead`, `worker` or `observer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoleName {
    /// Reads and writes everything.
    Lead,
    /// Changes only tasks it owns or claims.
    Worker,
    /// Reads only.
    Observer,
}

impl From<RoleName> for Role {
    fn from(r: RoleName) -> Role {
        match r {
            RoleName::Lead => Role::Lead,
            RoleName::Worker => Role::Worker,
            RoleName::Observer => Role::Observer,
        }
    }
}

impl From<ActionName> for Action {
    fn from(a: ActionName) -> Action {
        match a {
            ActionName::Report => Action::Report,
            ActionName::Repair => Action::Repair,
        }
    }
}

/// `[roles]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolesConfig {
    /// Everyone not named (absent: lead).
    pub default: Option<RoleName>,
    /// Agent id → role.
    #[serde(default)]
    pub agents: BTreeMap<String, RoleName>,
}

/// One `[[tokens]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// The secret, sent as `?token=` in the WebSocket URL.
    pub token: String,
    /// The agent id it stands for.
    pub agent: String,
    /// Its role.
    pub role: RoleName,
    /// Its role in particular lists (list name → role), overriding `role`.
    #[serde(default)]
    pub lists: BTreeMap<String, RoleName>,
}

/// A configuration that cannot be used; the message names the file and key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not valid TOML for this schema.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        message: String,
    },
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text).map_err(|message| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses and checks configuration text.
    pub fn parse(text: &str) -> Result<Config, String> {
        let config: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut seen = std::collections::BTreeSet::new();
        for (i, t) in config.tokens.iter().enumerate() {
            if !(TOKEN_BYTES_MIN..=TOKEN_BYTES_MAX).contains(&t.token.len()) {
                return Err(format!(
                    "tokens[{i}].token: must be {TOKEN_BYTES_MIN} to {TOKEN_BYTES_MAX} bytes"
                ));
            }
            if !t
                .token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
            {
                return Err(format!(
                    "tokens[{i}].token: use letters, digits and - _ . ~ only (it goes in a URL)"
                ));
            }
            if t.agent.is_empty() {
                return Err(format!("tokens[{i}].agent: must not be empty"));
            }
            if !seen.insert(t.token.as_str()) {
                return Err(format!("tokens[{i}].token: listed twice"));
            }
        }
        let l = &config.limits;
        if l.join_timeout_ms == Some(0) {
            return Err("limits.join_timeout_ms: must be at least 1".to_owned());
        }
        if l.connections_per_address_max == Some(0) {
            return Err("limits.connections_per_address_max: must be at least 1".to_owned());
        }
        if l.list_creations_burst == Some(0) {
            return Err("limits.list_creations_burst: must be at least 1".to_owned());
        }
        if l.connections_per_token_max == Some(0) {
            return Err("limits.connections_per_token_max: must be at least 1".to_owned());
        }
        if let Some(ms) = config.policy.lease_ms {
            if i64::from(ms) < LEASE_MS_MIN {
                return Err(format!("policy.lease_ms: must be at least {LEASE_MS_MIN} (a reconnect must not cost an agent its tasks)"));
            }
        }
        Ok(config)
    }

    /// The bounds on connections.
    pub fn conn_limits(&self) -> crate::server::ConnLimits {
        let mut l = crate::server::ConnLimits::default();
        let c = &self.limits;
        if let Some(ms) = c.join_timeout_ms {
            l.join_timeout = std::time::Duration::from_millis(ms);
        }
        if let Some(n) = c.connections_per_address_max {
            l.per_address_max = n;
        }
        if let Some(n) = c.connections_per_token_max {
            l.per_token_max = n;
        }
        l
    }

    /// List creations per identity: burst and per minute.
    pub fn list_creations(&self) -> (u32, u32) {
        let c = &self.limits;
        (
            c.list_creations_burst
                .unwrap_or(swarmtodo_core::hub::LIST_CREATIONS_BURST),
            c.list_creations_per_minute
                .unwrap_or(swarmtodo_core::hub::LIST_CREATIONS_PER_MINUTE),
        )
    }

    /// The authority's policy.
    pub fn policy(&self) -> Policy {
        let mut p = Policy::default();
        let c = &self.policy;
        if let Some(a) = c.schema {
            p.schema = a.into();
        }
        if let Some(a) = c.single_active {
            p.single_active = a.into();
        }
        if let Some(s) = c.single_active_scope {
            p.single_active_scope = match s {
                ScopeName::PerOwner => ActiveScope::PerOwner,
                ScopeName::PerList => ActiveScope::PerList,
            };
        }
        if let Some(a) = c.dependencies {
            p.dependencies = a.into();
        }
        if let Some(a) = c.ownership {
            p.ownership = a.into();
        }
        p.lease_ms = c.lease_ms.map(i64::from);
        if let Some(l) = c.lease {
            p.lease = match l {
                LeaseName::Release => Action::Repair,
                LeaseName::Report => Action::Report,
            };
        }
        p
    }

    /// Agents' roles: `[roles]`, then each token's agent.
    pub fn roles(&self) -> Roles {
        let mut r = Roles::default();
        if let Some(d) = self.roles.default {
            r.default = d.into();
        }
        for (agent, role) in &self.roles.agents {
            r.by_agent.insert(agent.clone(), (*role).into());
        }
        for t in &self.tokens {
            r.by_agent.insert(t.agent.clone(), t.role.into());
        }
        r
    }

    /// Token → identity; `None` when no token is configured (open access).
    pub fn tokens(&self) -> Option<BTreeMap<String, Identity>> {
        if self.tokens.is_empty() {
            return None;
        }
        Some(
            self.tokens
                .iter()
                .map(|t| {
                    (
                        t.token.clone(),
                        Identity {
                            agent: t.agent.clone(),
                            role: t.role.into(),
                            lists: t
                                .lists
                                .iter()
                                .map(|(name, r)| {
                                    (swarmtodo_proto::wire::list_document_id(name), (*r).into())
                                })
                                .collect(),
                        },
                    )
                })
                .collect(),
        )
    }
}
