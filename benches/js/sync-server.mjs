// The JS automerge-repo sync server, as automerge-repo-sync-server runs it (a Repo with
// a NodeWSServerAdapter, no storage, announcing nothing), for benches/side_by_side.
//
//   node sync-server.mjs PORT
//
// Prints "js listening on ws://127.0.0.1:PORT" once it accepts connections.
import { WebSocketServer } from "ws";
import { Repo } from "@automerge/automerge-repo";
import { NodeWSServerAdapter } from "@automerge/automerge-repo-network-websocket";

const port = Number(process.argv[2]);
if (!port) {
  console.error("usage: node sync-server.mjs PORT");
  process.exit(2);
}
const wss = new WebSocketServer({
  host: "127.0.0.1",
  port,
  maxPayload: 64 * 1024 * 1024,
});
new Repo({
  network: [new NodeWSServerAdapter(wss)],
  peerId: "js-sync-server",
  sharePolicy: async () => false,
});
wss.on("listening", () => console.log(`js listening on ws://127.0.0.1:${port}`));
