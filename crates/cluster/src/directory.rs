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
//! The values are the hub's to encode; this module moves bytes.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::StreamExt;

use crate::{Cluster, ClusterError};

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

    fn description(self) -> &'static str {
        match self {
            Bucket::Lists => "swarmtodo: the index of lists",
            Bucket::Tokens => "swarmtodo: the tokens hubs made for delegated tasks",
            Bucket::Links => "swarmtodo: the lists of delegated tasks and their tasks",
        }
    }
}

/// The buckets, as one hub uses them.
#[derive(Debug, Clone)]
pub(crate) struct Directory {
    lists: kv::Store,
    tokens: kv::Store,
    links: kv::Store,
}

impl Directory {
    /// Opens the buckets, creating those that do not exist with `replicas` copies.
    pub(crate) async fn open(
        js: &jetstream::Context,
        replicas: usize,
    ) -> Result<Directory, ClusterError> {
        Ok(Directory {
            lists: bucket(js, Bucket::Lists, replicas).await?,
            tokens: bucket(js, Bucket::Tokens, replicas).await?,
            links: bucket(js, Bucket::Links, replicas).await?,
        })
    }

    fn store(&self, bucket: Bucket) -> &kv::Store {
        match bucket {
            Bucket::Lists => &self.lists,
            Bucket::Tokens => &self.tokens,
            Bucket::Links => &self.links,
        }
    }
}

async fn bucket(
    js: &jetstream::Context,
    bucket: Bucket,
    replicas: usize,
) -> Result<kv::Store, ClusterError> {
    let name = bucket.name();
    if let Ok(kv) = js.get_key_value(name).await {
        return Ok(kv);
    }
    js.create_key_value(kv::Config {
        bucket: name.to_owned(),
        description: bucket.description().to_owned(),
        history: 1,
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| ClusterError::JetStream(format!("the bucket {name}: {e}")))
}

/// One key of a bucket watched, as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed {
    /// The key.
    pub key: String,
    /// Its value (`None`: deleted).
    pub value: Option<Bytes>,
}

/// A watch of one of the buckets: the last value of every key, then each new one.
pub struct Watched {
    bucket: Bucket,
    watch: kv::Watch,
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("bucket", &self.bucket)
            .finish()
    }
}

impl Watched {
    /// The next key written; `None` or `Err` when the watch ended (watch again: every
    /// key comes again).
    pub async fn next(&mut self) -> Option<Result<Keyed, ClusterError>> {
        let entry = self.watch.next().await?;
        Some(
            entry
                .map(|e| Keyed {
                    value: (e.operation == kv::Operation::Put).then_some(e.value),
                    key: e.key,
                })
                .map_err(|e| {
                    ClusterError::JetStream(format!(
                        "watching the bucket {}: {e}",
                        self.bucket.name()
                    ))
                }),
        )
    }
}

impl Cluster {
    /// Writes `value` at `key` in the directory's `bucket`.
    pub async fn directory_put(
        &self,
        bucket: Bucket,
        key: &str,
        value: Bytes,
    ) -> Result<(), ClusterError> {
        self.directory
            .store(bucket)
            .put(key, value)
            .await
            .map(|_| ())
            .map_err(|e| {
                ClusterError::JetStream(format!(
                    "writing {key} in the bucket {}: {e}",
                    bucket.name()
                ))
            })
    }

    /// Watches the directory's `bucket`.
    pub async fn watch(&self, bucket: Bucket) -> Result<Watched, ClusterError> {
        self.directory
            .store(bucket)
            .watch_with_history(">")
            .await
            .map(|watch| Watched { bucket, watch })
            .map_err(|e| {
                ClusterError::JetStream(format!("watching the bucket {}: {e}", bucket.name()))
            })
    }
}

/// A made token's key in [`Bucket::Tokens`]: its SHA-256 in hex.
pub fn token_key(sha256: &[u8; 32]) -> String {
    hex(sha256)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A made token's SHA-256 from its key in [`TOKENS_BUCKET`] (`None`: not one).
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
