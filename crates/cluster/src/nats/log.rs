//! Each list's log: one JetStream stream, a subject per list, records in order.
//!
//! A record is a commit (`record.rs`), split into parts when it is larger than one
//! message may be, or a fence: the mark a new authority writes when it takes a list,
//! after which the log refuses the previous holder's appends. Every append names the
//! sequence the writer last saw on the list's subject
//! (`Nats-Expected-Last-Subject-Sequence`), so the log itself refuses a writer that
//! is not up to date — the fencing the authority's lease relies on (`tenure.rs`).
//!
//! The parts of one commit are appended one after the other, each expecting the one
//! before, so nothing can come between them but a fence: a commit whose writer died
//! half-way is cut by the next holder's fence and readers drop it. It was never
//! acknowledged, so nothing acknowledged is lost.
//!
//! A snapshot (`record::Snapshot`: the list as the log holds it) is a rollup: the
//! holder appends it like a commit, after the last record it wrote, with
//! `Nats-Rollup: sub`, and the server drops every earlier message of the list's
//! subject. The log stays as long as what happened since the last compaction, and a
//! hub taking the list reads the snapshot and what follows. A snapshot larger than one
//! message goes first, in parts, to a subject of its own in the same stream
//! (`swarmtodo.snap.<list>.<lease>.<position>`), and the rollup names it: the rollup
//! is one message, whole or absent, and parts whose rollup was refused are never read.

use async_nats::jetstream::{self, consumer, context::PublishErrorKind, stream};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::StreamExt;
use swarmtodo_store::DocId;

use crate::limits::{
    LOG_PART_BYTES_MAX, LOG_RECORD_BYTES_MAX, LOG_RECORD_PARTS_MAX, NATS_REQUEST_TIMEOUT,
    READ_BATCH_BYTES, READ_BATCH_MESSAGES, READ_CONSUMER_IDLE,
};
use crate::log::{Entry, Logged, Read};
use crate::record::Snapshot;
use crate::{record, ClusterError};

/// The stream of every list's log.
pub const LOG_STREAM: &str = "SWARMTODO_LOG";
/// The prefix of a list's subject in [`LOG_STREAM`]: `swarmtodo.log.<document id>`.
pub const LOG_SUBJECT_PREFIX: &str = "swarmtodo.log.";

/// The header saying what a record is: `commit` or `fence`.
pub const KIND: &str = "Swarmtodo-Kind";
/// The header naming the hub that wrote a record.
pub const HUB: &str = "Swarmtodo-Hub";
/// The header with the revision of the writer's lease: its fencing token.
pub const LEASE: &str = "Swarmtodo-Lease";
/// The header numbering a commit's parts: `i/n`, from 1.
pub const PART: &str = "Swarmtodo-Part";
/// The header of a snapshot kept in parts: the subject of its parts.
pub const SNAPSHOT_PARTS: &str = "Swarmtodo-Snapshot-Parts";

/// The prefix of the subjects where snapshots larger than one message are kept, in
/// parts, in [`LOG_STREAM`]: `swarmtodo.snap.<document id>.<lease>.<log position>`.
pub const SNAPSHOT_SUBJECT_PREFIX: &str = "swarmtodo.snap.";

/// The subject of list `doc`'s log.
pub fn subject(doc: DocId) -> String {
    format!("{LOG_SUBJECT_PREFIX}{doc}")
}

/// How one message is labelled.
pub(crate) struct Label<'a> {
    pub(crate) hub: &'a str,
    pub(crate) lease: u64,
}

/// The log stream of a cluster.
#[derive(Debug, Clone)]
pub(crate) struct Log {
    js: jetstream::Context,
    stream: stream::Stream,
}

impl Log {
    /// Opens the log stream, creating it with `replicas` copies if it does not exist.
    pub(crate) async fn open(js: jetstream::Context, replicas: usize) -> Result<Log, ClusterError> {
        let failed =
            |e: String| ClusterError::JetStream(format!("the log stream {LOG_STREAM}: {e}"));
        let subjects = vec![
            format!("{LOG_SUBJECT_PREFIX}*"),
            format!("{SNAPSHOT_SUBJECT_PREFIX}>"),
        ];
        let mut stream = js
            .get_or_create_stream(stream::Config {
                name: LOG_STREAM.to_owned(),
                subjects: subjects.clone(),
                storage: stream::StorageType::File,
                num_replicas: replicas,
                // Room for a part's headers beside its payload.
                max_message_size: i32::try_from(LOG_PART_BYTES_MAX + 16 * 1024).unwrap_or(i32::MAX),
                allow_direct: true,
                allow_rollup: true,
                deny_delete: true,
                ..Default::default()
            })
            .await
            .map_err(|e| failed(e.to_string()))?;
        // A log made before snapshots takes them from now on.
        let config = stream.cached_info().config.clone();
        if !config.allow_rollup || config.subjects != subjects {
            js.update_stream(stream::Config {
                allow_rollup: true,
                subjects,
                ..config
            })
            .await
            .map_err(|e| failed(e.to_string()))?;
            stream = js
                .get_stream(LOG_STREAM)
                .await
                .map_err(|e| failed(e.to_string()))?;
        }
        Ok(Log { js, stream })
    }

    /// The stream itself.
    pub(crate) fn stream(&self) -> &stream::Stream {
        &self.stream
    }

    /// The sequence of the last message on `doc`'s subject (0: none).
    pub(crate) async fn last_seq(&self, doc: DocId) -> Result<u64, ClusterError> {
        match self
            .stream
            .get_last_raw_message_by_subject(&subject(doc))
            .await
        {
            Ok(m) => Ok(m.sequence),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Err(e) => Err(ClusterError::JetStream(format!("the log of {doc}: {e}"))),
        }
    }

    /// Appends a fence after `expected`; its sequence.
    pub(crate) async fn fence(
        &self,
        doc: DocId,
        expected: u64,
        label: &Label<'_>,
    ) -> Result<u64, ClusterError> {
        let headers = headers("fence", label, None);
        self.publish(doc, expected, headers, Bytes::new()).await
    }

    /// Appends an encoded commit (`record::encode`) after `expected`, in parts if it
    /// must be; the sequence of its last part. On `Err` nothing may be assumed of the
    /// log's end: a part may have landed.
    pub(crate) async fn commit(
        &self,
        doc: DocId,
        expected: u64,
        label: &Label<'_>,
        record: Vec<u8>,
    ) -> Result<u64, ClusterError> {
        let bytes = Bytes::from(record);
        let n = bytes.len().div_ceil(LOG_PART_BYTES_MAX).max(1);
        let mut last = expected;
        for i in 0..n {
            let part = bytes
                .slice(i * LOG_PART_BYTES_MAX..((i + 1) * LOG_PART_BYTES_MAX).min(bytes.len()));
            let headers = headers("commit", label, Some((i + 1, n)));
            last = self.publish(doc, last, headers, part).await?;
        }
        Ok(last)
    }

    /// Encodes `snapshot` for a rollup by `label` after `expected`: the message's
    /// payload, or — past one message — an empty payload and the subject of the parts
    /// now keeping it. `cluster_too_large` past the limit of a record.
    pub(crate) async fn keep(
        &self,
        doc: DocId,
        expected: u64,
        label: &Label<'_>,
        snapshot: &Snapshot,
    ) -> Result<(Bytes, Option<String>), ClusterError> {
        let bytes = record::encode_snapshot(snapshot)?;
        if bytes.len() <= LOG_PART_BYTES_MAX {
            return Ok((Bytes::from(bytes), None));
        }
        // A subject of its own, named after the list, the writer's lease and where the
        // log ends: no other rollup names the same. Its parts follow one another.
        let subject = format!("{SNAPSHOT_SUBJECT_PREFIX}{doc}.{}.{expected}", label.lease);
        let bytes = Bytes::from(bytes);
        let n = bytes.len().div_ceil(LOG_PART_BYTES_MAX);
        let mut last = 0;
        for i in 0..n {
            let part = bytes
                .slice(i * LOG_PART_BYTES_MAX..((i + 1) * LOG_PART_BYTES_MAX).min(bytes.len()));
            let headers = headers("snapshot-part", label, Some((i + 1, n)));
            match self.publish_to(&subject, doc, last, headers, part).await {
                Ok(seq) => last = seq,
                Err(e) => {
                    self.forget_parts(&subject).await;
                    return Err(e);
                }
            }
        }
        Ok((Bytes::new(), Some(subject)))
    }

    /// Appends a snapshot kept by [`Log::keep`] as a rollup after `expected`: every
    /// earlier record of the list goes. Its sequence. Refused like a commit when the
    /// log moved past `expected` (`cluster_fenced`); the parts it names are then
    /// purged.
    pub(crate) async fn roll_up(
        &self,
        doc: DocId,
        expected: u64,
        label: &Label<'_>,
        (payload, parts): (Bytes, Option<String>),
    ) -> Result<u64, ClusterError> {
        let mut headers = headers("snapshot", label, None);
        headers.insert("Nats-Rollup", "sub");
        if let Some(subject) = &parts {
            headers.insert(SNAPSHOT_PARTS, subject.as_str());
        }
        let rolled = self.publish(doc, expected, headers, payload).await;
        if rolled.is_err() {
            if let Some(subject) = &parts {
                self.forget_parts(subject).await;
            }
        }
        rolled
    }

    /// Deletes the snapshot parts of list `doc` on every subject but `keep` (the parts the
    /// last snapshot names): parts whose rollup never landed, their writer gone between
    /// the parts and the rollup. Called after a fence, which refuses any rollup of a
    /// former holder. How many subjects were purged.
    pub(crate) async fn sweep_parts(
        &self,
        doc: DocId,
        keep: Option<&str>,
    ) -> Result<usize, ClusterError> {
        let failed = |e: String| {
            ClusterError::JetStream(format!("listing the snapshot parts of {doc}: {e}"))
        };
        let mut subjects = self
            .stream
            .info_with_subjects(format!("{SNAPSHOT_SUBJECT_PREFIX}{doc}.>"))
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut orphans = Vec::new();
        while let Some(subject) = subjects.next().await {
            let (subject, _) = subject.map_err(|e| failed(e.to_string()))?;
            if Some(subject.as_str()) != keep {
                orphans.push(subject);
            }
        }
        for subject in &orphans {
            self.forget_parts(subject).await;
        }
        Ok(orphans.len())
    }

    /// Deletes the parts of a snapshot that no rollup names any more.
    pub(crate) async fn forget_parts(&self, subject: &str) {
        if let Err(e) = self.stream.purge().filter(subject).await {
            tracing::info!(subject, error = %e, "a snapshot's parts stay");
        }
    }

    async fn publish(
        &self,
        doc: DocId,
        expected: u64,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<u64, ClusterError> {
        self.publish_to(&subject(doc), doc, expected, headers, payload)
            .await
    }

    /// Appends to subject `to`, after its message `expected`, a message of list `doc`.
    async fn publish_to(
        &self,
        to: &str,
        doc: DocId,
        expected: u64,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<u64, ClusterError> {
        let message = jetstream::message::PublishMessage::build()
            .payload(payload)
            .headers(headers)
            .expected_last_subject_sequence(expected);
        let refused = |e: jetstream::context::PublishError| match e.kind() {
            PublishErrorKind::WrongLastSequence => ClusterError::Fenced { doc, expected },
            _ => ClusterError::JetStream(format!("appending to the log of {doc}: {e}")),
        };
        let ack = self
            .js
            .send_publish(to.to_owned(), message)
            .await
            .map_err(refused)?
            .await
            .map_err(refused)?;
        Ok(ack.sequence)
    }

    /// Reads `doc`'s log after sequence `after`, up to its end as it is now.
    pub(crate) async fn read(&self, doc: DocId, after: u64) -> Result<Read, ClusterError> {
        let end = self.last_seq(doc).await?;
        let mut read = Read {
            through: after,
            ..Read::default()
        };
        if end <= after {
            return Ok(read);
        }
        let failed = |e: String| ClusterError::JetStream(format!("reading the log of {doc}: {e}"));
        let consumer = self
            .consumer(
                subject(doc),
                consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: after + 1,
                },
            )
            .await
            .map_err(failed)?;
        let mut parts = Parts::default();
        let mut seen = after;
        while seen < end {
            let mut batch = fetch(&consumer).await.map_err(failed)?;
            let before = seen;
            while let Some(m) = batch.next().await {
                let m = match m {
                    Ok(m) => m,
                    // The server ends a fetch whose next message would pass its bytes
                    // with a status (409 "Message Size Exceeds MaxBytes"): the next
                    // fetch goes on from there. A fetch that brought nothing is a fault.
                    Err(e) if seen > before => {
                        tracing::trace!(%doc, seen, status = %e, "fetch ended");
                        break;
                    }
                    Err(e) => return Err(failed(e.to_string())),
                };
                let seq = m.info().map_err(|e| failed(e.to_string()))?.stream_sequence;
                seen = seq;
                let headers = m.headers.clone().unwrap_or_default();
                let payload = match headers.get(SNAPSHOT_PARTS) {
                    Some(parts) => self.snapshot_parts(doc, seq, parts.as_str()).await?,
                    None => m.payload.clone(),
                };
                parts.take(seq, &headers, payload, &mut read)?;
                if seq >= end {
                    break;
                }
            }
            // The messages up to `end` are stored: a fetch that brings none is a fault.
            if seen == before {
                return Err(failed(format!(
                    "no message after {seen} within {NATS_REQUEST_TIMEOUT:?} (the log ends at {end})"
                )));
            }
        }
        self.forget_consumer(&consumer, doc).await;
        Ok(read)
    }

    /// The bytes of the snapshot that record `seq` keeps in parts on `parts`.
    async fn snapshot_parts(
        &self,
        doc: DocId,
        seq: u64,
        parts: &str,
    ) -> Result<Bytes, ClusterError> {
        let bad = |reason: String| ClusterError::CorruptRecord { seq, reason };
        if !parts.starts_with(SNAPSHOT_SUBJECT_PREFIX) {
            return Err(bad(format!("a snapshot's parts on {parts:?}")));
        }
        let failed = |e: String| {
            ClusterError::JetStream(format!(
                "reading the snapshot of {doc} (record {seq}, parts on {parts}): {e}"
            ))
        };
        let consumer = self
            .consumer(parts.to_owned(), consumer::DeliverPolicy::All)
            .await
            .map_err(failed)?;
        let mut bytes = Vec::new();
        let (mut got, mut total) = (0usize, None::<usize>);
        while total.is_none_or(|n| got < n) {
            let mut batch = fetch(&consumer).await.map_err(failed)?;
            let before = got;
            while let Some(m) = batch.next().await {
                let m = match m {
                    Ok(m) => m,
                    // As in `read`: the fetch ended at its bytes; the next goes on.
                    Err(e) if got > before => {
                        tracing::trace!(%doc, status = %e, "fetch ended");
                        break;
                    }
                    Err(e) => return Err(failed(e.to_string())),
                };
                let (i, n) = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(PART))
                    .and_then(|p| part_of(p.as_str()))
                    .ok_or_else(|| {
                        bad(format!("a part on {parts} without a valid {PART} header"))
                    })?;
                if i != got + 1 || total.is_some_and(|t| t != n) {
                    return Err(bad(format!("part {i}/{n} on {parts} after part {got}")));
                }
                if bytes.len() + m.payload.len() > LOG_RECORD_BYTES_MAX {
                    return Err(bad(format!("a snapshot past {LOG_RECORD_BYTES_MAX} bytes")));
                }
                bytes.extend_from_slice(&m.payload);
                total = Some(n);
                got = i;
                if got == n {
                    break;
                }
            }
            if got == before {
                return Err(failed(format!(
                    "no part after part {got} within {NATS_REQUEST_TIMEOUT:?}"
                )));
            }
        }
        self.forget_consumer(&consumer, doc).await;
        Ok(Bytes::from(bytes))
    }
}

impl Log {
    /// A consumer of one read of `subject` only, gone when the read is
    /// ([`Log::forget_consumer`]; or, if this hub dies first, after the server's
    /// inactivity threshold). Its fetches ([`fetch`]) are bounded in messages and bytes,
    /// so a long log of large records never floods the connection (a stream of 1 MB
    /// parts stalled a server-driven consumer).
    async fn consumer(
        &self,
        subject: String,
        deliver_policy: consumer::DeliverPolicy,
    ) -> Result<consumer::PullConsumer, String> {
        self.stream
            .create_consumer(consumer::pull::Config {
                filter_subject: subject,
                deliver_policy,
                ack_policy: consumer::AckPolicy::None,
                inactive_threshold: READ_CONSUMER_IDLE,
                memory_storage: true,
                num_replicas: 1,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())
    }

    /// Deletes a read's consumer (on failure it ends by itself, idle).
    async fn forget_consumer(&self, consumer: &consumer::PullConsumer, doc: DocId) {
        let name = consumer.cached_info().name.clone();
        if let Err(e) = self.stream.delete_consumer(&name).await {
            tracing::debug!(%doc, error = %e, "a read's consumer stays until it times out");
        }
    }
}

/// One bounded fetch of a read's consumer.
async fn fetch(consumer: &consumer::PullConsumer) -> Result<consumer::pull::Batch, String> {
    consumer
        .fetch()
        .max_messages(READ_BATCH_MESSAGES)
        .max_bytes(READ_BATCH_BYTES)
        .expires(NATS_REQUEST_TIMEOUT)
        .messages()
        .await
        .map_err(|e| e.to_string())
}

/// A part header's `i/n`, checked: 1 ≤ i ≤ n ≤ [`LOG_RECORD_PARTS_MAX`].
fn part_of(header: &str) -> Option<(usize, usize)> {
    let (i, n) = header.split_once('/')?;
    let (i, n) = (i.parse::<usize>().ok()?, n.parse::<usize>().ok()?);
    ((1..=n).contains(&i) && n <= LOG_RECORD_PARTS_MAX).then_some((i, n))
}

fn headers(kind: &str, label: &Label<'_>, part: Option<(usize, usize)>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(KIND, kind);
    h.insert(HUB, label.hub);
    h.insert(LEASE, label.lease.to_string().as_str());
    if let Some((i, n)) = part {
        h.insert(PART, format!("{i}/{n}").as_str());
    }
    h
}

/// The parts of the commit being read.
#[derive(Default)]
struct Parts {
    /// Sequence of the first part, the writer, its lease, how many parts, the bytes.
    open: Option<(u64, String, u64, usize, Vec<u8>)>,
    /// Parts read so far of the open commit.
    got: usize,
}

impl Parts {
    /// Takes message `seq` into `read`: a whole record is pushed, a part kept.
    fn take(
        &mut self,
        seq: u64,
        headers: &HeaderMap,
        payload: Bytes,
        read: &mut Read,
    ) -> Result<(), ClusterError> {
        let bad = |reason: String| ClusterError::CorruptRecord { seq, reason };
        let get = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
        let hub = get(HUB).ok_or_else(|| bad(format!("no {HUB} header")))?;
        let lease = get(LEASE)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| bad(format!("no {LEASE} header")))?;
        match get(KIND).as_deref() {
            Some("fence") => {
                self.abandon(read);
                read.records.push(Logged {
                    seq,
                    hub,
                    lease,
                    entry: Entry::Fence,
                    parts: None,
                });
                read.through = seq;
            }
            Some("snapshot") => {
                self.abandon(read);
                let snapshot = record::decode_snapshot(&payload, seq)?;
                read.records.push(Logged {
                    seq,
                    hub,
                    lease,
                    entry: Entry::Snapshot(Box::new(snapshot)),
                    parts: get(SNAPSHOT_PARTS),
                });
                read.through = seq;
            }
            Some("commit") => {
                let (i, n) = get(PART)
                    .and_then(|p| part_of(&p))
                    .ok_or_else(|| bad(format!("no valid {PART} header")))?;
                if i == 1 {
                    self.abandon(read);
                    self.open = Some((seq, hub.clone(), lease, n, Vec::new()));
                }
                let follows = matches!(&self.open,
                    Some((_, h, l, total, _)) if *h == hub && *l == lease && *total == n && self.got + 1 == i);
                if !follows {
                    // A part with no commit open: the rest of one already dropped.
                    read.abandoned_parts += 1;
                    return Ok(());
                }
                let Some((first, hub, lease, _, bytes)) = &mut self.open else {
                    return Ok(());
                };
                if bytes.len() + payload.len() > LOG_RECORD_BYTES_MAX {
                    return Err(bad(format!(
                        "a commit past {LOG_RECORD_BYTES_MAX} bytes, in {n} parts"
                    )));
                }
                bytes.extend_from_slice(&payload);
                self.got += 1;
                if self.got == n {
                    let (hub, lease, first) = (std::mem::take(hub), *lease, *first);
                    let bytes = std::mem::take(bytes);
                    self.open = None;
                    self.got = 0;
                    let batch = record::decode(&bytes, seq)?;
                    tracing::trace!(first, seq, parts = n, "commit read");
                    read.records.push(Logged {
                        seq,
                        hub,
                        lease,
                        entry: Entry::Commit(batch),
                        parts: None,
                    });
                    read.through = seq;
                }
            }
            other => return Err(bad(format!("unknown record kind {other:?}"))),
        }
        Ok(())
    }

    /// Drops the open commit: something other than its next part came.
    fn abandon(&mut self, read: &mut Read) {
        if self.open.take().is_some() {
            read.abandoned_parts += self.got;
        }
        self.got = 0;
    }
}
