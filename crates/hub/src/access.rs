//! Who may connect and call: the hub open to anyone who reaches its socket, or only to
//! the holders of its tokens, each acting as the token's identity (docs/DESIGN.md §7).

use std::collections::BTreeMap;

use swarmtodo_core::hub::Identity;
use tokio_tungstenite::tungstenite::http;

/// Who may connect (docs/DESIGN.md §7).
#[derive(Debug, Clone, Default)]
pub enum Access {
    /// Anyone who can reach the socket (the default: loopback only).
    #[default]
    Open,
    /// Only connections whose URL carries a known `?token=`; each acts as the token's
    /// identity.
    Tokens(BTreeMap<String, Identity>),
}

impl Access {
    /// The token and identity for a WebSocket upgrade request's URI, or the HTTP
    /// refusal.
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
                .map(|who| Some((t.to_owned(), who.clone())))
                .ok_or("unknown token: ask the hub's operator for yours"),
        }
    }
}
