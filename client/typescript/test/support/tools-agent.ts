/**
 * The TypeScript side of tests/integration/test_tools_clients.py's cross-language check:
 * against the Python test's daemon, list the tools and run the declared `shout` and the
 * MCP `faulty.echo`, then print what it saw as one JSON line.
 *
 *     node dist/test/support/tools-agent.js --addr ADDR
 */

import { parseArgs } from "node:util";

import { Client } from "@execgate/client";

const { values } = parseArgs({ options: { addr: { type: "string" } } });
const client = new Client({ address: values.addr });
try {
  const tools = await client.listTools();
  const shout = await client.executeOne("shout", { text: "from node" });
  const echo = await client.executeOne("faulty.echo", { text: "from node" });
  const providers = await client.listProviders();
  console.log(
    JSON.stringify({
      providers: Object.fromEntries(tools.map((t) => [t.name, t.provider])),
      outcomes: [shout, echo].map((o) => ({ status: o.status, text: o.text })),
      servers: providers.map((p) => ({ provider: p.provider, running: p.running })),
    }),
  );
} finally {
  client.close();
}
