//! Connections and memory a hostile peer could hold, against a real `swarmtodo serve`
//! process on a loopback port: upgrades that never join, too many connections from one
//! address or with one token. Each hub runs with a configuration file whose `[limits]`
//! are small, so that the tests wait for short timeouts only; no test asserts how long
//! the hub took, only what it did within a generous bound.
#![allow(clippy::unwrap_used, clippy::expect_used)] // In tests a panic is the failure report.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use common::*;
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::hub::wire::{self, WireMessage};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Bound on each step of a peer (generous: a slow machine must not fail these tests).
const WAIT: Duration = Duration::from_secs(30);

/// A hub with its own scratch folder and configuration file (removed when dropped).
struct LimitedHub {
    hub: HubProc,
    dir: PathBuf,
}

impl LimitedHub {
    fn start(name: &str, config: &str) -> LimitedHub {
        let dir = scratch(&format!("limits-{name}"));
        let path = dir.join("swarmtodo.toml");
        std::fs::write(&path, config).unwrap();
        let hub = HubProc::start_with(
            &dir.join("hub.db"),
            "127.0.0.1:0",
            &["--config", path.to_str().unwrap()],
        );
        LimitedHub { hub, dir }
    }
}

impl Drop for LimitedHub {
    fn drop(&mut self) {
        let _ = self.hub.child.kill();
        let _ = self.hub.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn with_token(url: &str, token: &str) -> String {
    format!("{url}/?token={token}")
}

/// A WebSocket upgrade that never sends anything.
async fn upgrade(url: &str) -> Result<Ws, tungstenite::Error> {
    tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .expect("the upgrade is answered")
        .map(|(ws, _)| ws)
}

/// The close code and reason the hub ended `ws` with, and the `error` messages before
/// it; `None` when it did not end within `until`.
async fn ended(
    mut ws: Ws,
    until: tokio::time::Instant,
) -> Option<(Option<(u16, String)>, Vec<String>)> {
    let mut errors = Vec::new();
    loop {
        match tokio::time::timeout_at(until, ws.next()).await {
            Err(_) => return None,
            Ok(None | Some(Err(_))) => return Some((None, errors)),
            Ok(Some(Ok(Message::Close(frame)))) => {
                return Some((
                    frame.map(|f| (u16::from(f.code), f.reason.to_string())),
                    errors,
                ))
            }
            Ok(Some(Ok(Message::Binary(b)))) => {
                if let Ok(WireMessage::Error { message, .. }) = wire::decode(&b) {
                    errors.push(message);
                }
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// An honest agent syncs a list through the hub at `url`.
async fn honest_sync(url: &str, name: &str) {
    let doc = list_document_id(name);
    let mut lead = planned();
    let mut c = tokio::time::timeout(WAIT, Connection::connect(url, "honest"))
        .await
        .expect("the honest agent connects in time")
        .expect("the honest agent connects");
    tokio::time::timeout(WAIT, c.sync(doc, &mut lead))
        .await
        .expect("the honest sync ends in time")
        .expect("the honest agent syncs");
    assert!(c.in_sync(doc, &lead));
}

/// The status and body of a refused upgrade.
fn refused(r: Result<Ws, tungstenite::Error>) -> (u16, String) {
    match r {
        Err(tungstenite::Error::Http(resp)) => (
            resp.status().as_u16(),
            String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned(),
        ),
        Err(e) => panic!("expected an HTTP refusal, got {e}"),
        Ok(_) => panic!("expected an HTTP refusal, the upgrade was accepted"),
    }
}

// ---------------------------------------------------------------------------------
// Upgrades that never join
// ---------------------------------------------------------------------------------

/// Hundreds of upgrades that never send `join` are closed with `join_timeout` after the
/// (configured, short) join timeout, and an honest agent joins and syncs while they are
/// held. Before the join timeout, none of them was ever closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_that_never_join_are_closed_and_honest_peers_still_join() {
    const IDLE: usize = 300;
    const JOIN_TIMEOUT_MS: u64 = 3_000;
    let hub = LimitedHub::start(
        "idle",
        &format!("log = \"warn\"\n[limits]\njoin_timeout_ms = {JOIN_TIMEOUT_MS}\n"),
    );
    let fds_before = hub.hub.fd_count();
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(upgrade(&hub.hub.url).await.expect("an idle upgrade"));
    }
    let fds_held = hub.hub.fd_count();
    // While they are held, an honest agent joins and syncs.
    honest_sync(&hub.hub.url, "while-held").await;
    let until = tokio::time::Instant::now() + Duration::from_millis(JOIN_TIMEOUT_MS) + WAIT;
    let endings = futures_util::future::join_all(idle.into_iter().map(|ws| ended(ws, until))).await;
    let open = endings.iter().filter(|e| e.is_none()).count();
    eprintln!(
        "idle upgrades: {IDLE} opened (hub fds {fds_before} -> {fds_held}); {open} still open {} s after the {JOIN_TIMEOUT_MS} ms join timeout; hub fds now {}",
        WAIT.as_secs(),
        hub.hub.fd_count()
    );
    assert_eq!(open, 0, "{open} of {IDLE} idle upgrades were never closed");
    for (close, errors) in endings.into_iter().flatten() {
        assert_eq!(
            close.as_ref().map(|(c, r)| (*c, r.as_str())),
            Some((1008, "join_timeout")),
            "{close:?} {errors:?}"
        );
        assert!(
            errors.iter().any(|m| m.contains("send join")),
            "the error says what to do: {errors:?}"
        );
    }
    honest_sync(&hub.hub.url, "after").await;
    let mut hub = hub;
    hub.hub.assert_alive("after the idle upgrades");
}

// ---------------------------------------------------------------------------------
// Connections per address and per token
// ---------------------------------------------------------------------------------

const TOKENS: [&str; 5] = [
    "token-a-0123456789",
    "token-b-0123456789",
    "token-c-0123456789",
    "token-d-0123456789",
    "token-e-0123456789",
];

fn tokens_config(per_address: usize, per_token: usize) -> String {
    let mut c = format!(
        "log = \"warn\"\n[limits]\nconnections_per_address_max = {per_address}\nconnections_per_token_max = {per_token}\n"
    );
    for (i, t) in TOKENS.iter().enumerate() {
        c.push_str(&format!(
            "[[tokens]]\ntoken = \"{t}\"\nagent = \"agent-{i}\"\nrole = \"lead\"\n"
        ));
    }
    c
}

/// An upgrade that the hub accepts once the connections closed before are released
/// (retried within [`WAIT`]).
async fn upgrade_eventually(url: &str) -> Ws {
    let until = tokio::time::Instant::now() + WAIT;
    loop {
        match upgrade(url).await {
            Ok(ws) => return ws,
            Err(e) if tokio::time::Instant::now() < until => {
                eprintln!("retrying a refused upgrade: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the upgrade is still refused: {e}"),
        }
    }
}

/// One token may hold `connections_per_token_max` connections, one address
/// `connections_per_address_max`: the next upgrade is refused with HTTP 429 and the
/// reason, other tokens still get in (up to the address's bound), and a closed
/// connection frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_per_token_and_per_address_bounds_are_refused() {
    const PER_TOKEN: usize = 4;
    const PER_ADDRESS: usize = 10;
    let hub = LimitedHub::start("caps", &tokens_config(PER_ADDRESS, PER_TOKEN));
    let url = |t: &str| with_token(&hub.hub.url, t);
    let mut held = Vec::new();
    for _ in 0..PER_TOKEN {
        held.push(
            upgrade(&url(TOKENS[0]))
                .await
                .expect("within the token's bound"),
        );
    }
    let (status, body) = refused(upgrade(&url(TOKENS[0])).await);
    eprintln!("over the token's bound: {status} {body}");
    assert_eq!(status, 429, "{body}");
    assert!(body.starts_with("connections_per_token: "), "{body}");
    // Other tokens get in, up to the address's bound: 4 + 4 + 2.
    for _ in 0..PER_TOKEN {
        held.push(upgrade(&url(TOKENS[1])).await.expect("within the bounds"));
    }
    for _ in 0..PER_ADDRESS - 2 * PER_TOKEN {
        held.push(upgrade(&url(TOKENS[2])).await.expect("within the bounds"));
    }
    assert_eq!(held.len(), PER_ADDRESS);
    // TOKENS[2] holds 2 of its 4, but the address holds its 10.
    let (status, body) = refused(upgrade(&url(TOKENS[2])).await);
    eprintln!("over the address's bound: {status} {body}");
    assert_eq!(status, 429, "{body}");
    assert!(body.starts_with("connections_per_address: "), "{body}");
    // A closed connection frees its place under both bounds.
    let mut first = held.remove(0);
    first.close(None).await.unwrap();
    drop(first);
    held.push(upgrade_eventually(&url(TOKENS[0])).await);
    drop(held);
    let mut hub = hub;
    hub.hub.assert_alive("after the refusals");
}
