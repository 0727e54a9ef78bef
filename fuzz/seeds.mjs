// Writes the seed corpus of every fuzz target into fuzz/corpus/ from real parts: frames
// and sync messages of the JS automerge-repo peer, changes and DEFLATE streams of the JS
// Automerge, and the API's JSON and the config's TOML as the tests use them.
// Run: node fuzz/seeds.mjs (needs `npm install --prefix tests/js`).
import { createRequire } from "node:module";
import { mkdirSync, writeFileSync } from "node:fs";
import { deflateRawSync } from "node:zlib";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "../tests/js/package.json"));
const A = await import(require.resolve("@automerge/automerge"));
const { encode } = await import(require.resolve("cbor-x"));

const out = (target, name, data) => {
  const dir = join(here, "corpus", target);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, name), data);
};

// A list as swarmtodo lays it out, written by two actors.
let doc = A.from({ tasks: {}, agents: {} }, "01".repeat(16));
doc = A.change(doc, (d) => {
  d.tasks.t1 = { content: "Read the issue", status: "pending", priority: "medium", position: "a0", blocked_by: [] };
  d.tasks.t2 = { content: "Write the parser", status: "in_progress", owner: "w1", position: "a1", blocked_by: ["t1"] };
});
let other = A.clone(doc, "02".repeat(16));
other = A.change(other, (d) => {
  d.tasks.t1.status = "completed";
  d.tasks.t3 = { content: "A".repeat(300), status: "pending", position: "a2", blocked_by: [] };
});
const changes = A.getChanges(doc, other);
changes.forEach((c, i) => out("hub_changes", `change-${i}`, c));
out("hub_changes", "two-changes", Buffer.concat([Buffer.from([1]), ...A.getAllChanges(other)]));

// Sync messages, first and later.
let s1 = A.initSyncState();
let s2 = A.initSyncState();
let m;
let n = 0;
for (let round = 0; round < 4; round++) {
  [s1, m] = A.generateSyncMessage(other, s1);
  if (m) {
    out("sync_validate", `msg-${n++}`, m);
    [doc, s2] = A.receiveSyncMessage(doc, s2, m);
  }
  [s2, m] = A.generateSyncMessage(doc, s2);
  if (m) {
    out("sync_validate", `msg-${n++}`, m);
    [other, s1] = A.receiveSyncMessage(other, s1, m);
  }
}
// The whole document as one compressed chunk, which the validator inflates.
out("sync_validate", "saved-doc", A.save(other));

// Frames of the automerge-repo protocol.
const peer = "peer-fuzz";
out("wire_decode", "join", encode({ type: "join", senderId: peer, supportedProtocolVersions: ["1"], peerMetadata: { storageId: "s", isEphemeral: false } }));
out("wire_decode", "peer", encode({ type: "peer", senderId: "hub", targetId: peer, selectedProtocolVersion: "1", peerMetadata: {} }));
out("wire_decode", "request", encode({ type: "request", senderId: peer, targetId: "hub", documentId: "4FvxaPuPEUoh6bchuS5Z7YHcTq5B", data: A.generateSyncMessage(doc, A.initSyncState())[1] }));
out("wire_decode", "sync", encode({ type: "sync", senderId: peer, targetId: "hub", documentId: "4FvxaPuPEUoh6bchuS5Z7YHcTq5B", data: m ?? new Uint8Array([0x42, 0, 0, 0, 0]) }));
out("wire_decode", "ephemeral", encode({ type: "ephemeral", senderId: peer, targetId: "hub", documentId: "4FvxaPuPEUoh6bchuS5Z7YHcTq5B", sessionId: "s", count: 1, data: new Uint8Array([1, 2, 3]) }));
out("wire_decode", "error", encode({ type: "error", message: "nope" }));

// DEFLATE streams: text, zeros (a small bomb), a stored block; the first byte is the
// bound's low byte in the target's (u32, bytes) input.
const bound = Buffer.from([0, 0, 16, 0]);
out("inflate", "text", Buffer.concat([bound, deflateRawSync(Buffer.from("Read the issue ".repeat(40)))]));
out("inflate", "zeros", Buffer.concat([bound, deflateRawSync(Buffer.alloc(1 << 16))]));
out("inflate", "stored", Buffer.concat([bound, deflateRawSync(Buffer.from("abc"), { level: 0 })]));

// The JSON API and todo_write.
const writes = {
  "patch": { mode: "patch", ops: [{ op: "upsert", task: { id: "d", content: "D", status: "in_progress", priority: "high", blocked_by: ["a"] } }, { op: "move", id: "c", after: "a" }, { op: "remove", id: "b" }] },
  "replace": { mode: "replace", tasks: [{ id: "a", content: "A", status: "completed" }, { content: "New", active_form: "Making it" }], base_version: "0" },
  "cas": { mode: "patch", ops: [{ op: "upsert", task: { id: "a", owner: null, active_form: null } }], expected_version: "0", explanation: "why" },
};
for (const [name, w] of Object.entries(writes)) {
  out("todo_write", name, JSON.stringify(w));
  out("http_bodies", name, JSON.stringify(w));
}
out("http_bodies", "claim", JSON.stringify({ agent: "w1", task: "a" }));
out("http_bodies", "delegate", JSON.stringify({ task: "a", agent: "sub-1", list: "plan/a" }));

// The config file.
out("config", "full", `listen = "127.0.0.1:7700"
data = "swarmtodo.db"
log = "info"

[policy]
schema = "repair"
single_active = "repair"
single_active_scope = "per_owner"
dependencies = "report"
ownership = "repair"
lease_ms = 120000
lease = "release"

[roles]
default = "lead"
agents = { "sub-a" = "worker" }

[[tokens]]
token = "s3cret-lead-0123456789"
agent = "lead"
role = "lead"
lists = { "swarm-42" = "observer" }

[limits]
join_timeout_ms = 10000
connections_per_address_max = 4096
connections_per_token_max = 256
list_creations_burst = 100
list_creations_per_minute = 60
`);
console.log("seeds written under fuzz/corpus/");
