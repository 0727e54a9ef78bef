// A hostile automerge-repo peer for swarmtodo's tests (tests/hub/hostile_peers.rs): a
// real `@automerge/automerge-repo` client that writes what no honest client would.
//
//   node hostile.mjs WS_URL DOC_ID MODE [N]
//
// Finds the list DOC_ID on the hub at WS_URL (it must exist), registers its actor as
// agent $HOSTILE_AGENT (default "mallory"; the agent its token names, if it has one),
// makes MODE's change, waits until the hub has answered since and then been quiet for
// SETTLE_MS (its repairs and events have arrived), and prints what it then reads as
// JSON: {"tasks": {id: task}, "agents": {...}}.
//
// MODE:
//   wide N        N tasks with 30-character ids, all in_progress for owner "bob"
//   chain N       N tasks c0..c(N-1), each blocked_by the one before
//   wipe-delete   delete d.tasks
//   wipe-map      d.tasks = { x: {...} }
//   wipe-list     d.tasks = ["x"]
//   wipe-string   d.tasks = "pwned"
//   agents-delete delete d.agents
//   agents-lead   d.agents[myActor] = "lead", then an edit of t1
//   shapes        t2.blocked_by = "t1" (a string) and tasks.t0 = "just a string"
//   oversize      a task with 100 KB of content, one with a 1,000-byte id, an owner
//                 of 1,000 bytes
//   many N        N small tasks
import { Repo } from "@automerge/automerge-repo";
import { WebSocketClientAdapter } from "@automerge/automerge-repo-network-websocket";
import * as A from "@automerge/automerge";

const [url, docId, mode, nArg] = process.argv.slice(2);
if (!url || !docId || !mode) {
  console.error("usage: node hostile.mjs WS_URL DOC_ID MODE [N]");
  process.exit(2);
}
const n = Number(nArg ?? "0");
// Long enough that a hub under load, still merging a large change after answering a
// small one, is not taken for a hub that is done.
const SETTLE_MS = 3_000;

const repo = new Repo({ network: [new WebSocketClientAdapter(url)] });
let lastHeard = 0;
repo.networkSubsystem.on("message", () => {
  lastHeard = Date.now();
});
const handle = await repo.find(`automerge:${docId}`);
const actor = A.getActorId(handle.doc());
const task = (id, extra = {}) => ({
  content: `Do ${id}`,
  status: "pending",
  priority: "medium",
  blocked_by: [],
  position: "80",
  ...extra,
});

handle.change((d) => {
  d.agents[actor] = process.env.HOSTILE_AGENT ?? "mallory";
});

switch (mode) {
  case "wide":
    handle.change((d) => {
      for (let i = 0; i < n; i++) {
        const id = `wide-task-${String(i).padStart(20, "0")}`;
        d.tasks[id] = task(id, { status: "in_progress", owner: "bob", position: `8${i}` });
      }
    });
    break;
  case "chain":
    handle.change((d) => {
      for (let i = 0; i < n; i++) {
        const id = `c${i}`;
        d.tasks[id] = task(id, { blocked_by: i === 0 ? [] : [`c${i - 1}`], position: `8${i}` });
      }
    });
    break;
  case "many":
    handle.change((d) => {
      for (let i = 0; i < n; i++) {
        d.tasks[`m${i}`] = task(`m${i}`, { position: `8${i}` });
      }
    });
    break;
  case "wipe-delete":
    handle.change((d) => {
      delete d.tasks;
    });
    break;
  case "wipe-map":
    handle.change((d) => {
      d.tasks = { x: task("x") };
    });
    break;
  case "wipe-list":
    handle.change((d) => {
      d.tasks = ["x"];
    });
    break;
  case "wipe-string":
    handle.change((d) => {
      d.tasks = "pwned";
    });
    break;
  case "agents-delete":
    handle.change((d) => {
      delete d.agents;
    });
    break;
  case "agents-lead":
    handle.change((d) => {
      d.agents[actor] = "lead";
    });
    handle.change((d) => {
      d.tasks.t1.content = "Forged by mallory";
    });
    break;
  case "shapes":
    handle.change((d) => {
      d.tasks.t2.blocked_by = "t1";
      d.tasks.t0 = "just a string";
    });
    break;
  case "oversize":
    handle.change((d) => {
      d.tasks.big = task("big", { content: "x".repeat(100_000) });
      const long = "L".repeat(1_000);
      d.tasks[long] = task(long);
      d.tasks.t3.owner = "o".repeat(1_000);
    });
    break;
  default:
    console.error(`unknown mode ${mode}`);
    process.exit(2);
}

// Settled: the hub has answered since the change (it answers each sync message once
// merged, checked and stored) and then said nothing for SETTLE_MS; at most 60 s.
const changedAt = Date.now();
const deadline = changedAt + 60_000;
while (Date.now() < deadline) {
  const answered = lastHeard > changedAt;
  if (answered && Date.now() - lastHeard > SETTLE_MS) break;
  await new Promise((r) => setTimeout(r, 50));
}
const doc = handle.doc();
const plain = (v) => (v === undefined ? null : JSON.parse(JSON.stringify(v)));
const json = JSON.stringify({ tasks: plain(doc.tasks), agents: plain(doc.agents) });
// A pipe takes large output asynchronously: exit only once it is all written.
await new Promise((r) => process.stdout.write(json + "\n", r));
await repo.shutdown();
process.exit(0);
