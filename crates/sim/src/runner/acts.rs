//! What agents do in a simulated run: ordinary writes through the model, races between
//! sessions of one agent, the rogue's moves and raw (unvalidated) writes, and its bad
//! frames on side connections.

use automerge::ChangeHash;

use super::agents::in_sync;
use super::{Race, Side, Sim};
use crate::behave::{self, RawEdit, RogueMove};
use crate::net::{Dir, Event};
use crate::outcome::{Injection, SimError};
use crate::scenario::{Action, RoleSpec};
use swarmtodo_core::model::WriteContext;
use swarmtodo_proto::wire::{self, WireMessage};
use swarmtodo_proto::{Rule, WriteRequest};

impl Sim<'_> {
    pub(super) fn act(&mut self, a: usize) -> Result<(), SimError> {
        if !self.storm {
            return Ok(());
        }
        if let Some(at) = self.next_act(a) {
            self.queue.push(at, Event::Act(a))?;
        }
        if self.agents[a].lists.is_empty() {
            return Ok(());
        }
        let group = &self.scenario.agents[self.agents[a].group];
        let action = behave::pick_action(&mut self.rng, &group.mix);
        let l = self.rng.index(self.agents[a].lists.len());
        self.stats.ops += 1;
        let done = if action.is_rogue() {
            self.rogue(a, l, action)?
        } else if action == Action::RaceStart {
            self.race(a, l)?
        } else {
            match self.request(a, l, action) {
                Some(req) => {
                    self.write(a, l, &req, action);
                    true
                }
                None => false,
            }
        };
        if !done {
            self.stats.idle += 1;
        }
        self.flush(a, l)
    }

    /// The tasks of list `list` held for races the hub has not seen both starts of.
    fn held(&mut self, list: usize) -> Vec<String> {
        let (docs, acked) = (&self.docs, &self.acked);
        self.races.retain(|r| {
            let hub_has = acked.get(&docs[r.list]);
            !r.changes
                .iter()
                .all(|c| hub_has.is_some_and(|h| h.contains(c)))
        });
        self.races
            .iter()
            .filter(|r| r.list == list)
            .flat_map(|r| r.tasks.iter().cloned())
            .collect()
    }

    /// The write request for an ordinary action, if one applies.
    fn request(&mut self, a: usize, l: usize, action: Action) -> Option<WriteRequest> {
        let held = self.held(self.agents[a].lists[l].list);
        let agent = &mut self.agents[a];
        let al = &agent.lists[l];
        let writer = behave::Writer {
            name: &agent.name,
            lead: agent.role == RoleSpec::Lead,
            replica: &al.replica,
            seen: &al.seen,
            workers: &self.workers[al.list],
            next_task: &mut agent.next_task,
            session: agent.session,
            held: &held,
        };
        behave::request(&mut self.rng, writer, action)
    }

    /// A validated write through the model, as a real agent makes it. Returns the new
    /// change, if the write made one.
    pub(super) fn write(
        &mut self,
        a: usize,
        l: usize,
        req: &WriteRequest,
        action: Action,
    ) -> Option<ChangeHash> {
        let ctx = WriteContext::new(
            self.agents[a].name.clone(),
            self.epoch_ms(),
            self.rng.next_u64(),
        );
        let now = self.now;
        let al = &mut self.agents[a].lists[l];
        let outcome = match al.replica.write(req, &ctx) {
            Ok((result, _)) if result.changed => {
                self.stats.writes += 1;
                let hash = al.replica.doc().get_last_local_change().map(|c| c.hash());
                if let Some(h) = hash {
                    al.unacked.push((h, now));
                }
                hash
            }
            Ok(_) => {
                self.stats.idle += 1;
                None
            }
            Err(e) => {
                self.stats.refused_write(&e);
                None
            }
        };
        let line = format!(
            "a{a} {action:?} l{l} -> {}",
            outcome.map_or("-".to_owned(), |h| h.to_string())
        );
        self.note(line);
        outcome
    }

    // ----- races between sessions of one agent -----

    /// A `race_start` by session `a` on its list `l`: `a` and a sibling session of the
    /// same agent each start a different pending task of the agent, at the same
    /// instant, from replicas that agree (every session of the agent on the list in
    /// sync with the hub, at one version) that nothing of the agent's is in progress.
    /// Both writes are valid; their merge holds two tasks in progress for one owner, a
    /// single-active violation the hub must report exactly once. Nothing else of the
    /// agent's is in flight meanwhile, and both tasks are held (no behaviour touches
    /// them) until the hub has acknowledged both starts: nothing else decides the race.
    fn race(&mut self, a: usize, l: usize) -> Result<bool, SimError> {
        let list = self.agents[a].lists[l].list;
        let name = self.agents[a].name.clone();
        let heads = self.agents[a].lists[l].replica.heads();
        let mut siblings = Vec::new();
        for (b, other) in self.agents.iter().enumerate() {
            if other.name != name {
                continue;
            }
            let Some(ol) = other.lists.iter().position(|x| x.list == list) else {
                continue;
            };
            if !self.rogue_ready(b, ol) || other.lists[ol].replica.heads() != heads {
                return Ok(false);
            }
            if b != a {
                siblings.push((b, ol));
            }
        }
        if siblings.is_empty() {
            return Ok(false);
        }
        let held = self.held(list);
        let replica = &self.agents[a].lists[l].replica;
        let Some((mine, theirs)) = behave::race_tasks(&mut self.rng, &name, replica, &held) else {
            return Ok(false);
        };
        let (b, bl) = siblings[self.rng.index(siblings.len())];
        let Some(first) = self.write(a, l, &behave::start_request(&mine), Action::RaceStart) else {
            return Ok(false);
        };
        let second = self.write(b, bl, &behave::start_request(&theirs), Action::RaceStart);
        self.flush(b, bl)?;
        let Some(second) = second else {
            return Ok(true);
        };
        self.races.push(Race {
            list,
            tasks: [mine, theirs],
            changes: [first, second],
        });
        self.injected.push(Injection {
            rule: Rule::SingleActive,
            list,
            agent: name,
            change: first.to_string(),
            also: vec![second.to_string()],
            action: Action::RaceStart,
            at_ms: self.now,
        });
        Ok(true)
    }

    // ----- the rogue -----

    /// Ready for an injection whose report can be counted: connected, in sync (every
    /// earlier injection acknowledged and its repair received).
    fn rogue_ready(&self, a: usize, l: usize) -> bool {
        let agent = &self.agents[a];
        agent.online
            && agent.ready
            && agent.conn.is_some()
            && in_sync(&agent.client, &agent.lists[l])
    }

    fn rogue(&mut self, a: usize, l: usize, action: Action) -> Result<bool, SimError> {
        match action {
            Action::GarbageFrame | Action::InvalidSync | Action::Oversize => {
                self.bad_frame(a, l, action)?;
                return Ok(true);
            }
            _ => {}
        }
        if !self.rogue_ready(a, l) {
            return Ok(false);
        }
        let me = self.agents[a].name.clone();
        let replica = &self.agents[a].lists[l].replica;
        let (rule, change) = match behave::rogue_move(&mut self.rng, &me, replica, action) {
            RogueMove::Setup(req) => {
                self.write(a, l, &req, Action::Plan);
                return Ok(true);
            }
            RogueMove::Idle => return Ok(false),
            RogueMove::Foreign(req) => (Rule::Ownership, self.write(a, l, &req, action)),
            RogueMove::Raw { rule, ids, edit } => (rule, self.raw_write(a, l, &ids, &edit)),
        };
        let Some(change) = change else {
            return Ok(false);
        };
        let list = self.agents[a].lists[l].list;
        self.injected.push(Injection {
            rule,
            list,
            agent: me,
            change: change.to_string(),
            also: Vec::new(),
            action,
            at_ms: self.now,
        });
        Ok(true)
    }

    /// A write that bypasses the model's validation ([`behave::raw_change`]), stamped
    /// with simulated time, taken in by the rogue's replica.
    fn raw_write(
        &mut self,
        a: usize,
        l: usize,
        ids: &[String],
        edit: &RawEdit,
    ) -> Option<ChangeHash> {
        let now_ms = self.epoch_ms();
        let now = self.now;
        let agent = &mut self.agents[a];
        let al = &mut agent.lists[l];
        let change = behave::raw_change(
            &al.replica,
            &agent.raw_actor,
            &agent.name,
            now_ms,
            ids,
            edit,
        )?;
        let hash = change.hash();
        if al.replica.apply_changes(vec![change]).is_err() {
            self.stats.agent_errors += 1;
            return None;
        }
        al.unacked.push((hash, now));
        self.stats.writes += 1;
        self.note(format!("a{a} raw l{l} -> {hash}"));
        Some(hash)
    }

    /// Opens a side connection and sends one bad frame on it (reliably, so the hub's
    /// answer can be expected).
    fn bad_frame(&mut self, a: usize, l: usize, action: Action) -> Result<(), SimError> {
        if self.hub.is_none() {
            return Ok(());
        }
        self.stats.bad_frames += 1;
        let c = self.open_conn(a, true)?;
        let (frames, expect): (Vec<Vec<u8>>, &'static [u16]) = match action {
            Action::GarbageFrame => {
                let n = self.rng.range(1, 64) as usize;
                // 0xFF opens no CBOR item: never a message, whatever follows.
                let mut b = vec![0xFF];
                b.extend((0..n).map(|_| self.rng.below(256) as u8));
                (vec![b], &[1002])
            }
            Action::InvalidSync => {
                let mut data = vec![0x00];
                data.extend((0..self.rng.range(1, 64)).map(|_| self.rng.below(256) as u8));
                let sync = wire::encode(&WireMessage::Sync {
                    document_id: self.agents[a].lists[l].doc,
                    sender_id: self.peer_id(a)?,
                    target_id: self.hub_peer(a)?,
                    data,
                });
                (vec![self.join_frame(a)?, sync], &[1008])
            }
            _ => (vec![vec![0u8; wire::MESSAGE_BYTES_MAX + 1]], &[1009]),
        };
        self.sides.insert(
            c,
            Side {
                expect,
                what: action,
                got: None,
                void: false,
            },
        );
        for f in frames {
            self.send(c, Dir::ToHub, f, true)?;
        }
        Ok(())
    }
}
