//! Who may connect to a live run's hub, and as whom: the tokens of the configuration
//! file written for the run ([`Access`]), with the roles of the scenario's agents and
//! tokens of their own for the checker's read-back and the slow readers.

use std::collections::BTreeMap;

use crate::outcome::{LiveFault, SimError};
use crate::rng::Rng;
use crate::scenario::{RoleSpec, Scenario};
use swarmtodo_hub::config::Config;

/// Length of each token of the run's configuration: `sim-` and 16 random bytes in hex.
const TOKEN_BYTES: usize = "sim-".len() + 2 * 16;
const _: () = assert!(
    TOKEN_BYTES >= swarmtodo_hub::config::TOKEN_BYTES_MIN
        && TOKEN_BYTES <= swarmtodo_hub::config::TOKEN_BYTES_MAX,
    "tokens the hub accepts"
);
/// Mixed into the seed for the tokens' generator: the tokens draw nothing from the
/// run's own generator, so they leave the agents' choices as they were.
const TOKEN_STREAM: u64 = 0x746f_6b65_6e73_0001;
/// The checker's agent id (an observer: it only reads the lists back).
pub const CHECKER_AGENT: &str = "sim-checker";
/// The slow readers' writer's agent id: an observer, lead on the slow readers' lists.
pub const SLOW_WRITER_AGENT: &str = "slow-reader-writer";
/// The slow readers' agent id (an observer: a slow reader only asks).
pub const SLOW_READER_AGENT: &str = "slow-reader";

/// `url` with `token` as its `?token=` query.
pub(crate) fn authed(url: &str, token: &str) -> String {
    format!("{url}/?token={token}")
}

/// Who may connect to the run's hub, and as whom: the tokens of its configuration file.
#[derive(Debug, Clone)]
pub struct Access {
    /// Each agent's token, by agent id (an agent's sessions share it).
    agents: BTreeMap<String, String>,
    /// The checker's read-back.
    pub(super) checker: String,
    /// The writer beside each slow reader.
    pub(super) slow_writer: String,
    /// The slow readers.
    pub(super) slow_reader: String,
    /// The configuration, as the hub reads it (policy and roles for the checker; with
    /// [`LiveFault::HubIgnoresRoles`], as the hub should have read it).
    pub(super) config: Config,
    /// The configuration file's text.
    toml: String,
}

impl Access {
    /// Tokens for the agents of `scenario` (roles from their groups: a rogue is a
    /// worker), the checker and the slow readers, drawn from `seed`; checked by the
    /// hub's own configuration parser. With [`LiveFault::HubIgnoresRoles`] the file
    /// the hub gets makes every agent a lead, while the checker keeps the scenario's
    /// roles.
    pub fn new(
        scenario: &Scenario,
        seed: u64,
        fault: Option<LiveFault>,
    ) -> Result<Access, SimError> {
        let mut rng = Rng::new(seed ^ TOKEN_STREAM);
        let mut token = || {
            let hex: String = rng.bytes16().iter().map(|b| format!("{b:02x}")).collect();
            format!("sim-{hex}")
        };
        let mut roles: BTreeMap<String, &'static str> = BTreeMap::new();
        for (g, name, _) in scenario.agents() {
            let role = match scenario.agents[g].role {
                RoleSpec::Lead => "lead",
                RoleSpec::Worker | RoleSpec::Rogue => "worker",
                RoleSpec::Observer => "observer",
            };
            roles.insert(name, role);
        }
        for reserved in [CHECKER_AGENT, SLOW_WRITER_AGENT, SLOW_READER_AGENT] {
            if roles.contains_key(reserved) {
                return Err(SimError::Setup(format!(
                    "agent id {reserved:?} is the live runner's own: rename the group"
                )));
            }
        }
        let mut entries: Vec<TokenEntry> = Vec::new();
        let mut agents = BTreeMap::new();
        for (name, role) in &roles {
            let t = token();
            agents.insert(name.clone(), t.clone());
            entries.push(TokenEntry {
                scenario_agent: true,
                ..TokenEntry::new(t, name, role)
            });
        }
        let checker = token();
        entries.push(TokenEntry::new(checker.clone(), CHECKER_AGENT, "observer"));
        // The slow readers' writer writes only the slow readers' lists: a per-list role.
        let slow_writer = token();
        let mut writer = TokenEntry::new(slow_writer.clone(), SLOW_WRITER_AGENT, "observer");
        writer.lead_of = (0..scenario.faults.slow_readers)
            .map(|n| slow_reader_list(n as usize))
            .collect();
        entries.push(writer);
        let slow_reader = token();
        entries.push(TokenEntry::new(
            slow_reader.clone(),
            SLOW_READER_AGENT,
            "observer",
        ));
        let render = |leads: bool| -> Result<String, SimError> {
            let tokens = entries
                .iter()
                .map(|e| {
                    let mut t = toml::Table::new();
                    t.insert("token".into(), e.token.as_str().into());
                    t.insert("agent".into(), e.agent.as_str().into());
                    let role = if leads && e.scenario_agent {
                        "lead"
                    } else {
                        e.role
                    };
                    t.insert("role".into(), role.into());
                    if !e.lead_of.is_empty() {
                        let lists: toml::Table = e
                            .lead_of
                            .iter()
                            .map(|l| (l.clone(), toml::Value::from("lead")))
                            .collect();
                        t.insert("lists".into(), toml::Value::Table(lists));
                    }
                    toml::Value::Table(t)
                })
                .collect();
            let mut root = toml::Table::new();
            root.insert("tokens".into(), toml::Value::Array(tokens));
            let body = toml::to_string(&root)
                .map_err(|e| SimError::Setup(format!("the hub's configuration: {e}")))?;
            Ok(format!(
                "# Written by `swarmtodo sim --live` for scenario {:?}, seed {seed}: a token \
                 per agent,\n# with its role; the checker and the slow readers have their \
                 own.\n{body}",
                scenario.name
            ))
        };
        let parse = |text: &str| {
            Config::parse(text)
                .map_err(|e| SimError::Setup(format!("the hub's configuration: {e}")))
        };
        let honest = render(false)?;
        let config = parse(&honest)?;
        let toml = if fault == Some(LiveFault::HubIgnoresRoles) {
            let all_leads = render(true)?;
            parse(&all_leads)?;
            all_leads
        } else {
            honest
        };
        Ok(Access {
            agents,
            checker,
            slow_writer,
            slow_reader,
            config,
            toml,
        })
    }

    /// The token of agent `name` (empty for an agent the scenario does not have: the
    /// hub refuses it).
    pub(crate) fn token(&self, name: &str) -> &str {
        self.agents.get(name).map_or("", String::as_str)
    }

    /// The configuration file's text.
    pub fn toml(&self) -> &str {
        &self.toml
    }
}

/// One `[[tokens]]` entry of the run's configuration.
#[derive(Debug)]
struct TokenEntry {
    token: String,
    agent: String,
    role: &'static str,
    /// Lists on which it is a lead whatever its `role`.
    lead_of: Vec<String>,
    /// One of the scenario's agents (not the runner's own).
    scenario_agent: bool,
}

impl TokenEntry {
    fn new(token: String, agent: &str, role: &'static str) -> TokenEntry {
        TokenEntry {
            token,
            agent: agent.to_owned(),
            role,
            lead_of: Vec::new(),
            scenario_agent: false,
        }
    }
}

/// The list of slow reader `n`, which no agent syncs.
pub(super) fn slow_reader_list(n: usize) -> String {
    format!("slow-reader-{n}")
}
