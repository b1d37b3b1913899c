/**
 * A resumed TypeScript loop waits for its calls on the Execute stream, never by polling
 * GetCall (client/loop/batch.py, tests/integration/test_loop_resume_wait.py). The call is
 * parked for an approval at a daemon that restarted (no stream follows it); the resumed loop
 * re-sends it with its id and idempotency key and the daemon joins it to the parked
 * call. GetCall and Execute are counted on the client the loop uses.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";

import { type Call, Client, Loop, ScriptedModel } from "@execgate/client";

import { Daemon, type Who, waitUntil } from "./support/daemon.js";

const PEOPLE: Who[] = [
  { name: "bot", roles: ["agent"], token: "bot-" + "b".repeat(40) },
  { name: "alice", roles: ["approver"], token: "alice-" + "a".repeat(40) },
];
const POLICY = `\
version: 1
default: deny
rules:
  - id: tee
    effect: ask
    tools: [run_command]
    argv_prefix: [[tee]]
    approvers: [approver]
    ttl: 60
    reason: appending needs a human
`;

let daemon: Daemon;

before(async () => {
  daemon = await Daemon.start({ people: PEOPLE, policy: POLICY });
});

after(async () => {
  await daemon.stop();
});

function as(who: 0 | 1): Client {
  return new Client({ address: daemon.address, token: PEOPLE[who]?.token });
}

test("a resumed loop waits for its parked call on the stream, not by polling", async () => {
  const runId = "ts-parked-no-polling";
  const tee = ["run_command", { argv: ["tee", "-a", "approved.txt"], stdin: "ran\n" }] as const;
  const first = as(0);
  const dying = new Loop(first, new ScriptedModel([ScriptedModel.calls(tee)])).run("tee", {
    runId,
  });
  dying.catch(() => undefined); // awaited below, once the daemon has gone
  await waitUntil(async () => {
    const state = await first.runs.get(runId).then(
      (d) => d.run.state,
      () => "", // not started yet
    );
    return state === "awaiting_approval";
  }, "the call parked");
  await daemon.restart();
  await assert.rejects(dying); // its stream ended with the daemon
  first.close();

  const bot = as(0);
  const alice = as(1);
  try {
    const asked: string[] = [];
    const streams: string[][] = [];
    const getCall = bot.getCall.bind(bot);
    const execute = bot.execute.bind(bot);
    bot.getCall = (callId, options) => {
      asked.push(callId);
      return getCall(callId, options);
    };
    bot.execute = (calls, options) => {
      const sent: Call[] = [...calls];
      streams.push(sent.map((c) => c.callId ?? ""));
      return execute(sent, options);
    };

    const model = new ScriptedModel([ScriptedModel.answer("appended once")]);
    const resumed = new Loop(bot, model).resume(runId);
    // Approve only once the loop waits: on its stream, or (polling) asking again.
    await waitUntil(() => streams.length > 0 || asked.length > 1, "the resumed loop to wait");
    const [pending] = (await alice.approvals.pending()).filter((a) => a.runId === runId);
    assert.ok(pending, "the call is still parked at the restarted daemon");
    await alice.approvals.approve(pending.approvalId, "go");
    const result = await resumed;

    assert.equal(result.state, "completed", result.reason);
    assert.deepEqual(asked, ["s1c1"], "GetCall polled while the call awaited its approval");
    assert.deepEqual(streams, [["s1c1"]]);
    const approvals = await alice.approvals.ofRun(runId);
    assert.deepEqual(
      approvals.map((a) => a.approvalId),
      [pending.approvalId],
    );
    assert.equal(readFileSync(`${daemon.workspace}/approved.txt`, "utf8"), "ran\n");
    const detail = await bot.runs.get(runId);
    assert.deepEqual(
      detail.calls.map((c) => [c.callId, c.outcome?.status]),
      [["s1c1", "success"]],
    );
  } finally {
    bot.close();
    alice.close();
  }
});
