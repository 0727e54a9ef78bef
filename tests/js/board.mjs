// The hub's board (the page at `/`) in a real Chromium, driven by playwright-core, for
// tests/hub/board.rs. The Rust test starts the hub, writes over HTTP and decides; this
// script only does what a person at the page would, and measures.
//
//   node board.mjs        (CHROMIUM=path overrides /usr/bin/chromium; no browser download)
//
// Protocol: one JSON object per line. This script first prints
//   {"ready": true, "chromium": VERSION}
// then reads commands on stdin, one at a time, and answers each with one line:
//   {"ok": true, ...what the command reports}   or   {"ok": false, "error": "…"}
// An error says what was awaited and what the page showed (body dataset, #toast, rows,
// the page's console errors). At the end of stdin it closes the browser and exits.
// Every command names its `page` (a tab of its own, e.g. "board"); `timeout_ms` bounds
// each wait (default 20,000).
//
//   open       {page, url, tasks}    opens url in a new tab; waits for
//              body[data-stream=live], body[data-tasks=TASKS] and the rows →
//              {href, token_in_href, token_in_session_storage, first_render_ms, last_seq, rows}
//   wait       {page, selector, text?}  waits for an element (containing text) → {text}
//   watch      {page, id}            arms a watch for the row of task id (absent now)
//   written    {page, id, sent_at, written_at}  the test wrote task id (epoch ms: request
//              sent, answer received); waits for the row → {ms_from_written, ms_from_sent}
//   click      {page, id, action}    clicks the row's button[data-action=ACTION]
//   keys       {page, keys: [key]}   focuses #tasks and presses each key (playwright names)
//   press      {page, selector}      clicks the element
//   fill       {page, selector, text}  types text into the input (replacing what it held)
//   idle       {page, ms, settle_ms?}  once the page has started no request for settle_ms
//              (default 2,500), counts those it starts in ms → {requests, urls, settle_ms,
//              while_settling: [url]}
//   state      {page}                → {dataset, toast, rows, duplicates, last_seq,
//                                       seq_decreases, timeline}
//   screenshot {page, path}          saves the tab as a PNG
//   scroll_end {page, id}            scrolls #tasks to its end, waits for the row of id →
//                                    {rows_before, rows_after, visible}
//   hold       {page, path, ms}      from now on the answers to the page's GETs of path
//                                    (exactly) reach it ms after the hub gave them, as over
//                                    a slow network; ms 0 ends that
//   held       {page, answered?, delivered?}  waits until that many such GETs were
//                                    answered by the hub / delivered to the page →
//                                    {answered, delivered}
//   steady     {page, selector, ms}  the selector matches at every animation frame for ms
//                                    (fails at the first frame it does not)
import { chromium } from "playwright-core";
import readline from "node:readline";

const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const WAIT_MS = 20_000;

const browser = await chromium.launch({
  executablePath,
  // No sandbox (tests run as root); and nothing that reaches out: this machine has no
  // internet, and a page's figures must not share the network with Google's updaters.
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });

/** name → {page, requests: [url], errors: [text], dialogs: [text]} */
const tabs = new Map();

const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

function tab(name) {
  const t = tabs.get(name);
  if (!t) throw new Error(`no page ${JSON.stringify(name)} is open`);
  return t;
}

const rowSelector = (id) => `#tasks .task[data-id="${String(id).replace(/["\\]/g, "\\$&")}"]`;

/** What the page shows, for an error message. */
async function describe(t) {
  try {
    const shown = await t.page.evaluate(() => {
      const toast = document.querySelector("#toast");
      return {
        href: location.href.replace(/token=[^&]*/, "token=…"),
        dataset: { ...document.body.dataset },
        toast: toast && !toast.hidden ? toast.textContent.trim() : null,
        rows: [...document.querySelectorAll("#tasks .task")]
          .slice(0, 20)
          .map((r) => `${r.dataset.id}:${r.dataset.status}`),
        board: window.board
          ? { firstRenderMs: window.board.firstRenderMs, lastSeq: window.board.lastSeq }
          : null,
        timeline: [...document.querySelectorAll("#timeline .event")]
          .slice(0, 5)
          .map((e) => `${e.dataset.kind}: ${e.textContent.trim().slice(0, 160)}`),
      };
    });
    // One short line per field: a CI log keeps lines, and elides long ones.
    return Object.entries({ ...shown, console_errors: t.errors.slice(-10) })
      .map(([k, v]) => `\n  ${k}: ${JSON.stringify(v).slice(0, 400)}`)
      .join("");
  } catch (e) {
    return `(the page could not be read: ${e.message}; console errors ${JSON.stringify(t.errors.slice(-10))})`;
  }
}

/** Runs `wait`; on timeout throws what was awaited and what the page showed. */
async function awaiting(t, what, wait) {
  try {
    return await wait();
  } catch (e) {
    throw new Error(`waited for ${what}: ${e.message.split("\n")[0]}\nthe page shows:${await describe(t)}`);
  }
}

const commands = {
  async open({ page: name, url, tasks, timeout_ms = WAIT_MS }) {
    if (tabs.has(name)) await tabs.get(name).page.close();
    const page = await context.newPage();
    const t = { page, requests: [], errors: [], dialogs: [], held: { answered: 0, delivered: 0 }, holding: null };
    tabs.set(name, t);
    page.on("request", (r) => t.requests.push(r.url()));
    page.on("console", (m) => m.type() === "error" && t.errors.push(m.text()));
    page.on("pageerror", (e) => t.errors.push(`uncaught: ${e.message}`));
    // A confirmation the page asks for is given, as a person would.
    page.on("dialog", (d) => {
      t.dialogs.push(d.message());
      d.accept().catch(() => {});
    });
    await page.goto(url, { waitUntil: "load", timeout: timeout_ms });
    await awaiting(t, "body[data-stream=live]", () =>
      page.waitForSelector('body[data-stream="live"]', { state: "attached", timeout: timeout_ms }),
    );
    await awaiting(t, `body[data-tasks="${tasks}"]`, () =>
      page.waitForSelector(`body[data-tasks="${tasks}"]`, { state: "attached", timeout: timeout_ms }),
    );
    if (tasks > 0) {
      await awaiting(t, "#tasks .task rows", () =>
        page.waitForSelector("#tasks .task", { state: "attached", timeout: timeout_ms }),
      );
    }
    const token = new URLSearchParams(new URL(url).hash.slice(1)).get("token");
    const seen = await page.evaluate((token) => {
      // Watches window.board.lastSeq from now on: it may only grow.
      window.__seq = { max: window.board?.lastSeq ?? 0, decreases: [] };
      setInterval(() => {
        const s = window.board?.lastSeq;
        if (typeof s !== "number") return;
        if (s < window.__seq.max) window.__seq.decreases.push([window.__seq.max, s]);
        window.__seq.max = Math.max(window.__seq.max, s);
      }, 10);
      let inStorage = false;
      for (let i = 0; i < sessionStorage.length; i++) {
        if (token && sessionStorage.getItem(sessionStorage.key(i))?.includes(token)) inStorage = true;
      }
      return {
        href: location.href,
        token_in_href: token ? location.href.includes(token) : false,
        token_in_session_storage: inStorage,
        first_render_ms: window.board?.firstRenderMs ?? null,
        last_seq: window.board?.lastSeq ?? null,
        rows: document.querySelectorAll("#tasks .task").length,
      };
    }, token);
    if (token) seen.href = seen.href.split(token).join("…");
    return seen;
  },

  async wait({ page: name, selector, text, timeout_ms = WAIT_MS }) {
    const t = tab(name);
    const what = text === undefined ? selector : `${selector} containing ${JSON.stringify(text)}`;
    const loc =
      text === undefined ? t.page.locator(selector) : t.page.locator(selector, { hasText: text });
    await awaiting(t, what, () => loc.first().waitFor({ state: "attached", timeout: timeout_ms }));
    return { text: (await loc.first().textContent()).trim() };
  },

  async watch({ page: name, id }) {
    const t = tab(name);
    const already = await t.page.evaluate((sel) => {
      window.__appeared ??= {};
      const entry = { at: null };
      window.__appeared[sel] = entry;
      if (document.querySelector(sel)) return true;
      // Rows may be made anew or recycled (a virtualised list sets data-id on a row it
      // reuses): any addition or data-id change under #tasks is looked at.
      const seen = new MutationObserver(() => {
        if (document.querySelector(sel)) {
          entry.at = performance.timeOrigin + performance.now();
          seen.disconnect();
        }
      });
      seen.observe(document.body, {
        subtree: true,
        childList: true,
        attributes: true,
        attributeFilter: ["data-id"],
      });
      return false;
    }, rowSelector(id));
    if (already) throw new Error(`the row of ${id} is there before it was written`);
    return {};
  },

  async written({ page: name, id, sent_at, written_at, timeout_ms = WAIT_MS }) {
    const t = tab(name);
    const sel = rowSelector(id);
    const handle = await awaiting(t, `${sel} (a row for the task the test wrote)`, () =>
      t.page.waitForFunction((sel) => window.__appeared?.[sel]?.at, sel, {
        timeout: timeout_ms,
        polling: 10,
      }),
    );
    const at = await handle.jsonValue();
    return { ms_from_written: at - written_at, ms_from_sent: at - sent_at };
  },

  async click({ page: name, id, action, timeout_ms = WAIT_MS }) {
    const t = tab(name);
    const row = t.page.locator(rowSelector(id));
    const button = row.locator(`button[data-action="${action}"]`);
    await awaiting(t, `the ${action} button of ${id}`, async () => {
      await row.hover({ timeout: timeout_ms });
      await button.click({ timeout: timeout_ms });
    });
    return { dialogs: t.dialogs };
  },

  async press({ page: name, selector, timeout_ms = WAIT_MS }) {
    const t = tab(name);
    await awaiting(t, `a click on ${selector}`, () => t.page.click(selector, { timeout: timeout_ms }));
    return {};
  },

  async fill({ page: name, selector, text, timeout_ms = WAIT_MS }) {
    const t = tab(name);
    await awaiting(t, `typing into ${selector}`, () => t.page.fill(selector, text, { timeout: timeout_ms }));
    return {};
  },

  async keys({ page: name, keys }) {
    const t = tab(name);
    await t.page.focus("#tasks");
    for (const key of keys) await t.page.keyboard.press(key);
    return {};
  },

  async idle({ page: name, ms, settle_ms = 2500, timeout_ms = WAIT_MS }) {
    const t = tab(name);
    // What earlier events still cause (a read of the list a little after a new task)
    // is not polling: first a quiet spell of settle_ms, then the count.
    const settling = Date.now();
    const before = t.requests.length;
    let last = before;
    let quietSince = Date.now();
    while (Date.now() - quietSince < settle_ms) {
      if (Date.now() - settling > timeout_ms) {
        throw new Error(
          `the page never went ${settle_ms} ms without a request in ${timeout_ms} ms (polling?): ` +
            JSON.stringify(t.requests.slice(-10)),
        );
      }
      await new Promise((r) => setTimeout(r, 50));
      if (t.requests.length !== last) {
        last = t.requests.length;
        quietSince = Date.now();
      }
    }
    const from = t.requests.length;
    await new Promise((r) => setTimeout(r, ms));
    const urls = t.requests.slice(from);
    return {
      requests: urls.length,
      urls,
      settle_ms: Date.now() - settling - ms,
      while_settling: t.requests.slice(before, from),
    };
  },

  async state({ page: name }) {
    const t = tab(name);
    const s = await t.page.evaluate(() => {
      const toast = document.querySelector("#toast");
      const ids = [...document.querySelectorAll("#tasks .task")].map((r) => r.dataset.id);
      const timeline = {};
      for (const e of document.querySelectorAll("#timeline .event")) {
        timeline[e.dataset.kind] = (timeline[e.dataset.kind] ?? 0) + 1;
      }
      return {
        dataset: { ...document.body.dataset },
        toast: toast && !toast.hidden ? toast.textContent.trim() : null,
        rows: ids,
        duplicates: ids.filter((id, i) => ids.indexOf(id) !== i),
        last_seq: window.board?.lastSeq ?? null,
        seq_decreases: window.__seq?.decreases ?? [],
        timeline,
      };
    });
    return { ...s, console_errors: t.errors };
  },

  async hold({ page: name, path, ms }) {
    const t = tab(name);
    // A route is removed by the very predicate it was added with.
    if (t.holding) await t.page.unroute(t.holding);
    t.holding = null;
    if (ms > 0) {
      const matches = (url) => new URL(url).pathname === path;
      t.holding = matches;
      await t.page.route(matches, async (route) => {
        if (route.request().method() !== "GET") return route.fallback();
        const answer = await route.fetch();
        t.held.answered += 1;
        await new Promise((r) => setTimeout(r, ms));
        await route.fulfill({ response: answer });
        t.held.delivered += 1;
      });
    }
    return {};
  },

  async held({ page: name, answered = 0, delivered = 0, timeout_ms = WAIT_MS }) {
    const t = tab(name);
    const start = Date.now();
    while (t.held.answered < answered || t.held.delivered < delivered) {
      if (Date.now() - start > timeout_ms) {
        throw new Error(
          `waited ${timeout_ms} ms for ${answered} held answers answered and ${delivered} delivered: ` +
            `${JSON.stringify(t.held)}; the page shows:${await describe(t)}`,
        );
      }
      await new Promise((r) => setTimeout(r, 10));
    }
    return { ...t.held };
  },

  async steady({ page: name, selector, ms }) {
    const t = tab(name);
    const broke = await t.page.evaluate(
      ({ selector, ms }) =>
        new Promise((resolve) => {
          const start = performance.now();
          const frame = () => {
            const at = performance.now() - start;
            if (!document.querySelector(selector)) return resolve(at);
            if (at >= ms) return resolve(null);
            requestAnimationFrame(frame);
          };
          frame();
        }),
      { selector, ms },
    );
    if (broke !== null) {
      throw new Error(`${selector} stopped matching ${broke.toFixed(0)} ms in; the page shows:${await describe(t)}`);
    }
    return {};
  },

  async screenshot({ page: name, path }) {
    await tab(name).page.screenshot({ path });
    return { path };
  },

  async scroll_end({ page: name, id, timeout_ms = WAIT_MS }) {
    const t = tab(name);
    const rows_before = await t.page.locator("#tasks .task").count();
    await t.page.evaluate(() => {
      const list = document.querySelector("#tasks");
      list.scrollTop = list.scrollHeight;
    });
    const sel = rowSelector(id);
    await awaiting(t, `${sel} after scrolling #tasks to its end`, () =>
      t.page.waitForSelector(sel, { state: "attached", timeout: timeout_ms }),
    );
    // In the scrolled box's view, not only in the DOM.
    const visible = await t.page.evaluate((sel) => {
      const box = document.querySelector("#tasks").getBoundingClientRect();
      const row = document.querySelector(sel).getBoundingClientRect();
      return row.height > 0 && row.bottom > box.top && row.top < box.bottom;
    }, sel);
    return { rows_before, rows_after: await t.page.locator("#tasks .task").count(), visible };
  },
};

out({ ready: true, chromium: browser.version() });
for await (const line of readline.createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  let cmd;
  try {
    cmd = JSON.parse(line);
    const run = commands[cmd.cmd];
    if (!run) throw new Error(`unknown command ${JSON.stringify(cmd.cmd)}`);
    out({ ok: true, ...(await run(cmd)) });
  } catch (e) {
    out({ ok: false, error: `${cmd?.cmd ?? "?"}: ${e.message}` });
  }
}
await browser.close();
process.exit(0);
