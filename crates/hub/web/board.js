// The swarmtodo board: the lists of the hub that serves it, and for the chosen list its
// tasks, agents, timeline and burndown, live from the list's event stream. A client of
// the JSON API like any other (proto/PROTOCOL.md); nothing here is trusted by the hub.
"use strict";

// Limits of the page (each named, like the hub's).
const ROW_PX = 34; // height of a task row (board.css --row)
const ROWS_OVERSCAN = 12; // rows drawn beyond the visible ones, each side
const TIMELINE_MAX = 500; // timeline entries kept (the newest)
const HISTORY_EVENTS = 20000; // events read back when a list is opened (timeline, burndown)
const BURN_POINTS_MAX = 2000; // burndown points kept (halved when over)
const LIST_PAGES_MAX = 20; // pages of the list index read (1,000 lists a page)
const REFETCH_DEBOUNCE_MS = 250; // a burst of reorders or new tasks reads the list once
const REFETCH_WAIT_MAX_MS = 2000; // ...at the latest this long after the first
const RECONNECT_MIN_MS = 500; // the stream reconnects after this, doubling...
const RECONNECT_MAX_MS = 10000; // ...up to this
const TOAST_MS = 6000;
const HUB_AGENT = "swarmtodo-hub"; // the agent of the hub's own changes (repairs, releases)

// Status order of the burndown, bottom to top, and of the counts.
const STATUSES = ["completed", "cancelled", "in_progress", "blocked", "pending"];
const GLYPH = { pending: "\u25cb", in_progress: "\u25d0", completed: "\u2714", cancelled: "\u2298", blocked: "\u26d4" };
const COLOR = { pending: "#8a8a90", in_progress: "#1f6feb", completed: "#2da44e", cancelled: "#c6c6cc", blocked: "#cf222e" };

const $ = (sel) => document.querySelector(sel);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};
const enc = encodeURIComponent;

// What the page shows, for the list chosen.
const state = {
  list: null,
  tasks: [], // in list order
  byId: new Map(),
  selected: 0, // in `view`
  view: [], // the tasks shown: all of them, or those the filter keeps
  filter: "all",
  search: "",
  lastSeq: 0,
  timeline: [],
  agents: new Map(), // agent -> {lastMs, present}
  burn: [], // {at, d: {status: change}}: what each tasks_changed did to the counts
  firstSnapshot: false,
  changes: 0, // changes the stream has brought, on any list (see fromCall)
};
// Exposed for people at the console and for the page's own tests.
window.board = { firstRenderMs: null, lastSeq: 0, state };

// Half as many burndown steps: each pair of changes as one, at the later one's time.
function coarser(burn) {
  const out = [];
  for (let i = 0; i < burn.length; i += 2) {
    const b = burn[i + 1];
    if (!b) { out.push(burn[i]); break; }
    const d = { ...burn[i].d };
    for (const [s, n] of Object.entries(b.d)) d[s] = (d[s] || 0) + n;
    out.push({ at: b.at, d });
  }
  return out;
}

function zeroCounts() {
  return Object.fromEntries(STATUSES.map((s) => [s, 0]));
}

// The chosen list's tasks by status, as it is.
function countsNow() {
  const c = zeroCounts();
  for (const t of state.tasks) c[t.status] = (c[t.status] || 0) + 1;
  return c;
}

// Which tasks a filter keeps (a list of thousands, read for what needs an eye).
const FILTERS = {
  all: () => true,
  open: (t) => t.status !== "completed" && t.status !== "cancelled",
  in_progress: (t) => t.status === "in_progress",
  waiting: (t) => t.status === "blocked" || openDeps(t).length > 0,
};

function openDeps(t) {
  return (t.blocked_by || []).filter((d) => { const x = state.byId.get(d); return !x || x.status !== "completed"; });
}

function filtered() {
  return state.filter === "all" && !state.search;
}

function computeView() {
  if (filtered()) return state.tasks;
  const keep = FILTERS[state.filter] || FILTERS.all;
  const q = state.search.toLowerCase();
  return state.tasks.filter((t) => keep(t) && (!q || [t.id, t.content, t.active_form, t.owner]
    .some((f) => f && f.toLowerCase().includes(q))));
}

// ---- who the page acts as -------------------------------------------------------

function token() { return sessionStorage.getItem("swarmtodo.token") || ""; }
function agent() { return localStorage.getItem("swarmtodo.agent") || ""; }

function headers(write) {
  const h = {};
  const t = token();
  if (t) h.Authorization = `Bearer ${t}`;
  else if (write) h["X-Swarmtodo-Agent"] = agent() || "board";
  if (write) h["Content-Type"] = "application/json";
  return h;
}

// `#list=NAME&token=TOKEN`: the token moves to this tab's storage, out of the address bar.
function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  if (p.has("token")) {
    sessionStorage.setItem("swarmtodo.token", p.get("token"));
    p.delete("token");
    history.replaceState(null, "", `#${p.toString()}`);
  }
  return p.get("list");
}

// ---- calls ----------------------------------------------------------------------

let toastTimer = null;
function toast(text) {
  const t = $("#toast");
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, TOAST_MS);
}

async function call(method, path, body) {
  let res;
  try {
    res = await fetch(path, {
      method, headers: headers(method !== "GET"), cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    toast(`the hub did not answer (${e.message}): is it running?`);
    return null;
  }
  const data = await res.json().catch(() => null);
  if (!res.ok) {
    toast(data && data.code ? `${data.code}: ${data.message}` : `HTTP ${res.status}`);
    return null;
  }
  return data;
}

// ---- the list index -------------------------------------------------------------

async function loadLists() {
  const ul = $("#lists");
  const items = [];
  let after = null;
  for (let page = 0; page < LIST_PAGES_MAX; page++) {
    const data = await call("GET", `/v1/lists${after ? `?after=${enc(after)}` : ""}`);
    if (!data) return;
    items.push(...data.lists);
    if (!data.next) break;
    after = data.next;
  }
  ul.replaceChildren(...items.map((l) => {
    const c = l.tasks || {};
    const total = STATUSES.reduce((n, s) => n + (c[s] || 0), 0);
    const sum = el("span", "sum", `${c.completed || 0} of ${total} done, ${c.in_progress || 0} in progress`);
    const li = el("li");
    if (l.name === null || l.name === undefined) {
      // Made by a sync peer and never named by a call: the API reaches lists by name.
      const d = el("span", "unnamed");
      d.title = "a list made by a sync peer that no call has named yet: the board opens lists by name";
      d.append(el("span", "name", l.document), sum);
      li.append(d);
      return li;
    }
    const a = el("a");
    a.href = `#list=${enc(l.name)}`;
    a.dataset.list = l.name;
    a.append(el("span", "name", l.name), sum);
    if (l.name === state.list) a.setAttribute("aria-current", "true");
    li.append(a);
    return li;
  }));
  if (items.length === 0) ul.append(el("li", "sum", "no lists yet"));
}

// ---- the event stream -----------------------------------------------------------

let streamGen = 0;
let streamAbort = null;

function setStream(s) { document.body.dataset.stream = s; }

// Follows list `list` from the event after `state.lastSeq` (`Last-Event-ID`), over fetch
// so that the token goes in a header; reconnects with backoff and resumes where it was.
async function follow(list, gen) {
  let wait = RECONNECT_MIN_MS;
  while (gen === streamGen) {
    const abort = new AbortController();
    streamAbort = abort;
    setStream("connecting");
    try {
      const h = headers(false);
      // Resumed after the last event seen; the first time, the latest HISTORY_EVENTS.
      if (state.lastSeq > 0) h["Last-Event-ID"] = String(state.lastSeq);
      const res = await fetch(`/v1/lists/${enc(list)}/events?tail=${HISTORY_EVENTS}`, { headers: h, signal: abort.signal, cache: "no-store" });
      if (!res.ok) {
        const e = await res.json().catch(() => null);
        toast(e && e.code ? `${e.code}: ${e.message}` : `the event stream answered HTTP ${res.status}`);
        if ([401, 403, 404].includes(res.status)) {
          setStream("down");
          return; // a token or a list to choose first: changing either follows again
        }
      } else {
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done || gen !== streamGen) break;
          if (document.body.dataset.stream !== "live") setStream("live");
          wait = RECONNECT_MIN_MS;
          buf += value;
          let end;
          while ((end = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, end);
            buf = buf.slice(end + 2);
            if (gen === streamGen) message(block);
          }
        }
      }
    } catch (e) {
      if (abort.signal.aborted) return;
    }
    if (gen !== streamGen) return;
    setStream("connecting");
    await new Promise((r) => setTimeout(r, wait));
    wait = Math.min(wait * 2, RECONNECT_MAX_MS);
  }
}

// One SSE message: `id:`, `event:`, `data:` lines; comments (`: keep-alive`) skipped.
function message(block) {
  let id = null;
  let kind = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") id = Number(value);
    else if (field === "event") kind = value;
    else if (field === "data") data += data ? `\n${value}` : value;
  }
  if (!data) return;
  let json;
  try { json = JSON.parse(data); } catch { return; }
  if (kind === "snapshot") {
    state.changes += 1;
    setTasks(json.tasks);
    if (!state.firstSnapshot) {
      state.firstSnapshot = true;
      renderNow();
      if (window.board.firstRenderMs === null) window.board.firstRenderMs = performance.now();
    }
    return;
  }
  if (id !== null) {
    if (id <= state.lastSeq) return; // already seen (never sent twice, but cheap to say)
    state.lastSeq = id;
    window.board.lastSeq = id;
  }
  event(json);
}

// ---- what events do -------------------------------------------------------------

function seen(name, at, present) {
  if (!name) return;
  const a = state.agents.get(name) || { lastMs: 0, present: false };
  a.lastMs = Math.max(a.lastMs, at || 0);
  if (present !== undefined) a.present = present;
  state.agents.set(name, a);
}

function event(e) {
  const at = e.at_ms;
  switch (e.kind) {
    case "tasks_changed": {
      state.changes += 1;
      for (const a of e.agents || []) seen(a, at);
      let reorder = false;
      const d = {};
      for (const tc of e.tasks || []) {
        if (tc.before) d[tc.before.status] = (d[tc.before.status] || 0) - 1;
        if (tc.after) d[tc.after.status] = (d[tc.after.status] || 0) + 1;
        if (!tc.after) {
          removeTask(tc.task);
        } else if (state.byId.has(tc.task)) {
          Object.assign(state.byId.get(tc.task), { ...blankTask(), ...tc.after });
          if ((tc.fields || []).includes("position")) reorder = true;
        } else {
          addTask(tc.after);
          reorder = true; // where a new task stands: the list says
        }
      }
      state.burn.push({ at, d });
      if (state.burn.length > BURN_POINTS_MAX) state.burn = coarser(state.burn);
      if (reorder) refetchSoon();
      break;
    }
    case "violation":
      note(e, `${e.rule}: ${e.message}${resolutionText(e.resolution)}`, e.agents);
      break;
    case "conflict":
      note(e, `${e.task}.${e.field}: ${(e.agents || []).join(", ")} wrote at once; ${valueText(e.winner)} won`, e.agents);
      break;
    case "repaired":
      note(e, (e.notes || []).join("; ") || "repaired");
      break;
    case "claimed":
      seen(e.agent, at);
      note(e, `${e.agent} took ${e.task}`);
      break;
    case "unblocked":
      note(e, `${e.task} is ready (${e.by} done)`);
      break;
    case "lease_expired":
      seen(e.agent, 0, false);
      note(e, `${e.agent}'s lease ran out: ${(e.tasks || []).join(", ")} ${e.released ? "released" : "still held"}`);
      break;
    case "delegated":
      note(e, `${e.task} handed to ${e.agent} as list ${e.sub_list}`);
      break;
    case "rolled_up":
      note(e, `${e.task} is ${e.status} as its list ${e.sub_list} says`);
      break;
    case "agent_joined":
      seen(e.agent, at, true);
      note(e, `${e.agent} joined`);
      break;
    case "agent_left":
      seen(e.agent, at, false);
      note(e, `${e.agent} left`);
      break;
    default:
      note(e, e.kind);
  }
  renderSoon();
}

function resolutionText(r) {
  if (!r) return "";
  if (r.kind === "repaired") return ` \u2014 repaired: ${r.how}`;
  return ` \u2014 ${r.kind}`;
}

function valueText(v) {
  if (!v) return "a value";
  const shown = v.value === undefined ? JSON.stringify(v) : JSON.stringify(v.value);
  return v.agent ? `${v.agent}'s ${shown}` : shown;
}

function note(e, text, agents) {
  for (const a of agents || []) seen(a, e.at_ms);
  state.timeline.push({ seq: e.seq, at: e.at_ms, kind: e.kind, text });
  if (state.timeline.length > TIMELINE_MAX) state.timeline.splice(0, state.timeline.length - TIMELINE_MAX);
  timelineDirty = true;
}

function blankTask() {
  return { active_form: undefined, owner: undefined, blocked_by: [], priority: "medium" };
}

// A list a call read (a write's answer, a read for the order) is shown only if no change
// came on the stream while the call was out: its answer may arrive after events newer
// than it, and showing it then would undo them until the next change. Otherwise the
// list is read again (the stream has the changes; the read is for the order).
function fromCall(list, mark, snapshot) {
  if (!snapshot || list !== state.list) return;
  if (state.changes === mark) setTasks(snapshot.tasks);
  else refetchSoon();
}

function setTasks(tasks) {
  state.tasks = tasks;
  state.byId = new Map(tasks.map((t) => [t.id, t]));
  renderSoon();
}

function addTask(t) {
  state.tasks.push(t);
  state.byId.set(t.id, t);
}

function removeTask(id) {
  if (!state.byId.delete(id)) return;
  state.tasks = state.tasks.filter((t) => t.id !== id);
}

// The list's order is in its snapshot, not in the events: a burst of new or moved tasks
// reads the list once.
let refetchTimer = null;
let refetchFirst = 0;
function refetchSoon() {
  const now = Date.now();
  if (!refetchTimer) refetchFirst = now;
  clearTimeout(refetchTimer);
  const wait = Math.max(0, Math.min(REFETCH_DEBOUNCE_MS, refetchFirst + REFETCH_WAIT_MAX_MS - now));
  const list = state.list;
  refetchTimer = setTimeout(async () => {
    refetchTimer = null;
    const mark = state.changes;
    fromCall(list, mark, await call("GET", `/v1/lists/${enc(list)}`));
  }, wait);
}

// ---- drawing --------------------------------------------------------------------

let renderPending = false;
let timelineDirty = true;
function renderSoon() {
  if (renderPending) return;
  renderPending = true;
  requestAnimationFrame(() => { renderPending = false; renderNow(); });
}

function renderNow() {
  renderTasks();
  renderCounts();
  renderAgents();
  if (timelineDirty) renderTimeline();
  renderBurndown();
  document.body.dataset.tasks = String(state.tasks.length);
  document.body.dataset.shown = String(state.view.length);
}

// Only the rows near the viewport are in the page: a list of thousands scrolls as one
// of ten.
function renderTasks() {
  const box = $("#tasks");
  const space = $("#tasks-space");
  state.view = computeView();
  state.selected = Math.min(state.selected, Math.max(0, state.view.length - 1));
  const n = state.view.length;
  space.style.height = `${n * ROW_PX}px`;
  const first = Math.max(0, Math.floor(box.scrollTop / ROW_PX) - ROWS_OVERSCAN);
  const last = Math.min(n, Math.ceil((box.scrollTop + box.clientHeight) / ROW_PX) + ROWS_OVERSCAN);
  const rows = [];
  for (let i = first; i < last; i++) rows.push(row(state.view[i], i));
  space.replaceChildren(...rows);
  const sel = state.view[state.selected];
  if (sel) box.setAttribute("aria-activedescendant", `task-${state.selected}`);
  else box.removeAttribute("aria-activedescendant");
}

function row(t, i) {
  const r = el("div", "task");
  r.id = `task-${i}`;
  r.setAttribute("role", "option");
  r.dataset.id = t.id;
  r.dataset.index = String(i);
  r.dataset.status = t.status;
  r.style.top = `${i * ROW_PX}px`;
  if (i === state.selected) { r.classList.add("selected"); r.setAttribute("aria-selected", "true"); }
  const text = t.status === "in_progress" && t.active_form ? t.active_form : t.content;
  const content = el("span", "content", text);
  content.title = t.content;
  r.append(el("span", "glyph", GLYPH[t.status] || "?"), content, el("span", "owner", t.owner || ""));
  if (t.priority === "high" || t.priority === "low") r.append(el("span", "prio", t.priority));
  const deps = t.blocked_by || [];
  if (deps.length) {
    const open = openDeps(t);
    const d = el("span", `deps${open.length ? " open" : ""}`, `after ${deps.join(", ")}`);
    d.title = open.length ? `waits for ${open.join(", ")}` : "every task it waits for is done";
    r.append(d);
  }
  if (t.status === "cancelled" || t.status === "blocked") r.append(el("span", "id", t.status));
  r.append(el("span", "id", t.id));
  const actions = el("span", "actions");
  for (const [action, label, title] of [
    ["claim", "claim", "take it: yours, in progress (c)"],
    ["complete", "done", "mark it completed (d)"],
    ["cancel", "cancel", "mark it cancelled (x)"],
    ["up", "\u2191", "move it up ([)"],
    ["down", "\u2193", "move it down (])"],
  ]) {
    const b = el("button", "", label);
    b.type = "button";
    b.dataset.action = action;
    b.title = title;
    b.tabIndex = -1;
    actions.append(b);
  }
  r.append(actions);
  return r;
}

function renderCounts() {
  const c = countsNow();
  // The chosen list's line in the index follows it live (the others as last read).
  const sum = state.list && document.querySelector(`#lists a[data-list="${CSS.escape(state.list)}"] .sum`);
  if (sum && state.firstSnapshot) sum.textContent = `${c.completed} of ${state.tasks.length} done, ${c.in_progress} in progress`;
  $("#counts").textContent = state.list
    ? `${c.completed} of ${state.tasks.length} done \u00b7 ${c.in_progress} in progress \u00b7 ${c.blocked} blocked \u00b7 ${c.cancelled} cancelled`
    : "";
}

function ago(ms) {
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

function renderAgents() {
  const holds = new Map();
  for (const t of state.tasks) {
    if (!t.owner || t.status === "completed" || t.status === "cancelled") continue;
    if (!holds.has(t.owner)) holds.set(t.owner, []);
    holds.get(t.owner).push(t);
    if (!state.agents.has(t.owner)) state.agents.set(t.owner, { lastMs: 0, present: false });
  }
  const names = [...state.agents.keys()].sort();
  $("#agents").replaceChildren(...names.map((name) => {
    const a = state.agents.get(name);
    const li = el("li", `agent${a.present ? " present" : ""}`);
    li.dataset.agent = name;
    const held = holds.get(name) || [];
    const working = held.filter((t) => t.status === "in_progress");
    li.append(
      el("div", "name", name === HUB_AGENT ? `${name} (authority)` : name),
      el("div", "holds", held.length
        ? `holds ${held.map((t) => t.status === "in_progress" ? `${t.id} (in progress)` : t.id).join(", ")}`
        : "holds nothing"),
      el("div", "seen", `${a.lastMs ? `last spoke ${ago(a.lastMs)}` : "not heard from on this list"}${working.length > 1 ? " \u00b7 more than one in progress" : ""}`),
    );
    return li;
  }));
}

function renderTimeline() {
  timelineDirty = false;
  const items = [];
  for (let i = state.timeline.length - 1; i >= 0; i--) {
    const e = state.timeline[i];
    const li = el("li", "event");
    li.dataset.kind = e.kind;
    li.dataset.seq = String(e.seq);
    const time = el("time", "", e.at ? new Date(e.at).toLocaleTimeString() : "");
    if (e.at) time.dateTime = new Date(e.at).toISOString();
    li.append(time, el("span", "kind", e.kind.replace("_", " ")), document.createTextNode(e.text));
    items.push(li);
  }
  $("#timeline").replaceChildren(...items);
}

// Tasks by status over time, stacked: drawn from the events (every `tasks_changed`
// moves the counts), ending at the list as it is now.
const BURN_REDRAW_MS = 1000; // the burndown is drawn at most this often
let burnDrawn = 0;
let burnTimer = null;
function renderBurndown() {
  const now = Date.now();
  if (burnDrawn && now - burnDrawn < BURN_REDRAW_MS) {
    if (!burnTimer) {
      burnTimer = setTimeout(() => { burnTimer = null; renderBurndown(); }, BURN_REDRAW_MS - (now - burnDrawn));
    }
    return;
  }
  burnDrawn = now;
  const nowCounts = countsNow();
  // Backwards from the list as it is: right however far back the events go.
  const points = [{ at: now, c: nowCounts }];
  let c = { ...nowCounts };
  for (let i = state.burn.length - 1; i >= 0; i--) {
    const { at, d } = state.burn[i];
    points.push({ at, c: { ...c } });
    for (const [s, n] of Object.entries(d)) c[s] = Math.max(0, (c[s] || 0) - n);
    if (i === 0) points.push({ at, c: { ...c } });
  }
  points.reverse();
  const W = 340, H = 120;
  const t0 = points[0].at, t1 = Math.max(now, t0 + 1);
  const max = Math.max(1, ...points.map((p) => STATUSES.reduce((n, s) => n + (p.c[s] || 0), 0)));
  const x = (at) => ((at - t0) / (t1 - t0)) * W;
  const y = (n) => H - (n / max) * (H - 4);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `tasks by status over time: now ${STATUSES.map((s) => `${nowCounts[s]} ${s.replace("_", " ")}`).join(", ")}`);
  let below = points.map(() => 0);
  for (const s of STATUSES) {
    const above = points.map((p, i) => below[i] + (p.c[s] || 0));
    // Steps: a count holds until the next event.
    let top = "", bottom = "";
    points.forEach((p, i) => {
      const xi = x(p.at), xn = i + 1 < points.length ? x(points[i + 1].at) : W;
      top += `${xi.toFixed(1)},${y(above[i]).toFixed(1)} ${xn.toFixed(1)},${y(above[i]).toFixed(1)} `;
      bottom = `${xn.toFixed(1)},${y(below[i]).toFixed(1)} ${xi.toFixed(1)},${y(below[i]).toFixed(1)} ` + bottom;
    });
    const poly = document.createElementNS(ns, "polygon");
    poly.setAttribute("points", top + bottom);
    poly.setAttribute("fill", COLOR[s]);
    svg.append(poly);
    below = above;
  }
  const legend = el("div", "legend");
  legend.append(el("span", "", state.burn.length ? `since ${new Date(t0).toLocaleString()}` : "no change yet"));
  for (const s of STATUSES) {
    const item = el("span");
    const swatch = el("i");
    swatch.style.background = COLOR[s];
    item.append(swatch, document.createTextNode(`${s.replace("_", " ")} ${nowCounts[s]}`));
    legend.append(item);
  }
  $("#burndown").replaceChildren(svg, legend);
}

// ---- acting on a task (a lead, with a token; the hub checks every call) ----------

async function act(action, i) {
  const t = state.view[i];
  if (!t || !state.list) return;
  const list = state.list;
  const mark = state.changes;
  const path = `/v1/lists/${enc(list)}`;
  const upsert = (status) => ({
    mode: "patch",
    ops: [{ op: "upsert", task: { id: t.id, status } }],
    explanation: `${status} from the board`,
  });
  let answer = null;
  switch (action) {
    case "claim": {
      const body = { task: t.id };
      if (!token()) body.agent = agent() || "board";
      answer = await call("POST", `${path}/claim`, body);
      break;
    }
    case "complete": answer = await call("POST", `${path}/todo_write`, upsert("completed")); break;
    case "cancel": answer = await call("POST", `${path}/todo_write`, upsert("cancelled")); break;
    case "up":
    case "down": {
      if (!filtered()) {
        toast("moving a task needs the whole list in view: show all, without a filter text");
        return;
      }
      const to = action === "up" ? i - 1 : i + 1;
      if (to < 0 || to >= state.tasks.length) return;
      const after = action === "up" ? (i >= 2 ? state.tasks[i - 2].id : undefined) : state.tasks[i + 1].id;
      answer = await call("POST", `${path}/todo_write`, {
        mode: "patch", ops: [{ op: "move", id: t.id, after }], explanation: "moved from the board",
      });
      if (answer) state.selected = to;
      break;
    }
  }
  // A write's answer is the list after it; the stream brings the same soon after.
  fromCall(list, mark, answer?.snapshot);
}

// ---- choosing a list, keys ------------------------------------------------------

function choose(list) {
  streamGen += 1;
  if (streamAbort) streamAbort.abort();
  Object.assign(state, {
    list, tasks: [], byId: new Map(), selected: 0, view: [], lastSeq: 0, timeline: [],
    agents: new Map(), burn: [], firstSnapshot: false,
  });
  timelineDirty = true;
  burnDrawn = 0;
  $("#list-title").textContent = list || "no list chosen";
  document.title = list ? `${list} \u00b7 swarmtodo` : "swarmtodo board";
  for (const a of document.querySelectorAll("#lists a")) {
    if (a.dataset.list === list) a.setAttribute("aria-current", "true");
    else a.removeAttribute("aria-current");
  }
  renderNow();
  if (list) follow(list, streamGen);
  else setStream("down");
}

function setFilter(f) {
  state.filter = f;
  state.selected = 0;
  for (const b of document.querySelectorAll("#filter button[data-filter]")) {
    b.setAttribute("aria-pressed", String(b.dataset.filter === f));
  }
  renderSoon();
}

function select(i) {
  const n = state.view.length;
  if (n === 0) return;
  state.selected = Math.max(0, Math.min(n - 1, i));
  const box = $("#tasks");
  const top = state.selected * ROW_PX;
  if (top < box.scrollTop) box.scrollTop = top;
  else if (top + ROW_PX > box.scrollTop + box.clientHeight) box.scrollTop = top + ROW_PX - box.clientHeight;
  renderTasks();
}

function keys(e) {
  if (e.target.closest("input")) return;
  const page = Math.max(1, Math.floor($("#tasks").clientHeight / ROW_PX) - 1);
  const map = {
    ArrowDown: () => select(state.selected + 1), j: () => select(state.selected + 1),
    ArrowUp: () => select(state.selected - 1), k: () => select(state.selected - 1),
    PageDown: () => select(state.selected + page), PageUp: () => select(state.selected - page),
    Home: () => select(0), End: () => select(state.view.length - 1),
    c: () => act("claim", state.selected), d: () => act("complete", state.selected),
    x: () => act("cancel", state.selected), "[": () => act("up", state.selected),
    "]": () => act("down", state.selected), r: () => loadLists(),
    "/": () => $("#search").focus(),
  };
  const f = map[e.key];
  if (!f || e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.target === document.body || e.target.closest("#tasks") || e.key === "r" || e.key === "/") {
    e.preventDefault();
    f();
  }
}

function start() {
  $("#token").value = token();
  $("#agent").value = agent();
  $("#who").addEventListener("submit", (e) => e.preventDefault());
  $("#token").addEventListener("change", (e) => {
    if (e.target.value) sessionStorage.setItem("swarmtodo.token", e.target.value);
    else sessionStorage.removeItem("swarmtodo.token");
    loadLists();
    choose(state.list);
  });
  $("#agent").addEventListener("change", (e) => localStorage.setItem("swarmtodo.agent", e.target.value.trim()));
  $("#refresh-lists").addEventListener("click", loadLists);
  for (const b of document.querySelectorAll("#filter button[data-filter]")) {
    b.addEventListener("click", () => setFilter(b.dataset.filter));
  }
  $("#search").addEventListener("input", (e) => {
    state.search = e.target.value.trim();
    state.selected = 0;
    renderSoon();
  });
  $("#search").addEventListener("keydown", (e) => {
    if (e.key === "Escape") { e.target.value = ""; state.search = ""; $("#tasks").focus(); renderSoon(); }
    if (e.key === "Enter") { e.preventDefault(); $("#tasks").focus(); }
  });
  $("#tasks").addEventListener("scroll", renderSoon, { passive: true });
  $("#tasks").addEventListener("click", (e) => {
    const r = e.target.closest(".task");
    if (!r) return;
    const i = Number(r.dataset.index);
    const b = e.target.closest("button[data-action]");
    state.selected = i;
    $("#tasks").focus({ preventScroll: true });
    if (b) act(b.dataset.action, i);
    renderTasks();
  });
  document.addEventListener("keydown", keys);
  window.addEventListener("hashchange", () => {
    const list = readHash();
    if (list !== state.list) choose(list);
  });
  window.addEventListener("resize", renderSoon);
  // Relative times ("12 s ago") age without any call to the hub.
  setInterval(() => { if (state.list) renderAgents(); }, 10000);
  const list = readHash();
  $("#token").value = token();
  loadLists();
  choose(list);
}

start();
