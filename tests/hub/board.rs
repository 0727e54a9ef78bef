//! The board (the page the hub serves at `/`) in a real Chromium, against a real
//! `swarmtodo serve` with tokens: what another process writes appears on it, violations
//! show in its timeline, its buttons act as the token's agent, it polls nothing, it
//! resumes after the hub comes back, and it shows 5,000 tasks virtualised.
//!
//! `tests/js/board.mjs` (playwright-core driving /usr/bin/chromium) is the person at the
//! page; this test is the rest of the swarm, over HTTP. Figures (appearance latency,
//! first render) are printed and written to `target/board/board.json`; a screenshot to
//! `target/board/board.png` (the README's picture, `docs/board.png`, is one of them).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::common::*;
use crate::http::http;

/// How long the driver may take to answer one command (its own waits are shorter and
/// say what they awaited).
const ANSWER: Duration = Duration::from_secs(120);

/// `tests/js/board.mjs` and its Chromium. Dropped, it is told to close (the end of its
/// stdin: Chromium closes and its profile folder goes), and killed if it has not within
/// 5 s, or at once when the test is failing; by its parent-death signal it dies with the
/// test's thread too. Chromium exits when its driver's pipe closes.
struct Browser {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    chromium: String,
}

impl Browser {
    async fn start() -> Browser {
        let js = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js");
        assert!(
            js.join("node_modules/playwright-core").exists(),
            "playwright-core is not installed: run `npm install --prefix tests/js` (.ci/run does)"
        );
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        assert!(
            Path::new(&chromium).exists(),
            "no Chromium at {chromium}: `apt-get install chromium` (.ci/run does), or set CHROMIUM"
        );
        let mut child = dies_with_parent(&mut Command::new("node"))
            .arg(js.join("board.mjs"))
            .env("CHROMIUM", &chromium)
            .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node must be installed");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let stderr = BufReader::new(child.stderr.take().unwrap());
        // Into this test's captured output, shown if it fails.
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                eprintln!("board.mjs: {line}");
            }
        });
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut browser = Browser {
            child,
            stdin: Some(stdin),
            lines,
            chromium: String::new(),
        };
        let ready = browser.answer("starting Chromium").await;
        assert_eq!(ready["ready"], true, "{ready}");
        browser.chromium = ready["chromium"].as_str().unwrap_or("?").to_owned();
        browser
    }

    async fn answer(&mut self, what: &str) -> Value {
        let line = tokio::time::timeout(ANSWER, self.lines.recv())
            .await
            .unwrap_or_else(|_| panic!("board.mjs did not answer within {ANSWER:?}: {what}"))
            .unwrap_or_else(|| {
                let status = self.child.try_wait().ok().flatten();
                panic!("board.mjs ended ({status:?}) during: {what}")
            });
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("board.mjs printed no JSON ({e}): {line:?}"))
    }

    /// Sends one command; its answer, or a panic with the driver's error.
    async fn ask(&mut self, cmd: Value) -> Value {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").expect("write to board.mjs");
        stdin.flush().unwrap();
        let answer = self.answer(&cmd.to_string()).await;
        if answer["ok"] != true {
            panic!(
                "the board, at {cmd}:\n{}",
                answer["error"].as_str().unwrap_or(&answer.to_string())
            );
        }
        answer
    }

    async fn wait(&mut self, page: &str, selector: &str) -> Value {
        self.ask(json!({"cmd": "wait", "page": page, "selector": selector}))
            .await
    }

    /// Waits until task `id`'s row on the board shows `status`.
    async fn row_status(&mut self, id: &str, status: &str) {
        let selector = format!("#tasks .task[data-id=\"{id}\"][data-status=\"{status}\"]");
        self.wait("board", &selector).await;
    }

    /// Clicks the `action` button of task `id`'s row on the board.
    async fn click(&mut self, id: &str, action: &str) {
        self.ask(json!({"cmd": "click", "page": "board", "id": id, "action": action}))
            .await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !std::thread::panicking() && std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encodes everything but unreserved characters (for a URL fragment's values).
fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

/// The board's URL on `hub` for list `list`, with `token`.
fn board_url(hub: &HubProc, list: &str, token: &str) -> String {
    let addr = hub.url.trim_start_matches("ws://");
    format!("http://{addr}/#list={}&token={}", pct(list), pct(token))
}

/// Upserts `tasks` into `list` with `token`; the status and the answer.
async fn write_as(hub: &HubProc, token: &str, list: &str, tasks: &[Value]) -> (u16, Value) {
    let ops: Vec<Value> = tasks
        .iter()
        .map(|t| json!({"op": "upsert", "task": t}))
        .collect();
    let body = json!({"mode": "patch", "ops": ops}).to_string();
    let auth = format!("Bearer {token}");
    http(
        hub,
        "POST",
        &format!("/v1/lists/{}/todo_write", pct(list)),
        &[("Authorization", &auth)],
        &body,
    )
    .await
}

async fn lead_writes(hub: &HubProc, list: &str, tasks: &[Value]) {
    let (s, answer) = write_as(hub, LEAD_TOKEN, list, tasks).await;
    assert_eq!(s, 200, "the lead's write to {list}: {answer}");
}

async fn read_list(hub: &HubProc, list: &str) -> Value {
    let auth = format!("Bearer {LEAD_TOKEN}");
    let (s, read) = http(
        hub,
        "GET",
        &format!("/v1/lists/{}", pct(list)),
        &[("Authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(s, 200, "{read}");
    read
}

/// Where the figures and the screenshot go: `target/board/`.
fn out_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("board");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The board end to end, as a lead watching a swarm sees it: a list opened from the
/// URL fragment (its token moved out of the address bar into sessionStorage) goes live
/// with its rows, lists, agents and burndown; a task another process writes over HTTP
/// appears on its own (the latency is measured and reported, bounded at 5 s); a
/// worker's write to the lead's task is refused with `forbidden` and its `ownership`
/// violation shows in the timeline; the claim button claims as the token's agent (the
/// hub says so over HTTP), a key completes a task, buttons cancel and move one; filters by status and text show
/// only their tasks (a move under a filter is refused with a message); a live page starts no request while nothing happens (no
/// polling); after the hub dies and comes back on the same port and data, the page
/// resumes — a new write appears, no row is doubled, no event shown twice, and
/// `window.board.lastSeq` never goes back; a read of the list that reaches the page after
/// a newer change (held on its way back) does not undo it. Then 5,000 tasks: rendered in a fresh tab
/// (the time to first render is reported), with far fewer rows in the DOM than tasks,
/// and the last one shown once `#tasks` is scrolled to its end.
#[tokio::test]
async fn the_board_shows_a_live_list_acts_as_its_lead_and_shows_5000_tasks() {
    let (hub, dir) = hub_with_config("board", TOKENS_CONFIG);
    let config = dir.join("swarmtodo.toml");
    let db = dir.join("hub.db");
    let listen = hub.url.trim_start_matches("ws://").to_owned();
    let mut figures = serde_json::Map::new();

    // 1. The lead's plan: wendy's task in progress, one ready, one done, one waiting on
    // it, and one of the lead's own (pending: the lead holds nothing in progress, so the
    // board's claim is allowed).
    let auth = format!("Bearer {LEAD_TOKEN}");
    let (s, created) = http(
        &hub,
        "PUT",
        "/v1/lists/board",
        &[("Authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(s, 200, "{created}");
    lead_writes(
        &hub,
        "board",
        &[
            json!({"id": "t1", "content": "Write the parser", "owner": "wendy", "status": "in_progress"}),
            json!({"id": "t2", "content": "Write the tests"}),
            json!({"id": "t3", "content": "Read the issue", "owner": "lead", "status": "completed"}),
            json!({"id": "t4", "content": "Ship it", "blocked_by": ["t2"]}),
            json!({"id": "t5", "content": "Review the design", "owner": "lead"}),
        ],
    )
    .await;

    // 2. The page, opened on the list with the lead's token.
    let mut b = Browser::start().await;
    figures.insert("chromium".into(), json!(b.chromium));
    let opened = b
        .ask(json!({"cmd": "open", "page": "board", "url": board_url(&hub, "board", LEAD_TOKEN), "tasks": 5}))
        .await;
    assert_eq!(
        opened["token_in_href"], false,
        "the token stays in the address bar: {opened}"
    );
    assert_eq!(
        opened["token_in_session_storage"], true,
        "the token is not in sessionStorage: {opened}"
    );
    figures.insert(
        "first_render_ms_5_tasks".into(),
        opened["first_render_ms"].clone(),
    );
    for id in ["t1", "t2", "t3", "t4", "t5"] {
        b.wait("board", &format!("#tasks .task[data-id=\"{id}\"]"))
            .await;
    }
    b.row_status("t1", "in_progress").await;
    b.row_status("t3", "completed").await;
    let owner = b.wait("board", "#tasks .task[data-id=\"t1\"] .owner").await;
    assert!(owner["text"].as_str().unwrap().contains("wendy"), "{owner}");
    let content = b
        .wait("board", "#tasks .task[data-id=\"t2\"] .content")
        .await;
    assert!(
        content["text"]
            .as_str()
            .unwrap()
            .contains("Write the tests"),
        "{content}"
    );
    b.wait("board", "#lists [data-list=\"board\"]").await;
    b.wait("board", "#agents .agent[data-agent=\"lead\"]").await;
    b.wait("board", "#burndown svg").await;

    // 3. Another process writes a task: it appears without anything asked of the page.
    b.ask(json!({"cmd": "watch", "page": "board", "id": "t6"}))
        .await;
    let sent_at = now_ms();
    lead_writes(
        &hub,
        "board",
        &[json!({"id": "t6", "content": "Appear on the board"})],
    )
    .await;
    let written_at = now_ms();
    let appeared = b
        .ask(json!({"cmd": "written", "page": "board", "id": "t6", "sent_at": sent_at, "written_at": written_at, "timeout_ms": 5000}))
        .await;
    let appear_ms = appeared["ms_from_written"].as_f64().unwrap();
    let appear_from_request_ms = appeared["ms_from_sent"].as_f64().unwrap();
    println!(
        "board: a task written over HTTP is on the board {appear_ms:.1} ms after the write's \
         answer ({appear_from_request_ms:.1} ms after its request was sent)"
    );
    figures.insert("appear_ms".into(), json!(appear_ms));
    figures.insert(
        "appear_from_request_ms".into(),
        json!(appear_from_request_ms),
    );
    assert!(
        appear_from_request_ms < 5000.0,
        "{appear_from_request_ms} ms"
    );

    // 4. A worker writes to the lead's task: refused, and reported in the timeline.
    let (s, e) = write_as(
        &hub,
        WORKER_TOKEN,
        "board",
        &[json!({"id": "t5", "status": "completed"})],
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (403, Some("forbidden")), "{e}");
    let violation = b
        .ask(json!({"cmd": "wait", "page": "board", "selector": "#timeline .event[data-kind=\"violation\"]", "text": "ownership"}))
        .await;
    println!("board: the timeline says {}", violation["text"]);
    b.wait("board", "#agents .agent[data-agent=\"wendy\"]")
        .await;
    b.row_status("t5", "pending").await;

    // 5. The lead claims the ready task from the page.
    b.click("t2", "claim").await;
    b.row_status("t2", "in_progress").await;
    let list = read_list(&hub, "board").await;
    let t2 = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "t2")
        .unwrap_or_else(|| panic!("no t2: {list}"));
    assert_eq!(
        (t2["status"].as_str(), t2["owner"].as_str()),
        (Some("in_progress"), Some("lead")),
        "{t2}"
    );
    b.wait("board", "#timeline .event[data-kind=\"claimed\"]")
        .await;
    // By keyboard: the fifth task (t5, the lead's) completed; by its buttons, t6
    // cancelled and moved up, before t5.
    b.ask(json!({"cmd": "keys", "page": "board", "keys": ["Home", "j", "j", "j", "j", "d"]}))
        .await;
    b.row_status("t5", "completed").await;
    b.click("t6", "cancel").await;
    b.row_status("t6", "cancelled").await;
    b.click("t6", "up").await;
    b.wait("board", "#tasks .task[data-id=\"t6\"][data-index=\"4\"]")
        .await;
    let list = read_list(&hub, "board").await;
    let seen: Vec<(&str, &str)> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [
            ("t1", "in_progress"),
            ("t2", "in_progress"),
            ("t3", "completed"),
            ("t4", "pending"),
            ("t6", "cancelled"),
            ("t5", "completed"),
        ],
        "the hub's list after the page's keys and buttons"
    );
    // The burndown ends at the list as it is.
    b.wait(
        "board",
        "#burndown svg[aria-label$=\"now 2 completed, 1 cancelled, 2 in progress, 0 blocked, 1 pending\"]",
    )
    .await;
    let state = b.ask(json!({"cmd": "state", "page": "board"})).await;
    assert_eq!(state["toast"], Value::Null, "an error shown: {state}");
    // Filters: the tasks in progress, then those whose text says "parser" (a filter's
    // rows are the only ones drawn; moving needs the whole list and says so), then all.
    b.ask(json!({"cmd": "press", "page": "board", "selector": "#filter button[data-filter=\"in_progress\"]"}))
        .await;
    b.wait("board", "body[data-shown=\"2\"][data-tasks=\"6\"]")
        .await;
    b.ask(json!({"cmd": "fill", "page": "board", "selector": "#search", "text": "parser"}))
        .await;
    b.wait(
        "board",
        "body[data-shown=\"1\"] #tasks .task[data-id=\"t1\"]",
    )
    .await;
    b.click("t1", "up").await;
    b.ask(json!({"cmd": "wait", "page": "board", "selector": "#toast", "text": "whole list"}))
        .await;
    b.ask(json!({"cmd": "fill", "page": "board", "selector": "#search", "text": ""}))
        .await;
    b.ask(
        json!({"cmd": "press", "page": "board", "selector": "#filter button[data-filter=\"all\"]"}),
    )
    .await;
    b.wait("board", "body[data-shown=\"6\"]").await;

    // 6. Nothing happens: the page asks nothing (it is told, it does not poll). What the
    // last events still cause (the page reads the list once, a moment after a new task,
    // for its order) is let settle first: any polling every 2.5 s or more often keeps it
    // from settling, and any up to 5.5 s shows in the count.
    let idle = b
        .ask(json!({"cmd": "idle", "page": "board", "ms": 3000}))
        .await;
    assert_eq!(idle["requests"], 0, "requests while idle: {idle}");
    println!(
        "board: 0 requests in 3 s idle (settled after {} ms; meanwhile {})",
        idle["settle_ms"], idle["while_settling"]
    );
    figures.insert("idle_requests_3s".into(), idle["requests"].clone());

    // 7. The hub dies; the page says so; the hub comes back on the same port and data;
    // the page resumes where it was.
    let before = b.ask(json!({"cmd": "state", "page": "board"})).await;
    hub.kill9();
    b.wait("board", "body:not([data-stream=\"live\"])").await;
    let down = b.ask(json!({"cmd": "state", "page": "board"})).await;
    println!(
        "board: with the hub gone the page shows data-stream={}",
        down["dataset"]["stream"]
    );
    let hub = HubProc::start_with(&db, &listen, &["--config", config.to_str().unwrap()]);
    lead_writes(
        &hub,
        "board",
        &[json!({"id": "t7", "content": "Written after the restart"})],
    )
    .await;
    b.ask(json!({"cmd": "wait", "page": "board", "selector": "#tasks .task[data-id=\"t7\"]", "timeout_ms": 30000}))
        .await;
    b.wait("board", "body[data-stream=\"live\"][data-tasks=\"7\"]")
        .await;
    let after = b.ask(json!({"cmd": "state", "page": "board"})).await;
    assert_eq!(after["duplicates"], json!([]), "rows doubled: {after}");
    assert_eq!(after["rows"].as_array().unwrap().len(), 7, "{after}");
    assert_eq!(
        after["seq_decreases"],
        json!([]),
        "window.board.lastSeq went back: {after}"
    );
    assert!(
        after["last_seq"].as_u64() > before["last_seq"].as_u64(),
        "lastSeq did not grow: {} then {}",
        before["last_seq"],
        after["last_seq"]
    );
    for kind in ["violation", "claimed"] {
        assert_eq!(
            after["timeline"][kind], before["timeline"][kind],
            "{kind} events shown again after resuming: {before} then {after}"
        );
    }

    // 8. The picture.
    let out = out_dir();
    let png = out.join("board.png");
    b.ask(json!({"cmd": "screenshot", "page": "board", "path": png}))
        .await;
    println!("board: screenshot {}", png.display());

    // 8b. A read that comes back after newer events does not undo them. The page reads
    // the list for its order after a new task; that read's answer is held 1.5 s on its
    // way back (a slow network), and meanwhile the task is completed: the stream shows
    // it completed, and the older answer, once in, does not put it back to pending.
    b.ask(json!({"cmd": "hold", "page": "board", "path": "/v1/lists/board", "ms": 1500}))
        .await;
    lead_writes(
        &hub,
        "board",
        &[json!({"id": "t8", "content": "Outrun a read"})],
    )
    .await;
    b.ask(json!({"cmd": "held", "page": "board", "answered": 1}))
        .await;
    lead_writes(&hub, "board", &[json!({"id": "t8", "status": "completed"})]).await;
    b.row_status("t8", "completed").await;
    b.ask(json!({"cmd": "held", "page": "board", "delivered": 1}))
        .await;
    b.ask(json!({"cmd": "steady", "page": "board", "selector": "#tasks .task[data-id=\"t8\"][data-status=\"completed\"]", "ms": 2000}))
        .await;
    b.ask(json!({"cmd": "hold", "page": "board", "path": "/v1/lists/board", "ms": 0}))
        .await;

    // 9. 5,000 tasks, in one write (WRITE_OPS_MAX and LIST_TASKS_MAX are 10,000; the
    // body is about 0.4 MiB of the 8 MiB allowed).
    const BIG: usize = 5_000;
    let tasks: Vec<Value> = (0..BIG)
        .map(|i| json!({"id": format!("b{i:04}"), "content": format!("Task {i} of the big list")}))
        .collect();
    lead_writes(&hub, "big", &tasks).await;
    let big = b
        .ask(json!({"cmd": "open", "page": "big", "url": board_url(&hub, "big", LEAD_TOKEN), "tasks": BIG, "timeout_ms": 30000}))
        .await;
    let first_render_ms = big["first_render_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("no window.board.firstRenderMs: {big}"));
    println!("board: 5,000 tasks rendered {first_render_ms:.1} ms after navigation start");
    figures.insert("first_render_ms_5000_tasks".into(), json!(first_render_ms));
    let rows = big["rows"].as_u64().unwrap();
    figures.insert("rows_in_dom_5000_tasks".into(), json!(rows));
    assert!(
        (1..500).contains(&rows),
        "{rows} rows in the DOM for 5,000 tasks: not virtualised"
    );
    let end = b
        .ask(json!({"cmd": "scroll_end", "page": "big", "id": format!("b{:04}", BIG - 1)}))
        .await;
    assert_eq!(end["visible"], true, "the last row is not in view: {end}");
    assert!(end["rows_after"].as_u64().unwrap() < 500, "{end}");

    figures.insert(
        "build".into(),
        json!(if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }),
    );
    let report = out.join("board.json");
    std::fs::write(
        &report,
        serde_json::to_string_pretty(&Value::Object(figures)).unwrap() + "\n",
    )
    .unwrap();
    println!("board: figures in {}", report.display());
    drop(b);
    drop(hub);
}
