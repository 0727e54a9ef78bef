//! A live run of a cluster (`[cluster]` in the scenario): a nats-server, a relay per hub
//! between it and the hub (cut and healed by the controller), each hub's `--nats` and
//! `--hub-id`, and an observer of its own that finds which hub holds a list, audits each
//! list's log as it grows (one authority at a time) and, at the end, replays each
//! list's log into one SQLite file for the checker.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::hub::HubCommand;
use super::nats::{nats_server_bin, NatsProcess, Relay};
use crate::outcome::{ClusterStats, LiveConfig, SimError};
use crate::scenario::ClusterSpec;
use swarmtodo_cluster::{replay_into, Cluster, ClusterConfig, Entry, Logged};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_store::persist::doc_id;
use swarmtodo_store::Db;

/// The hub id of a cluster's hub `i`: `hub-i`.
const HUB_ID_PREFIX: &str = "hub-";

/// How often the observer reads what the lists' logs took since its last read: well
/// under the time a rollup takes to come (`rollup_after_commits` commits), so that the
/// audit reads nearly every record before a rollup drops it.
const AUDIT_EVERY: Duration = Duration::from_millis(200);

/// What a live run of a cluster adds to a single hub's.
pub(super) struct ClusterRun {
    _nats: NatsProcess,
    observer: Cluster,
    audit: Arc<Mutex<Audit>>,
    auditing: tokio::task::JoinHandle<()>,
}

impl Drop for ClusterRun {
    fn drop(&mut self) {
        self.auditing.abort();
    }
}

/// The lists' logs read as they grow: one authority at a time — every commit written
/// by the hub whose fence (or, read after a rollup dropped it, snapshot) opens its
/// stretch of the log.
#[derive(Debug, Default)]
struct Audit {
    /// What it found so far: fences, records read, commits out of their stretch.
    found: ClusterStats,
    /// Per list: where the next read starts after, and which hub's stretch it is in.
    lists: BTreeMap<DocumentId, (u64, Option<String>)>,
}

/// Problems an [`Audit`] keeps: the first ones.
const AUDIT_PROBLEMS_KEPT: usize = 10;

impl Audit {
    /// Reads what the log of each of `docs` took since the last read.
    async fn read(audit: &Mutex<Audit>, observer: &Cluster, docs: &[DocumentId]) {
        for doc in docs {
            let after = match audit.lock() {
                Ok(a) => a.lists.get(doc).map_or(0, |(after, _)| *after),
                Err(_) => return,
            };
            // A read that fails (NATS busy) is made again at the next turn.
            let Ok(read) = observer.read(doc_id(doc), after).await else {
                continue;
            };
            let Ok(mut a) = audit.lock() else {
                return;
            };
            let mut writer = a.lists.get(doc).and_then(|(_, w)| w.clone());
            let (fences, problems) = audit_records(doc, &mut writer, &read.records);
            let found = &mut a.found;
            found.fences += fences;
            found.records_audited += read.records.len() as u64;
            let room = AUDIT_PROBLEMS_KEPT.saturating_sub(found.authority_problems.len());
            found
                .authority_problems
                .extend(problems.into_iter().take(room));
            a.lists.insert(*doc, (read.through, writer));
        }
    }
}

/// Audits `records`, read from list `doc`'s log after a stretch written by `writer`
/// (`None`: the log's start): the fences among them, and the commits written by another
/// hub than the one whose fence or snapshot opens their stretch. `writer` is left as the
/// last stretch's.
fn audit_records(
    doc: &DocumentId,
    writer: &mut Option<String>,
    records: &[Logged],
) -> (u64, Vec<String>) {
    let (mut fences, mut problems) = (0, Vec::new());
    for r in records {
        match &r.entry {
            Entry::Fence => {
                fences += 1;
                *writer = Some(r.hub.clone());
            }
            Entry::Snapshot(_) => *writer = Some(r.hub.clone()),
            Entry::Commit(_) if writer.as_deref() != Some(r.hub.as_str()) => {
                problems.push(format!(
                    "{doc}: record {} written by {} in the stretch of {}",
                    r.seq,
                    r.hub,
                    writer.as_deref().unwrap_or("nobody (no fence before it)")
                ));
            }
            Entry::Commit(_) => {}
        }
    }
    (fences, problems)
}

/// Terms as a list's authority that the hubs whose logs are `logs` ended, by the code
/// of the refusal that ended each ([`swarmtodo_hub::TERM_ENDED_LOG`] lines).
pub(super) fn terms_ended(logs: &[&Path]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let marker = format!("{}: ", swarmtodo_hub::TERM_ENDED_LOG);
    for log in logs {
        let Ok(text) = std::fs::read_to_string(log) else {
            continue;
        };
        for line in text.lines() {
            let Some(at) = line.find(&marker) else {
                continue;
            };
            let code: String = line[at + marker.len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            *out.entry(code).or_default() += 1;
        }
    }
    out
}

impl ClusterRun {
    /// Starts the nats-server and a relay per hub of `cmds`, whose arguments it
    /// completes, and the audit of the logs of `docs`; the relays, in the hubs' order.
    pub(super) async fn start(
        spec: &ClusterSpec,
        cfg: &LiveConfig,
        cmds: &mut [HubCommand],
        dir: &Path,
        docs: &[DocumentId],
    ) -> Result<(ClusterRun, Vec<Relay>), SimError> {
        let bin = cfg.nats_bin.clone().unwrap_or_else(nats_server_bin);
        let store = dir.join("nats");
        let nats =
            tokio::task::spawn_blocking(move || NatsProcess::start(Command::new(bin), &store, &[]))
                .await
                .map_err(|e| SimError::Setup(format!("starting nats-server: {e}")))??;
        let mut relays = Vec::new();
        for (i, cmd) in cmds.iter_mut().enumerate() {
            let relay = Relay::start(&nats.url).await?;
            cmd.extra = vec![
                "--nats".into(),
                relay.url.clone(),
                "--hub-id".into(),
                format!("{HUB_ID_PREFIX}{i}"),
            ];
            relays.push(relay);
        }
        let mut config = ClusterConfig::new(&nats.url, "sim-observer");
        config.lease_ttl = Duration::from_millis(spec.lease_ms);
        let observer = Cluster::connect(&config)
            .await
            .map_err(|e| SimError::Setup(format!("the cluster's observer: {e}")))?;
        let audit = Arc::new(Mutex::new(Audit::default()));
        let auditing = tokio::spawn({
            let (audit, observer, docs) = (audit.clone(), observer.clone(), docs.to_vec());
            async move {
                loop {
                    Audit::read(&audit, &observer, &docs).await;
                    tokio::time::sleep(AUDIT_EVERY).await;
                }
            }
        });
        Ok((
            ClusterRun {
                _nats: nats,
                observer,
                audit,
                auditing,
            },
            relays,
        ))
    }

    /// What the audit of the lists' logs found, read to their end (the terms ended are
    /// the hubs' logs' to say: [`terms_ended`]).
    pub(super) async fn audit(&self, docs: &[DocumentId]) -> ClusterStats {
        self.auditing.abort();
        Audit::read(&self.audit, &self.observer, docs).await;
        self.audit
            .lock()
            .map(|a| a.found.clone())
            .unwrap_or_default()
    }

    /// The hub (its index) that holds list `doc` now, if one does.
    pub(super) async fn holder(&self, doc: &DocumentId) -> Option<usize> {
        match self.observer.holder(doc_id(doc)).await {
            Ok(Some((hub, _))) => hub.strip_prefix(HUB_ID_PREFIX)?.parse().ok(),
            _ => None,
        }
    }

    /// Replays each list's log into a new SQLite file at `path`.
    pub(super) async fn replay_logs(
        &self,
        docs: &[DocumentId],
        path: &Path,
    ) -> Result<PathBuf, SimError> {
        let mut db = Db::open(path)?;
        for (i, doc) in docs.iter().enumerate() {
            let id = doc_id(doc);
            let read = self
                .observer
                .read(id, 0)
                .await
                .map_err(|e| SimError::Setup(format!("reading the log of list-{i}: {e}")))?;
            replay_into(&mut db, id, &format!("list-{i}"), &read.records)
                .map_err(|e| SimError::Setup(format!("replaying the log of list-{i}: {e}")))?;
        }
        Ok(path.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use swarmtodo_store::Batch;

    fn record(seq: u64, hub: &str, entry: Entry) -> Logged {
        Logged {
            seq,
            hub: hub.into(),
            lease: seq,
            entry,
            parts: None,
        }
    }

    #[test]
    fn a_commit_outside_its_writer_s_stretch_is_a_problem() {
        let doc = swarmtodo_client::list_document_id("list-0");
        let commit = || Entry::Commit(Batch::default());
        let records = [
            record(1, "hub-0", Entry::Fence),
            record(2, "hub-0", commit()),
            record(3, "hub-1", Entry::Fence),
            record(4, "hub-1", commit()),
            // hub-0 after hub-1 fenced the list: two authorities at once.
            record(5, "hub-0", commit()),
        ];
        let mut writer = None;
        let (fences, problems) = audit_records(&doc, &mut writer, &records[..4]);
        assert_eq!((fences, problems.len()), (2, 0), "{problems:?}");
        let (fences, problems) = audit_records(&doc, &mut writer, &records[4..]);
        assert_eq!(fences, 0);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("record 5 written by hub-0 in the stretch of hub-1"));
        // A log read from its start without a fence: nobody's stretch.
        let (_, problems) = audit_records(&doc, &mut None, &records[1..2]);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    #[test]
    fn ended_terms_are_counted_from_the_hubs_logs_by_code() {
        let dir = std::env::temp_dir().join(format!("swarmtodo-terms-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("hub-0.log");
        let line = |code: &str| {
            format!(
                "2026-12-07T16:00:00Z  WARN swarmtodo_hub::cluster: {}: {code} \x1b[3mdoc\x1b[0m=x\n",
                swarmtodo_hub::TERM_ENDED_LOG
            )
        };
        let text = [
            line("cluster_fenced"),
            line("cluster_lease_lost"),
            line("cluster_lease_lost"),
            "INFO list taken\n".into(),
        ]
        .concat();
        std::fs::write(&log, text).unwrap();
        let ended = terms_ended(&[log.as_path(), dir.join("absent.log").as_path()]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            ended,
            BTreeMap::from([
                ("cluster_fenced".to_owned(), 1),
                ("cluster_lease_lost".to_owned(), 2)
            ])
        );
    }
}
