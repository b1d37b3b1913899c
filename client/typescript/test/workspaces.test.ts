/**
 * The TypeScript client naming workspaces, against a real daemon whose policy gives each
 * agent its own (`home`, under `spaces/{agent}`) and the agent `ann` also `shared`.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Client, PermissionDenied } from "@execgate/client";

import { Daemon, type Who } from "./support/daemon.js";

const PEOPLE: Who[] = [
  { name: "ann", roles: ["agent"], token: "ann-" + "a".repeat(40) },
  { name: "ben", roles: ["agent"], token: "ben-" + "b".repeat(40) },
];
const TOKEN = Object.fromEntries(PEOPLE.map((p) => [p.name, p.token]));

let daemon: Daemon;
const clients: Client[] = [];

function as(who: string, workspace?: string): Client {
  const client = new Client({ address: daemon.address, token: TOKEN[who] ?? who, workspace });
  clients.push(client);
  return client;
}

function spaces(): string {
  return join(daemon.root, "spaces");
}

before(async () => {
  // Absolute roots under the daemon's directory (a relative one would be relative to
  // the daemon's working directory).
  daemon = await Daemon.start({
    people: PEOPLE,
    policy: (root: string) => `\
version: 1
default: deny
rules:
  - {id: everything, effect: allow, tools: ['*']}
workspaces:
  - {name: home, root: "${join(root, "spaces", "{agent}")}"}
  - {name: shared, root: "${join(root, "spaces", "shared")}", agents: [ann]}
`,
  });
});

after(async () => {
  for (const c of clients) c.close();
  await daemon.stop();
});

describe("workspaces", () => {
  test("each agent's calls work in its own workspace; a named one is used", async () => {
    const ann = await as("ann").executeOne("write_file", { path: "me.txt", content: "ann" });
    const ben = await as("ben").executeOne("write_file", { path: "me.txt", content: "ben" });
    assert.equal(ann.status, "success");
    assert.equal(ben.status, "success");
    assert.equal(readFileSync(join(spaces(), "ann", "me.txt"), "utf8"), "ann");
    assert.equal(readFileSync(join(spaces(), "ben", "me.txt"), "utf8"), "ben");

    const shared = await as("ann", "shared").executeOne("write_file", {
      path: "s.txt",
      content: "from ann",
    });
    assert.equal(shared.status, "success");
    assert.ok(existsSync(join(spaces(), "shared", "s.txt")));
    const read = await as("ann").executeOne(
      "read_file",
      { path: "s.txt" },
      { workspace: "shared" },
    );
    assert.equal(read.text, "from ann");

    const listed = await as("ann").listCalls({ workspace: "shared" });
    assert.ok(listed.length >= 2);
    assert.ok(listed.every((r) => r.workspace === "shared"));
  });

  test("a workspace not given is REJECTED permission_denied naming the field", async () => {
    for (const name of ["shared", "no-such-space"]) {
      const o = await as("ben").executeOne(
        "write_file",
        { path: "x.txt", content: "no" },
        { workspace: name },
      );
      assert.equal(o.status, "rejected");
      assert.equal(o.errorClass, "permission_denied");
      assert.equal(o.field, "workspace");
      assert.equal(o.message, `workspace '${name}' is not given to ben`);
    }
    assert.ok(!existsSync(join(spaces(), "shared", "x.txt")));
  });

  test("a run is bound to one workspace", async () => {
    const ann = as("ann");
    const run = await ann.runs.start("in shared", { workspace: "shared" });
    assert.equal(run.workspace, "shared");
    const o = await ann.executeOne(
      "write_file",
      { path: "run.txt", content: "r" },
      {
        runId: run.runId,
      },
    );
    assert.equal(o.status, "success");
    assert.ok(existsSync(join(spaces(), "shared", "run.txt")));
    const other = await ann.executeOne(
      "read_file",
      { path: "run.txt" },
      {
        runId: run.runId,
        workspace: "home",
      },
    );
    assert.equal(other.status, "rejected");
    assert.equal(other.field, "workspace");
    await assert.rejects(
      as("ben").runs.start("not mine", { workspace: "shared" }),
      PermissionDenied,
    );
  });
});
