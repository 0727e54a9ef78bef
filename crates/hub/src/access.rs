//! Who may connect and call: the hub open to anyone who reaches its socket, or only to
//! the holders of its tokens, each acting as the token's identity (docs/DESIGN.md §7):
//! those of the configuration, and those the hub made for the agents it delegated tasks
//! to (kept in the store by their SHA-256).

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use swarmtodo_core::authority::Role;
use swarmtodo_core::hub::Identity;
use swarmtodo_proto::wire::list_document_id;
use tokio_tungstenite::tungstenite::http;

/// Who may connect (docs/DESIGN.md §7).
#[derive(Debug, Clone, Default)]
pub enum Access {
    /// Anyone who can reach the socket (the default: loopback only).
    #[default]
    Open,
    /// Only connections whose URL carries a known `?token=`; each acts as the token's
    /// identity.
    Tokens(Tokens),
}

/// The tokens of a hub that has them.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    /// The configuration's, by token.
    configured: BTreeMap<String, Identity>,
    /// The ones the hub made, by their SHA-256 (shared by every clone: a token made
    /// is known to every connection and call from then on).
    made: Arc<RwLock<BTreeMap<[u8; 32], Identity>>>,
}

/// The identity of a token made for `agent`, handed list `list` of `parent`: a worker
/// of its list, an observer of the others (it reads its parent's).
pub(crate) fn delegated_identity(agent: &str, list: &str) -> Identity {
    Identity {
        agent: agent.to_owned(),
        role: Role::Observer,
        lists: BTreeMap::from([(list_document_id(list), Role::Worker)]),
    }
}

impl Tokens {
    /// The configuration's tokens.
    pub fn new(configured: BTreeMap<String, Identity>) -> Tokens {
        Tokens {
            configured,
            made: Arc::default(),
        }
    }

    /// The identity of `token`, if it is one.
    pub fn get(&self, token: &str) -> Option<Identity> {
        if let Some(who) = self.configured.get(token) {
            return Some(who.clone());
        }
        let made = self.made.read().unwrap_or_else(|e| e.into_inner());
        made.get(&sha256(token)).cloned()
    }

    /// Knows a token the hub made (by its SHA-256) from now on.
    pub fn add_made(&self, token_sha256: [u8; 32], who: Identity) {
        let mut made = self.made.write().unwrap_or_else(|e| e.into_inner());
        made.insert(token_sha256, who);
    }
}

/// A token's SHA-256 (what the store keeps of a token the hub made).
pub(crate) fn sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A new token: 32 random bytes from the system, as hex.
pub(crate) fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Access {
    /// The identity a WebSocket upgrade's `?token=` gives, or why it is refused; `None`
    /// on an open hub.
    pub(crate) fn admit(
        &self,
        uri: &http::Uri,
    ) -> Result<Option<(String, Identity)>, &'static str> {
        let Access::Tokens(tokens) = self else {
            return Ok(None);
        };
        let token = uri
            .query()
            .unwrap_or("")
            .split('&')
            .find_map(|kv| kv.strip_prefix("token="));
        match token {
            None => Err("this hub needs a token: connect to ws://HOST:PORT/?token=YOUR_TOKEN"),
            Some(t) => tokens
                .get(t)
                .map(|who| Some((t.to_owned(), who)))
                .ok_or("unknown token: ask the hub's operator for yours"),
        }
    }
}
