// A real automerge-repo client (@automerge/automerge-repo + its WebSocket adapter) for
// swarmtodo's end-to-end tests (tests/hub_e2e.rs).
//
//   node repo_client.mjs WS_URL DOC_ID
//
// Finds the list DOC_ID on the hub at WS_URL, prints what it reads, then — as agent
// "js-agent" — starts two tasks for the same owner at once (t2 and t3 in_progress for
// "bob"), which breaks the single-active invariant. It waits until the hub's repair
// comes back (at most one in_progress for bob) and prints the list again as JSON:
//   {"before": [...], "after": [...]}
import { Repo } from "@automerge/automerge-repo";
import { WebSocketClientAdapter } from "@automerge/automerge-repo-network-websocket";
import * as A from "@automerge/automerge";

const [url, docId] = process.argv.slice(2);
if (!url || !docId) {
  console.error("usage: node repo_client.mjs WS_URL DOC_ID");
  process.exit(2);
}
const deadline = Date.now() + 20_000;
const fail = (msg) => {
  console.error(msg);
  process.exit(1);
};

const repo = new Repo({ network: [new WebSocketClientAdapter(url)] });
const handle = await repo.find(`automerge:${docId}`);
const read = (doc) =>
  Object.entries(doc.tasks ?? {})
    .map(([id, t]) => ({
      id,
      content: String(t.content),
      status: String(t.status),
      owner: t.owner === undefined ? null : String(t.owner),
      position: String(t.position),
    }))
    .sort((a, b) => (a.position + a.id < b.position + b.id ? -1 : 1));

const before = read(handle.doc());
if (before.length === 0) fail("the list arrived empty");
const actor = A.getActorId(handle.doc());
handle.change((d) => {
  d.agents[actor] = "js-agent";
  d.tasks.t2.status = "in_progress";
  d.tasks.t2.owner = "bob";
  d.tasks.t3.status = "in_progress";
  d.tasks.t3.owner = "bob";
});

const active = (doc) =>
  Object.values(doc.tasks).filter(
    (t) => String(t.status) === "in_progress" && String(t.owner) === "bob",
  ).length;
while (active(handle.doc()) > 1) {
  if (Date.now() > deadline) fail("the hub's repair never arrived");
  await new Promise((r) => setTimeout(r, 50));
}
console.log(JSON.stringify({ before, after: read(handle.doc()) }));
await repo.shutdown();
process.exit(0);
