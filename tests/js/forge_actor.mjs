// A hostile worker for swarmtodo's tests (tests/hub/identity.rs): a real automerge-repo
// peer that writes with another agent's actor id.
//
//   node forge_actor.mjs WS_URL DOC_ID ACTOR_HEX TASK_ID TEXT
//
// Finds the list DOC_ID on the hub at WS_URL (the URL carries the worker's token), takes
// ACTOR_HEX (the lead's actor) as its own, sets task TASK_ID's content to TEXT and
// syncs. Prints what became of it as JSON: {"close": {"code", "reason"} | null,
// "errors": [the hub's error messages]}.
import { Repo } from "@automerge/automerge-repo";
import { WebSocketClientAdapter } from "@automerge/automerge-repo-network-websocket";
import * as A from "@automerge/automerge";
import { decode } from "cbor-x";

const [url, docId, actor, taskId, text] = process.argv.slice(2);
if (!url || !docId || !actor || !taskId || text === undefined) {
  console.error("usage: node forge_actor.mjs WS_URL DOC_ID ACTOR_HEX TASK_ID TEXT");
  process.exit(2);
}
const fail = (msg) => {
  console.error(msg);
  process.exit(1);
};

// No reconnection within the run: the hub's verdict on this connection is the result.
const adapter = new WebSocketClientAdapter(url, 600_000);
const repo = new Repo({ network: [adapter] });
let close = null;
const errors = [];
let watched = null;
const watch = setInterval(() => {
  const socket = adapter.socket;
  if (!socket || socket === watched) return;
  watched = socket;
  socket.addEventListener("close", (e) => {
    close ??= { code: e.code, reason: e.reason };
  });
  socket.addEventListener("message", (e) => {
    try {
      const m = decode(new Uint8Array(e.data));
      if (m.type === "error") errors.push(m.message);
    } catch {}
  });
}, 1);

const handle = await repo.find(`automerge:${docId}`);
if (!handle.doc().tasks?.[taskId]) fail(`no task ${taskId} in the list`);
handle.update((d) => A.clone(d, { actor }));
if (A.getActorId(handle.doc()) !== actor) fail("the actor did not take");
handle.change((d) => {
  d.tasks[taskId].content = text;
});

const deadline = Date.now() + 5_000;
while (close === null && Date.now() < deadline) {
  await new Promise((r) => setTimeout(r, 50));
}
clearInterval(watch);
console.log(JSON.stringify({ close, errors }));
process.exit(0);
