/**
 * How a TypeScript run ends when the model's turn did not end normally, when the answer
 * arrives on the budget-crossing request, when the provider fails for a moment, and what
 * a completion says backs it -- through a real daemon, with the real OpenAI and Anthropic
 * adapters talking to a local server in their wire formats (support/provider.ts).
 */

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, afterEach, before, describe, test } from "node:test";

import {
  AnthropicMessagesModel,
  Client,
  endingOf,
  Loop,
  MaxSteps,
  MaxTokens,
  ModelRateLimited,
  ModelUnavailable,
  OpenAIChatModel,
  pathOf,
  ScriptedModel,
  StopRules,
  type Transition,
  type Turn,
} from "@execgate/client";

import { backoff } from "../src/loop/retry.js";
import { Daemon } from "./support/daemon.js";
import { fixture, ProviderServer } from "./support/provider.js";

let daemon: Daemon;
let eg: Client;
let provider: ProviderServer;
// Retries without waiting: the backoff is still computed and recorded.
const NO_WAIT = { attempts: 3, baseS: 0, maxS: 0 };

before(async () => {
  daemon = await Daemon.start();
  const { writeFileSync } = await import("node:fs");
  writeFileSync(`${daemon.workspace}/a.txt`, "alpha\n");
  eg = new Client({ address: daemon.address });
  provider = await ProviderServer.start();
});

after(async () => {
  eg.close();
  await provider.stop();
  await daemon.stop();
});

afterEach(() => provider.reset());

type Data = Record<string, unknown>;

async function last(runId: string): Promise<Transition> {
  const { events } = await eg.runs.get(runId);
  const end = events[events.length - 1];
  assert.ok(end !== undefined);
  return end;
}

const openai = (): OpenAIChatModel =>
  new OpenAIChatModel("gpt-4o", { baseUrl: `${provider.url}/v1`, apiKey: "sk-test" });
const anthropic = (): AnthropicMessagesModel =>
  new AnthropicMessagesModel("claude-sonnet-4", { baseUrl: provider.url, apiKey: "k" });

function openaiAnswer(finishReason: string, message: Data = {}): Data {
  const doc = fixture("openai_answer") as { choices: { finish_reason: string; message: Data }[] };
  const choice = doc.choices[0];
  assert.ok(choice !== undefined);
  choice.finish_reason = finishReason;
  Object.assign(choice.message, message);
  return doc;
}

function anthropicAnswer(stopReason: string): Data {
  return { ...fixture("anthropic_answer"), stop_reason: stopReason };
}

function turn(stopReason: string, usage = { inputTokens: 0, outputTokens: 0, cost: 0 }): Turn {
  return { text: "text", toolCalls: [], usage, stopReason };
}

describe("stop reasons", () => {
  const cases: [string, "openai" | "anthropic", Data, string][] = [
    ["openai length", "openai", openaiAnswer("length"), "truncated"],
    ["anthropic max_tokens", "anthropic", anthropicAnswer("max_tokens"), "truncated"],
    ["openai content_filter", "openai", openaiAnswer("content_filter"), "refused"],
    [
      "openai refusal field",
      "openai",
      openaiAnswer("stop", { content: null, refusal: "No." }),
      "refused",
    ],
    ["anthropic refusal", "anthropic", anthropicAnswer("refusal"), "refused"],
    ["an unknown reason", "anthropic", anthropicAnswer("something_new"), "unexpected_stop"],
  ];
  for (const [name, kind, body, rule] of cases) {
    test(`${name}: failed, rule ${rule}, never completed`, async () => {
      provider.reply(body);
      const model = kind === "openai" ? openai() : anthropic();
      const result = await new Loop(eg, model).run("summarise a.txt");
      assert.equal(result.state, "failed");
      assert.equal(result.rule, rule);
      assert.equal(result.answer, "");
      assert.equal((await last(result.runId)).data["rule"], rule);
    });
  }

  test("a truncated turn with calls runs none of them", async () => {
    const cut = {
      ...ScriptedModel.calls(["read_file", { path: "a.txt" }]),
      stopReason: "max_tokens",
    };
    const result = await new Loop(eg, new ScriptedModel([cut])).run("read a.txt");
    assert.equal(result.rule, "truncated");
    assert.deepEqual((await eg.runs.get(result.runId)).calls, []);
    assert.deepEqual((await last(result.runId)).data["not_run"], [
      { name: "read_file", arguments: { path: "a.txt" } },
    ]);
  });

  test("a paused turn is continued", async () => {
    provider.reply({
      ...anthropicAnswer("pause_turn"),
      content: [{ type: "text", text: "Searching..." }],
    });
    provider.reply(fixture("anthropic_answer"));
    const result = await new Loop(eg, anthropic()).run("look it up");
    assert.equal(result.state, "completed");
    assert.equal(provider.requests.length, 2);
    const messages = provider.requests[1]?.body["messages"] as Data[];
    assert.equal(messages[messages.length - 1]?.["role"], "assistant");
  });

  test("the table and the paths agree with Python's", () => {
    assert.equal(endingOf("length"), "truncated");
    assert.equal(endingOf("END_TURN"), "end");
    assert.equal(endingOf("recitation"), "unknown");
    assert.equal(pathOf(turn("pause_turn")), "continue");
    assert.equal(pathOf(turn("tool_calls")), "fail");
    assert.equal(pathOf(turn("stop")), "answer");
  });
});

describe("budgets", () => {
  test("an answer on the budget-crossing request completes, the overrun recorded", async () => {
    const model = new ScriptedModel([
      {
        ...ScriptedModel.calls(["read_file", { path: "a.txt" }]),
        usage: { inputTokens: 60, outputTokens: 20, cost: 0 },
      },
      ScriptedModel.answer("a.txt says alpha", { inputTokens: 70, outputTokens: 30, cost: 0 }),
    ]);
    const stops = new StopRules([new MaxTokens(100), new MaxSteps(10)]);
    const result = await new Loop(eg, model, { stops }).run("read a.txt");
    assert.equal(result.state, "completed");
    assert.equal(result.answer, "a.txt says alpha");
    assert.deepEqual(result.figures["overrun"], { rule: "max_tokens", limit: 100, tokens: 180 });
    const figures = (await last(result.runId)).data["figures"] as Data;
    assert.deepEqual(figures["overrun"], { rule: "max_tokens", limit: 100, tokens: 180 });
  });

  test("calls proposed on the budget-crossing request never run", async () => {
    const model = new ScriptedModel([
      {
        ...ScriptedModel.calls(["read_file", { path: "a.txt" }]),
        usage: { inputTokens: 60, outputTokens: 60, cost: 0 },
      },
      ScriptedModel.answer("never asked"),
    ]);
    const stops = new StopRules([new MaxTokens(100)]);
    const result = await new Loop(eg, model, { stops }).run("read a.txt");
    assert.equal(result.state, "budget_exhausted");
    assert.equal(result.rule, "max_tokens");
    assert.deepEqual((await eg.runs.get(result.runId)).calls, []);
    assert.equal(model.remaining, 1);
  });
});

describe("transient model errors", () => {
  test("a 429 then success completes, the retry recorded", async () => {
    provider.reply(fixture("openai_error_429"), 429, { "retry-after": "0" });
    provider.reply(fixture("openai_answer"));
    const result = await new Loop(eg, openai(), { retry: NO_WAIT }).run("find the TODOs");
    assert.equal(result.state, "completed");
    assert.equal(provider.requests.length, 2);
    const { events } = await eg.runs.get(result.runId);
    const replied = events.filter((e) => e.toState === "validating");
    assert.equal(replied.length, 1);
    const retries = replied[0]?.data["retries"] as Data[];
    assert.deepEqual(
      retries.map((r) => [r["retry"], r["error"], r["status"]]),
      [[1, "ModelRateLimited", 429]],
    );
  });

  test("5xx and 529 are retried", async () => {
    provider.reply(fixture("anthropic_error_500"), 500);
    provider.reply(fixture("anthropic_error_529"), 529);
    provider.reply(fixture("anthropic_answer"));
    const result = await new Loop(eg, anthropic(), { retry: NO_WAIT }).run("find the TODOs");
    assert.equal(result.state, "completed");
    const { events } = await eg.runs.get(result.runId);
    const retries = events.find((e) => e.toState === "validating")?.data["retries"] as Data[];
    assert.deepEqual(
      retries.map((r) => r["status"]),
      [500, 529],
    );
  });

  for (const status of [400, 401, 404]) {
    test(`HTTP ${status} fails at once`, async () => {
      provider.reply(fixture("openai_error_400"), status);
      provider.reply(fixture("openai_answer"));
      const result = await new Loop(eg, openai(), { retry: NO_WAIT }).run("find the TODOs");
      assert.equal(result.state, "failed");
      assert.equal(result.rule, "model_error");
      assert.equal(provider.requests.length, 1);
    });
  }

  test("connection errors are retried, then fail with every retry recorded", async () => {
    const port = await closedPort();
    const model = new OpenAIChatModel("m", { baseUrl: `http://127.0.0.1:${port}/v1`, apiKey: "" });
    const result = await new Loop(eg, model, { retry: NO_WAIT }).run("anything");
    assert.equal(result.rule, "model_error");
    const retries = (await last(result.runId)).data["retries"] as Data[];
    assert.deepEqual(
      retries.map((r) => r["retry"]),
      [1, 2, 3],
    );
    assert.ok(retries.every((r) => r["error"] === "ModelUnavailable"));
  });

  test("a wait past the run's deadline is not taken", async () => {
    provider.reply(fixture("openai_error_429"), 429, { "retry-after": "3600" });
    const slept: number[] = [];
    const retry = { attempts: 3, sleep: async (s: number) => void slept.push(s) };
    const loop = new Loop(eg, openai(), { retry, limits: { deadlineSeconds: 60 } });
    const result = await loop.run("find the TODOs");
    assert.equal(result.rule, "model_error");
    assert.deepEqual(slept, []);
  });

  test("backoff doubles to its cap, jitter below, Retry-After a floor", () => {
    const err = new ModelUnavailable("m", "down");
    const top = { baseS: 1, maxS: 5, random: () => 0 };
    assert.deepEqual(
      [1, 2, 3, 4].map((n) => backoff(top, n, err)),
      [1, 2, 4, 5],
    );
    const low = { baseS: 1, maxS: 5, jitter: 0.5, random: () => 1 };
    assert.deepEqual(
      [1, 2, 3, 4].map((n) => backoff(low, n, err)),
      [0.5, 1, 2, 2.5],
    );
    assert.equal(backoff(top, 1, new ModelRateLimited("m", 7.5)), 7.5);
  });
});

describe("what backs a completion", () => {
  test("a verifier's name and finding are recorded", async () => {
    const model = new ScriptedModel([
      ScriptedModel.calls(["read_file", { path: "a.txt" }]),
      ScriptedModel.answer("alpha"),
    ]);
    const saysAlpha = (): { accepted: boolean; finding: string } => ({
      accepted: true,
      finding: "read_file of a.txt succeeded",
    });
    const result = await new Loop(eg, model, { verifier: saysAlpha }).run("read a.txt");
    assert.equal(result.state, "completed");
    assert.deepEqual(result.verification, {
      verifier: "saysAlpha",
      verified: true,
      finding: "read_file of a.txt succeeded",
    });
    assert.deepEqual(result.caveats, []);
    assert.deepEqual((await last(result.runId)).data["verification"], result.verification);
  });

  test("a verifier that fails the run is named in its record", async () => {
    const never = (): { accepted: boolean; finding: string } => ({
      accepted: false,
      finding: "no file was read",
    });
    const model = new ScriptedModel([ScriptedModel.answer("guess")]);
    const loop = new Loop(eg, model, { verifier: never, onRejectedAnswer: "fail" });
    const result = await loop.run("read a.txt");
    assert.equal(result.rule, "verifier");
    assert.deepEqual(result.verification, {
      verifier: "never",
      verified: false,
      finding: "no file was read",
    });
  });

  test("no verifier: unverified, and the failed call a caveat", async () => {
    const model = new ScriptedModel([
      ScriptedModel.calls(["read_file", { path: "missing.txt" }]),
      ScriptedModel.answer("it is empty"),
    ]);
    const result = await new Loop(eg, model).run("read missing.txt");
    assert.equal(result.state, "completed");
    assert.equal(result.verification?.verified, false);
    assert.equal(result.caveats.length, 1);
    assert.match(
      result.caveats[0] ?? "",
      /^answer followed 1 failed call\(s\): s1c1 read_file failure/,
    );
  });
});

test("an endless script is read lazily", async () => {
  let pulled = 0;
  function* endless(): Generator<Turn> {
    for (;;) {
      pulled += 1;
      if (pulled > 100) throw new Error("the script was read ahead of the run");
      yield ScriptedModel.calls(["read_file", { path: "a.txt" }]);
    }
  }
  const model = new ScriptedModel(endless());
  assert.equal(model.remaining, undefined);
  const stops = new StopRules([new MaxSteps(3)]);
  const result = await new Loop(eg, model, { stops }).run("loop");
  assert.equal(result.rule, "max_steps");
  assert.equal(pulled, 3);
});

/** A port on 127.0.0.1 nothing listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}
