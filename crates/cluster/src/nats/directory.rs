//! The directory's buckets on NATS (`directory.rs` says what they hold): opened, written,
//! watched.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::StreamExt;

use crate::directory::{Bucket, Keyed};
use crate::{Cluster, ClusterError};

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
        description: description(bucket).to_owned(),
        history: 1,
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| ClusterError::JetStream(format!("the bucket {name}: {e}")))
}

/// A watch of one of the buckets: the last value of every key, then each new one.
pub struct Watched {
    bucket: Bucket,
    watch: kv::Watch,
    /// [`Watched::is_current`].
    current: bool,
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("bucket", &self.bucket)
            .field("current", &self.current)
            .finish()
    }
}

impl Watched {
    /// True once the watch has brought the last value of every key the bucket held
    /// when it began (at once for a bucket that held none): each key it brings from then
    /// on was written since.
    pub fn is_current(&self) -> bool {
        self.current
    }

    /// The next key written; `None` or `Err` when the watch ended (watch again: every
    /// key comes again).
    pub async fn next(&mut self) -> Option<Result<Keyed, ClusterError>> {
        let entry = self.watch.next().await?;
        if entry.as_ref().is_ok_and(|e| e.seen_current) {
            self.current = true;
        }
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
        let failed = |e: String| {
            ClusterError::JetStream(format!("watching the bucket {}: {e}", bucket.name()))
        };
        let store = self.directory.store(bucket);
        // An empty bucket brings nothing to say the watch is current: it is at once.
        let held = store
            .stream
            .get_info()
            .await
            .map_err(|e| failed(e.to_string()))?
            .state
            .messages;
        store
            .watch_with_history(">")
            .await
            .map(|watch| Watched {
                bucket,
                watch,
                current: held == 0,
            })
            .map_err(|e| failed(e.to_string()))
    }
}

/// What a bucket is for, as NATS shows it.
fn description(bucket: Bucket) -> &'static str {
    match bucket {
        Bucket::Lists => "swarmtodo: the index of lists",
        Bucket::Tokens => "swarmtodo: the tokens hubs made for delegated tasks",
        Bucket::Links => "swarmtodo: the lists of delegated tasks and their tasks",
    }
}
