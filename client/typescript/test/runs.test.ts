/**
 * client.runs against a real daemon: start, append, get, find, cancel, watch, and the
 * daemon's refusals of a history that does not continue the run (gap, duplicate,
 * discontinuous, illegal, ended, cancel_requested, exists).
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  type CancelNotice,
  Client,
  isCancelNotice,
  Machine,
  RunNotFound,
  RunRefused,
  type Transition,
} from "@execgate/client";

import { Daemon } from "./support/daemon.js";

let daemon: Daemon;
let client: Client;

before(async () => {
  daemon = await Daemon.start();
  client = new Client({ address: daemon.address });
});

after(async () => {
  client.close();
  await daemon.stop();
});

async function refusal(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof RunRefused, String(err));
    return err.kind;
  }
  assert.fail("the daemon accepted it");
}

test("start records the goal, limits, labels and owner; get returns the run", async () => {
  const info = await client.runs.start("count the files", {
    runId: "runs-start",
    limits: { maxSteps: 7, deadlineSeconds: 60 },
    model: "scripted",
    configVersion: "v1",
    labels: { client: "typescript", team: "qa" },
  });
  assert.equal(info.runId, "runs-start");
  assert.equal(info.owner, "local");
  assert.equal(info.state, "created");
  assert.equal(info.terminal, false);
  assert.equal(info.lastSeq, 0);
  assert.deepEqual(info.limits, { maxSteps: 7, deadlineSeconds: 60 });
  assert.deepEqual(info.labels, { client: "typescript", team: "qa" });
  assert.ok(Math.abs(info.createdAt - Date.now() / 1000) < 60);

  const detail = await client.runs.get("runs-start");
  assert.equal(detail.run.goal, "count the files");
  assert.equal(detail.run.model, "scripted");
  assert.deepEqual(detail.events, []);
  assert.deepEqual(detail.calls, []);
  assert.equal(await refusal(client.runs.start("again", { runId: "runs-start" })), "exists");
  const assigned = await client.runs.start("no id given");
  assert.match(assigned.runId, /^run_/);
});

test("append persists transitions in order, all or none", async () => {
  const run = await client.runs.start("append", { runId: "runs-append" });
  const m = new Machine(run.runId);
  const first = m.advance("requesting_model", "run started");
  let info = await client.runs.append(run.runId, [first]);
  assert.equal(info.state, "requesting_model");
  assert.equal(info.lastSeq, 1);

  const second = m.advance("validating", "model replied", { turn: { text: "é ✓", calls: [] } });
  const third = m.advance("requesting_model", "answer not accepted", { finding: "no" });
  const shifted = (t: Transition, seq: number): Transition => ({ ...t, seq });

  assert.equal(await refusal(client.runs.append(run.runId, [shifted(third, 3)])), "gap");
  assert.equal(await refusal(client.runs.append(run.runId, [first])), "duplicate");
  assert.equal(await refusal(client.runs.append(run.runId, [shifted(third, 2)])), "discontinuous");
  const completed = { ...second, toState: "completed" as const };
  assert.equal(
    await refusal(client.runs.append(run.runId, [{ ...completed, fromState: "requesting_model" }])),
    "illegal",
  );
  // One bad event refuses the whole append.
  assert.equal(await refusal(client.runs.append(run.runId, [second, shifted(third, 4)])), "gap");
  assert.equal((await client.runs.get(run.runId)).run.lastSeq, 1);

  info = await client.runs.append(run.runId, [second, third]);
  assert.equal(info.lastSeq, 3);
  const detail = await client.runs.get(run.runId);
  assert.deepEqual(
    detail.events.map((e) => [e.seq, e.fromState, e.toState, e.reason]),
    [
      [1, "created", "requesting_model", "run started"],
      [2, "requesting_model", "validating", "model replied"],
      [3, "validating", "requesting_model", "answer not accepted"],
    ],
  );
  assert.deepEqual(detail.events[1]?.data, { turn: { text: "é ✓", calls: [] } });
  assert.ok(Math.abs((detail.events[0]?.at ?? 0) - first.at) < 1e-3);
});

test("unknown runs are RunNotFound", async () => {
  await assert.rejects(client.runs.get("no-such-run"), RunNotFound);
  const m = new Machine("no-such-run");
  await assert.rejects(
    client.runs.append("no-such-run", [m.advance("requesting_model", "x")]),
    (err: unknown) => err instanceof RunNotFound && err.runId === "no-such-run",
  );
});

test("a cancel is carried by the next append's reply; the run may not complete, then ends", async () => {
  const run = await client.runs.start("cancel me", { runId: "runs-cancel" });
  const m = new Machine(run.runId);
  await client.runs.append(run.runId, [m.advance("requesting_model", "run started")]);
  const asked = await client.runs.cancel(run.runId, "stop it");
  assert.equal(asked.cancel?.reason, "stop it");
  assert.equal(asked.cancel?.requester, "local");
  assert.equal(asked.state, "requesting_model"); // the loop records the terminal state

  const reply = await client.runs.append(run.runId, [m.advance("validating", "model replied")]);
  assert.equal(reply.cancel?.reason, "stop it");
  const done = m.advance("completed", "final answer accepted");
  assert.equal(await refusal(client.runs.append(run.runId, [done])), "cancel_requested");

  const stop = new Machine(run.runId);
  for (const s of ["requesting_model", "validating"] as const) stop.advance(s, "");
  const ended = await client.runs.append(run.runId, [
    stop.advance("cancelled", "cancelled by local"),
  ]);
  assert.ok(ended.terminal);
  assert.equal(ended.state, "cancelled");
  const later = stop.nextSeq;
  assert.equal(later, 4);
  assert.equal(
    await refusal(
      client.runs.append(run.runId, [
        {
          runId: run.runId,
          seq: 4,
          at: 0,
          fromState: "cancelled",
          toState: "failed",
          reason: "",
          data: {},
        },
      ]),
    ),
    "ended",
  );
});

test("find lists runs by state", async () => {
  const active = await client.runs.find({ states: ["active"] });
  assert.ok(active.some((r) => r.runId === "runs-append"));
  assert.ok(!active.some((r) => r.runId === "runs-cancel"));
  const cancelled = await client.runs.find({ states: ["cancelled"] });
  assert.deepEqual(
    cancelled.map((r) => r.runId),
    ["runs-cancel"],
  );
});

test("watch sends the history, then new events and the cancel, and ends with the run", async () => {
  const run = await client.runs.start("watch me", { runId: "runs-watch" });
  const m = new Machine(run.runId);
  await client.runs.append(run.runId, [m.advance("requesting_model", "run started")]);

  const seen: (Transition | CancelNotice)[] = [];
  const watching = (async () => {
    for await (const update of client.runs.watch(run.runId)) {
      seen.push(update);
      // Move on only once the watcher has seen each step (no race, no sleep).
      if (!isCancelNotice(update) && update.seq === 1) {
        await client.runs.append(run.runId, [m.advance("validating", "model replied")]);
      } else if (!isCancelNotice(update) && update.seq === 2) {
        await client.runs.cancel(run.runId, "enough watching");
      } else if (isCancelNotice(update)) {
        await client.runs.append(run.runId, [m.advance("cancelled", "cancelled by local")]);
      }
    }
  })();
  await watching;
  assert.deepEqual(
    seen.map((u) => (isCancelNotice(u) ? `cancel:${u.reason}` : `${u.seq}:${u.toState}`)),
    ["1:requesting_model", "2:validating", "cancel:enough watching", "3:cancelled"],
  );
});

test("step records the opening, runs the batch and returns the end the daemon recorded; a retry is answered the same", async () => {
  const run = await client.runs.start("one step", { runId: "runs-step" });
  const m = new Machine(run.runId);
  await client.runs.append(run.runId, [m.advance("requesting_model", "run started")]);
  const opening = [
    m.advance("validating", "model replied", { turn: { text: "", calls: [] } }),
    m.advance("running_tools", "1 call(s) sent", { calls: [{ call_id: "s1c1" }] }),
  ];
  const calls = [
    {
      tool: "run_command",
      arguments: { argv: ["sh", "-c", "echo once >> step.txt"] },
      callId: "s1c1",
      idempotencyKey: "runs-step:s1c1",
    },
  ];
  const seen: string[] = [];
  const done = await client.runs.step(run.runId, opening, calls, {
    onEvent: (e) => void seen.push(e.kind),
  });
  assert.deepEqual(seen, ["queued", "started", "finished"]);
  assert.deepEqual(
    done.outcomes.map((o) => o.status),
    ["success"],
  );
  const [end] = done.events;
  assert.ok(end);
  assert.equal(
    `${end.seq} ${end.fromState}>${end.toState} ${end.reason}`,
    "4 running_tools>requesting_model batch finished",
  );
  assert.deepEqual(end.data, {
    results: [{ call_id: "s1c1", status: "success", error_class: "none" }],
  });
  assert.equal(done.run.lastSeq, 4);
  m.record(end); // the loop's machine takes the daemon's move

  const again = await client.runs.step(run.runId, opening, calls); // the answer was lost
  assert.deepEqual(
    again.events.map((e) => [e.seq, e.reason, e.data]),
    [[end.seq, end.reason, end.data]],
  );
  const detail = await client.runs.get(run.runId);
  assert.equal(detail.events.length, 4);
  assert.deepEqual(
    detail.calls.map((c) => c.callId),
    ["s1c1"],
  );
  assert.equal(
    await refusal(client.runs.step(run.runId, [opening[0] as Transition], calls)),
    "malformed",
  );
});
