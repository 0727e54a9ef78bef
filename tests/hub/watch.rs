//! `swarmtodo watch` in a real terminal: tmux runs it at a fixed size against a real
//! hub, and its screen (`tmux capture-pane`) follows the list while other processes
//! claim and complete tasks, the hub is killed and restarted, and a sync peer breaks
//! the one-task-in-progress rule. tmux must be installed (`.ci/run` installs it).

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cli::cli;
use crate::common::*;
use swarmtodo::client::{list_document_id, Connection};
use swarmtodo::model::TodoList;
use swarmtodo::proto::{Status, TaskPatch};

/// How long the screen may take to show a change (a debug build on a busy machine).
const SCREEN_DEADLINE: Duration = Duration::from_secs(20);
/// How often the screen is read while waiting.
const SCREEN_POLL: Duration = Duration::from_millis(100);

/// A tmux server of this test's own (its socket in the test's scratch folder), killed
/// when dropped: at the end, and on a failed assertion too.
struct Tmux {
    socket: std::path::PathBuf,
    /// The log file of the `watch` it runs, shown when the screen is not what it should be.
    log: std::path::PathBuf,
}

impl Tmux {
    /// Starts `swarmtodo watch LIST` in a detached 120×40 session, as `agent` on `hub`.
    /// When `watch` exits, the pane says so (`watch exited: CODE`) and stays.
    fn watch(hub: &HubProc, agent: &str, list: &str, dir: &std::path::Path) -> Tmux {
        let tmux = Tmux {
            socket: dir.join("tmux.sock"),
            log: dir.join("watch.log"),
        };
        // Bounded: a test binary killed before its drops leaves nothing running for long.
        let shell = format!(
            "timeout --foreground 300 '{}' watch '{list}' --log '{}'; echo \"watch exited: $?\"; sleep 300",
            env!("CARGO_BIN_EXE_swarmtodo"),
            tmux.log.display()
        );
        let out = tmux
            .command(&[
                "new-session",
                "-d",
                "-s",
                "watch",
                "-x",
                "120",
                "-y",
                "40",
                &shell,
            ])
            .env("SWARMTODO_HUB", &hub.url)
            .env("SWARMTODO_AGENT", agent)
            .env("SWARMTODO_LOG", "debug")
            .env_remove("SWARMTODO_TOKEN")
            .output()
            .expect("tmux must be installed (.ci/run installs it)");
        assert!(out.status.success(), "tmux new-session: {out:?}");
        tmux
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("tmux");
        // No configuration of the machine's, and not nested in a tmux the test runs in.
        c.arg("-S")
            .arg(&self.socket)
            .args(["-f", "/dev/null"])
            .args(args)
            .env_remove("TMUX");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run tmux")
    }

    /// The screen as text; with `escapes`, with its colours and attributes.
    fn screen(&self, escapes: bool) -> String {
        let mut args = vec!["capture-pane", "-p", "-t", "watch"];
        if escapes {
            args.push("-e");
        }
        let out = self.run(&args);
        assert!(out.status.success(), "tmux capture-pane: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Reads the screen until `ok` holds, and returns it; fails after
    /// [`SCREEN_DEADLINE`] with the last screen and the watch's log.
    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + SCREEN_DEADLINE;
        loop {
            let screen = self.screen(false);
            if ok(&screen) {
                return screen;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!(
                    "the screen did not show {what} within {SCREEN_DEADLINE:?}:\n{screen}\nwatch's log:\n{log}"
                );
            }
            std::thread::sleep(SCREEN_POLL);
        }
    }

    fn keys(&self, keys: &str) {
        let out = self.run(&["send-keys", "-t", "watch", keys]);
        assert!(out.status.success(), "tmux send-keys: {out:?}");
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The screen's line that holds `text`.
fn line_of<'s>(screen: &'s str, text: &str) -> Option<&'s str> {
    screen.lines().find(|l| l.contains(text))
}

/// Whether the line (with escapes) turns strikethrough on (SGR 9) before `text`.
fn struck_before(line: &str, text: &str) -> bool {
    let Some(end) = line.find(text) else {
        return false;
    };
    line[..end].split("\x1b[").skip(1).any(|seq| {
        seq.split_once('m')
            .is_some_and(|(params, _)| params.split(';').any(|p| p == "9"))
    })
}

/// Writes `ops` (a patch) to `list` as `agent`.
fn patch_as(hub: &HubProc, dir: &std::path::Path, agent: &str, list: &str, ops: serde_json::Value) {
    let file = dir.join("ops.json");
    std::fs::write(&file, ops.to_string()).unwrap();
    let o = cli(
        hub,
        agent,
        &["write", list, "--patch", file.to_str().unwrap()],
        "",
    );
    assert!(o.status.success(), "{o:?}");
}

fn claim_as(hub: &HubProc, agent: &str, list: &str, task: &str) {
    let o = cli(hub, agent, &["claim", list, task], "");
    assert!(o.status.success(), "{o:?}");
}

#[test]
fn watch_shows_a_list_live_in_a_terminal() {
    let dir = scratch("watch");
    let db = dir.join("hub.db");
    let hub = HubProc::start(&db);
    let listen = hub.url.trim_start_matches("ws://").to_owned();
    patch_as(
        &hub,
        &dir,
        "lead",
        "board",
        json!([
            {"op": "upsert", "task": {"id": "t1", "content": "Write the parser", "active_form": "Writing the parser"}},
            {"op": "upsert", "task": {"id": "t2", "content": "Write the tests", "active_form": "Writing the tests"}},
            {"op": "upsert", "task": {"id": "t3", "content": "Ship it", "blocked_by": ["t1"]}},
            {"op": "upsert", "task": {"id": "t4", "content": "Drop the old API", "status": "cancelled"}},
        ]),
    );

    let tmux = Tmux::watch(&hub, "viewer", "board", &dir);
    let screen = tmux.wait_for("the list, pending", |s| {
        s.contains("board")
            && s.contains("live")
            && s.contains("[ ] Write the parser  (t1)")
            && s.contains("[ ] Ship it  (t3) ← t1")
            && s.contains("[-] Drop the old API  (t4)")
    });
    assert!(
        screen.contains("4 tasks: 3 pending, 0 in progress, 0 completed, 1 cancelled"),
        "{screen}"
    );

    // Another process claims t1: in progress, its active form and its owner.
    claim_as(&hub, "worker-1", "board", "t1");
    tmux.wait_for("t1 in progress, worker-1's", |s| {
        line_of(s, "(t1)").is_some_and(|l| l.contains("[>] Writing the parser  (t1) @worker-1"))
            && s.contains("worker-1 took t1")
    });

    // And completes it: checked, struck through; t3 is ready.
    patch_as(
        &hub,
        &dir,
        "worker-1",
        "board",
        json!([{"op": "upsert", "task": {"id": "t1", "status": "completed"}}]),
    );
    tmux.wait_for("t1 completed, t3 unblocked", |s| {
        s.contains("[x] Write the parser  (t1)") && s.contains("t3 is ready to claim")
    });
    let coloured = tmux.screen(true);
    let row = line_of(&coloured, "(t1)").unwrap();
    assert!(struck_before(row, "Write the parser"), "{row:?}");

    // The hub dies: the view says so, and picks up where it was once the hub is back.
    hub.kill9();
    tmux.wait_for("reconnecting", |s| s.contains("reconnecting"));
    let hub = HubProc::start_at(&db, &listen);
    claim_as(&hub, "worker-2", "board", "t3");
    let screen = tmux.wait_for("t3 claimed after the restart", |s| {
        s.contains("[>] Ship it  (t3) @worker-2") && s.contains("live")
    });
    assert_eq!(
        screen.matches("worker-1 took t1").count(),
        1,
        "resumed after the last event seen, not from the start: {screen}"
    );

    // A sync peer, behind the hub, starts a second task for worker-1 while worker-1
    // claims t2 over HTTP: the authority reports the violation and repairs the list.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let doc = list_document_id("board");
    let mut peer = TodoList::create(actor(7));
    let mut conn = runtime.block_on(async {
        let mut conn = Connection::connect(&hub.url, "sub-a").await.unwrap();
        conn.sync(doc, &mut peer).await.unwrap();
        conn
    });
    assert_eq!(peer.read().tasks.len(), 4);
    claim_as(&hub, "worker-1", "board", "t2");
    write(
        &mut peer,
        "sub-a",
        patch(vec![upsert(TaskPatch {
            owner: Some(Some("worker-1".into())),
            status: Some(Status::InProgress),
            ..task("t5", "Hotfix the release")
        })]),
    );
    runtime.block_on(conn.sync(doc, &mut peer)).unwrap();
    let screen = tmux.wait_for("the violation and its repair", |s| {
        s.contains("violation") && s.contains("single_active") && s.contains("repaired")
    });
    assert!(screen.contains("(t5)"), "{screen}");

    // q quits, and the terminal is given back.
    tmux.keys("q");
    tmux.wait_for("watch's exit", |s| s.contains("watch exited: 0"));
    drop(tmux);
    drop(hub);
}
