//! A live run of a cluster (`[cluster]` in the scenario): a nats-server, a relay per hub
//! between it and the hub (cut and healed by the controller), each hub's `--nats` and
//! `--hub-id`, and an observer of its own that finds which hub holds a list and, at the
//! end, replays each list's log into one SQLite file for the checker.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::hub::HubCommand;
use super::nats::{nats_server_bin, NatsProcess, Relay};
use crate::outcome::{LiveConfig, SimError};
use crate::scenario::ClusterSpec;
use swarmtodo_cluster::{replay_into, Cluster, ClusterConfig};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_store::persist::doc_id;
use swarmtodo_store::Db;

/// The hub id of a cluster's hub `i`: `hub-i`.
const HUB_ID_PREFIX: &str = "hub-";

/// What a live run of a cluster adds to a single hub's.
pub(super) struct ClusterRun {
    _nats: NatsProcess,
    observer: Cluster,
}

impl ClusterRun {
    /// Starts the nats-server and a relay per hub of `cmds`, whose arguments it
    /// completes; the relays, in the hubs' order.
    pub(super) async fn start(
        spec: &ClusterSpec,
        cfg: &LiveConfig,
        cmds: &mut [HubCommand],
        dir: &Path,
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
        Ok((
            ClusterRun {
                _nats: nats,
                observer,
            },
            relays,
        ))
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
