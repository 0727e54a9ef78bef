//! What every hub of a cluster knows of the whole cluster beside the lists' logs: the
//! index of lists, the tokens hubs made for delegated tasks, and the links of the lists
//! made for them. Each is a key-value bucket ([`Bucket`]) every hub watches from its
//! start (the last value of every key, then each new one), so that a hub answers the
//! index, admits a made token and rolls a delegated list up whichever hub wrote them.
//!
//! - [`Bucket::Lists`] (`swarmtodo-lists`): a key per list (its document id), its summary
//!   as its holder last stored it (written at most as often as a hub stores a list's
//!   summary).
//! - [`Bucket::Tokens`] (`swarmtodo-tokens`): a key per made token (its SHA-256 in hex,
//!   [`token_key`]; never the token), who it names.
//! - [`Bucket::Links`] (`swarmtodo-links`): a key per delegated task's list (its document
//!   id), the task it rolls up into.
//!
//! The values are the hub's to encode; here they are bytes. Opening, writing and
//! watching the buckets is `nats/directory.rs`'s.

use bytes::Bytes;

/// One of the directory's buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    /// The index of lists: a key per list, its summary.
    Lists,
    /// The tokens hubs made: a key per token's SHA-256, who it names.
    Tokens,
    /// The links of delegated tasks' lists: a key per list, its task.
    Links,
}

impl Bucket {
    /// Its name in NATS.
    pub fn name(self) -> &'static str {
        match self {
            Bucket::Lists => "swarmtodo-lists",
            Bucket::Tokens => "swarmtodo-tokens",
            Bucket::Links => "swarmtodo-links",
        }
    }
}

/// One key of a bucket watched, as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed {
    /// The key.
    pub key: String,
    /// Its value (`None`: deleted).
    pub value: Option<Bytes>,
}

/// A made token's key in [`Bucket::Tokens`]: its SHA-256 in hex.
pub fn token_key(sha256: &[u8; 32]) -> String {
    hex(sha256)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A made token's SHA-256 from its key in [`Bucket::Tokens`] (`None`: not one).
pub fn token_sha256(key: &str) -> Option<[u8; 32]> {
    if key.len() != 64 || !key.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&key[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_s_key_is_its_sha256_in_hex_and_nothing_else_reads_as_one() {
        let sha = [0xab; 32];
        assert_eq!(token_sha256(&token_key(&sha)), Some(sha));
        assert_eq!(token_sha256("ab"), None);
        assert_eq!(token_sha256(&"zz".repeat(32)), None);
        assert_eq!(token_sha256(&"é".repeat(32)), None);
    }
}
