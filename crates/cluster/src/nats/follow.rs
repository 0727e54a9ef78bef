//! A list read from its log by any hub, holding it or not: its events, numbered as every
//! hub numbers them, followed as the log grows; and its document.
//!
//! In a cluster the log is the list: a hub's own store holds only what it replayed while
//! it held the list. So the JSON API's event stream and a task's history, at whatever
//! hub they are asked for, read the log.
//!
//! Events are numbered by their order in the log, from the last snapshot (which carries
//! every event before it) on: the numbering [`replay_into`](crate::replay_into) gives a
//! store. A follower ([`Follow`]) reads the log after the last record it read whenever a
//! record is stored there: it is rung by an ordered consumer of the list's subject that
//! brings only the records' headers, so it learns of a record once the log holds it
//! (never of an append the log refused) and carries no payload twice. A rollup that
//! dropped records it had not read yet brings their events in its snapshot.

use std::time::Duration;

use async_nats::jetstream::consumer;
use futures_util::{FutureExt, StreamExt};
use swarmtodo_store::{DocId, Loaded, StoredEvent};

use crate::limits::{FOLLOW_POLL, FOLLOW_RETRY};
use crate::log::{document_of, number_events};
use crate::nats::log::{subject, Log};
use crate::{Cluster, ClusterError};

/// A reader of one list's events as the log takes them ([`Cluster::follow`]).
pub struct Follow {
    log: Log,
    doc: DocId,
    /// Where the next read starts after.
    through: u64,
    /// Events numbered so far.
    numbered: u64,
    /// Rings when the log stores a record of the list (none: to be made again).
    doorbell: Option<consumer::pull::Ordered>,
}

impl std::fmt::Debug for Follow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follow")
            .field("doc", &self.doc)
            .field("through", &self.through)
            .field("numbered", &self.numbered)
            .field("doorbell", &self.doorbell.is_some())
            .finish()
    }
}

impl Cluster {
    /// Follows list `doc`'s log from its start: [`Follow::next`] gives every event of the
    /// list in order, each once, numbered as every hub numbers them.
    pub async fn follow(&self, doc: DocId) -> Result<Follow, ClusterError> {
        // Rung for every record stored from now on; the first read takes what came before.
        let doorbell = ring(&self.log, doc).await?;
        Ok(Follow {
            log: self.log.clone(),
            doc,
            through: 0,
            numbered: 0,
            doorbell: Some(doorbell),
        })
    }

    /// Every event of list `doc` as its log numbers them now.
    pub async fn events(&self, doc: DocId) -> Result<Vec<StoredEvent>, ClusterError> {
        let read = self.log.read(doc, 0).await?;
        Ok(number_events(&read.records, &mut 0))
    }

    /// List `doc`'s document as its log holds it now (`None`: no change logged).
    pub async fn document(&self, doc: DocId) -> Result<Option<Loaded>, ClusterError> {
        let read = self.log.read(doc, 0).await?;
        Ok(document_of(doc, &read.records))
    }
}

impl Follow {
    /// The events numbered so far.
    pub fn numbered(&self) -> u64 {
        self.numbered
    }

    /// The events the log took since the last call (at the first, all of them), waiting
    /// up to `wait` for one when there is none yet (then: none). On `Err` (NATS failed)
    /// the follower is as it was, and may be asked again.
    pub async fn next(&mut self, wait: Duration) -> Result<Vec<StoredEvent>, ClusterError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Rings already heard are answered by this read.
            if let Some(doorbell) = &mut self.doorbell {
                while let Some(Some(rang)) = doorbell.next().now_or_never() {
                    if rang.is_err() {
                        self.doorbell = None;
                        break;
                    }
                }
            }
            let read = self.log.read(self.doc, self.through).await?;
            let mut numbered = self.numbered;
            let new = number_events(&read.records, &mut numbered);
            (self.through, self.numbered) = (read.through, numbered);
            if !new.is_empty() {
                return Ok(new);
            }
            if self.doorbell.is_none() {
                match ring(&self.log, self.doc).await {
                    Ok(doorbell) => {
                        self.doorbell = Some(doorbell);
                        // What was stored before it rings no more: read again.
                        continue;
                    }
                    Err(e) => {
                        tracing::info!(doc = %self.doc, error = %e, "no doorbell on the log: reading it every {FOLLOW_RETRY:?}")
                    }
                }
            }
            let until = deadline.min(
                tokio::time::Instant::now()
                    + if self.doorbell.is_some() {
                        FOLLOW_POLL
                    } else {
                        FOLLOW_RETRY
                    },
            );
            let rang = async {
                match &mut self.doorbell {
                    Some(doorbell) => doorbell.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                rang = rang => {
                    if !matches!(rang, Some(Ok(_))) {
                        tracing::info!(doc = %self.doc, "the log's doorbell stopped: made again");
                        self.doorbell = None;
                    }
                }
                () = tokio::time::sleep_until(until) => {
                    if until >= deadline {
                        return Ok(Vec::new());
                    }
                }
            }
        }
    }
}

/// An ordered consumer of the headers of list `doc`'s records stored from now on (a
/// free function: the follower is not shared between threads, so it is not borrowed
/// across a wait).
async fn ring(log: &Log, doc: DocId) -> Result<consumer::pull::Ordered, ClusterError> {
    let failed = |e: String| ClusterError::JetStream(format!("following the log of {doc}: {e}"));
    log.stream()
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subject(doc),
            deliver_policy: consumer::DeliverPolicy::New,
            headers_only: true,
            ..Default::default()
        })
        .await
        .map_err(|e| failed(e.to_string()))?
        .messages()
        .await
        .map_err(|e| failed(e.to_string()))
}
