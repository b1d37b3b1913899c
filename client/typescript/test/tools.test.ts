/**
 * The TypeScript client against a real daemon serving a declared command tool and the
 * fixture MCP server (tests/fixtures/mcp/faulty_server.py, run with the venv's python):
 * both listed with their provider, both executed, each with its status and result text.
 * The Python twin is tests/integration/test_tools_clients.py.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Client } from "@execgate/client";

import { Daemon, repoRoot } from "./support/daemon.js";

const POLICY = `\
version: 1
default: deny
rules:
  - {id: mine, effect: allow, tools: [shout, "faulty.*"], reason: the test's tools}
`;

function toolsYaml(): string {
  const python = JSON.stringify(join(repoRoot(), ".venv", "bin", "python"));
  const fixture = JSON.stringify(join(repoRoot(), "tests", "fixtures", "mcp", "faulty_server.py"));
  return `\
version: 1
tools:
  - name: shout
    description: echo the text back
    input_schema:
      type: object
      properties: {text: {type: string}}
      required: [text]
      additionalProperties: false
    argv: [echo, "{text}"]
    effects: {}
servers:
  - name: faulty
    command: ${python}
    args: [${fixture}]
`;
}

let daemon: Daemon;
let client: Client;
const dir = mkdtempSync(join(tmpdir(), "execgate-ts-tools-"));

before(async () => {
  const file = join(dir, "tools.yaml");
  writeFileSync(file, toolsYaml());
  daemon = await Daemon.start({ policy: POLICY, args: ["--tools", file] });
  client = new Client({ address: daemon.address });
});

after(async () => {
  client?.close();
  await daemon?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe("declared and MCP tools", () => {
  test("both are listed with their provider", async () => {
    const specs = new Map((await client.listTools()).map((t) => [t.name, t]));
    assert.equal(specs.get("shout")?.provider, "command");
    assert.equal(specs.get("shout")?.readOnly, true);
    assert.equal(specs.get("faulty.echo")?.provider, "mcp:faulty");
    assert.equal(specs.get("faulty.echo")?.readOnly, false); // untrusted: a writer
    assert.equal(specs.get("shout")?.annotationsTrusted, true);
    assert.equal(specs.get("faulty.echo")?.annotationsTrusted, false);
  });

  test("the server's state", async () => {
    const [faulty, ...others] = await client.listProviders();
    assert.deepEqual(others, []);
    assert.equal(faulty?.provider, "mcp:faulty");
    assert.equal(faulty?.lastError, "");
    assert.ok((faulty?.tools ?? 0) >= 8, JSON.stringify(faulty));
  });

  test("the declared tool runs", async () => {
    const o = await client.executeOne("shout", { text: "hello $(id)" });
    assert.equal(o.status, "success", o.message);
    assert.equal(o.text, "hello $(id)\n");
  });

  test("the MCP tool runs", async () => {
    const o = await client.executeOne("faulty.echo", { text: "from typescript" });
    assert.equal(o.status, "success", o.message);
    assert.equal(o.text, "from typescript");
  });

  test("the MCP tool's error is typed", async () => {
    const o = await client.executeOne("faulty.fails", { why: "on purpose" });
    assert.equal(o.status, "failure");
    assert.equal(o.errorClass, "tool_error");
  });
});
