/**
 * The TypeScript Loop against a real daemon, driven by a ScriptedModel: the two
 * minimal-loop scenarios, each stop rule and terminal state, cancel via CancelRun, the
 * loop's own refusals, approvals inside a run -- and the record each run leaves, in the
 * Python loop's format (the daemon checks every transition against its table).
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  Client,
  type Event,
  Loop,
  type Message,
  ScriptedModel,
  type Transition,
  type Turn,
} from "@execgate/client";

import { Daemon, type Who } from "./support/daemon.js";

const PEOPLE: Who[] = [
  { name: "bot", roles: ["agent"], token: "bot-" + "b".repeat(40) },
  { name: "alice", roles: ["approver"], token: "alice-" + "a".repeat(40) },
];
const POLICY = `\
version: 1
default: deny
rules:
  - {id: everything, effect: allow, tools: ['*'], reason: the tests may do anything}
  - id: touching
    effect: ask
    tools: [run_command]
    argv_prefix: [[touch]]
    approvers: [approver]
    reason: touching needs a human
`;

let daemon: Daemon;
let bot: Client;
let alice: Client;

before(async () => {
  daemon = await Daemon.start({ people: PEOPLE, policy: POLICY });
  bot = new Client({ address: daemon.address, token: PEOPLE[0]?.token });
  alice = new Client({ address: daemon.address, token: PEOPLE[1]?.token });
});

after(async () => {
  bot.close();
  alice.close();
  await daemon.stop();
});

type Data = Record<string, unknown>;

async function events(runId: string): Promise<readonly Transition[]> {
  return (await bot.runs.get(runId)).events;
}

function moves(history: readonly Transition[]): string[] {
  return history.map((e) => `${e.fromState}>${e.toState}`);
}

function last(history: readonly Transition[]): Transition {
  const end = history.at(-1);
  assert.ok(end);
  return end;
}

/** The content of the one tool result the loop sent back last. */
function lastResult(messages: readonly Message[]): string {
  const m = messages.at(-1);
  assert.ok(m?.role === "tool_results");
  const [only] = m.results;
  assert.ok(only);
  return only.content;
}

function usage(tokens: number, cost = 0): Turn["usage"] {
  return { inputTokens: tokens / 2, outputTokens: tokens / 2, cost };
}

describe("the minimal loop's scenarios", () => {
  test("completed after 3 steps: write, read back, answer from the result", async () => {
    const model = new ScriptedModel([
      ScriptedModel.calls(["write_file", { path: "note.txt", content: "hello from a loop\n" }]),
      ScriptedModel.calls(["read_file", { path: "note.txt" }]),
      (messages) =>
        ScriptedModel.answer(`the note says: ${lastResult(messages).split("\n").at(-2)}`),
    ]);
    const result = await new Loop(bot, model).run("write note.txt, read it back, say what it says");
    assert.equal(result.state, "completed", result.reason);
    assert.ok(result.completed);
    assert.equal(result.answer, "the note says: hello from a loop");
    assert.equal(result.figures["steps"], 3);

    const detail = await bot.runs.get(result.runId);
    assert.equal(detail.run.owner, "bot");
    assert.deepEqual(detail.run.labels, { client: "typescript" });
    assert.deepEqual(detail.run.limits, { maxSteps: 50, maxConsecutiveErrors: 5, maxRepeats: 3 });
    assert.equal(detail.run.model, "scripted");
    const step = [
      "requesting_model>validating",
      "validating>running_tools",
      "running_tools>requesting_model",
    ];
    assert.deepEqual(moves(detail.events), [
      "created>requesting_model",
      ...step,
      ...step,
      "requesting_model>validating",
      "validating>completed",
    ]);
    assert.deepEqual(
      detail.events.map((e) => e.seq),
      [1, 2, 3, 4, 5, 6, 7, 8, 9],
    );

    // The record's data, key for key as the Python loop writes it.
    const [, proposed, sentCalls, results] = detail.events;
    assert.deepEqual(proposed?.data, {
      turn: {
        text: "",
        calls: [
          {
            id: "call_1",
            name: "write_file",
            arguments: { path: "note.txt", content: "hello from a loop\n" },
          },
        ],
        stop_reason: "tool_calls",
      },
      usage: { input_tokens: 0, output_tokens: 0, cost: 0 },
    });
    assert.deepEqual(sentCalls?.data, {
      calls: [
        {
          call_id: "s1c1",
          index: 0,
          model_id: "call_1",
          tool: "write_file",
          arguments: { path: "note.txt", content: "hello from a loop\n" },
        },
      ],
      refused: [],
    });
    assert.deepEqual(results?.data, {
      results: [{ call_id: "s1c1", status: "success", error_class: "none" }],
    });
    const done = last(detail.events).data as Data;
    assert.equal(done["answer"], result.answer);
    assert.deepEqual(Object.keys(done).sort(), [
      "actions",
      "answer",
      "caveats",
      "figures",
      "verification",
    ]);
    assert.deepEqual(done["actions"], [
      {
        call_id: "s1c1",
        tool: "write_file",
        arguments: '{"content":"hello from a loop\\n","path":"note.txt"}',
        status: "success",
      },
      { call_id: "s2c1", tool: "read_file", arguments: '{"path":"note.txt"}', status: "success" },
    ]);

    // The journal has the calls, with the loop's ids and idempotency keys.
    assert.deepEqual(
      detail.calls.map((c) => [c.callId, c.idempotencyKey, c.agent, c.outcome?.status]),
      [
        ["s1c1", `${result.runId}:s1c1`, "bot", "success"],
        ["s2c1", `${result.runId}:s2c1`, "bot", "success"],
      ],
    );
  });

  test("each tool batch is one Runs.Step: no separate append or Execute around it", async () => {
    const counted = { step: 0, append: 0, execute: 0, executeBatch: 0 };
    const client = new Client({ address: daemon.address, token: PEOPLE[0]?.token });
    const spy = <K extends "step" | "append">(target: typeof client.runs, name: K): void => {
      const real = target[name].bind(target) as (...args: unknown[]) => unknown;
      (target as unknown as Record<string, unknown>)[name] = (...args: unknown[]) => {
        counted[name] += 1;
        return real(...args);
      };
    };
    spy(client.runs, "step");
    spy(client.runs, "append");
    for (const name of ["execute", "executeBatch"] as const) {
      const real = client[name].bind(client) as (...args: unknown[]) => unknown;
      (client as unknown as Record<string, unknown>)[name] = (...args: unknown[]) => {
        counted[name] += 1;
        return real(...args);
      };
    }
    const model = new ScriptedModel([
      ScriptedModel.calls(["list_dir", { path: "." }]),
      ScriptedModel.calls(["list_dir", { path: "." }], ["read_file", { path: "note.txt" }]),
      ScriptedModel.answer("looked"),
    ]);
    try {
      const result = await new Loop(client, model).run("look around");
      assert.equal(result.state, "completed", result.reason);
    } finally {
      client.close();
    }
    // Two steps; appends: the start, and the final answer's two moves.
    assert.deepEqual(counted, { step: 2, append: 3, execute: 0, executeBatch: 0 });
  });

  test("max_steps stops a looping model before its next request", async () => {
    const model = new ScriptedModel(
      Array(10).fill(ScriptedModel.calls(["list_dir", { path: "." }])),
    );
    const result = await new Loop(bot, model, { limits: { maxSteps: 2 } }).run(
      "list the workspace",
    );
    assert.equal(result.state, "expired");
    assert.equal(result.rule, "max_steps");
    assert.equal(result.reason, "2 model requests made; the run may make at most 2");
    assert.equal(model.remaining, 8);
    const history = await events(result.runId);
    assert.equal(moves(history).at(-1), "requesting_model>expired");
    const data = last(history).data as Data;
    assert.equal(data["rule"], "max_steps");
    assert.deepEqual(data["evidence"], { limit: 2, steps: 2 });
    assert.equal((data["figures"] as Data)["steps"], 2);
    assert.match(String(data["last_action"]), /^tool list_dir/);
  });
});

describe("stop rules", () => {
  test("max_tokens: the turn that crosses the budget is not run", async () => {
    const spend = { ...ScriptedModel.calls(["noop", { echo: "x" }]), usage: usage(600) };
    const model = new ScriptedModel([spend, spend, spend]);
    const result = await new Loop(bot, model, { limits: { maxTokens: 1000 } }).run("spend");
    assert.equal(result.state, "budget_exhausted");
    assert.equal(result.rule, "max_tokens");
    assert.deepEqual(result.evidence, { limit: 1000, tokens: 1200 });
    const detail = await bot.runs.get(result.runId);
    assert.equal(moves(detail.events).at(-1), "validating>budget_exhausted");
    assert.deepEqual((last(detail.events).data as Data)["not_run"], [
      { name: "noop", arguments: { echo: "x" } },
    ]);
    assert.deepEqual(
      detail.calls.map((c) => c.callId),
      ["s1c1"],
    );
  });

  test("max_cost ends the run budget_exhausted", async () => {
    const spend = { ...ScriptedModel.calls(["noop", {}]), usage: usage(10, 0.4) };
    const model = new ScriptedModel([spend, spend, spend, spend]);
    const result = await new Loop(bot, model, { limits: { maxCost: 1 } }).run("spend money");
    assert.equal(result.state, "budget_exhausted");
    assert.equal(result.rule, "max_cost");
    assert.equal(result.figures["steps"], 3);
  });

  test("deadline: a model slower than the run's deadline ends it expired", async () => {
    const slow = async (): Promise<Turn> => {
      await new Promise((r) => setTimeout(r, 600)); // the model thinking
      return ScriptedModel.calls(["noop", {}]);
    };
    const model = new ScriptedModel([ScriptedModel.calls(["noop", {}]), slow]);
    const result = await new Loop(bot, model, { limits: { deadlineSeconds: 0.5 } }).run("hurry");
    assert.equal(result.state, "expired");
    assert.equal(result.rule, "deadline");
    assert.ok(Number(result.evidence["elapsed_s"]) >= 0.5);
    assert.equal(moves(await events(result.runId)).at(-1), "validating>expired");
  });

  test("max_consecutive_errors ends the run failed", async () => {
    const model = new ScriptedModel(
      ["a", "b", "c", "d"].map((f) =>
        ScriptedModel.calls(["read_file", { path: `missing-${f}.txt` }]),
      ),
    );
    const result = await new Loop(bot, model, { limits: { maxConsecutiveErrors: 2 } }).run("read");
    assert.equal(result.state, "failed");
    assert.equal(result.rule, "max_consecutive_errors");
    assert.equal(result.evidence["count"], 2);
    assert.equal(result.evidence["last_result"], "failure/not_found");
    assert.equal(moves(await events(result.runId)).at(-1), "requesting_model>failed");
  });

  test("no_progress: the same call with the same result too often escalates", async () => {
    const model = new ScriptedModel(Array(6).fill(ScriptedModel.calls(["noop", { echo: "same" }])));
    const result = await new Loop(bot, model, { limits: { maxRepeats: 2 } }).run("poll");
    assert.equal(result.state, "escalated");
    assert.equal(result.rule, "no_progress");
    assert.equal(result.evidence["tool"], "noop");
    assert.equal(result.evidence["count"], 3);
    assert.equal(result.evidence["arguments"], '{"echo":"same"}');
  });

  test("a model that fails ends the run failed (model_error)", async () => {
    const result = await new Loop(bot, new ScriptedModel([])).run("nothing to say");
    assert.equal(result.state, "failed");
    assert.equal(result.rule, "model_error");
    assert.match(result.reason, /the script has 0 turn\(s\)/);
  });
});

describe("cancel, refusals, verification, approvals", () => {
  test("CancelRun stops the running call; the loop ends the run cancelled", async () => {
    let runId = "";
    const onEvent = async (e: Event): Promise<void> => {
      if (e.kind === "started") await bot.runs.cancel(runId, "not now");
    };
    const model = new ScriptedModel([
      ScriptedModel.calls(["run_command", { argv: ["sleep", "30"] }]),
      ScriptedModel.answer("slept"),
    ]);
    const loop = new Loop(bot, model, {
      onEvent,
      onTransition: (t) => {
        runId = t.runId;
      },
    });
    const result = await loop.run("sleep a while");
    assert.equal(result.state, "cancelled");
    assert.equal(result.rule, "cancelled");
    assert.equal(result.reason, "cancelled by bot: not now");
    assert.equal(model.remaining, 1, "no model request after the cancel");
    const history = await events(result.runId);
    assert.equal(moves(history).at(-1), "requesting_model>cancelled");
    const data = last(history).data as Data;
    assert.equal(data["rolled_back"], false);
    const [stopped] = data["stopped_calls"] as Data[];
    assert.equal(stopped?.["call_id"], "s1c1");
    assert.equal(stopped?.["status"], "unknown_outcome");
    assert.ok(Number(stopped?.["stopped_at"]) >= Number(stopped?.["cancel_requested_at"]));
    assert.equal((data["evidence"] as Data)["who"], "bot");
  });

  test("a tool not offered is refused by the loop; the model sees why, all results together", async () => {
    const model = new ScriptedModel([
      ScriptedModel.calls(["write_file", { path: "w.txt", content: "x" }]),
      ScriptedModel.calls(
        ["read_file", { path: "nope.txt" }],
        ["write_file", { path: "w.txt", content: "x" }],
        ["noop", {}],
      ),
      ScriptedModel.answer("gave up"),
    ]);
    const loop = new Loop(bot, model, { tools: ["read_file", "noop"] });
    const result = await loop.run("write w.txt");
    assert.equal(result.state, "completed");
    const history = await events(result.runId);
    assert.equal(moves(history)[2], "validating>requesting_model");
    const refused = (history[2]?.data as Data)["refused"] as Data[];
    assert.deepEqual(
      refused.map((r) => [r["index"], r["tool"], r["error_class"]]),
      [[0, "write_file", "tool_not_offered"]],
    );
    assert.match(lastResultOf(model.requests[1]), /^\[rejected: tool_not_offered\]/);

    // The second turn's three calls: one message, one result per call, in the model's order.
    const third = model.requests[2]?.at(-1);
    assert.ok(third?.role === "tool_results");
    assert.deepEqual(
      third.results.map((r) => [r.callId, r.content.split("\n")[0]?.split("]")[0]]),
      [
        ["call_2", "[failure: not_found"],
        ["call_3", "[rejected: tool_not_offered"],
        ["call_4", "[success"],
      ],
    );
    const sentCalls = history.find((e) => e.toState === "running_tools")?.data as Data;
    assert.deepEqual(
      (sentCalls["calls"] as Data[]).map((c) => c["call_id"]),
      ["s2c1", "s2c3"],
    );
  });

  test("a rejected answer goes back to the model; onRejectedAnswer fail ends the run", async () => {
    const verifier = (so: { answer: string }) => ({
      accepted: so.answer === "42",
      finding: "wrong number",
    });
    const model = new ScriptedModel([ScriptedModel.answer("41"), ScriptedModel.answer("42")]);
    const result = await new Loop(bot, model, { verifier }).run("the answer?");
    assert.equal(result.state, "completed");
    const history = await events(result.runId);
    assert.deepEqual(history[2]?.data, { finding: "wrong number" });
    const strict = await new Loop(bot, new ScriptedModel([ScriptedModel.answer("41")]), {
      verifier,
      onRejectedAnswer: "fail",
    }).run("the answer?");
    assert.equal(strict.state, "failed");
    assert.equal(strict.rule, "verifier");
  });

  test("a call an `ask` rule parks moves the run to awaiting_approval and back", async () => {
    const onEvent = async (e: Event): Promise<void> => {
      if (e.kind === "awaiting_approval") await alice.approvals.approve(e.approvalId, "go ahead");
    };
    const model = new ScriptedModel([
      ScriptedModel.calls(["run_command", { argv: ["touch", "loop-approved.txt"] }]),
      ScriptedModel.answer("touched"),
    ]);
    const result = await new Loop(bot, model, { onEvent }).run("touch a file");
    assert.equal(result.state, "completed", result.reason);
    const history = await events(result.runId);
    assert.deepEqual(moves(history).slice(2, 6), [
      "validating>running_tools",
      "running_tools>awaiting_approval",
      "awaiting_approval>running_tools",
      "running_tools>requesting_model",
    ]);
    assert.match(history[3]?.reason ?? "", /^rule touching: touching needs a human/);
  });
});

function lastResultOf(messages: readonly Message[] | undefined): string {
  assert.ok(messages);
  return lastResult(messages);
}
