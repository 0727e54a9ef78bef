//! A hub that runs for weeks, measured: a soak (many agents on several lists writing at a
//! steady rate for minutes), housekeeping (a list with a long history compacting and
//! rebuilding beside a small one), and lists out of memory (thousands stored, a hundred
//! in use). The hub alone: these figures have no peer in the other servers (samod and the
//! JS server keep every document they ever saw in memory).
//!
//! ```text
//! cargo bench --bench side_by_side -- --soak 600          # 10 minutes
//! cargo bench --bench side_by_side -- --housekeeping 60   # 2 × 60 s
//! cargo bench --bench side_by_side -- --unload 10000      # 10,000 stored lists
//! ```
//!
//! Each writes its figures to `target/side-by-side/hardening.json` (kept between runs,
//! one part per measure) and rewrites the *Weeks of uptime* section of `BENCHMARKS.md`.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::ChangeHash;
use serde::{Deserialize, Serialize};
use swarmtodo::client::list_document_id;
use swarmtodo::hub::wire::DocumentId;

use crate::seed::Seed;
use crate::servers::{Kind, Server};
use crate::swarm::{self, Cmd, Ev};
use crate::{ms, verify, Dist, Options, Swarm, IDLE};

mod report;
pub(crate) use report::{kept, section};
use report::{record, rewrite_section, HEADING};

/// Lists of the soak.
pub(crate) const SOAK_LISTS: usize = 10;
/// Agents of the soak (across its lists).
pub(crate) const SOAK_AGENTS: usize = 1_000;
/// Writes per second the soak offers (in total): steady, below what the hub sustains in
/// this shape (a write fans out to 99 agents of its own list, 10 lists batched apart:
/// at 500/s the hub's core was busy all along, fell behind after four minutes and its
/// memory grew with the backlog), so that what moves over the minutes is the hub, not a
/// queue.
pub(crate) const SOAK_RATE: f64 = 200.0;
/// How often the soak reads the hub's resident memory.
const RSS_EVERY: Duration = Duration::from_secs(5);
/// Agents writing to the busy list of the housekeeping measure, and their rate.
const BUSY_AGENTS: usize = 100;
const BUSY_RATE: f64 = 500.0;
/// Agents on the probe list, and the probe's rate (one write at a time, in turn).
const PROBE_AGENTS: usize = 10;
const PROBE_RATE: f64 = 20.0;
/// Lists in use while many are stored.
const IN_USE: usize = 100;
/// How long the last acknowledgements may take after a phase.
const ACK_GRACE: Duration = Duration::from_secs(5);

/// What one invocation or another measured (each part kept until measured again).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Hardening {
    pub(crate) soak: Option<Soak>,
    pub(crate) housekeeping: Option<Housekeeping>,
    pub(crate) unload: Option<Unload>,
}

/// Many agents writing steadily for minutes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Soak {
    pub(crate) measured: String,
    pub(crate) agents: usize,
    pub(crate) lists: usize,
    pub(crate) history: usize,
    pub(crate) offered_per_s: f64,
    pub(crate) seconds: f64,
    pub(crate) sent: usize,
    pub(crate) acked: usize,
    /// Acknowledged writes a fresh peer did not find afterwards.
    pub(crate) acked_lost: usize,
    /// Connections that failed or were closed by the hub.
    pub(crate) dropped: usize,
    pub(crate) minutes: Vec<Minute>,
    /// Least squares over the samples after the first minute (none for a shorter soak).
    pub(crate) rss_slope_mib_per_min: Option<f64>,
    /// Resident memory gained per acknowledged write over the soak (the lists' histories
    /// grow with every write: their documents keep it).
    pub(crate) rss_bytes_per_write: f64,
    pub(crate) rss_first_mib: f64,
    pub(crate) rss_last_mib: f64,
    pub(crate) server_cpu_share: f64,
}

/// One minute of the soak.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Minute {
    pub(crate) minute: usize,
    pub(crate) ack: Dist,
    /// Resident memory at the minute's end.
    pub(crate) rss_mib: f64,
}

/// A probe list's writes while another list does its housekeeping.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Housekeeping {
    pub(crate) measured: String,
    pub(crate) busy_agents: usize,
    pub(crate) busy_rate: f64,
    pub(crate) probe_rate: f64,
    pub(crate) seconds: f64,
    /// The busy list with a short history (its compactions and rebuilds are cheap).
    pub(crate) short: Phase,
    /// The same load on a long history (whole-list saves and rebuilds).
    pub(crate) long: Phase,
    /// The probe's p99, long over short.
    pub(crate) p99_ratio: f64,
}

/// One phase of the housekeeping measure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Phase {
    pub(crate) history: usize,
    pub(crate) probe: Dist,
    pub(crate) busy: Dist,
    pub(crate) busy_acked_per_s: f64,
    pub(crate) server_cpu_share: f64,
    pub(crate) acked_lost: usize,
    pub(crate) dropped: usize,
}

/// Lists stored, a few in use.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Unload {
    pub(crate) measured: String,
    pub(crate) stored: usize,
    pub(crate) in_use: usize,
    pub(crate) history: usize,
    pub(crate) store_mib: f64,
    /// Every list stored, none in use.
    pub(crate) idle_mib: f64,
    /// `in_use` lists in use.
    pub(crate) in_use_mib: f64,
    /// Those released, then `in_use` others in use.
    pub(crate) others_mib: f64,
    /// All released again.
    pub(crate) released_mib: f64,
    /// A hub that stores only the `in_use` lists, all in use.
    pub(crate) alone_mib: f64,
}

/// Which agents write at what total rate (each in turn).
struct Stream {
    agents: Range<usize>,
    rate: f64,
}

/// One acknowledged write.
struct Ack {
    agent: usize,
    hash: ChangeHash,
    /// Seconds from the start to its sending.
    at_s: f64,
    ms: f64,
}

/// Offers each stream's writes for `duration`, then waits for the last
/// acknowledgements; `tick` runs about every millisecond with the time since the start.
async fn drive(
    swarm: &mut Swarm,
    streams: &[Stream],
    duration: Duration,
    mut tick: impl FnMut(Duration),
) -> (usize, Vec<Ack>) {
    let start = Instant::now();
    let end = start + duration;
    let mut issued = vec![0usize; streams.len()];
    let mut sent: HashSet<ChangeHash> = HashSet::new();
    let mut acks = Vec::new();
    let mut every = tokio::time::interval(Duration::from_millis(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let grace = tokio::time::Instant::from_std(end + ACK_GRACE);
    loop {
        let now = Instant::now();
        tick(now.duration_since(start));
        if now < end {
            for (s, n) in streams.iter().zip(issued.iter_mut()) {
                let due = (now.duration_since(start).as_secs_f64() * s.rate) as usize;
                while *n < due {
                    swarm.tell(s.agents.start + *n % s.agents.len(), Cmd::Write);
                    *n += 1;
                }
            }
        } else if acks.len() >= sent.len() || tokio::time::Instant::now() >= grace {
            break;
        }
        tokio::select! {
            _ = every.tick() => {}
            ev = swarm.next(grace) => match ev {
                Some(Ev::Sent(h, _)) => { sent.insert(h); }
                Some(Ev::Acked(agent, hash, t, at)) if sent.contains(&hash) => acks.push(Ack {
                    agent,
                    hash,
                    at_s: t.duration_since(start).as_secs_f64(),
                    ms: ms(at.duration_since(t)),
                }),
                _ => {}
            }
        }
    }
    (sent.len(), acks)
}

/// Seeds each list (the seeders stay connected, so the lists stay in memory).
async fn seeded(
    server: &Server,
    lists: &[(DocumentId, &Arc<Seed>)],
) -> anyhow::Result<Vec<swarm::Seeder>> {
    let mut seeders = Vec::new();
    for (doc, seed) in lists {
        seeders.push(swarm::seed_list(&server.url, server.kind, seed, *doc).await?);
    }
    Ok(seeders)
}

/// Acknowledged writes missing on the server, list by list (`list_of` maps an agent to
/// its place in `lists`).
async fn lost(
    server: &Server,
    lists: &[(DocumentId, &Arc<Seed>)],
    acks: &[Ack],
    list_of: impl Fn(usize) -> usize,
) -> anyhow::Result<usize> {
    let mut by_list: HashMap<usize, Vec<ChangeHash>> = HashMap::new();
    for a in acks {
        by_list.entry(list_of(a.agent)).or_default().push(a.hash);
    }
    let mut lost = 0;
    for (l, hashes) in by_list {
        let (doc, seed) = lists[l];
        lost += verify(server, seed, doc, &hashes).await?;
    }
    Ok(lost)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

/// The soak: [`SOAK_AGENTS`] agents on [`SOAK_LISTS`] lists, [`SOAK_RATE`] writes per
/// second for `seconds`.
pub(crate) async fn soak(o: &Options, seconds: f64) -> anyhow::Result<Soak> {
    let seed = Seed::load_or_build(o.history, &o.work)?;
    let server = Server::start(Kind::Hub, &o.work)?;
    let docs: Vec<DocumentId> = (0..SOAK_LISTS)
        .map(|k| list_document_id(&format!("soak-{k}")))
        .collect();
    let lists: Vec<_> = docs.iter().map(|d| (*d, &seed)).collect();
    let seeders = seeded(&server, &lists).await?;
    let t = Instant::now();
    let mut swarm =
        Swarm::connect_to(&server, 0, SOAK_AGENTS, |k| (docs[k % docs.len()], &seed)).await?;
    for s in seeders {
        s.close().await;
    }
    eprintln!(
        "── soak: {SOAK_AGENTS} agents on {SOAK_LISTS} lists in step in {:.1} s; {SOAK_RATE}/s for {seconds} s",
        t.elapsed().as_secs_f64()
    );
    let u0 = server.usage();
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut next_sample = Duration::ZERO;
    let (sent, acks) = drive(
        &mut swarm,
        &[Stream {
            agents: 0..SOAK_AGENTS,
            rate: SOAK_RATE,
        }],
        Duration::from_secs_f64(seconds),
        |since| {
            if since >= next_sample && since.as_secs_f64() <= seconds {
                let rss = mib(server.usage().rss_bytes);
                samples.push((since.as_secs_f64() / 60.0, rss));
                if next_sample.as_secs().is_multiple_of(60) {
                    eprintln!("   {:.0} s: RSS {rss:.1} MiB", since.as_secs_f64());
                }
                next_sample += RSS_EVERY;
            }
        },
    )
    .await;
    let u1 = server.usage();
    let dropped = swarm.failed;
    let acked_lost = lost(&server, &lists, &acks, |a| a % docs.len()).await?;
    let minutes = (0..(seconds / 60.0).ceil() as usize)
        .filter(|m| acks.iter().any(|a| (a.at_s / 60.0) as usize == *m))
        .map(|m| {
            let lat: Vec<f64> = acks
                .iter()
                .filter(|a| (a.at_s / 60.0) as usize == m)
                .map(|a| a.ms)
                .collect();
            let rss_mib = samples
                .iter()
                .rev()
                .find(|(t, _)| *t <= (m + 1) as f64)
                .map_or(0.0, |(_, r)| *r);
            Minute {
                minute: m + 1,
                ack: Dist::of(&lat),
                rss_mib,
            }
        })
        .collect();
    let steady: Vec<(f64, f64)> = samples.iter().copied().filter(|(t, _)| *t >= 1.0).collect();
    let rss_first_mib = samples.first().map_or(0.0, |s| s.1);
    let rss_last_mib = samples.last().map_or(0.0, |s| s.1);
    let soak = Soak {
        measured: crate::report::utc_now(),
        agents: SOAK_AGENTS,
        lists: SOAK_LISTS,
        history: seed.changes(),
        offered_per_s: SOAK_RATE,
        seconds,
        sent,
        acked: acks.len(),
        acked_lost,
        dropped,
        minutes,
        rss_slope_mib_per_min: slope(&steady),
        rss_first_mib,
        rss_last_mib,
        rss_bytes_per_write: (rss_last_mib - rss_first_mib) * 1_048_576.0
            / acks.len().max(1) as f64,
        server_cpu_share: u1.cpu_share_since(&u0),
    };
    eprintln!(
        "   sent {}, acked {}, lost {}, dropped {}; RSS {:.1} → {:.1} MiB ({:.0} B per write), slope {:?} MiB/min",
        soak.sent,
        soak.acked,
        soak.acked_lost,
        soak.dropped,
        soak.rss_first_mib,
        soak.rss_last_mib,
        soak.rss_bytes_per_write,
        soak.rss_slope_mib_per_min
    );
    Ok(soak)
}

/// Least-squares slope of `(x, y)` points (none for fewer than two).
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(num, den), (x, y)| {
        (num + (x - mx) * (y - my), den + (x - mx) * (x - mx))
    });
    Some(num / den)
}

/// Housekeeping: a busy list written at [`BUSY_RATE`] beside a probe list written at
/// [`PROBE_RATE`], once with a short history and once with a long one.
pub(crate) async fn housekeeping(o: &Options, seconds: f64) -> anyhow::Result<Housekeeping> {
    let short = Seed::load_or_build(o.history, &o.work)?;
    let long = Seed::load_or_build(o.long_history.unwrap_or(60_000), &o.work)?;
    let phase_short = housekeeping_phase(o, &short, &short, seconds).await?;
    let phase_long = housekeeping_phase(o, &long, &short, seconds).await?;
    Ok(Housekeeping {
        measured: crate::report::utc_now(),
        busy_agents: BUSY_AGENTS,
        busy_rate: BUSY_RATE,
        probe_rate: PROBE_RATE,
        seconds,
        p99_ratio: phase_long.probe.p99 / phase_short.probe.p99,
        short: phase_short,
        long: phase_long,
    })
}

async fn housekeeping_phase(
    o: &Options,
    busy: &Arc<Seed>,
    probe: &Arc<Seed>,
    seconds: f64,
) -> anyhow::Result<Phase> {
    eprintln!(
        "── housekeeping: busy list of {} changes at {BUSY_RATE}/s, probe at {PROBE_RATE}/s, {seconds} s",
        busy.changes()
    );
    let server = Server::start(Kind::Hub, &o.work)?;
    let lists = [
        (list_document_id("housekeeping-busy"), busy),
        (list_document_id("housekeeping-probe"), probe),
    ];
    let seeders = seeded(&server, &lists).await?;
    // Both lists hold the same agents' actors; the probe agents come after the busy ones.
    let doc_of = |k: usize| usize::from(k >= BUSY_AGENTS);
    let mut swarm =
        Swarm::connect_to(&server, 0, BUSY_AGENTS + PROBE_AGENTS, |k| lists[doc_of(k)]).await?;
    for s in seeders {
        s.close().await;
    }
    tokio::time::sleep(IDLE).await;
    let u0 = server.usage();
    let (_, acks) = drive(
        &mut swarm,
        &[
            Stream {
                agents: 0..BUSY_AGENTS,
                rate: BUSY_RATE,
            },
            Stream {
                agents: BUSY_AGENTS..BUSY_AGENTS + PROBE_AGENTS,
                rate: PROBE_RATE,
            },
        ],
        Duration::from_secs_f64(seconds),
        |_| {},
    )
    .await;
    let u1 = server.usage();
    let (probe_acks, busy_acks): (Vec<&Ack>, Vec<&Ack>) =
        acks.iter().partition(|a| doc_of(a.agent) == 1);
    let acked_lost = lost(&server, &lists, &acks, doc_of).await?;
    let phase = Phase {
        history: busy.changes(),
        probe: Dist::of(&probe_acks.iter().map(|a| a.ms).collect::<Vec<_>>()),
        busy: Dist::of(&busy_acks.iter().map(|a| a.ms).collect::<Vec<_>>()),
        busy_acked_per_s: busy_acks.len() as f64 / seconds,
        server_cpu_share: u1.cpu_share_since(&u0),
        acked_lost,
        dropped: swarm.failed,
    };
    eprintln!(
        "   probe p50 {:.2} ms p99 {:.2} ms max {:.1} ms; busy {:.0}/s p99 {:.1} ms; CPU {:.0} %; lost {}",
        phase.probe.p50,
        phase.probe.p99,
        phase.probe.max,
        phase.busy_acked_per_s,
        phase.busy.p99,
        phase.server_cpu_share * 100.0,
        phase.acked_lost
    );
    Ok(phase)
}

/// Lists out of memory: a store of `stored` copies of the list, [`IN_USE`] of them
/// in use at a time.
pub(crate) async fn unload(o: &Options, stored: usize) -> anyhow::Result<Unload> {
    let seed = Seed::load_or_build(o.history, &o.work)?;
    let names: Vec<String> = (0..stored).map(|k| format!("unload-{k}")).collect();
    let many = o.work.join(format!("unload-{stored}.db"));
    let few = o.work.join(format!("unload-{IN_USE}.db"));
    let t = Instant::now();
    store_copies(o, &seed, &many, &names).await?;
    store_copies(o, &seed, &few, &names[..IN_USE]).await?;
    let store_mib = mib(std::fs::metadata(&many)?.len());
    eprintln!(
        "── unload: {stored} lists stored ({store_mib:.0} MiB) in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let in_use = |range: Range<usize>| -> Vec<(DocumentId, &Arc<Seed>)> {
        names[range]
            .iter()
            .map(|n| (list_document_id(n), &seed))
            .collect()
    };
    let rss = |s: &Server| mib(s.usage().rss_bytes);

    let server = Server::hub_on(&many, &o.work)?;
    tokio::time::sleep(IDLE * 2).await;
    let idle_mib = rss(&server);
    let seeders = seeded(&server, &in_use(0..IN_USE)).await?;
    tokio::time::sleep(IDLE * 2).await;
    let in_use_mib = rss(&server);
    for s in seeders {
        s.close().await;
    }
    let seeders = seeded(&server, &in_use(IN_USE..2 * IN_USE)).await?;
    tokio::time::sleep(IDLE * 2).await;
    let others_mib = rss(&server);
    for s in seeders {
        s.close().await;
    }
    tokio::time::sleep(IDLE * 2).await;
    let released_mib = rss(&server);
    drop(server);

    let server = Server::hub_on(&few, &o.work)?;
    let seeders = seeded(&server, &in_use(0..IN_USE)).await?;
    tokio::time::sleep(IDLE * 2).await;
    let alone_mib = rss(&server);
    for s in seeders {
        s.close().await;
    }
    drop(server);
    let _ = std::fs::remove_file(&many);
    let _ = std::fs::remove_file(&few);
    let u = Unload {
        measured: crate::report::utc_now(),
        stored,
        in_use: IN_USE,
        history: seed.changes(),
        store_mib,
        idle_mib,
        in_use_mib,
        others_mib,
        released_mib,
        alone_mib,
    };
    eprintln!(
        "   RSS: idle {idle_mib:.1} MiB; {IN_USE} in use {in_use_mib:.1}; {IN_USE} others {others_mib:.1}; released {released_mib:.1}; {IN_USE} stored and in use {alone_mib:.1} MiB"
    );
    Ok(u)
}

/// A store file holding `names`, each a copy of the list as a hub stored it (a hub
/// given the list once; its rows copied under each name in one transaction).
async fn store_copies(
    o: &Options,
    seed: &Arc<Seed>,
    db: &Path,
    names: &[String],
) -> anyhow::Result<()> {
    for f in [
        db.to_path_buf(),
        db.with_extension("db-wal"),
        db.with_extension("db-shm"),
    ] {
        let _ = std::fs::remove_file(f);
    }
    let first = list_document_id(&names[0]);
    {
        let server = Server::hub_on(db, &o.work)?;
        let seeder = swarm::seed_list(&server.url, Kind::Hub, seed, first).await?;
        tokio::time::sleep(IDLE).await;
        seeder.close().await;
        drop(server);
    }
    let mut conn = rusqlite::Connection::open(db)?;
    let tx = conn.transaction()?;
    let src: i64 = tx.query_row(
        "SELECT id FROM lists WHERE doc_id = ?1",
        [first.as_bytes().as_slice()],
        |r| r.get(0),
    )?;
    tx.execute(
        "UPDATE lists SET name = ?1 WHERE id = ?2",
        rusqlite::params![names[0], src],
    )?;
    for name in &names[1..] {
        let doc = list_document_id(name);
        tx.execute(
            "INSERT INTO lists (name, doc_id, changes, change_bytes, version, pending, \
             in_progress, completed, cancelled, blocked) SELECT ?1, ?2, changes, change_bytes, \
             version, pending, in_progress, completed, cancelled, blocked FROM lists WHERE id = ?3",
            rusqlite::params![name, doc.as_bytes().as_slice(), src],
        )?;
        let id = tx.last_insert_rowid();
        tx.execute(
            "INSERT INTO snapshots (list_id, heads, bytes) SELECT ?1, heads, bytes FROM snapshots WHERE list_id = ?2",
            rusqlite::params![id, src],
        )?;
        tx.execute(
            "INSERT INTO changes (list_id, hash, deps, bytes) SELECT ?1, hash, deps, bytes FROM changes WHERE list_id = ?2",
            rusqlite::params![id, src],
        )?;
    }
    tx.commit()?;
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
    Ok(())
}

/// Runs the measures `o` asks for, records them and rewrites the section.
pub(crate) async fn run(o: &Options) -> anyhow::Result<()> {
    if let Some(secs) = o.soak {
        let k = soak(o, secs).await?;
        record(&o.work, |h| h.soak = Some(k))?;
    }
    if let Some(secs) = o.housekeeping {
        let k = housekeeping(o, secs).await?;
        record(&o.work, |h| h.housekeeping = Some(k))?;
    }
    if let Some(stored) = o.unload {
        let k = unload(o, stored).await?;
        record(&o.work, |h| h.unload = Some(k))?;
    }
    let h = kept(&o.work).unwrap_or_default();
    println!("{}", section(&h));
    if let Some(out) = &o.out {
        rewrite_section(out, &h)?;
        eprintln!("rewrote {HEADING:?} in {out:?}");
    }
    Ok(())
}
