// A real JS Automerge peer for swarmtodo's interop tests (tests/interop/js.rs).
//
//   node interop.mjs edit IN OUT ACTOR_HEX
//
// Loads the list a Rust replica saved to IN, prints what JS reads from it (JSON on
// stdout), then edits it the way a JS client would — native JS strings, which Automerge
// stores as Text objects — and saves the result to OUT:
//   - adds task "js1" ("Written in JS", priority high) at the end of the list,
//   - rewrites t1's content,
//   - sets t2's status to "done" (not a valid status: the authority must repair it),
//   - registers its actor as agent "js-agent".
import * as A from "@automerge/automerge";
import { readFileSync, writeFileSync } from "node:fs";

const [cmd, input, output, actor] = process.argv.slice(2);
if (cmd !== "edit" || !input || !output || !actor) {
  console.error("usage: node interop.mjs edit IN OUT ACTOR_HEX");
  process.exit(2);
}

const doc = A.load(new Uint8Array(readFileSync(input)), { actor });
const str = (v) => (v === undefined || v === null ? null : String(v));
const read = Object.entries(doc.tasks).map(([id, t]) => ({
  id,
  content: str(t.content),
  status: str(t.status),
  priority: str(t.priority),
  owner: str(t.owner),
  position: str(t.position),
  blocked_by: (t.blocked_by ?? []).map(String),
}));

const maxPos = read.map((t) => t.position ?? "").sort().at(-1) ?? "80";
const next = A.change(doc, { time: 0 }, (d) => {
  d.tasks.js1 = {
    content: "Written in JS",
    status: "pending",
    priority: "high",
    blocked_by: [],
    position: maxPos + "80",
  };
  d.tasks.t1.content = "Edited in JS";
  d.tasks.t2.status = "done";
  d.agents[actor] = "js-agent";
});
writeFileSync(output, A.save(next));

const kinds = {
  // How JS stored what it wrote: native strings become Text objects.
  js1_content_is_string: typeof next.tasks.js1.content === "string",
};
console.log(JSON.stringify({ read, kinds }));
