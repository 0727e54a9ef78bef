//! What each connection may still cost the hub: relayed bytes, list creations, history work.

use std::collections::BTreeMap;

use super::limits::{
    CHANGE_WORK_UNITS, CREATORS_KEPT_MAX, EPHEMERAL_BURST_BYTES, EPHEMERAL_BURST_MESSAGES,
    EPHEMERAL_BYTES_PER_SECOND, EPHEMERAL_MESSAGES_PER_SECOND,
};
use super::{Conn, ConnId, DocState, Effects, HubCore};
use crate::proto::wire::DocumentId;

/// What [`RelayBudget::take`] decides for one `ephemeral` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Within the budget: relay it.
    Pass,
    /// Over it: drop it.
    Drop,
    /// Over it by a whole burst more (in bytes or messages): the sender keeps flooding
    /// after its messages were dropped; close it (`ephemeral_rate`).
    Close,
}

/// Token buckets of relayed `ephemeral` bytes and messages, in thousandths (so that a
/// millisecond's refill is not rounded away).
#[derive(Debug)]
pub(super) struct RelayBudget {
    pub(super) milli_bytes: i64,
    pub(super) milli_messages: i64,
    pub(super) at_ms: i64,
}

impl RelayBudget {
    pub(super) fn new(now_ms: i64) -> RelayBudget {
        RelayBudget {
            milli_bytes: EPHEMERAL_BURST_BYTES * 1_000,
            milli_messages: EPHEMERAL_BURST_MESSAGES * 1_000,
            at_ms: now_ms,
        }
    }

    /// Refills for the time since the last call, then takes a message of `bytes`: it is
    /// relayed while both buckets hold enough; a dropped message is charged too (a
    /// debt time repays), and a debt past a whole burst closes the sender.
    pub(super) fn take(&mut self, now_ms: i64, bytes: usize) -> Verdict {
        let elapsed = now_ms.saturating_sub(self.at_ms).max(0);
        self.at_ms = self.at_ms.max(now_ms);
        self.milli_bytes = self
            .milli_bytes
            .saturating_add(elapsed.saturating_mul(EPHEMERAL_BYTES_PER_SECOND))
            .min(EPHEMERAL_BURST_BYTES * 1_000);
        self.milli_messages = self
            .milli_messages
            .saturating_add(elapsed.saturating_mul(EPHEMERAL_MESSAGES_PER_SECOND))
            .min(EPHEMERAL_BURST_MESSAGES * 1_000);
        let cost = i64::try_from(bytes)
            .unwrap_or(i64::MAX)
            .saturating_mul(1_000);
        let fits = self.milli_bytes >= cost && self.milli_messages >= 1_000;
        self.milli_bytes = self.milli_bytes.saturating_sub(cost);
        self.milli_messages = self.milli_messages.saturating_sub(1_000);
        if fits {
            Verdict::Pass
        } else if self.milli_bytes < -EPHEMERAL_BURST_BYTES * 1_000
            || self.milli_messages < -EPHEMERAL_BURST_MESSAGES * 1_000
        {
            Verdict::Close
        } else {
            Verdict::Drop
        }
    }
}

/// Whom a list creation is counted against (see [`LIST_CREATIONS_BURST`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Creator {
    /// A token's agent.
    Agent(String),
    /// A connection without a token, by its remote address.
    Address(std::net::IpAddr),
    /// A connection the runtime said nothing about (the simulation).
    Unknown,
}

/// A token bucket of list creations (see [`LIST_CREATIONS_BURST`]), in 1/60,000ths
/// of a creation so that a refill per millisecond is exact.
#[derive(Debug)]
pub(super) struct CreationBudget {
    pub(super) scaled: u64,
    pub(super) at_ms: i64,
}

impl CreationBudget {
    const SCALE: u64 = 60_000;

    pub(super) fn full((burst, _): (u32, u32), now_ms: i64) -> CreationBudget {
        CreationBudget {
            scaled: u64::from(burst) * Self::SCALE,
            at_ms: now_ms,
        }
    }

    pub(super) fn refill(&mut self, now_ms: i64, (burst, per_minute): (u32, u32)) -> bool {
        let elapsed = u64::try_from(now_ms.saturating_sub(self.at_ms)).unwrap_or(0);
        let cap = u64::from(burst) * Self::SCALE;
        self.scaled = self
            .scaled
            .saturating_add(elapsed.saturating_mul(u64::from(per_minute)))
            .min(cap);
        self.at_ms = self.at_ms.max(now_ms);
        self.scaled >= cap
    }

    /// Takes one creation; false when none is left.
    pub(super) fn take(&mut self, now_ms: i64, limits: (u32, u32)) -> bool {
        self.refill(now_ms, limits);
        if self.scaled < Self::SCALE {
            return false;
        }
        self.scaled -= Self::SCALE;
        true
    }
}

/// A token bucket of history work (see [`SYNC_WORK_BURST`]).
#[derive(Debug)]
pub(super) struct WorkBudget {
    pub(super) units: i64,
    pub(super) at_ms: i64,
}

impl WorkBudget {
    pub(super) fn new(now_ms: i64, (burst, _): (i64, i64)) -> WorkBudget {
        WorkBudget {
            units: burst,
            at_ms: now_ms,
        }
    }

    /// Refills for the time since the last call, then takes `cost` units if the budget
    /// is positive (it may go into debt); false when it is not.
    pub(super) fn take(&mut self, now_ms: i64, cost: i64, (burst, per_second): (i64, i64)) -> bool {
        let elapsed = now_ms.saturating_sub(self.at_ms).max(0);
        self.units = self
            .units
            .saturating_add(elapsed.saturating_mul(per_second) / 1_000)
            .min(burst);
        self.at_ms = self.at_ms.max(now_ms);
        if self.units <= 0 {
            return false;
        }
        self.units = self.units.saturating_sub(cost);
        true
    }
}

impl HubCore {
    /// Charges connection `c` for the history work its message and our answer caused
    /// (`steps` stock sync steps, each costing the list's size). False when its budget
    /// is exhausted.
    pub(super) fn charge(
        conns: &mut BTreeMap<ConnId, Conn>,
        doc: &DocState,
        c: ConnId,
        now_ms: i64,
        steps: u64,
        limits: (i64, i64),
    ) -> bool {
        if steps == 0 {
            return true;
        }
        let stats = automerge::ReadDoc::stats(doc.list.doc());
        let size = i64::try_from(stats.num_changes)
            .unwrap_or(i64::MAX)
            .saturating_mul(CHANGE_WORK_UNITS)
            .saturating_add(i64::try_from(stats.num_ops).unwrap_or(i64::MAX));
        let cost = i64::try_from(steps)
            .unwrap_or(i64::MAX)
            .saturating_mul(size);
        conns
            .get_mut(&c)
            .is_none_or(|conn| conn.work.take(now_ms, cost, limits))
    }

    pub(super) fn over_budget(&mut self, c: ConnId, doc_id: DocumentId, fx: &mut Effects) {
        tracing::warn!(conn = c.0, doc = %doc_id, "sync work budget exhausted");
        self.fail(
            c,
            1008,
            "sync_budget",
            format!(
                "this connection made the hub walk the whole list history too often (budget {} units, {}/s): keep your sync state between messages instead of starting over, or reconnect later",
                self.config.sync_work.0, self.config.sync_work.1
            ),
            fx,
        );
    }

    /// Takes one list creation from the budget of connection `c`'s identity (see
    /// [`LIST_CREATIONS_BURST`]); false when it is spent.
    pub(super) fn take_creation(&mut self, now_ms: i64, c: ConnId) -> bool {
        let creator = match self.conns.get(&c) {
            Some(Conn {
                identity: Some(who),
                ..
            }) => Creator::Agent(who.agent.clone()),
            Some(Conn {
                address: Some(a), ..
            }) => Creator::Address(*a),
            _ => Creator::Unknown,
        };
        self.take_creation_by(now_ms, creator)
    }

    /// One list creation of `creator`'s budget; false when it has none left.
    pub(super) fn take_creation_by(&mut self, now_ms: i64, creator: Creator) -> bool {
        let limits = self.config.list_creations;
        if self.creators.len() >= CREATORS_KEPT_MAX && !self.creators.contains_key(&creator) {
            self.creators.retain(|_, b| !b.refill(now_ms, limits));
        }
        self.creators
            .entry(creator)
            .or_insert_with(|| CreationBudget::full(limits, now_ms))
            .take(now_ms, limits)
    }
}
