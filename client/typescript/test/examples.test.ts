/**
 * The example runs as documented, against a real daemon, and what it prints is what the
 * daemon recorded; `execgate runs show` reads the TypeScript runs like Python ones.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { Client, type RunInfo } from "@execgate/client";

import { Daemon, execgateBin } from "./support/daemon.js";

const run = promisify(execFile);
const EXAMPLE = fileURLToPath(new URL("../examples/minimal-loop.js", import.meta.url));

let daemon: Daemon;

before(async () => {
  daemon = await Daemon.start();
});

after(async () => {
  await daemon.stop();
});

test("minimal-loop shows a completed and an expired run", async () => {
  const { stdout: out } = await run(process.execPath, [EXAMPLE, "--addr", daemon.address]);
  assert.match(out, /scenario 1/);
  assert.match(out, /ended: completed -- final answer accepted/);
  assert.match(out, /answer: the note says: hello from a loop/);
  assert.match(out, /ended: expired \(rule max_steps\)/);
  assert.ok(out.indexOf("ended: completed") < out.indexOf("ended: expired"));
  assert.match(out, /validating -> completed/);
  assert.match(out, /requesting_model -> expired/);

  const client = new Client({ address: daemon.address });
  let runs: RunInfo[];
  try {
    runs = await client.runs.find();
  } finally {
    client.close();
  }
  assert.deepEqual(runs.map((r) => r.state).sort(), ["completed", "expired"]);
  for (const r of runs) {
    assert.ok(out.includes(`run ${r.runId} ended: ${r.state}`), out);
    assert.deepEqual(r.labels, { client: "typescript" });
  }
  const note = readFileSync(join(daemon.workspace, "minimal_loop_note.txt"), "utf8");
  assert.equal(note, "hello from a loop\n");

  // The Python CLI shows a TypeScript run as it shows its own.
  const completed = runs.find((r) => r.state === "completed");
  assert.ok(completed);
  const shown = await run(
    execgateBin(),
    ["runs", "show", completed.runId, "--addr", daemon.address],
    {
      env: { ...process.env, COLUMNS: "200" },
    },
  );
  assert.match(shown.stdout, /state: completed\s+\(final answer accepted\)/);
  assert.match(shown.stdout, /sent s1c1 write_file/);
  assert.match(shown.stdout, /s2c1 success/);
  assert.match(shown.stdout, /2 action\(s\); answer: the note says: hello from a loop/);
});

test("minimal-loop says when no daemon answers", async () => {
  const missing = await run(process.execPath, [
    EXAMPLE,
    "--addr",
    `unix:${join(daemon.root, "nothing.sock")}`,
  ]).then(
    () => assert.fail("it exited 0"),
    (err: { code: number; stdout: string; stderr: string }) => err,
  );
  assert.equal(missing.code, 2);
  assert.match(missing.stderr, /no execgate daemon answers/);
  assert.equal(missing.stdout, "");
});
