//! What every hub of a cluster knows of the whole cluster beside the lists' logs: the
//! index of lists and the tokens hubs made for delegated tasks. Each is a key-value
//! bucket every hub watches from its start (the last value of every key, then each new
//! one), so that a hub answers the index and admits a made token whichever hub wrote
//! them.
//!
//! - [`LISTS_BUCKET`]: a key per list (its document id), its summary as its holder last
//!   stored it (written at most as often as a hub stores a list's summary).
//! - [`TOKENS_BUCKET`]: a key per made token (its SHA-256, in hex; never the token), who
//!   it names.
//!
//! The values are the hub's to encode; this module moves bytes.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::StreamExt;
use swarmtodo_store::DocId;

use crate::{Cluster, ClusterError};

/// The bucket of the index of lists: a key per list, its summary.
pub const LISTS_BUCKET: &str = "swarmtodo-lists";
/// The bucket of the tokens hubs made: a key per token's SHA-256, who it names.
pub const TOKENS_BUCKET: &str = "swarmtodo-tokens";

/// The two buckets, as one hub uses them.
#[derive(Debug, Clone)]
pub(crate) struct Directory {
    lists: kv::Store,
    tokens: kv::Store,
}

impl Directory {
    /// Opens the buckets, creating those that do not exist with `replicas` copies.
    pub(crate) async fn open(
        js: &jetstream::Context,
        replicas: usize,
    ) -> Result<Directory, ClusterError> {
        Ok(Directory {
            lists: bucket(js, LISTS_BUCKET, "swarmtodo: the index of lists", replicas).await?,
            tokens: bucket(
                js,
                TOKENS_BUCKET,
                "swarmtodo: the tokens hubs made for delegated tasks",
                replicas,
            )
            .await?,
        })
    }
}

async fn bucket(
    js: &jetstream::Context,
    name: &str,
    description: &str,
    replicas: usize,
) -> Result<kv::Store, ClusterError> {
    if let Ok(kv) = js.get_key_value(name).await {
        return Ok(kv);
    }
    js.create_key_value(kv::Config {
        bucket: name.to_owned(),
        description: description.to_owned(),
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
    bucket: &'static str,
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
                    ClusterError::JetStream(format!("watching the bucket {}: {e}", self.bucket))
                }),
        )
    }
}

impl Cluster {
    /// Writes list `doc`'s summary into the index of lists.
    pub async fn index_list(&self, doc: DocId, summary: Bytes) -> Result<(), ClusterError> {
        self.directory
            .lists
            .put(doc.to_string(), summary)
            .await
            .map(|_| ())
            .map_err(|e| ClusterError::JetStream(format!("indexing list {doc}: {e}")))
    }

    /// Tells every hub of a token this hub made (by its SHA-256): `made` says who it names.
    pub async fn add_token(&self, sha256: [u8; 32], made: Bytes) -> Result<(), ClusterError> {
        self.directory
            .tokens
            .put(hex(&sha256), made)
            .await
            .map(|_| ())
            .map_err(|e| ClusterError::JetStream(format!("sharing a made token: {e}")))
    }

    /// Watches the index of lists (keys: document ids).
    pub async fn watch_lists(&self) -> Result<Watched, ClusterError> {
        watch(&self.directory.lists, LISTS_BUCKET).await
    }

    /// Watches the made tokens (keys: SHA-256s in hex, [`token_sha256`]).
    pub async fn watch_tokens(&self) -> Result<Watched, ClusterError> {
        watch(&self.directory.tokens, TOKENS_BUCKET).await
    }
}

async fn watch(kv: &kv::Store, bucket: &'static str) -> Result<Watched, ClusterError> {
    kv.watch_with_history(">")
        .await
        .map(|watch| Watched { bucket, watch })
        .map_err(|e| ClusterError::JetStream(format!("watching the bucket {bucket}: {e}")))
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
        assert_eq!(token_sha256(&hex(&sha)), Some(sha));
        assert_eq!(token_sha256("ab"), None);
        assert_eq!(token_sha256(&"zz".repeat(32)), None);
        assert_eq!(token_sha256(&"é".repeat(32)), None);
    }
}
