/**
 * `Loop.resume` in TypeScript against a real daemon: a client that died after its calls
 * ran continues from the record (the calls' results from the journal, nothing run twice);
 * a run that died in `validating` sends its calls then; an ended run answers its record.
 * And the address: resolved as Python resolves it, EXECGATE_ADDR from any directory.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Client, Loop, type Message, ScriptedModel, type Turn } from "@execgate/client";

import { reconcile, toCall } from "../src/loop/batch.js";
import { Daemon, repoRoot } from "./support/daemon.js";

let daemon: Daemon;
let eg: Client;

before(async () => {
  daemon = await Daemon.start();
  writeFileSync(`${daemon.workspace}/a.txt`, "alpha\n");
  eg = new Client({ address: daemon.address });
});

after(async () => {
  eg.close();
  await daemon.stop();
});

class Crash extends Error {}

function crash(): Turn {
  throw new Crash("the client died");
}

test("a run whose client died after its batch resumes from the journal", async () => {
  const first = new ScriptedModel([ScriptedModel.calls(["read_file", { path: "a.txt" }]), crash]);
  await assert.rejects(new Loop(eg, first).run("read a.txt", { runId: "ts-resume-1" }), Crash);
  assert.equal((await eg.runs.get("ts-resume-1")).run.state, "requesting_model");
  let seen: readonly Message[] = [];
  const second = new ScriptedModel([
    (messages: readonly Message[]) => {
      seen = messages;
      return ScriptedModel.answer("a.txt says alpha");
    },
  ]);
  const result = await new Loop(eg, second).resume("ts-resume-1");
  assert.equal(result.state, "completed");
  const last = seen[seen.length - 1];
  assert.equal(last?.role, "tool_results");
  assert.match(last?.role === "tool_results" ? (last.results[0]?.content ?? "") : "", /alpha/);
  const detail = await eg.runs.get("ts-resume-1");
  assert.equal(detail.calls.length, 1, "the call ran once");
  const again = await new Loop(eg, new ScriptedModel([])).resume("ts-resume-1");
  assert.equal(again.state, "completed");
  assert.equal(again.answer, "a.txt says alpha");
});

test("a run that died while validating sends its calls on resume", async () => {
  // The model replied with calls and the client died before sending them: only the
  // record exists (appended by hand here, exactly as the loop writes it).
  const run = await eg.runs.start("read a.txt", { runId: "ts-resume-2" });
  const turn = {
    turn: {
      text: "",
      calls: [{ id: "c1", name: "read_file", arguments: { path: "a.txt" } }],
      stop_reason: "tool_calls",
    },
    usage: { input_tokens: 1, output_tokens: 1, cost: 0 },
  };
  const at = Date.now() / 1000;
  await eg.runs.append(run.runId, [
    {
      runId: run.runId,
      seq: 1,
      at,
      fromState: "created",
      toState: "requesting_model",
      reason: "run started",
      data: {},
    },
    {
      runId: run.runId,
      seq: 2,
      at,
      fromState: "requesting_model",
      toState: "validating",
      reason: "model replied",
      data: turn,
    },
  ]);
  const model = new ScriptedModel([ScriptedModel.answer("done")]);
  const result = await new Loop(eg, model).resume(run.runId);
  assert.equal(result.state, "completed");
  const detail = await eg.runs.get(run.runId);
  assert.deepEqual(
    detail.calls.map((c) => [c.callId, c.tool, c.outcome?.status]),
    [["s1c1", "read_file", "success"]],
  );
});

test("the address resolves as Python's does, and EXECGATE_ADDR works from any directory", () => {
  const elsewhere = mkdtempSync(join(tmpdir(), "eg-addr-"));
  const index = fileURLToPath(new URL("../src/index.js", import.meta.url));
  const python = process.env["EXECGATE_PYTHON"] ?? join(repoRoot(), ".venv", "bin", "python");
  const cases: [string, string][] = [
    ["", ""],
    ["", "unix:state/rel.sock"],
    ["unix:var/execgate.sock", ""],
    ["unix:/abs/execgate.sock", "unix:ignored.sock"],
    ["127.0.0.1:7000", ""],
  ];
  for (const [given, env] of cases) {
    const run = (cmd: string, args: string[]): string =>
      execFileSync(cmd, args, {
        cwd: elsewhere,
        encoding: "utf8",
        env: { ...process.env, EXECGATE_ADDR: env },
      }).trim();
    const ts = run(process.execPath, [
      "--input-type=module",
      "-e",
      `const m = await import(${JSON.stringify(index)}); console.log(m.resolveAddress(${JSON.stringify(given)}));`,
    ]);
    const py = run(python, [
      "-c",
      `from execgate.client.wire import resolve_address; print(resolve_address(${JSON.stringify(given)} or None))`,
    ]);
    assert.equal(ts, py, `address ${JSON.stringify(given)}, EXECGATE_ADDR ${JSON.stringify(env)}`);
    assert.ok(!ts.startsWith("unix:") || ts.startsWith("unix:/"), ts);
  }
  // An agent started in another directory reaches the daemon through EXECGATE_ADDR.
  const tools = execFileSync(
    process.execPath,
    [
      "--input-type=module",
      "-e",
      `const m = await import(${JSON.stringify(index)}); const c = new m.Client();` +
        " console.log((await c.listTools()).length); c.close();",
    ],
    { cwd: elsewhere, encoding: "utf8", env: { ...process.env, EXECGATE_ADDR: daemon.address } },
  );
  assert.ok(Number(tools.trim()) > 0, tools);
});

test("a call still running is waited for on the Execute stream, joined to the one run", async () => {
  const run = await eg.runs.start("sleep a moment");
  const p = {
    callId: "s1c1",
    index: 0,
    modelId: "m1",
    tool: "run_command",
    arguments: { argv: ["sleep", "1"] },
  };
  const first = (async () => {
    const events = [];
    for await (const e of eg.execute([toCall(run.runId, p)], { runId: run.runId })) events.push(e);
    return events;
  })();
  for (let i = 0; ; i++) {
    const running = await eg.getCall("s1c1", { runId: run.runId }).then(
      (r) => r.running,
      () => false,
    );
    if (running) break;
    assert.ok(i < 200, "the call did not start");
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  const outcomes = await reconcile(eg, run.runId, [p], 30, undefined);
  assert.equal(outcomes.get("s1c1")?.status, "success");
  assert.equal(outcomes.get("s1c1")?.replayOf, "s1c1", "from the stream, joined to the one run");
  assert.equal((await first).at(-1)?.kind, "finished");
  assert.equal((await eg.runs.get(run.runId)).calls.length, 1);
});
