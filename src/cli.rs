//! The commands that reach a hub's JSON API (`lists`, `read`, `history`, `write`,
//! `claim`, `wait`, `events`, `watch`), for people and shell-driven agents. Hub, token
//! and agent come from flags or `SWARMTODO_HUB`, `SWARMTODO_TOKEN`, `SWARMTODO_AGENT`.

use std::io::{Read, Write};
use std::path::PathBuf;

use swarmtodo::client::http::{Api, HttpError, StreamItem};
use swarmtodo::proto::{projection, Snapshot, Status};

/// The id of the Codex `todo_list` item `read` and `events` print (Codex numbers its
/// items `item_N`; one list is one item).
const CODEX_ITEM_ID: &str = "item_0";

/// Exit codes of the API commands.
pub(crate) const EXIT_OK: i32 = 0;
/// The hub refused the call (its code and message on stderr; with `--json`, the error
/// as JSON on stdout).
pub(crate) const EXIT_REFUSED: i32 = 1;
/// The hub could not be reached, or the input could not be read.
pub(crate) const EXIT_UNREACHABLE: i32 = 3;

/// What every API command takes.
#[derive(Debug, clap::Args)]
pub(crate) struct HubArgs {
    /// The hub (`http://HOST:PORT`; its `ws://` URL works too).
    #[arg(long, env = "SWARMTODO_HUB", default_value = "http://127.0.0.1:7700")]
    hub: String,
    /// The token, on a hub with tokens.
    #[arg(long, env = "SWARMTODO_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The agent to act as, on a hub without tokens.
    #[arg(long, env = "SWARMTODO_AGENT")]
    agent: Option<String>,
    /// Print JSON (what a program reads) instead of text.
    #[arg(long)]
    json: bool,
}

/// How `read` and `events` print a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// `read`: a checklist for people; `events`: JSON lines.
    Text,
    /// The snapshot, and events, as swarmtodo's JSON.
    Json,
    /// A Markdown checklist (for chat surfaces); `events`: one per change.
    Markdown,
    /// ACP `session/update` plan notifications (JSON-RPC lines; session = the list's
    /// name), with what ACP cannot say in `_meta`.
    Acp,
    /// The Codex exec JSONL `todo_list` item: `item.started`, `item.updated` per change,
    /// `item.completed` at the end.
    Codex,
}

/// The API commands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ApiCommand {
    /// Print every list of the hub: its name, tasks by status and version (with
    /// `--json`, one JSON array of them).
    Lists {
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Print a list: a checklist, or its snapshot as JSON.
    Read {
        /// The list.
        list: String,
        /// The list as it was at this version.
        #[arg(long)]
        version: Option<String>,
        /// How to print it (`--json` is `--format json`).
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Write to a list (`todo_write`), answered once durable: a whole request on stdin
    /// (`-`), the tasks of a replace (`--replace FILE`: a JSON array) or the ops of a
    /// patch (`--patch FILE`: a JSON array).
    Write {
        /// The list (created by the first write).
        list: String,
        /// A JSON array of tasks: the list becomes these.
        #[arg(long, conflicts_with_all = ["patch", "stdin"])]
        replace: Option<PathBuf>,
        /// A JSON array of patch ops.
        #[arg(long, conflicts_with = "stdin")]
        patch: Option<PathBuf>,
        /// `-`: read a whole `todo_write` request from stdin.
        #[arg(value_name = "-", value_parser = clap::builder::PossibleValuesParser::new(["-"]))]
        stdin: Option<String>,
        /// Refuse the write unless the list is at this version (compare-and-set).
        #[arg(long)]
        expected_version: Option<String>,
        /// For a replace: the version the tasks were read at (tasks others added since
        /// stay).
        #[arg(long)]
        base_version: Option<String>,
        /// Why (recorded with the change).
        #[arg(long)]
        explanation: Option<String>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Print who changed a task's fields to what, when and why, oldest first (from the
    /// list's history).
    History {
        /// The list.
        list: String,
        /// The task.
        task: String,
        /// Only the latest this many changes (at most 500).
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Claim a task: the one named, or the first ready one; it becomes yours and
    /// in progress.
    Claim {
        /// The list.
        list: String,
        /// The task.
        task: Option<String>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Hand a task to a subagent, who works it as a list of its own: the task becomes
    /// the agent's and its status follows that list's (all done: completed; one in
    /// progress: in progress; else blocked or pending). Prints the new list's name, and
    /// on a hub with tokens the agent's new worker token (with `--json`, the answer).
    Delegate {
        /// The list the task is in.
        list: String,
        /// The task.
        task: String,
        /// The agent that takes it.
        #[arg(long)]
        to: String,
        /// The name of its new list (default `LIST/TASK`).
        #[arg(long = "as")]
        as_list: Option<String>,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Wait until every agent syncing the list holds a version (exit 0), or the timeout
    /// passes (exit 1, naming those that do not).
    Wait {
        /// The list.
        list: String,
        /// The version (from a write's answer).
        version: String,
        /// Give up after this many milliseconds (at most 60,000).
        #[arg(long, default_value_t = 10_000)]
        timeout_ms: u64,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Print a list's events as JSON lines (the snapshot first), from a seq.
    Events {
        /// The list.
        list: String,
        /// Print the events after this seq (0: all).
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Keep following new events; without it, stop at the last one stored.
        #[arg(long)]
        follow: bool,
        /// How to print them: JSON lines of events, or the list after each change as
        /// Markdown, ACP plan updates or the Codex `todo_list` item lifecycle.
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Show a list live in the terminal: a checklist that follows the list's events,
    /// with the latest violations, conflicts, repairs, claims, expired leases and
    /// unblocked tasks below (q, Esc or Ctrl-C quits; arrows, PgUp, PgDn, Home and End
    /// scroll).
    Watch {
        /// The list.
        list: String,
        /// Append logs to this file (the terminal belongs to the view); `SWARMTODO_LOG`
        /// filters them.
        #[arg(long)]
        log: Option<PathBuf>,
        #[command(flatten)]
        hub: HubArgs,
    },
}

/// Runs an API command; its exit code.
pub(crate) fn run(cmd: ApiCommand) -> i32 {
    if let ApiCommand::Watch { hub, .. } = &cmd {
        if hub.json {
            clap::Error::raw(
                clap::error::ErrorKind::ArgumentConflict,
                "watch draws a terminal view: `swarmtodo events LIST --follow` prints the events as JSON lines\n",
            )
            .exit();
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("swarmtodo: {e}");
            return EXIT_UNREACHABLE;
        }
    };
    let json = match &cmd {
        ApiCommand::Lists { hub }
        | ApiCommand::Read { hub, .. }
        | ApiCommand::History { hub, .. }
        | ApiCommand::Write { hub, .. }
        | ApiCommand::Claim { hub, .. }
        | ApiCommand::Delegate { hub, .. }
        | ApiCommand::Wait { hub, .. }
        | ApiCommand::Events { hub, .. }
        | ApiCommand::Watch { hub, .. } => hub.json,
    };
    match runtime.block_on(call(cmd)) {
        Ok(true) => EXIT_OK,
        Ok(false) => EXIT_REFUSED,
        Err(HttpError::Api(e)) => {
            if json {
                println!("{}", serde_json::to_string(&e).unwrap_or_default());
            }
            eprintln!(
                "swarmtodo: {} — {}",
                serde_json::to_value(e.code)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                e.message
            );
            EXIT_REFUSED
        }
        Err(HttpError::Transport(e)) => {
            eprintln!("swarmtodo: {e}");
            EXIT_UNREACHABLE
        }
    }
}

fn api(hub: &HubArgs) -> Result<Api, HttpError> {
    let mut api = Api::new(&hub.hub)?;
    if let Some(t) = &hub.token {
        api = api.token(t);
    }
    if let Some(a) = &hub.agent {
        api = api.agent(a);
    }
    Ok(api)
}

fn print_json<T: serde::Serialize>(value: &T) {
    println!("{}", serde_json::to_string(value).unwrap_or_default());
}

/// A list as a checklist: `[x]` completed, `[>]` in progress (with its active form and
/// owner), `[ ]` pending, `[-]` cancelled, `[!]` blocked.
pub(crate) fn checklist(s: &Snapshot) -> String {
    let mut out = String::new();
    for t in &s.tasks {
        let mark = match t.status {
            Status::Completed => "[x]",
            Status::InProgress => "[>]",
            Status::Pending => "[ ]",
            Status::Cancelled => "[-]",
            Status::Blocked => "[!]",
        };
        let text = match (&t.status, &t.active_form) {
            (Status::InProgress, Some(active)) => active.as_str(),
            _ => t.content.as_str(),
        };
        out.push_str(&format!("{mark} {text}  ({})", t.id));
        if let Some(owner) = &t.owner {
            out.push_str(&format!(" @{owner}"));
        }
        if !t.blocked_by.is_empty() {
            out.push_str(&format!(" after {}", t.blocked_by.join(", ")));
        }
        out.push('\n');
    }
    out.push_str(&format!("version {}\n", s.version));
    out
}

fn read_file(path: &PathBuf) -> Result<serde_json::Value, HttpError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| HttpError::Transport(format!("reading {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| HttpError::Transport(format!("{} is not JSON: {e}", path.display())))
}

/// Runs a command; false when it did not get what it asked (a wait that timed out).
async fn call(cmd: ApiCommand) -> Result<bool, HttpError> {
    match cmd {
        ApiCommand::Lists { hub } => {
            let api = api(&hub)?;
            let mut lists = Vec::new();
            let mut after = None;
            loop {
                let page = api.lists(after.as_deref()).await?;
                lists.extend(page.lists);
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            if hub.json {
                print_json(&lists);
            } else {
                for l in &lists {
                    let t = &l.tasks;
                    println!(
                        "{}  {} pending, {} in progress, {} completed, {} cancelled, {} blocked",
                        l.name.as_deref().unwrap_or(&l.document),
                        t.pending,
                        t.in_progress,
                        t.completed,
                        t.cancelled,
                        t.blocked
                    );
                }
            }
        }
        ApiCommand::Read {
            list: name,
            version,
            format,
            hub,
        } => {
            let s = api(&hub)?.read(&name, version.as_deref()).await?;
            match (format, hub.json) {
                (Format::Json, _) | (Format::Text, true) => print_json(&s),
                (Format::Text, false) => print!("{}", checklist(&s)),
                (Format::Markdown, _) => print!("{}", projection::markdown(&s)),
                (Format::Acp, _) => print_json(&projection::acp_session_update(&s, &name)),
                (Format::Codex, _) => {
                    let mut item = projection::CodexTodoList::new(CODEX_ITEM_ID);
                    if let Some(line) = item.next(&s) {
                        print_json(&line);
                    }
                    if let Some(line) = item.finish() {
                        print_json(&line);
                    }
                }
            }
        }
        ApiCommand::Write {
            list,
            replace,
            patch,
            stdin,
            expected_version,
            base_version,
            explanation,
            hub,
        } => {
            let mut request = match (replace, patch, stdin) {
                (Some(file), _, _) => {
                    serde_json::json!({"mode": "replace", "tasks": read_file(&file)?})
                }
                (_, Some(file), _) => {
                    serde_json::json!({"mode": "patch", "ops": read_file(&file)?})
                }
                (_, _, Some(_)) => {
                    let mut text = String::new();
                    std::io::stdin()
                        .read_to_string(&mut text)
                        .map_err(|e| HttpError::Transport(format!("reading stdin: {e}")))?;
                    serde_json::from_str(&text)
                        .map_err(|e| HttpError::Transport(format!("stdin is not JSON: {e}")))?
                }
                _ => return Err(HttpError::Transport(
                    "say what to write: --replace FILE, --patch FILE, or - (a request on stdin)"
                        .into(),
                )),
            };
            if let Some(obj) = request.as_object_mut() {
                for (key, value) in [
                    ("expected_version", expected_version),
                    ("base_version", base_version),
                    ("explanation", explanation),
                ] {
                    if let Some(v) = value {
                        obj.insert(key.into(), v.into());
                    }
                }
            }
            let answer = api(&hub)?.write(&list, &request.to_string()).await?;
            if hub.json {
                print_json(&answer);
            } else {
                let r = &answer.result;
                println!(
                    "{} created, {} updated, {} removed",
                    r.created.len(),
                    r.updated.len(),
                    r.removed.len()
                );
                print!("{}", checklist(&answer.snapshot));
            }
        }
        ApiCommand::History {
            list,
            task,
            limit,
            hub,
        } => {
            let h = api(&hub)?.history(&list, &task, limit).await?;
            if hub.json {
                print_json(&h);
            } else {
                if h.total > h.entries.len() as u64 {
                    println!("(the latest {} of {} changes)", h.entries.len(), h.total);
                }
                for e in &h.entries {
                    let fields: Vec<String> = e
                        .fields
                        .iter()
                        .map(|f| format!("{}: {} → {}", f.field, f.before, f.after))
                        .collect();
                    println!(
                        "{} {} {}{}",
                        swarmtodo::utc(e.at_ms),
                        e.agent.as_deref().unwrap_or("?"),
                        fields.join("; "),
                        e.explanation
                            .as_deref()
                            .map(|x| format!("  ({x})"))
                            .unwrap_or_default()
                    );
                }
            }
        }
        ApiCommand::Claim { list, task, hub } => {
            let answer = api(&hub)?.claim(&list, task.as_deref()).await?;
            if hub.json {
                print_json(&answer);
            } else {
                println!("claimed {}: {}", answer.task.id, answer.task.content);
            }
        }
        ApiCommand::Wait {
            list,
            version,
            timeout_ms,
            hub,
        } => {
            let answer = api(&hub)?.wait(&list, &version, timeout_ms).await?;
            if hub.json {
                print_json(&answer);
            } else if answer.acknowledged {
                println!("every agent holds {}", answer.version);
            } else {
                println!("not yet held by: {}", answer.pending.join(", "));
            }
            return Ok(answer.acknowledged);
        }
        ApiCommand::Delegate {
            list,
            task,
            to,
            as_list,
            hub,
        } => {
            let d = api(&hub)?
                .delegate(&list, &task, &to, as_list.as_deref())
                .await?;
            if hub.json {
                print_json(&d);
            } else {
                println!(
                    "{}:{} is {}'s, as list {}",
                    d.parent, d.task.id, d.agent, d.list
                );
                if let Some(t) = &d.token {
                    println!("token for {}: {t}", d.agent);
                }
            }
        }
        ApiCommand::Events {
            list: name,
            from,
            follow,
            format,
            hub,
        } => {
            // Without --follow, the stream is read until it goes quiet for this long.
            const QUIET: std::time::Duration = std::time::Duration::from_millis(500);
            let mut out = std::io::stdout().lock();
            let mut view: Option<Snapshot> = None;
            let mut codex = projection::CodexTodoList::new(CODEX_ITEM_ID);
            api(&hub)?
                .events(&name, from, (!follow).then_some(QUIET), |item| {
                    if matches!(format, Format::Text | Format::Json) {
                        let line = match &item {
                            StreamItem::Snapshot(s) => {
                                serde_json::json!({"kind": "snapshot", "snapshot": s})
                            }
                            StreamItem::Event(e) => serde_json::to_value(e).unwrap_or_default(),
                        };
                        return writeln!(out, "{line}").is_ok();
                    }
                    // The list after each change, in the projection asked for.
                    match item {
                        StreamItem::Snapshot(s) => view = Some(s),
                        StreamItem::Event(e) => match &mut view {
                            Some(v) if e.body.kind() == "tasks_changed" => {
                                projection::apply(v, &e.body)
                            }
                            _ => return true,
                        },
                    }
                    let Some(v) = &view else { return true };
                    let text = match format {
                        Format::Markdown => format!("{}\n", projection::markdown(v)),
                        Format::Acp => format!("{}\n", projection::acp_session_update(v, &name)),
                        _ => match codex.next(v) {
                            Some(line) => format!("{line}\n"),
                            None => return true,
                        },
                    };
                    write!(out, "{text}").is_ok()
                })
                .await?;
            if format == Format::Codex {
                if let Some(line) = codex.finish() {
                    writeln!(out, "{line}").map_err(|e| HttpError::Transport(e.to_string()))?;
                }
            }
        }
        ApiCommand::Watch { list, log, hub } => {
            return crate::watch::run(api(&hub)?, list, log.as_deref()).await;
        }
    }
    Ok(true)
}
