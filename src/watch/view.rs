//! What `swarmtodo watch` shows, and how it is drawn: the list as the hub last answered
//! it, the connection's state, and the latest notable events. Only the task rows on
//! screen are built, whatever the list's length.

use std::collections::VecDeque;

use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;

use swarmtodo::proto::{Event, EventBody, Resolution, Snapshot, Status, Task};

/// How many of the latest notable events (violations, conflicts, repairs, claims,
/// expired leases, unblocked tasks) the bottom pane keeps, newest first.
pub(crate) const RECENT_EVENTS_MAX: usize = 100;

/// Rows of the bottom pane, its borders included.
const EVENTS_PANE_ROWS: u16 = 9;

/// How many characters of the version the header shows.
const VERSION_SHOWN: usize = 12;

/// The state of the connection to the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Link {
    /// The first connection is being made.
    Connecting,
    /// The event stream is open.
    Live,
    /// The stream broke; the next try is on its way.
    Reconnecting {
        /// Why it broke.
        reason: String,
    },
}

/// A key's effect on the view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scroll {
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
}

/// Tasks by status: pending, in progress, completed, cancelled, blocked.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts([usize; 5]);

impl Counts {
    fn of(tasks: &[Task]) -> Counts {
        let mut c = Counts::default();
        for t in tasks {
            c.0[status_index(t.status)] += 1;
        }
        c
    }
}

fn status_index(s: Status) -> usize {
    match s {
        Status::Pending => 0,
        Status::InProgress => 1,
        Status::Completed => 2,
        Status::Cancelled => 3,
        Status::Blocked => 4,
    }
}

/// One line of the bottom pane.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Notice {
    seq: u64,
    at_ms: i64,
    kind: &'static str,
    color: Color,
    text: String,
}

/// Everything the screen shows.
#[derive(Debug)]
pub(crate) struct View {
    list: String,
    snapshot: Option<Snapshot>,
    counts: Counts,
    link: Link,
    recent: VecDeque<Notice>,
    /// The first task row on screen.
    scroll: usize,
    /// How many task rows the last draw had room for.
    rows: usize,
}

impl View {
    /// A view of `list`, before anything came.
    pub(crate) fn new(list: &str) -> View {
        View {
            list: list.to_owned(),
            snapshot: None,
            counts: Counts::default(),
            link: Link::Connecting,
            recent: VecDeque::new(),
            scroll: 0,
            rows: 1,
        }
    }

    /// Shows the list as of `snapshot`.
    pub(crate) fn set_snapshot(&mut self, snapshot: Snapshot) {
        self.counts = Counts::of(&snapshot.tasks);
        self.snapshot = Some(snapshot);
        self.clamp();
    }

    /// Shows the connection's state.
    pub(crate) fn set_link(&mut self, link: Link) {
        self.link = link;
    }

    /// Takes an event into the bottom pane, if it is one it shows.
    pub(crate) fn note(&mut self, e: &Event) {
        let mut push = |kind: &'static str, color: Color, text: String| {
            self.recent.push_front(Notice {
                seq: e.seq,
                at_ms: e.at_ms,
                kind,
                color,
                text,
            });
            self.recent.truncate(RECENT_EVENTS_MAX);
        };
        match &e.body {
            EventBody::Violation(v) => {
                let rule = serde_json::to_value(v.rule)
                    .ok()
                    .and_then(|r| r.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let resolution = match &v.resolution {
                    Resolution::Reported => "reported".to_owned(),
                    Resolution::Repaired { how } => format!("repaired: {how}"),
                };
                push(
                    "violation",
                    Color::Red,
                    format!("{rule}: {} ({resolution})", v.message),
                );
            }
            EventBody::Conflict(c) => {
                let winner = c.winner.agent.as_deref().unwrap_or("?");
                push(
                    "conflict",
                    Color::Yellow,
                    format!(
                        "{}.{} written at once by {}; {winner}'s value {} won",
                        c.task,
                        c.field,
                        c.agents.join(", "),
                        c.winner.value
                    ),
                );
            }
            EventBody::Repaired { notes, .. } => {
                push("repaired", Color::Green, notes.join("; "));
            }
            EventBody::Unblocked { task, by } => {
                push(
                    "unblocked",
                    Color::Cyan,
                    format!("{task} is ready to claim ({by} done)"),
                );
            }
            EventBody::LeaseExpired {
                agent,
                tasks,
                tasks_total,
                released,
            } => {
                let what = if *released { "released" } else { "still held" };
                push(
                    "lease",
                    Color::LightRed,
                    format!(
                        "{agent} gone past its lease: {} ({tasks_total} in progress) {what}",
                        tasks.join(", ")
                    ),
                );
            }
            EventBody::Delegated {
                parent,
                task,
                sub_list,
                agent,
            } => {
                push(
                    "delegated",
                    Color::Magenta,
                    format!("{parent}:{task} handed to {agent} as list {sub_list}"),
                );
            }
            EventBody::RolledUp {
                task,
                sub_list,
                status,
            } => {
                push(
                    "rolled up",
                    Color::Magenta,
                    format!("{task} is {} (from list {sub_list})", status.as_str()),
                );
            }
            // Comings and goings would bury what needs a look in a large swarm; a claim
            // shows from its `tasks_changed` (as a task taken over sync does).
            EventBody::AgentJoined { .. }
            | EventBody::AgentLeft { .. }
            | EventBody::Claimed { .. } => {}
            EventBody::TasksChanged { tasks, .. } => {
                for change in tasks {
                    let Some(after) = &change.after else { continue };
                    let Some(owner) = &after.owner else { continue };
                    let held_before = change.before.as_ref().is_some_and(|b| {
                        b.status == Status::InProgress && b.owner.as_ref() == Some(owner)
                    });
                    if after.status == Status::InProgress && !held_before {
                        push(
                            "claimed",
                            Color::Magenta,
                            format!("{owner} took {}: {}", after.id, after.content),
                        );
                    }
                }
            }
        }
    }

    /// Moves the task rows.
    pub(crate) fn scroll(&mut self, how: Scroll) {
        let page = self.rows.max(1);
        self.scroll = match how {
            Scroll::Up => self.scroll.saturating_sub(1),
            Scroll::Down => self.scroll + 1,
            Scroll::PageUp => self.scroll.saturating_sub(page),
            Scroll::PageDown => self.scroll + page,
            Scroll::Home => 0,
            Scroll::End => usize::MAX,
        };
        self.clamp();
    }

    fn tasks(&self) -> &[Task] {
        self.snapshot.as_ref().map_or(&[], |s| &s.tasks)
    }

    /// Keeps the last page full: no scrolling past the end.
    fn clamp(&mut self) {
        let last = self.tasks().len().saturating_sub(self.rows);
        self.scroll = self.scroll.min(last);
    }

    /// Draws the whole screen.
    pub(crate) fn draw(&mut self, frame: &mut Frame<'_>) {
        let [head, body, pane, keys] = Layout::vertical([
            Constraint::Length(2),
            Constraint::Min(3),
            Constraint::Length(EVENTS_PANE_ROWS),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        frame.render_widget(Paragraph::new(self.header()), head);

        let block = Block::bordered();
        self.rows = usize::from(block.inner(body).height).max(1);
        self.clamp();
        let tasks = self.tasks();
        let shown = &tasks[self.scroll..tasks.len().min(self.scroll + self.rows)];
        let title = if tasks.is_empty() {
            " tasks ".to_owned()
        } else {
            format!(
                " tasks {}–{} of {} ",
                self.scroll + 1,
                self.scroll + shown.len(),
                tasks.len()
            )
        };
        let lines: Vec<Line<'_>> = shown.iter().map(row).collect();
        frame.render_widget(Paragraph::new(lines).block(block.title(title)), body);

        let pane_block = Block::bordered().title(" events, newest first ");
        let room = usize::from(pane_block.inner(pane).height);
        let notices: Vec<Line<'_>> = self.recent.iter().take(room).map(notice).collect();
        frame.render_widget(Paragraph::new(notices).block(pane_block), pane);

        frame.render_widget(
            Paragraph::new("q quit · ↑ ↓ PgUp PgDn Home End scroll")
                .style(Style::new().add_modifier(Modifier::DIM)),
            keys,
        );
    }

    fn header(&self) -> Vec<Line<'_>> {
        let version = self.snapshot.as_ref().map_or("-", |s| s.version.0.as_str());
        let short: String = version.chars().take(VERSION_SHOWN).collect();
        let link = match &self.link {
            Link::Connecting => Span::styled("connecting", Style::new().fg(Color::Yellow)),
            Link::Live => Span::styled("live", Style::new().fg(Color::Green)),
            Link::Reconnecting { reason } => Span::styled(
                format!("reconnecting ({reason})"),
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
            ),
        };
        let bold = Style::new().add_modifier(Modifier::BOLD);
        let first = Line::from(vec![
            Span::styled(self.list.as_str(), bold),
            Span::raw(format!("  version {short}  ")),
            link,
        ]);
        let [pending, in_progress, completed, cancelled, blocked] = self.counts.0;
        let second = Line::from(format!(
            "{} tasks: {pending} pending, {in_progress} in progress, {completed} completed, \
             {cancelled} cancelled, {blocked} blocked",
            self.tasks().len()
        ));
        vec![first, second]
    }
}

/// One task as a checklist row: `[x]` completed (struck through), `[>]` in progress
/// (its active form, highlighted), `[ ]` pending (dim), `[-]` cancelled (struck
/// through), `[!]` blocked; the owner, and the tasks it waits for.
fn row(t: &Task) -> Line<'_> {
    let dim = Style::new().add_modifier(Modifier::DIM);
    let struck = Modifier::CROSSED_OUT;
    let (mark, text, style) = match t.status {
        Status::Completed => (
            "[x]",
            t.content.as_str(),
            Style::new().fg(Color::Green).add_modifier(struck),
        ),
        Status::InProgress => (
            "[>]",
            t.active_form.as_deref().unwrap_or(&t.content),
            Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
        ),
        Status::Pending => ("[ ]", t.content.as_str(), dim),
        Status::Cancelled => ("[-]", t.content.as_str(), dim.add_modifier(struck)),
        Status::Blocked => ("[!]", t.content.as_str(), Style::new().fg(Color::Red)),
    };
    let mut spans = vec![
        Span::styled(mark, style.remove_modifier(struck)),
        Span::raw(" "),
        Span::styled(text, style),
        Span::styled(format!("  ({})", t.id), dim),
    ];
    if let Some(owner) = &t.owner {
        spans.push(Span::styled(
            format!(" @{owner}"),
            Style::new().fg(Color::Cyan),
        ));
    }
    if t.status == Status::Blocked {
        spans.push(Span::styled(
            " blocked",
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        ));
    }
    if !t.blocked_by.is_empty() {
        spans.push(Span::styled(format!(" ← {}", t.blocked_by.join(", ")), dim));
    }
    Line::from(spans)
}

fn notice(n: &Notice) -> Line<'_> {
    let secs = n.at_ms.div_euclid(1000).rem_euclid(86_400);
    Line::from(vec![
        Span::styled(
            format!(
                "{:02}:{:02}:{:02} #{:<5} ",
                secs / 3600,
                secs / 60 % 60,
                secs % 60,
                n.seq
            ),
            Style::new().add_modifier(Modifier::DIM),
        ),
        Span::styled(format!("{:<9} ", n.kind), Style::new().fg(n.color)),
        Span::raw(n.text.as_str()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use swarmtodo::proto::{Priority, Version};

    fn task(i: usize, status: Status) -> Task {
        Task {
            id: format!("t{i}"),
            content: format!("Task {i}"),
            active_form: Some(format!("Doing task {i}")),
            status,
            priority: Priority::default(),
            owner: (status == Status::InProgress).then(|| "ann".to_owned()),
            blocked_by: if i == 2 { vec!["t1".into()] } else { vec![] },
        }
    }

    fn screen(view: &mut View, w: u16, h: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
        terminal.draw(|f| view.draw(f)).unwrap();
        let buffer = terminal.backend().buffer();
        (0..h)
            .map(|y| (0..w).map(|x| buffer[(x, y)].symbol()).collect())
            .collect()
    }

    #[test]
    fn a_long_list_shows_the_rows_that_fit_and_scrolls_to_its_end() {
        let statuses = [Status::Pending, Status::InProgress, Status::Completed];
        let tasks = (0..5_000).map(|i| task(i, statuses[i % 3])).collect();
        let mut view = View::new("big");
        view.set_snapshot(Snapshot {
            version: Version("abc".into()),
            tasks,
        });
        let text = screen(&mut view, 80, 30).join("\n");
        assert!(
            text.contains("5000 tasks: 1667 pending, 1667 in progress"),
            "{text}"
        );
        assert!(text.contains("[ ] Task 0  (t0)"), "{text}");
        assert!(text.contains("[>] Doing task 1  (t1) @ann"), "{text}");
        assert!(text.contains("[x] Task 2  (t2) ← t1"), "{text}");
        view.scroll(Scroll::End);
        let text = screen(&mut view, 80, 30).join("\n");
        assert!(text.contains("[>] Doing task 4999  (t4999) @ann"), "{text}");
        assert!(text.contains("tasks 4985–5000 of 5000"), "{text}");
        view.scroll(Scroll::PageUp);
        view.scroll(Scroll::Home);
        assert!(screen(&mut view, 80, 30).join("\n").contains("(t0)"));
    }

    #[test]
    fn the_pane_keeps_the_latest_events_newest_first() {
        let mut view = View::new("l");
        for seq in 1..=(RECENT_EVENTS_MAX as u64 + 10) {
            view.note(&Event {
                seq,
                list: "l".into(),
                at_ms: 0,
                body: EventBody::Unblocked {
                    task: format!("t{seq}"),
                    by: "t0".into(),
                },
            });
        }
        assert_eq!(view.recent.len(), RECENT_EVENTS_MAX);
        assert_eq!(view.recent[0].seq, RECENT_EVENTS_MAX as u64 + 10);
    }
}
