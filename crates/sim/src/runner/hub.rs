//! The hub side of a simulated run: the real [`HubCore`] started, crashed and restarted
//! on the run's SQLite file, its batches of input, and the simulation as the I/O
//! ([`Io`]) of the one effect driver (`swarmtodo_store::drive`), with the store's
//! planted faults.

use std::collections::BTreeSet;

use automerge::ActorId;

use super::{Sim, HUB_BUSY_MS};
use crate::net::{Dir, Event};
use crate::outcome::{Fault, SimError};
use swarmtodo_core::hub::{
    Answer, CallId, Close, Commit, Compaction, ConnId, HubConfig, HubCore, Input, Stored,
    StoredList,
};
use swarmtodo_proto::wire::DocumentId;
use swarmtodo_proto::ApiError;
use swarmtodo_proto::EventBody;
use swarmtodo_store::drive::{self, Io};
use swarmtodo_store::persist;
use swarmtodo_store::StoreError;

impl Sim<'_> {
    fn hub_config(&mut self) -> HubConfig {
        // A new actor per process start, as `Hub::open` does: a restarted hub must never
        // reuse a sequence number its crashed predecessor may have used.
        let mut c = HubConfig::new(ActorId::from(self.rng.bytes16()));
        c.policy = self.policy.clone();
        c.roles = self.roles.clone();
        c
    }

    pub(super) fn start_hub(&mut self) -> Result<(), SimError> {
        let mut core = HubCore::new(self.hub_config());
        self.known = persist::stored_sync(&self.db, &mut core)?;
        self.hub = Some(core);
        self.incarnation += 1;
        Ok(())
    }

    pub(super) fn hub_input(&mut self, input: Input) -> Result<(), SimError> {
        self.hub_inputs(vec![input])
    }

    fn hub_inputs(&mut self, inputs: Vec<Input>) -> Result<(), SimError> {
        self.hub_batch(inputs, false)
    }

    /// The hub handles `inputs` and the one driver performs its effects, with this
    /// simulation as its I/O (as the server does with its own). When the hub deferred
    /// news or events, a tick follows once nothing else is due (as a server's queue
    /// runs dry).
    pub(super) fn hub_batch(
        &mut self,
        inputs: Vec<Input>,
        more_waiting: bool,
    ) -> Result<(), SimError> {
        let now_ms = self.epoch_ms();
        let Some(mut hub) = self.hub.take() else {
            return Ok(());
        };
        let fx = hub.handle_batch_deferring(now_ms, inputs, more_waiting);
        let done = drive::run_sync(drive::perform(&mut hub, self, fx));
        let deferred = hub.deferred();
        self.hub = Some(hub);
        if let Some(e) = self.io_error.take() {
            return Err(e);
        }
        done?;
        if deferred && !self.tick_due {
            self.tick_due = true;
            self.queue.push(self.now + HUB_BUSY_MS, Event::Tick)?;
        }
        Ok(())
    }

    /// The planted faults of the store, then the store: one transaction per batch.
    fn store_commits(&mut self, commits: &[Commit], at_ms: i64) -> Result<Vec<Stored>, StoreError> {
        self.stats.commits += commits.len() as u64;
        let mut commits = commits.to_vec();
        if self.cfg.fault == Some(Fault::DoubleReport) && !self.planted {
            for commit in &mut commits {
                let first = commit
                    .events
                    .iter()
                    .find(|e| matches!(e, EventBody::Violation(_)))
                    .cloned();
                if let Some(v) = first {
                    commit.events.push(v);
                    self.planted = true;
                    break;
                }
            }
        }
        if self.cfg.fault == Some(Fault::StoreLosesLastWrite) {
            // Acknowledged now, written only when the next batch comes (its events'
            // seqs unknown: they are not pushed).
            let prev = std::mem::replace(&mut self.held, commits);
            persist::commit_all_sync(&mut self.db, &mut self.known, &prev, at_ms)?;
            return Ok(vec![Stored::Durable(Vec::new()); self.held.len()]);
        }
        let stored = persist::as_stored(persist::commit_all_sync(
            &mut self.db,
            &mut self.known,
            &commits,
            at_ms,
        )?);
        for (commit, s) in commits.iter().zip(&stored) {
            if let Stored::Durable(seqs) = s {
                self.delivery.durable(commit, seqs);
            }
        }
        Ok(stored)
    }

    pub(super) fn crash(&mut self) -> Result<(), SimError> {
        if !self.storm || self.hub.is_none() {
            return Ok(());
        }
        self.stats.hub_crashes += 1;
        self.hub = None;
        if self.cfg.fault == Some(Fault::StoreLosesLastWrite) {
            self.held.clear();
        }
        let dead: BTreeSet<ConnId> = std::mem::take(&mut self.hub_conns);
        self.queue.drop_frames(|c| dead.contains(&c));
        for c in dead {
            if let Some(side) = self.sides.get_mut(&c) {
                side.void = side.got.is_none();
            }
            let at = self.now + self.net.latency(&mut self.rng);
            let close = Close {
                code: 1006,
                reason: "hub_crashed".to_owned(),
                message: None,
            };
            self.queue.push(at, Event::Closed(c, close))?;
        }
        Ok(())
    }
}

/// The simulation as the driver's I/O: its SQLite file, its network, its fault hooks.
impl Io for Sim<'_> {
    fn now_ms(&self) -> i64 {
        self.epoch_ms()
    }

    async fn commit(&mut self, commits: &[Commit], at_ms: i64) -> Result<Vec<Stored>, StoreError> {
        self.store_commits(commits, at_ms)
    }

    /// Stored, and rebuilt at once (the simulation is one thread).
    async fn compact(&mut self, c: Compaction) -> Option<swarmtodo_core::model::Rebuilt> {
        self.stats.compactions += 1;
        if let Err(e) = self
            .db
            .compact(persist::doc_id(&c.doc), &c.snapshot, &c.heads)
        {
            self.io_error.get_or_insert(e.into());
        }
        c.rebuild
            .then(|| persist::rebuild(&c.doc, &c.snapshot))
            .flatten()
    }

    async fn load(
        &mut self,
        doc: DocumentId,
        actor: ActorId,
    ) -> Result<Option<Option<StoredList>>, StoreError> {
        persist::load_sync(&self.db, doc, actor).map(Some)
    }

    fn send(&mut self, c: ConnId, frame: Vec<u8>) -> bool {
        if let Err(e) = self.send(c, Dir::ToAgent, frame, false) {
            self.io_error.get_or_insert(e);
        }
        true
    }

    /// Events travel as a WebSocket frame does: never lost, doubled or overtaken within
    /// their connection (a lost frame ends the connection), but for the planted faults.
    fn send_events(&mut self, c: ConnId, frame: Vec<u8>) -> bool {
        let fault = self.cfg.fault;
        let times = match fault {
            Some(Fault::DropEvent) if !self.planted => 0,
            Some(Fault::DuplicateEvent) if !self.planted => 2,
            _ => 1,
        };
        if times != 1 {
            self.planted = true;
        }
        for _ in 0..times {
            if let Err(e) = self.send(c, Dir::ToAgent, frame.clone(), true) {
                self.io_error.get_or_insert(e);
            }
        }
        true
    }

    fn relay(&mut self, c: ConnId, frame: Vec<u8>) {
        if let Err(e) = self.send(c, Dir::ToAgent, frame, false) {
            self.io_error.get_or_insert(e);
        }
    }

    /// The simulated agents sync; they make no API calls, so nothing is answered.
    fn answer(&mut self, id: CallId, _answer: Result<Answer, ApiError>) {
        tracing::warn!(
            call = id.0,
            "an answer to an API call no simulated agent made"
        );
    }

    fn close(&mut self, c: ConnId, close: Close) {
        self.hub_conns.remove(&c);
        let at = self.now + self.net.latency(&mut self.rng);
        let at = self.net.after_last(c, Dir::ToAgent, at);
        if let Err(e) = self.queue.push(at, Event::Closed(c, close)) {
            self.io_error.get_or_insert(e);
        }
    }
}
