//! The agents' side of a simulated run: their connections (connect, drop, close), the
//! frames the hub sends them through the real client's session, the sync messages they
//! flush, their stall timers and keepalives, and the replica that drops a change
//! ([`Fault::ReplicaDropsChange`]).

use automerge::sync;

use super::{agent_peer_id, Agent, AgentList, ConnInfo, Sim};
use super::{KEEPALIVE_MS, RECONNECT_MS_MAX, STALL_CHECK_MS, STALL_MS};
use crate::behave::SEEN_VERSIONS_MAX;
use crate::net::{Dir, Event};
use crate::outcome::{Fault, SimError};
use swarmtodo_client::session::{FromHub, Session};
use swarmtodo_core::hub::{Close, ConnId, EventKinds, Input};
use swarmtodo_core::syncmsg;
use swarmtodo_proto::wire::{self, PeerId, WireMessage};

impl Sim<'_> {
    pub(super) fn schedule_connect(&mut self, a: usize) -> Result<(), SimError> {
        if self.agents[a].connecting {
            return Ok(());
        }
        self.agents[a].connecting = true;
        let at = self.now + self.rng.range(1, RECONNECT_MS_MAX);
        self.queue.push(at, Event::Connect(a))
    }

    pub(super) fn connect(&mut self, a: usize) -> Result<(), SimError> {
        self.agents[a].connecting = false;
        if !self.agents[a].online || self.agents[a].conn.is_some() {
            return Ok(());
        }
        if self.hub.is_none() {
            return self.schedule_connect(a);
        }
        let c = self.open_conn(a, false)?;
        self.stats.connects += 1;
        let agent = &mut self.agents[a];
        agent.conn = Some(c);
        agent.ready = false;
        agent.last_io = self.now;
        agent.last_rx = self.now;
        agent.progress = (0, self.now);
        // A new connection starts a new session (new sync states).
        let peer = agent_peer_id(&agent.name, agent.session)?;
        agent.client = Session::new(peer);
        let join = wire::encode(&agent.client.join());
        // The handshake is never lost, doubled or overtaken: a doubled or late `join`
        // is a protocol error the hub rightly closes for, not a fault under test.
        self.send(c, Dir::ToHub, join, true)
    }

    /// A `join` as the agent's client sends it (for a side connection).
    pub(super) fn join_frame(&self, a: usize) -> Result<Vec<u8>, SimError> {
        Ok(wire::encode(&Session::new(self.peer_id(a)?).join()))
    }

    pub(super) fn peer_id(&self, a: usize) -> Result<PeerId, SimError> {
        agent_peer_id(&self.agents[a].name, self.agents[a].session)
    }

    pub(super) fn open_conn(&mut self, a: usize, side: bool) -> Result<ConnId, SimError> {
        self.next_conn += 1;
        let c = ConnId(self.next_conn);
        self.conns.insert(c, ConnInfo { agent: a, side });
        self.hub_conns.insert(c);
        self.hub_input(Input::Connected(c))?;
        // Every other connection asks for every kind of event; the others take the
        // default (the delivery check follows each one's kinds).
        let kinds = if c.0.is_multiple_of(2) {
            EventKinds::ALL
        } else {
            EventKinds::DEFAULT
        };
        self.delivery.subscribed(c, kinds);
        self.hub_input(Input::Subscribed(c, kinds))?;
        Ok(c)
    }

    /// The agent drops its connection (partition, stall); the hub learns it later.
    pub(super) fn drop_conn(&mut self, a: usize) -> Result<(), SimError> {
        let agent = &mut self.agents[a];
        agent.ready = false;
        if let Some(c) = agent.conn.take() {
            let at = self.now + self.net.latency(&mut self.rng);
            self.queue.push(at, Event::Gone(c))?;
        }
        Ok(())
    }

    pub(super) fn closed(&mut self, c: ConnId, close: Close) -> Result<(), SimError> {
        self.net.forget(c);
        let Some(info) = self.conns.remove(&c) else {
            return Ok(());
        };
        if info.side {
            if let Some(side) = self.sides.get_mut(&c) {
                if side.got.is_none() && !side.void {
                    side.got = Some(close.code);
                }
            }
            return Ok(());
        }
        let a = info.agent;
        if self.agents[a].conn != Some(c) {
            return Ok(());
        }
        if close.code != 1006 {
            *self
                .stats
                .closes
                .entry(format!("{} {}", close.code, close.reason))
                .or_default() += 1;
        }
        self.agents[a].conn = None;
        self.agents[a].ready = false;
        self.schedule_connect(a)
    }

    pub(super) fn timer(&mut self, a: usize) -> Result<(), SimError> {
        self.queue
            .push(self.now + STALL_CHECK_MS, Event::Timer(a))?;
        let agent = &self.agents[a];
        if !agent.online || agent.conn.is_none() {
            return Ok(());
        }
        let synced = agent.ready && agent.lists.iter().all(|l| in_sync(&agent.client, l));
        let mark = progress_mark(agent);
        if mark != agent.progress.0 {
            self.agents[a].progress = (mark, self.now);
        }
        let agent = &self.agents[a];
        let quiet = self.now.saturating_sub(agent.last_io);
        let stuck = self.now.saturating_sub(agent.progress.1);
        // Silent for long, or talking without progress for long (automerge's sync
        // never resends a change it believes sent: a lost frame inside a session is
        // only recovered by a new session).
        if !synced && (quiet >= STALL_MS || stuck >= STALL_MS) {
            self.stats.stall_resets += 1;
            self.drop_conn(a)?;
            self.schedule_connect(a)?;
        } else if agent.ready && self.now.saturating_sub(agent.last_rx) >= KEEPALIVE_MS {
            self.stats.keepalives += 1;
            self.agents[a].last_rx = self.now;
            self.keepalive = true;
            for l in 0..self.agents[a].lists.len() {
                // Forget what was sent so that a message goes out, with our heads.
                let doc = self.agents[a].lists[l].doc;
                self.agents[a].client.resend(doc);
                if let Err(e) = self.flush(a, l) {
                    self.keepalive = false;
                    return Err(e);
                }
            }
            self.keepalive = false;
        }
        Ok(())
    }

    pub(super) fn agent_frame(&mut self, c: ConnId, bytes: &[u8]) -> Result<(), SimError> {
        let Some(info) = self.conns.get(&c).copied() else {
            return Ok(());
        };
        let a = info.agent;
        if info.side || self.agents[a].conn != Some(c) {
            return Ok(());
        }
        self.agents[a].last_io = self.now;
        self.agents[a].last_rx = self.now;
        let msg = match wire::decode(bytes) {
            Ok(m) => m,
            Err(_) => {
                self.stats.agent_errors += 1;
                return Ok(());
            }
        };
        let doc = match &msg {
            WireMessage::Peer { .. } => {
                if self.agents[a].client.handshake(msg).is_err() {
                    self.stats.agent_errors += 1;
                    return Ok(());
                }
                self.agents[a].ready = true;
                for l in 0..self.agents[a].lists.len() {
                    self.flush(a, l)?;
                }
                return Ok(());
            }
            WireMessage::Sync { document_id, .. } | WireMessage::Ephemeral { document_id, .. } => {
                *document_id
            }
            _ => return Ok(()),
        };
        let Some(l) = self.agents[a].lists.iter().position(|x| x.doc == doc) else {
            return Ok(());
        };
        let msg = match msg {
            WireMessage::Sync {
                document_id,
                sender_id,
                target_id,
                data,
            } if self.cfg.fault == Some(Fault::ReplicaDropsChange) && a == self.victim() => {
                let Ok(m) = syncmsg::validate(&data, &syncmsg::Limits::default()) else {
                    self.stats.agent_errors += 1;
                    return self.flush(a, l);
                };
                let data = self.drop_one_change(a, l, m.into_message()).encode();
                WireMessage::Sync {
                    document_id,
                    sender_id,
                    target_id,
                    data,
                }
            }
            other => other,
        };
        let agent = &mut self.agents[a];
        let al = &mut agent.lists[l];
        let before = al.replica.heads();
        match agent.client.receive(doc, &mut al.replica, msg) {
            Ok(FromHub::Merged(_)) => {}
            Ok(FromHub::Events(events)) => {
                self.delivery.received(c, doc, events.iter().map(|e| e.seq));
                return Ok(());
            }
            Ok(_) => return Ok(()),
            Err(_) => {
                self.stats.agent_errors += 1;
                return self.flush(a, l);
            }
        }
        if al.replica.heads() != before {
            if al.seen.len() >= SEEN_VERSIONS_MAX {
                al.seen.pop_front();
            }
            al.seen.push_back(al.replica.version());
        }
        if in_sync(&agent.client, al) {
            let acked = self.acked.entry(al.doc).or_default();
            for (h, t) in al.unacked.drain(..) {
                acked.insert(h);
                self.latencies.push(self.now - t);
            }
        }
        self.flush(a, l)
    }

    /// The replica of [`Fault::ReplicaDropsChange`]: the last agent.
    fn victim(&self) -> usize {
        self.agents.len().saturating_sub(1)
    }

    fn drop_one_change(&mut self, a: usize, l: usize, mut message: sync::Message) -> sync::Message {
        let own = self.agents[a].lists[l].replica.doc().get_actor().clone();
        let mut kept: Vec<Vec<u8>> = Vec::new();
        for chunk in message.changes.iter() {
            // A chunk is one change, or (a V2 message) a whole saved document: either
            // way it is taken apart into changes so that the one can be left out.
            let changes = match automerge::Change::from_bytes(chunk.to_vec()) {
                Ok(c) => vec![c],
                Err(_) => match automerge::Automerge::load(chunk) {
                    Ok(doc) => doc.get_changes(&[]),
                    Err(_) => {
                        kept.push(chunk.to_vec());
                        continue;
                    }
                },
            };
            for mut change in changes {
                let foreign = *change.actor_id() != own && !change.deps().is_empty();
                if self.dropped_change.is_none() && foreign {
                    self.dropped_change = Some(change.hash());
                }
                if Some(change.hash()) != self.dropped_change {
                    kept.push(change.bytes().into_owned());
                }
            }
        }
        message.changes = sync::ChunkList::from(kept);
        message
    }

    pub(super) fn flush(&mut self, a: usize, l: usize) -> Result<(), SimError> {
        let agent = &mut self.agents[a];
        let (Some(c), true, true) = (agent.conn, agent.ready, agent.online) else {
            return Ok(());
        };
        let al = &agent.lists[l];
        let Some(m) = agent.client.sync_message(al.doc, &al.replica, false) else {
            return Ok(());
        };
        agent.last_io = self.now;
        self.send(c, Dir::ToHub, wire::encode(&m), false)
    }

    /// The hub's peer id as the agent heard it (before the answer: a placeholder).
    pub(super) fn hub_peer(&self, a: usize) -> Result<PeerId, SimError> {
        match self.agents[a].client.hub() {
            Some(p) => Ok(p.clone()),
            None => PeerId::new("swarmtodo-hub").map_err(|e| SimError::Setup(e.to_string())),
        }
    }
}

/// A fingerprint of where an agent's sync stands.
fn progress_mark(agent: &Agent) -> u64 {
    let mut bytes = Vec::new();
    bytes.push(u8::from(agent.ready));
    for l in &agent.lists {
        for h in l.replica.heads() {
            bytes.extend_from_slice(&h.0);
        }
        bytes.push(0);
        let theirs = agent
            .client
            .state(l.doc)
            .and_then(|s| s.their_heads.as_ref());
        for h in theirs.into_iter().flatten() {
            bytes.extend_from_slice(&h.0);
        }
        bytes.push(1);
    }
    crate::net::fingerprint(&bytes)
}

/// The hub has acknowledged everything this replica has (and nothing waits).
pub(super) fn in_sync(client: &Session, l: &AgentList) -> bool {
    client.in_sync(l.doc, &l.replica) && l.replica.pending_changes() == 0
}
