//! A thin automerge-repo peer: the sync protocol over the change graph only.
//!
//! A swarm of N full replicas on this machine would spend N× the server's work applying
//! every change (≈50 µs each), so the generator's agents keep what the protocol needs —
//! which changes exist, the heads, the largest op counter — and nothing of the document's
//! content. What they put on the wire is what automerge's stock `generate_sync_message`
//! would (same fields, same rules: `need`, one `have` with a Bloom filter of what the
//! server may lack, changes the server's Bloom filter says it lacks, `in_flight`, resets,
//! V1/V2 by the server's capabilities); a write is a real automerge change (one `status`
//! op on the agent's own task, deps = the agent's heads), encoded by automerge.
//!
//! Every run ends with a full replica reading the list back from the server and
//! checking it holds every acknowledged write: a protocol slip shows up there.

/// Keyed by change hashes: foldhash costs a fraction of SipHash on 32 bytes, and the
/// generator's thousands of peers look hashes up for every change they receive.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use automerge::sync::{BloomFilter, ChunkList, Have, Message, MessageFlags, MessageVersion};
use automerge::{Change, ChangeHash, ExpandedChange, ReadDoc};

use crate::seed::{agent_actor, Seed, STATUSES};

/// What a thin peer keeps of a change it received.
pub(crate) struct Lite {
    hash: ChangeHash,
    /// Sorted.
    deps: Vec<ChangeHash>,
    max_op: u64,
}

/// Changes parsed, by their bytes, shared by the generator's agents (see
/// [`parse_chunk`]); the cache is dropped whole when it holds this many.
const PARSED_MAX: usize = 65_536;

/// Parsed changes by their bytes.
type Parsed = HashMap<Box<[u8]>, Arc<Lite>>;

static PARSED: Mutex<Option<Parsed>> = Mutex::new(None);

/// The changes of a sync message's change chunk. Automerge parses a change whole (its
/// op columns, its hash): ≈2 µs, for every agent, and at 2,000 writes/s to 100 agents
/// that was 44 % of the generator's core, which then limited the run instead of the
/// server. The generator's agents all receive the same changes, so each is parsed
/// once, by its bytes, and shared; what goes on the wire is unchanged.
pub(crate) fn parse_chunk(chunk: &[u8]) -> Result<Vec<Arc<Lite>>, String> {
    let mut out = Vec::new();
    let mut rest = chunk;
    while !rest.is_empty() {
        let len = swarmtodo::model::storage_chunk_len(rest)?;
        let (one, tail) = rest.split_at(len);
        rest = tail;
        let cached = PARSED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|m| m.get(one).cloned());
        if let Some(lite) = cached {
            out.push(lite);
            continue;
        }
        let changes = swarmtodo::model::chunk_changes(one)?;
        let lites: Vec<Arc<Lite>> = changes
            .iter()
            .map(|c| {
                let mut deps = c.deps().to_vec();
                deps.sort_unstable();
                Arc::new(Lite {
                    hash: c.hash(),
                    deps,
                    max_op: c.max_op(),
                })
            })
            .collect();
        if let [lite] = lites.as_slice() {
            let mut parsed = PARSED.lock().unwrap_or_else(|e| e.into_inner());
            let map = parsed.get_or_insert_with(HashMap::default);
            if map.len() >= PARSED_MAX {
                map.clear();
            }
            map.insert(one.into(), lite.clone());
        }
        out.extend(lites);
    }
    Ok(out)
}

/// One of the agent's own writes the server has not acknowledged yet.
struct Own {
    hash: ChangeHash,
    change: Change,
    sent_at: Option<Instant>,
}

/// What the agent writes to: its task and the op holding the current status.
struct Writer {
    actor_hex: String,
    seq: u64,
    obj: String,
    status_op: String,
    status: usize,
}

/// The sync state automerge keeps per peer (the fields the protocol uses).
#[derive(Default)]
struct State {
    shared_heads: Vec<ChangeHash>,
    last_sent_heads: Vec<ChangeHash>,
    their_heads: Option<Vec<ChangeHash>>,
    their_need: Option<Vec<ChangeHash>>,
    their_have: Option<Vec<Have>>,
    sent_hashes: HashSet<ChangeHash>,
    in_flight: bool,
    have_responded: bool,
    their_v2: bool,
}

/// What one received message brought.
#[derive(Default)]
pub(crate) struct Received {
    /// Changes new to this agent.
    pub(crate) new: Vec<ChangeHash>,
    /// Own writes the server now has, with the time they were sent.
    pub(crate) acked: Vec<(ChangeHash, Instant)>,
}

/// A thin peer of one document.
pub(crate) struct Peer {
    seed: Arc<Seed>,
    known: HashSet<ChangeHash>,
    heads: Vec<ChangeHash>,
    max_op: u64,
    st: State,
    own: Vec<Own>,
    /// Changes received before their dependencies.
    waiting: Vec<Arc<Lite>>,
    writer: Writer,
}

/// A message the thin peer could not take.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PeerError {
    #[error("bad change chunk: {0}")]
    Chunk(String),
    #[error("more than {0} changes wait for their dependencies")]
    Waiting(usize),
}

/// Changes a peer holds back for missing dependencies before giving up.
const WAITING_MAX: usize = 100_000;

impl Peer {
    /// Agent `i` holding the seed list, in the state automerge is in after generating
    /// its first message (the seed's `hello`).
    pub(crate) fn new(seed: Arc<Seed>, i: usize) -> Peer {
        let task = &seed.tasks[i % seed.tasks.len()];
        let status = STATUSES
            .iter()
            .position(|s| s.as_str() == task.status)
            .unwrap_or(0);
        let writer = Writer {
            actor_hex: agent_actor(i).to_hex_string(),
            seq: 0,
            obj: task.obj.clone(),
            status_op: task.status_op.clone(),
            status,
        };
        let st = State {
            last_sent_heads: seed.heads.clone(),
            have_responded: true,
            in_flight: true,
            ..State::default()
        };
        Peer {
            heads: seed.heads.clone(),
            max_op: seed.max_op,
            known: HashSet::default(),
            st,
            own: Vec::new(),
            waiting: Vec::new(),
            writer,
            seed,
        }
    }

    /// The first message, already encoded by automerge.
    pub(crate) fn hello(&self) -> Vec<u8> {
        self.seed.hello.clone().encode()
    }

    fn has(&self, h: &ChangeHash) -> bool {
        self.seed.hashes.contains(h) || self.known.contains(h)
    }

    /// Heads, sorted.
    pub(crate) fn heads(&self) -> &[ChangeHash] {
        &self.heads
    }

    /// True when the server's last word was that it has exactly our heads.
    pub(crate) fn in_sync(&self) -> bool {
        self.st.their_heads.as_deref() == Some(&self.heads[..])
    }

    /// The encoded bytes of an own write not acknowledged yet (empty if unknown).
    pub(crate) fn own_bytes(&self, h: &ChangeHash) -> Vec<u8> {
        self.own
            .iter()
            .find(|o| o.hash == *h)
            .map(|o| o.change.raw_bytes().to_vec())
            .unwrap_or_default()
    }

    fn ack(&mut self, h: &ChangeHash, out: &mut Received) {
        if let Some(i) = self.own.iter().position(|o| o.hash == *h) {
            self.ack_through(i, out);
        }
    }

    /// Own writes up to `own[i]` are on the server: everything that write depends on
    /// is too.
    fn ack_through(&mut self, i: usize, out: &mut Received) {
        for o in self.own.drain(..=i) {
            if let Some(at) = o.sent_at {
                out.acked.push((o.hash, at));
            }
            self.st.sent_hashes.remove(&o.hash);
        }
    }

    /// Adds a change (its hash, its dependencies sorted, its last op) to the graph; a
    /// change from the server also acknowledges what it depends on. Concurrent writers
    /// leave ~100 heads and give each change as many dependencies: lookups by binary
    /// search, not a scan of one list per member of the other.
    fn apply(
        &mut self,
        hash: ChangeHash,
        deps: &[ChangeHash],
        max_op: u64,
        from_server: Option<&mut Received>,
    ) {
        self.known.insert(hash);
        self.heads.retain(|h| deps.binary_search(h).is_err());
        if let Err(at) = self.heads.binary_search(&hash) {
            self.heads.insert(at, hash);
        }
        self.max_op = self.max_op.max(max_op);
        if let Some(out) = from_server {
            if let Some(i) = self
                .own
                .iter()
                .rposition(|o| deps.binary_search(&o.hash).is_ok())
            {
                self.ack_through(i, out);
            }
            out.new.push(hash);
        }
    }

    /// Stock `receive_sync_message`, over the graph.
    pub(crate) fn receive(&mut self, msg: Message) -> Result<Received, PeerError> {
        let mut out = Received::default();
        self.st.in_flight = false;
        let before = self.heads.clone();
        if let Some(flags) = msg.flags {
            self.st.their_v2 = true;
            if flags.contains(MessageFlags::SYNC_RESET) {
                self.st.sent_hashes.clear();
            }
        }
        let had_changes = !msg.changes.is_empty();
        for chunk in msg.changes.iter() {
            self.waiting
                .extend(parse_chunk(chunk).map_err(PeerError::Chunk)?);
        }
        // Changes come in causal order (the server's messages list them so): one pass
        // applies them all; what waits for a dependency is passed over again only while
        // a pass makes progress.
        let mut progress = true;
        while progress && !self.waiting.is_empty() {
            progress = false;
            let mut rest = Vec::new();
            for c in std::mem::take(&mut self.waiting) {
                if self.has(&c.hash) {
                    progress = true;
                } else if c.deps.iter().all(|d| self.has(d)) {
                    self.apply(c.hash, &c.deps, c.max_op, Some(&mut out));
                    progress = true;
                } else {
                    rest.push(c);
                }
            }
            self.waiting = rest;
        }
        if self.waiting.len() > WAITING_MAX {
            return Err(PeerError::Waiting(WAITING_MAX));
        }
        if had_changes {
            self.st.shared_heads = advance_heads(&before, &self.heads, &self.st.shared_heads);
        }
        for h in &msg.heads {
            self.ack(h, &mut out);
        }
        if let Some(first) = msg.have.first() {
            for h in &first.last_sync {
                self.ack(h, &mut out);
            }
        }
        if !had_changes && msg.heads == before {
            self.st.last_sent_heads.clone_from(&msg.heads);
        }
        let known: Vec<ChangeHash> = msg.heads.iter().filter(|h| self.has(h)).copied().collect();
        if known.len() == msg.heads.len() {
            self.st.shared_heads.clone_from(&msg.heads);
            if msg.heads.is_empty() {
                self.st.last_sent_heads.clear();
                self.st.sent_hashes.clear();
            }
        } else {
            let mut s = self.st.shared_heads.clone();
            s.extend(known);
            s.sort();
            s.dedup();
            self.st.shared_heads = s;
        }
        self.st.their_have = Some(msg.have);
        self.st.their_heads = Some(msg.heads);
        self.st.their_need = Some(msg.need);
        Ok(out)
    }

    /// Stock `generate_sync_message`, over the graph.
    pub(crate) fn generate(&mut self) -> Option<Message> {
        let our_heads = self.heads.clone();
        let their_heads: HashSet<ChangeHash> =
            self.st.their_heads.iter().flatten().copied().collect();
        let need: Vec<ChangeHash> = {
            let mut n: Vec<ChangeHash> = their_heads
                .iter()
                .filter(|h| !self.has(h) && !self.waiting.iter().any(|c| c.hash == **h))
                .copied()
                .collect();
            for c in &self.waiting {
                n.extend(c.deps.iter().filter(|d| !self.has(d)).copied());
            }
            n.sort();
            n.dedup();
            n
        };
        let send_have = need.iter().all(|h| their_heads.contains(h));
        if let Some(first) = self.st.their_have.as_ref().and_then(|h| h.first()) {
            if !first.last_sync.iter().all(|h| self.has(h)) {
                let mut flags = MessageFlags::new();
                flags.set(MessageFlags::SUPPORTS_SYNC_RESET);
                return Some(Message {
                    heads: our_heads,
                    need: Vec::new(),
                    have: vec![Have::default()],
                    changes: ChunkList::empty(),
                    flags: Some(flags),
                    version: MessageVersion::V1,
                });
            }
        }
        let changes = self.changes_to_send();
        let heads_unchanged = self.st.last_sent_heads == our_heads;
        let heads_equal = self.st.their_heads.as_ref() == Some(&our_heads);
        if heads_unchanged && self.st.have_responded {
            if heads_equal && changes.is_empty() {
                return None;
            }
            if self.st.in_flight {
                return None;
            }
        }
        let have = if send_have {
            // What the server may lack: our writes it has not acknowledged.
            let bloom = BloomFilter::from_hashes(
                self.own
                    .iter()
                    .map(|o| o.hash)
                    .collect::<Vec<_>>()
                    .into_iter(),
            );
            vec![Have {
                last_sync: self.st.shared_heads.clone(),
                bloom,
            }]
        } else {
            Vec::new()
        };
        self.st.have_responded = true;
        self.st.last_sent_heads.clone_from(&our_heads);
        self.st.sent_hashes.extend(changes.iter().map(|c| c.hash()));
        let mut flags = MessageFlags::new();
        flags.set(MessageFlags::SUPPORTS_SYNC_RESET);
        let (chunks, version) = swarmtodo::model::sync::change_chunks(
            changes.iter().map(|c| c.raw_bytes()),
            self.st.their_v2,
        );
        self.st.in_flight = true;
        Some(Message {
            heads: our_heads,
            need,
            have,
            changes: ChunkList::from(chunks),
            flags: Some(flags),
            version,
        })
    }

    /// Stock `get_hashes_to_send` minus what was sent: what the server asked for by hash,
    /// and our writes that its Bloom filters do not hold.
    fn changes_to_send(&self) -> Vec<Change> {
        let (Some(have), Some(need)) = (&self.st.their_have, &self.st.their_need) else {
            return Vec::new();
        };
        let mut out: Vec<Change> = Vec::new();
        let mut picked: HashSet<ChangeHash> = HashSet::default();
        let owned: HashMap<ChangeHash, &Own> = self.own.iter().map(|o| (o.hash, o)).collect();
        for h in need {
            if self.st.sent_hashes.contains(h) || !picked.insert(*h) {
                continue;
            }
            if let Some(o) = owned.get(h) {
                out.push(o.change.clone());
            } else if self.seed.hashes.contains(h) {
                let doc = self.seed.doc.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(c) = doc.get_change_by_hash(h) {
                    out.push(c);
                }
            }
        }
        if !have.is_empty() {
            // Once one write is missing, the later ones (which depend on it) go too.
            let mut sending = false;
            for o in &self.own {
                sending |= have.iter().all(|h| !h.bloom.contains_hash(&o.hash));
                if sending && !self.st.sent_hashes.contains(&o.hash) && picked.insert(o.hash) {
                    out.push(o.change.clone());
                }
            }
        }
        out
    }

    /// Writes the next status to the agent's task: one automerge change on top of
    /// everything this agent has. Returns its hash.
    pub(crate) fn write(&mut self, now_ms: i64) -> ChangeHash {
        let w = &mut self.writer;
        w.seq += 1;
        w.status = (w.status + 1) % STATUSES.len();
        let start_op = self.max_op + 1;
        let json = serde_json::json!({
            "ops": [{
                "action": "set",
                "obj": w.obj,
                "key": "status",
                "value": STATUSES[w.status].as_str(),
                "pred": [w.status_op],
            }],
            "actor": w.actor_hex,
            "hash": null,
            "seq": w.seq,
            "startOp": start_op,
            "time": now_ms,
            "message": null,
            "deps": self.heads.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
        });
        let expanded: ExpandedChange =
            serde_json::from_value(json).expect("a well-formed expanded change");
        let change = Change::from(expanded);
        w.status_op = format!("{start_op}@{}", w.actor_hex);
        let hash = change.hash();
        let mut deps = change.deps().to_vec();
        deps.sort_unstable();
        self.apply(hash, &deps, change.max_op(), None);
        self.own.push(Own {
            hash,
            change,
            sent_at: None,
        });
        hash
    }

    /// Marks the writes not sent yet as sent at `at`.
    pub(crate) fn mark_sent(&mut self, at: Instant) {
        for o in self.own.iter_mut().filter(|o| o.sent_at.is_none()) {
            o.sent_at = Some(at);
        }
    }
}

/// Stock `advance_heads`.
fn advance_heads(
    before: &[ChangeHash],
    after: &[ChangeHash],
    shared: &[ChangeHash],
) -> Vec<ChangeHash> {
    let mut out: Vec<ChangeHash> = after
        .iter()
        .filter(|h| !before.contains(h))
        .chain(shared.iter().filter(|h| after.contains(h)))
        .copied()
        .collect();
    out.sort();
    out.dedup();
    out
}
