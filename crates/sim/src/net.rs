//! The simulated network and the event queue of simulated time.
//!
//! Time is a `u64` of simulated milliseconds; nothing reads a clock. Events are ordered
//! by `(time, sequence number)`, the sequence number being the order they were
//! scheduled in, so two events at one instant always run in the same order.
//!
//! A frame between an agent and the hub takes a latency drawn from the scenario's
//! range and arrives after every earlier frame of the same direction of the same
//! connection (FIFO, like a WebSocket), unless the storm's faults apply: then it may be
//! lost, arrive twice, or be held back so that later frames overtake it.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use super::rng::Rng;
use super::scenario::NetworkSpec;
use swarmtodo_core::hub::{Close, ConnId};

/// Longest extra hold of a frame picked for reordering, in simulated milliseconds.
pub const REORDER_HOLD_MS_MAX: u64 = 200;
/// Most events waiting in the queue; past it the run stops with an error (a scenario
/// far beyond what the simulator is for, or a feedback loop in the runner).
pub const QUEUE_EVENTS_MAX: usize = 4_000_000;

/// Which way a frame travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dir {
    /// Agent to hub.
    ToHub,
    /// Hub to agent.
    ToAgent,
}

/// Something that happens at a simulated instant.
#[derive(Debug)]
pub enum Event {
    /// An agent's next action.
    Act(usize),
    /// An agent checks its connection (stalled sync, reconnect).
    Timer(usize),
    /// An agent tries to connect.
    Connect(usize),
    /// A frame arrives.
    Frame(ConnId, Dir, Vec<u8>),
    /// The hub closed the connection; the agent learns it now.
    Closed(ConnId, Close),
    /// The agent's side of the connection is gone; the hub learns it now.
    Gone(ConnId),
    /// The hub process is killed.
    Crash,
    /// The hub process starts again from its store.
    Restart,
    /// These agents lose the network.
    PartitionStart(Vec<usize>),
    /// These agents get it back.
    PartitionEnd(Vec<usize>),
    /// The storm ends: faults stop, agents stop acting, the run waits for quiescence.
    StormEnd,
    /// Measure divergence (for the convergence picture) and look for quiescence.
    Sample,
    /// The hub's queue ran dry: it sends what it deferred.
    Tick,
}

impl Event {
    /// A frame or a close on its way: the network is not quiet while one is.
    pub fn in_flight(&self) -> bool {
        matches!(self, Event::Frame(..) | Event::Closed(..) | Event::Gone(..))
    }

    /// A short, deterministic description for the trace.
    pub fn describe(&self) -> String {
        match self {
            Event::Act(a) => format!("act a{a}"),
            Event::Timer(a) => format!("timer a{a}"),
            Event::Connect(a) => format!("connect a{a}"),
            Event::Frame(c, d, bytes) => {
                format!(
                    "frame c{} {d:?} {}B #{:016x}",
                    c.0,
                    bytes.len(),
                    fingerprint(bytes)
                )
            }
            Event::Closed(c, close) => format!("closed c{} {} {}", c.0, close.code, close.reason),
            Event::Gone(c) => format!("gone c{}", c.0),
            Event::Crash => "crash".to_owned(),
            Event::Restart => "restart".to_owned(),
            Event::PartitionStart(a) => format!("partition {a:?}"),
            Event::PartitionEnd(a) => format!("heal {a:?}"),
            Event::StormEnd => "storm end".to_owned(),
            Event::Sample => "sample".to_owned(),
            Event::Tick => "tick".to_owned(),
        }
    }
}

/// The trace's fingerprint of a frame: FNV-1a's xor-multiply over little-endian 64-bit
/// words in four independent lanes (each step rotated, so that high bits reach low
/// ones), folded with the length at the end. Byte by byte, FNV-1a is a chain of one
/// multiplication per byte: with the rogue agent's oversize frames (a mebibyte each) it
/// was 29 % of a `rogue-agent` run, and the run took 38 % less time with this one.
/// Deterministic on every platform (a fixed byte order, no per-process seed), as the
/// trace digest needs.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    const LANES: usize = 4;
    let mut lanes: [u64; LANES] = [
        0xcbf2_9ce4_8422_2325,
        0x8422_2325_cbf2_9ce4,
        0x9ce4_8422_2325_cbf2,
        0x2325_cbf2_9ce4_8422,
    ];
    let mut blocks = bytes.chunks_exact(8 * LANES);
    for block in blocks.by_ref() {
        for (lane, word) in lanes.iter_mut().zip(block.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            let w = u64::from_le_bytes(w);
            *lane = (*lane ^ w).wrapping_mul(PRIME).rotate_left(29);
        }
    }
    let mut h = lanes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, l| {
        (h ^ l).wrapping_mul(PRIME).rotate_left(29)
    });
    for b in blocks.remainder() {
        h = (h ^ u64::from(*b)).wrapping_mul(PRIME);
    }
    (h ^ bytes.len() as u64).wrapping_mul(PRIME)
}

/// Events by simulated time, ties in scheduling order.
#[derive(Debug, Default)]
pub struct Queue {
    heap: BinaryHeap<std::cmp::Reverse<(u64, u64)>>,
    events: BTreeMap<u64, Event>,
    next: u64,
    /// Frames and connection closes in the queue (quiescence needs none in flight).
    frames: usize,
    /// The keepalive frames among them (by sequence number): quiescence does not wait
    /// for them. Once every replica has what the hub has, a keepalive carries nothing
    /// new and is not answered; at a thousand idle agents one is almost always on its
    /// way, and a run whose convergence outlasted KEEPALIVE_MS never looked quiet.
    keepalives: BTreeSet<u64>,
}

impl Queue {
    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: u64, event: Event) -> Result<(), super::outcome::SimError> {
        self.push_seq(at, event).map(|_| ())
    }

    /// Schedules a keepalive frame (see `Queue::keepalives`).
    pub fn push_keepalive(
        &mut self,
        at: u64,
        event: Event,
    ) -> Result<(), super::outcome::SimError> {
        let seq = self.push_seq(at, event)?;
        self.keepalives.insert(seq);
        Ok(())
    }

    fn push_seq(&mut self, at: u64, event: Event) -> Result<u64, super::outcome::SimError> {
        if self.events.len() >= QUEUE_EVENTS_MAX {
            return Err(super::outcome::SimError::QueueFull(QUEUE_EVENTS_MAX));
        }
        if event.in_flight() {
            self.frames += 1;
        }
        let seq = self.next;
        self.next += 1;
        self.heap.push(std::cmp::Reverse((at, seq)));
        self.events.insert(seq, event);
        Ok(seq)
    }

    /// The next event and its time.
    pub fn pop(&mut self) -> Option<(u64, Event)> {
        loop {
            let std::cmp::Reverse((at, seq)) = self.heap.pop()?;
            let Some(event) = self.events.remove(&seq) else {
                continue;
            };
            self.taken(seq, &event);
            return Some((at, event));
        }
    }

    /// The next event if it is due at `at` and `wanted` accepts it (the hub taking
    /// every frame that arrived in the same millisecond as one batch).
    pub fn pop_if(&mut self, at: u64, wanted: impl Fn(&Event) -> bool) -> Option<Event> {
        let (next_at, seq) = self.peek_live()?;
        if next_at != at || !self.events.get(&seq).is_some_and(wanted) {
            return None;
        }
        self.heap.pop();
        let event = self.events.remove(&seq)?;
        self.taken(seq, &event);
        Some(event)
    }

    fn taken(&mut self, seq: u64, event: &Event) {
        if event.in_flight() {
            self.frames -= 1;
        }
        self.keepalives.remove(&seq);
    }

    /// The time and sequence number of the next event still queued (entries of events
    /// taken out of order are dropped on the way).
    fn peek_live(&mut self) -> Option<(u64, u64)> {
        loop {
            let &std::cmp::Reverse((next_at, seq)) = self.heap.peek()?;
            if self.events.contains_key(&seq) {
                return Some((next_at, seq));
            }
            self.heap.pop();
        }
    }

    /// Whether the next event is due by `until` and `wanted`.
    pub fn next_is(&mut self, until: u64, wanted: impl Fn(&Event) -> bool) -> bool {
        self.peek_live().is_some_and(|(next_at, seq)| {
            next_at <= until && self.events.get(&seq).is_some_and(wanted)
        })
    }

    /// Frames and closes in flight, keepalives aside (see `Queue::keepalives`).
    pub fn frames_in_flight(&self) -> usize {
        self.frames - self.keepalives.len()
    }

    /// Drops every frame in flight on the connections `dead` says are gone (a crash).
    pub fn drop_frames(&mut self, dead: impl Fn(ConnId) -> bool) {
        let before = self.events.len();
        self.events
            .retain(|_, e| !matches!(e, Event::Frame(c, ..) if dead(*c)));
        let dropped = before - self.events.len();
        self.frames -= dropped;
        let events = &self.events;
        self.keepalives.retain(|seq| events.contains_key(seq));
        // Their heap entries stay and are skipped by `pop` (no event under the seq).
    }
}

/// What happens to one frame.
#[derive(Debug, Default)]
pub struct Fate {
    /// Delivery times (none: lost; two: duplicated).
    pub deliveries: Vec<u64>,
    /// It was lost.
    pub dropped: bool,
    /// It was duplicated.
    pub duplicated: bool,
    /// It was held back for reordering.
    pub reordered: bool,
}

/// The network's state: FIFO order per connection and direction, and the faults.
#[derive(Debug)]
pub struct Net {
    spec: NetworkSpec,
    /// Last delivery time per connection and direction (FIFO unless reordered).
    last: BTreeMap<(ConnId, Dir), u64>,
    /// Faults apply (during the storm only).
    pub faulty: bool,
}

impl Net {
    /// A network as the scenario describes it, faults on.
    pub fn new(spec: NetworkSpec) -> Net {
        Net {
            spec,
            last: BTreeMap::new(),
            faulty: true,
        }
    }

    /// One-way latency.
    pub fn latency(&self, rng: &mut Rng) -> u64 {
        rng.range(self.spec.latency_ms[0], self.spec.latency_ms[1])
    }

    /// When (and whether) a frame sent at `now` arrives. `reliable` frames (connection
    /// set-up of the rogue's side channels) are never lost.
    pub fn fate(&mut self, rng: &mut Rng, now: u64, conn: ConnId, dir: Dir) -> Fate {
        let mut fate = Fate::default();
        let faulty = self.faulty;
        if faulty && rng.chance(self.spec.drop) {
            fate.dropped = true;
            return fate;
        }
        let mut at = now + self.latency(rng);
        let last = self.last.entry((conn, dir)).or_insert(0);
        if faulty && rng.chance(self.spec.reorder) {
            // Held back; later frames do not wait for it.
            fate.reordered = true;
            at += rng.range(1, REORDER_HOLD_MS_MAX);
        } else {
            at = at.max(*last);
            *last = at;
        }
        fate.deliveries.push(at);
        if faulty && rng.chance(self.spec.duplicate) {
            fate.duplicated = true;
            fate.deliveries.push(at + self.latency(rng));
        }
        fate
    }

    /// Forgets a closed connection.
    pub fn forget(&mut self, conn: ConnId) {
        self.last.remove(&(conn, Dir::ToHub));
        self.last.remove(&(conn, Dir::ToAgent));
    }

    /// The earliest time a frame on `conn` in `dir` could arrive without overtaking
    /// (for a close that must follow the frames sent before it).
    pub fn after_last(&self, conn: ConnId, dir: Dir, at: u64) -> u64 {
        self.last.get(&(conn, dir)).map_or(at, |l| at.max(*l + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Quiescence waits for frames and closes, not for keepalives: taken in order, out
    /// of order, or dropped with their connection, each is counted out once.
    #[test]
    fn keepalives_in_flight_do_not_count_as_frames() {
        let mut q = Queue::default();
        let frame = |c| Event::Frame(ConnId(c), Dir::ToHub, vec![1]);
        q.push(5, frame(1)).unwrap();
        q.push_keepalive(3, frame(2)).unwrap();
        q.push_keepalive(4, frame(3)).unwrap();
        q.push(1, Event::Sample).unwrap();
        assert_eq!(q.frames_in_flight(), 1);
        assert!(matches!(q.pop(), Some((1, Event::Sample))));
        assert!(q.pop_if(3, |_| true).is_some(), "the keepalive due at 3");
        assert_eq!(q.frames_in_flight(), 1);
        q.drop_frames(|c| c == ConnId(3));
        assert_eq!(q.frames_in_flight(), 1);
        assert!(matches!(q.pop(), Some((5, Event::Frame(ConnId(1), ..)))));
        assert_eq!(q.frames_in_flight(), 0);
        assert!(q.pop().is_none());
        q.push_keepalive(6, frame(4)).unwrap();
        assert_eq!(q.frames_in_flight(), 0, "a keepalive alone is quiet");
        q.push(7, frame(5)).unwrap();
        assert_eq!(q.frames_in_flight(), 1);
    }
}
