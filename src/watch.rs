//! `swarmtodo watch LIST`: a list as a live checklist in the terminal.
//!
//! It follows the list's event stream (a snapshot, then each event) and re-reads the list
//! after events that changed tasks (one read at a time; events that come during a read
//! ask for one more), so the rows are always a snapshot the hub answered, in list order.
//! When the stream breaks it reconnects with backoff from the last event it saw; the
//! stream's new snapshot replaces the list. The terminal is restored on quit, on error
//! and on panic; logs go to a file (`--log`), never to the terminal the view owns.

mod view;

use std::path::Path;
use std::time::Duration;

use ratatui::crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers};
use tokio::sync::mpsc;
use tokio::time::Instant;

use swarmtodo::client::http::{Api, HttpError, StreamItem};
use swarmtodo::proto::{ApiError, EventBody, Snapshot};
use view::{Link, Scroll, View};

/// The first wait before reconnecting; it doubles at each failed try.
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
/// The longest wait before reconnecting.
const BACKOFF_MAX: Duration = Duration::from_secs(8);
/// The wait before reading the list again after a read failed.
const READ_RETRY: Duration = Duration::from_secs(1);

/// What the network tasks tell the view.
#[derive(Debug)]
enum Net {
    /// The stream's snapshot or one of its events.
    Item(StreamItem),
    /// The stream broke; the next try is after `retry_in`.
    Lost { reason: String, retry_in: Duration },
    /// The hub refused the stream: nothing to retry.
    Refused(ApiError),
    /// The answer of a read made after events that changed tasks.
    Read(Result<Snapshot, HttpError>),
}

/// Restores the terminal when the view ends, however it ends (the panic hook of
/// `ratatui::try_init` covers panics).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// When to read the list again.
#[derive(Debug, Default)]
struct Reads {
    /// Events changed tasks since the last read started.
    wanted: bool,
    /// A read is on its way.
    running: bool,
    /// The stream brought a new snapshot while the read ran: its answer may be older.
    outdated: bool,
    /// After a failed read, not before this.
    not_before: Option<Instant>,
    /// The stream is open (reads wait for it while it reconnects).
    live: bool,
}

/// Runs the view until the user quits (`Ok(true)`), the hub refuses the stream, or the
/// terminal fails.
pub(crate) async fn run(api: Api, list: String, log: Option<&Path>) -> Result<bool, HttpError> {
    if let Some(path) = log {
        start_log(path)?;
    }
    let mut terminal = ratatui::try_init().map_err(|e| {
        // Whatever it had set up before it failed.
        let _ = ratatui::try_restore();
        HttpError::Transport(format!("the terminal: {e}"))
    })?;
    let _restore = Restore;
    let (net_tx, mut net) = mpsc::unbounded_channel();
    let follower = tokio::spawn(follow(api.clone(), list.clone(), net_tx.clone()));
    let (key_tx, mut keys) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        // Blocks on the terminal; ends with the process, or when the view is gone.
        while let Ok(e) = event::read() {
            if key_tx.send(e).is_err() {
                break;
            }
        }
    });
    let mut view = View::new(&list);
    let mut reads = Reads::default();
    let result = loop {
        if let Err(e) = terminal.draw(|f| view.draw(f)) {
            break Err(HttpError::Transport(format!("the terminal: {e}")));
        }
        let retry = reads.not_before.filter(|_| reads.wanted && !reads.running);
        tokio::select! {
            msg = net.recv() => {
                let Some(msg) = msg else { break Ok(true) };
                let mut taken = take(&mut view, &mut reads, msg);
                // Take whatever else has come before drawing again.
                while taken.is_ok() {
                    let Ok(msg) = net.try_recv() else { break };
                    taken = take(&mut view, &mut reads, msg);
                }
                if let Err(e) = taken {
                    break Err(e);
                }
            }
            key = keys.recv() => {
                let Some(key) = key else {
                    break Err(HttpError::Transport("the terminal closed".into()));
                };
                if quits(&key) {
                    break Ok(true);
                }
                if let Some(how) = scrolls(&key) {
                    view.scroll(how);
                }
            }
            () = sleep_until(retry), if retry.is_some() => reads.not_before = None,
        }
        let ready = reads.not_before.is_none_or(|t| Instant::now() >= t);
        if reads.wanted && !reads.running && reads.live && ready {
            reads.wanted = false;
            reads.running = true;
            reads.outdated = false;
            reads.not_before = None;
            let (api, list, tx) = (api.clone(), list.clone(), net_tx.clone());
            tokio::spawn(async move {
                let _ = tx.send(Net::Read(api.read(&list, None).await));
            });
        }
    };
    follower.abort();
    tracing::info!(list, "the view ends");
    result
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Takes one message from the network into the view; an error ends the view.
fn take(view: &mut View, reads: &mut Reads, msg: Net) -> Result<(), HttpError> {
    match msg {
        Net::Item(StreamItem::Snapshot(s)) => {
            tracing::info!(version = %s.version, tasks = s.tasks.len(), "stream open");
            view.set_link(Link::Live);
            view.set_snapshot(s);
            // The snapshot is newer than any event before it, and than a read running.
            reads.outdated = reads.running;
            reads.wanted = false;
            reads.live = true;
        }
        Net::Item(StreamItem::Event(e)) => {
            tracing::debug!(seq = e.seq, "event");
            if matches!(e.body, EventBody::TasksChanged { .. }) {
                reads.wanted = true;
            }
            view.note(&e);
        }
        Net::Lost { reason, retry_in } => {
            tracing::warn!(%reason, ?retry_in, "stream lost");
            reads.live = false;
            view.set_link(Link::Reconnecting {
                reason: format!("{reason}; next try in {retry_in:.1?}"),
            });
        }
        Net::Refused(e) => return Err(HttpError::Api(e)),
        Net::Read(answer) => {
            reads.running = false;
            match answer {
                Ok(s) if !reads.outdated => view.set_snapshot(s),
                Ok(_) => {}
                Err(HttpError::Api(e)) => return Err(HttpError::Api(e)),
                Err(e) => {
                    tracing::warn!(%e, "reading the list");
                    reads.wanted = true;
                    reads.not_before = Some(Instant::now() + READ_RETRY);
                }
            }
        }
    }
    Ok(())
}

/// Follows the list's event stream, resuming after the last event seen, until the hub
/// refuses it or the view is gone.
async fn follow(api: Api, list: String, tx: mpsc::UnboundedSender<Net>) {
    let mut last_seq = 0;
    let mut backoff = BACKOFF_FIRST;
    loop {
        let mut opened = false;
        let ended = api
            .events(&list, last_seq, None, |item| {
                match &item {
                    StreamItem::Snapshot(_) => opened = true,
                    StreamItem::Event(e) => last_seq = e.seq,
                }
                tx.send(Net::Item(item)).is_ok()
            })
            .await;
        if tx.is_closed() {
            return;
        }
        let reason = match ended {
            Ok(()) => "the hub closed the stream".to_owned(),
            Err(HttpError::Api(e)) => {
                let _ = tx.send(Net::Refused(e));
                return;
            }
            Err(HttpError::Transport(e)) => e,
        };
        if opened {
            backoff = BACKOFF_FIRST;
        }
        if tx
            .send(Net::Lost {
                reason,
                retry_in: backoff,
            })
            .is_err()
        {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// q, Esc and Ctrl-C quit.
fn quits(e: &TermEvent) -> bool {
    let TermEvent::Key(k) = e else { return false };
    k.kind == KeyEventKind::Press
        && match k.code {
            KeyCode::Char('q') | KeyCode::Esc => true,
            KeyCode::Char('c') => k.modifiers.contains(KeyModifiers::CONTROL),
            _ => false,
        }
}

fn scrolls(e: &TermEvent) -> Option<Scroll> {
    let TermEvent::Key(k) = e else { return None };
    if k.kind != KeyEventKind::Press {
        return None;
    }
    Some(match k.code {
        KeyCode::Up | KeyCode::Char('k') => Scroll::Up,
        KeyCode::Down | KeyCode::Char('j') => Scroll::Down,
        KeyCode::PageUp => Scroll::PageUp,
        KeyCode::PageDown | KeyCode::Char(' ') => Scroll::PageDown,
        KeyCode::Home | KeyCode::Char('g') => Scroll::Home,
        KeyCode::End | KeyCode::Char('G') => Scroll::End,
        _ => return None,
    })
}

/// Sends the logs to `path` (appended), filtered by `SWARMTODO_LOG` (default `info`).
fn start_log(path: &Path) -> Result<(), HttpError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| HttpError::Transport(format!("opening {}: {e}", path.display())))?;
    let filter = tracing_subscriber::EnvFilter::try_from_env("SWARMTODO_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .init();
    Ok(())
}
