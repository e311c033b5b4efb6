// Follows one Field subscription resource with the official MCP TypeScript SDK, on the
// 2025 revision (a session, resources/subscribe, notifications/resources/updated), through
// restarts of the Field: tests/test_mcp_typescript.py runs it.
//
//   node follow.mjs <mcp url> <bearer token> <subscription id> <how many>
//
// Prints one JSON line per notification read ({"unit": ..., "cursor": ...}), a line
// {"connected": n} each time a session is up and subscribed, and exits once it has
// read <how many>. It keeps the cursor of its last read: after the Field went away it
// opens a new session, subscribes again and reads once with ?since=<cursor>, which
// returns exactly what it missed.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ResourceUpdatedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, token, subscriptionId, wantedText] = process.argv.slice(2);
const wanted = Number(wantedText);
const uri = `field://subscriptions/${subscriptionId}`;
let cursor = null;
let seen = 0;
let connections = 0;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const print = (value) => process.stdout.write(JSON.stringify(value) + "\n");

async function readAll(client) {
  // a read that leaves some behind says "more": read again until it does not
  for (;;) {
    const target = cursor === null ? uri : `${uri}?since=${encodeURIComponent(cursor)}`;
    const result = await client.readResource({ uri: target });
    const page = JSON.parse(result.contents[0].text);
    for (const notification of page.notifications) {
      print({ unit: notification.memory_unit_id, cursor: notification.cursor });
      seen += 1;
    }
    if (page.cursor) cursor = page.cursor;
    if (seen >= wanted) process.exit(0);
    if (!page.more) return;
  }
}

async function follow() {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
    reconnectionOptions: { maxRetries: 0 },
  });
  const client = new Client({ name: "field-ts-follower", version: "1.0.0" });
  const ended = new Promise((resolve) => {
    transport.onclose = resolve;
    transport.onerror = resolve;
  });
  let pending = Promise.resolve();
  client.setNotificationHandler(ResourceUpdatedNotificationSchema, (message) => {
    if (message.params.uri === uri) pending = pending.then(() => readAll(client));
  });
  await client.connect(transport);
  await client.subscribeResource({ uri });
  connections += 1;
  print({ connected: connections, protocol: transport.protocolVersion ?? null });
  pending = pending.then(() => readAll(client)); // what was missed while away
  await ended;
  await pending.catch(() => {});
}

for (;;) {
  try {
    await follow();
  } catch {
    // the Field is not there (killed, restarting): try again shortly
  }
  await sleep(100);
}
