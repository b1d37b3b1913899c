/**
 * The loop's pure core, without a daemon: the state machine, the stop rules and their
 * priority, the tally, the observations. The tables are compared with the one data file
 * both loops and the daemon are generated from (proto/execgate/v1/runstates.json); what
 * the code does with them (hints, rendering, fingerprints) with the Python loop's, since
 * the model must see the same text from either loop.
 */

import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";

import * as client from "@execgate/client";
import {
  bound,
  Cancelled,
  canonicalArguments,
  DAEMON_HINTS,
  Deadline,
  fingerprint,
  hintFor,
  IllegalTransition,
  Machine,
  MaxConsecutiveErrors,
  MaxCost,
  MaxSteps,
  MaxTokens,
  NoProgress,
  observe,
  Outcome,
  PRIORITY,
  REFUSAL_HINTS,
  render,
  RESUME_INTO,
  type State,
  STATES,
  STOPS,
  StopRules,
  Tally,
  TERMINAL,
  TRANSITIONS,
} from "@execgate/client";

import * as generated from "../src/gen/runstates.js";
import { pythonJson } from "./support/python.js";
import { expandEdges, ofKind, runstates, withoutComments } from "./support/runstates.js";

describe("the state machine", () => {
  test("the transition table is the data file's, edge for edge", () => {
    const doc = runstates();
    const ours = {
      transitions: Object.fromEntries([...TRANSITIONS].map(([k, v]) => [k, [...v].sort()])),
      terminal: [...TERMINAL].sort(),
      stops: [...STOPS].sort(),
      resume: Object.fromEntries(RESUME_INTO),
      states: [...STATES],
    };
    assert.deepEqual(ours, {
      transitions: Object.fromEntries(expandEdges(doc)),
      terminal: ofKind(doc, "success", "stop").sort(),
      stops: ofKind(doc, "stop").sort(),
      resume: withoutComments(doc["resume_into"]),
      states: doc.states.map((s) => s.name),
    });
    // The package's tables are built from the generated module, not kept beside it.
    assert.deepEqual(ours.states, generated.STATES);
    assert.deepEqual(
      [...TRANSITIONS.keys()],
      generated.TRANSITIONS.map(([k]) => k),
    );
  });

  test("an illegal move throws and changes nothing; seq counts from 1", () => {
    let now = 100;
    const m = new Machine("r", () => now);
    const first = m.advance("requesting_model", "run started");
    assert.deepEqual(
      [first.seq, first.fromState, first.toState, first.at],
      [1, "created", "requesting_model", 100],
    );
    assert.throws(() => m.advance("completed", "skip the gate"), IllegalTransition);
    assert.equal(m.state, "requesting_model");
    assert.equal(m.nextSeq, 2);
    now = 101;
    assert.equal(m.advance("validating", "model replied").seq, 2);
  });

  test("a suspended run resumes only into the state it left (or stops)", () => {
    const m = new Machine("r");
    for (const s of ["requesting_model", "validating", "waiting"] as State[]) m.advance(s, "");
    assert.throws(() => m.advance("running_tools", "skip validation"), /resumes into validating/);
    assert.equal(m.advance("validating", "resumed").toState, "validating");
    const stopped = new Machine("s");
    stopped.advance("waiting", "");
    assert.equal(stopped.advance("expired", "deadline").toState, "expired");
    assert.throws(() => stopped.advance("requesting_model", ""), IllegalTransition);
  });
});

function tally(): Tally {
  return new Tally(1000);
}

describe("stop rules", () => {
  test("each rule fires at its bound, into its terminal state", () => {
    const t = tally();
    const rules = [
      new MaxSteps(2),
      new MaxTokens(100),
      new MaxCost(1),
      new MaxConsecutiveErrors(2),
    ];
    assert.ok(rules.every((r) => r.check(t, 1000) === undefined));
    t.recordModel(40, 10, 0.5);
    t.recordModel(40, 10, 0.5);
    assert.equal(new MaxSteps(2).check(t, 1000)?.state, "expired");
    assert.equal(new MaxSteps(3).check(t, 1000), undefined);
    assert.deepEqual(new MaxTokens(100).check(t, 1000)?.evidence, { limit: 100, tokens: 100 });
    assert.equal(new MaxCost(1).check(t, 1000)?.state, "budget_exhausted");
    assert.equal(new Deadline(5).check(t, 1004.9), undefined);
    assert.equal(new Deadline(5).check(t, 1005)?.state, "expired");
    t.recordResult("read_file", { path: "a" }, false, "r1", "failure/not_found");
    t.recordResult("read_file", { path: "b" }, false, "r2", "failure/not_found");
    const failed = new MaxConsecutiveErrors(2).check(t, 1000);
    assert.equal(failed?.state, "failed");
    assert.equal(failed?.evidence["last_result"], "failure/not_found");
    t.recordResult("noop", {}, true, "ok");
    assert.equal(new MaxConsecutiveErrors(2).check(t, 1000), undefined);
    assert.equal(t.failures, 2);
  });

  test("no progress counts the same call with the same result, and nothing else", () => {
    const t = tally();
    const rule = new NoProgress(2);
    for (let i = 0; i < 3; i++) t.recordResult("read_file", { b: 1, a: 2 }, true, "same");
    t.recordResult("read_file", { a: 2, b: 1 }, true, "different");
    const stop = rule.check(t, 1000);
    assert.equal(stop?.state, "escalated");
    assert.deepEqual(stop?.evidence, {
      tool: "read_file",
      arguments: '{"a":2,"b":1}',
      result: "same",
      count: 3,
      limit: 2,
    });
  });

  test("when several fire, the priority decides: the data file's order", () => {
    const doc = runstates();
    assert.deepEqual(PRIORITY, (doc["stop_priority"] as { rules: string[] }).rules);
    assert.equal(PRIORITY, generated.STOP_PRIORITY);
    const t = tally();
    t.recordModel(500, 500, 5);
    t.recordResult("x", {}, false, "e");
    t.recordResult("x", {}, false, "e");
    const rules = StopRules.default({
      maxSteps: 1,
      maxTokens: 10,
      maxCost: 1,
      deadlineSeconds: 1,
      maxConsecutiveErrors: 1,
      maxRepeats: 1,
    });
    const order: string[] = [];
    for (let rule = rules.first(t, 2000); rule !== undefined; rule = rules.first(t, 2000, order)) {
      order.push(rule.rule);
    }
    assert.deepEqual(order, PRIORITY.slice(1)); // all but cancelled
    t.requestCancel("alice", "stop", 5);
    t.requestCancel("bob", "later", 6); // the first request stands
    assert.equal(rules.first(t, 2000)?.reason, "cancelled by alice: stop");
    assert.ok(new Cancelled().check(t, 2000));
    assert.throws(() => new StopRules([new MaxSteps(1), new MaxSteps(2)]), /one rule per name/);
  });
});

describe("observations and fingerprints match the Python loop's", () => {
  test("hints, word for word: the data file's, and hintFor picks as the Python loop does", () => {
    const doc = runstates();
    const refusals = withoutComments(doc["refusals"]) as Record<string, { hint: string }>;
    assert.deepEqual(
      { daemon: DAEMON_HINTS, refusal: REFUSAL_HINTS },
      {
        daemon: withoutComments(doc["daemon_hints"]),
        refusal: Object.fromEntries(Object.entries(refusals).map(([k, v]) => [k, v.hint])),
      },
    );
    assert.equal(DAEMON_HINTS, generated.DAEMON_HINTS);
    assert.equal(REFUSAL_HINTS, generated.REFUSAL_HINTS);
    const cases: [client.Status, string][] = [
      ["failure", "nonzero_exit"],
      ["partial", "none"],
      ["unknown_outcome", "timeout"],
      ["rejected", "some_new_class"],
      ["failure", "some_new_class"],
      ["rejected", "tool_not_offered"],
    ];
    const theirs = pythonJson(
      "import json, sys; from execgate.client.loop.observe import hint_for; " +
        "print(json.dumps([hint_for(s, c) for s, c in json.load(sys.stdin)]))",
      JSON.stringify(cases),
    );
    assert.deepEqual(
      cases.map(([s, c]) => hintFor(s, c)),
      theirs,
    );
  });

  test("the text the model sees of an outcome, cut at the cap", () => {
    const text = "line\n".repeat(300);
    const outcome = new Outcome({
      callId: "c1",
      status: "partial",
      errorClass: "none",
      message: "",
      field: "",
      text,
      structured: {},
      truncated: true,
      returnedBytes: 1500,
      totalBytes: 9000,
      evidence: { path: "", sandbox: "" },
      timeline: [],
      stoppedHow: "completed",
      replayOf: "",
    });
    const seen = observe(outcome, "read_file", 200);
    assert.ok(seen.text.length <= 200);
    assert.ok(!seen.isError);
    const python = pythonJson(
      `
import json, sys
from execgate.client.loop.observe import observe
from execgate.client.types import Outcome, Status
text = sys.stdin.read()
o = Outcome(call_id="c1", status=Status.PARTIAL, error_class="none", text=text,
            truncated=True, returned_bytes=1500, total_bytes=9000)
print(json.dumps(observe(o, "read_file", cap=200).render()))`,
      text,
    );
    assert.equal(render(seen), python);
    assert.equal(bound("short", 64), "short");
    assert.throws(() => bound("x", 10), RangeError);
  });

  test("fingerprints and canonical arguments", () => {
    const values = [{ b: [1, "two", null], a: { z: true, y: "é" } }, "text", ["x", 3]];
    const python = pythonJson(
      `
import json, sys
from execgate.client.loop.tally import canonical_arguments, fingerprint
vs = json.load(sys.stdin)
raw = '{"b": 1, "a": 2}'
print(json.dumps([[fingerprint(v) for v in vs], canonical_arguments(vs[0]), canonical_arguments(raw)]))`,
      JSON.stringify(values),
    );
    assert.deepEqual(
      [
        values.map(fingerprint),
        canonicalArguments(values[0]),
        canonicalArguments('{"b": 1, "a": 2}'),
      ],
      python,
    );
    assert.equal(canonicalArguments("not json"), "not json");
  });
});

test("the package's public surface", () => {
  assert.deepEqual(Object.keys(client).sort(), [
    "AnthropicMessagesModel",
    "ApprovalNotPending",
    "Approvals",
    "CallNotFound",
    "Cancelled",
    "Client",
    "DAEMON_HINTS",
    "DEFAULT_ADDRESS",
    "DEFAULT_LIMITS",
    "DaemonUnavailable",
    "Deadline",
    "ENDINGS",
    "ExecgateClientError",
    "IllegalTransition",
    "Loop",
    "LoopError",
    "Machine",
    "MaxConsecutiveErrors",
    "MaxCost",
    "MaxSteps",
    "MaxTokens",
    "ModelBadResponse",
    "ModelError",
    "ModelRateLimited",
    "ModelRequestRejected",
    "ModelUnavailable",
    "NoProgress",
    "OpenAIChatModel",
    "Outcome",
    "PRIORITY",
    "PermissionDenied",
    "REFUSAL_HINTS",
    "RESUME_INTO",
    "RequestError",
    "RunNotFound",
    "RunRefused",
    "Runs",
    "STATES",
    "STATUSES",
    "STOPS",
    "ScriptExhausted",
    "ScriptedModel",
    "StopRules",
    "TERMINAL",
    "TRANSITIONS",
    "Tally",
    "UNVERIFIED",
    "Unauthenticated",
    "bound",
    "canonicalArguments",
    "checkTransition",
    "endingOf",
    "fingerprint",
    "hintFor",
    "isCancelNotice",
    "isFinal",
    "observe",
    "pathOf",
    "render",
    "resolveAddress",
    "resolveToken",
    "retryable",
  ]);
});

describe("the token", () => {
  test("given, else $EXECGATE_TOKEN, else the agent token beside a Unix socket", () => {
    const dir = mkdtempSync(join(tmpdir(), "eg-token-"));
    mkdirSync(join(dir, "tokens"));
    writeFileSync(join(dir, "tokens", "agent.token"), "tok-agent\n", { mode: 0o600 });
    const saved = process.env.EXECGATE_TOKEN;
    delete process.env.EXECGATE_TOKEN;
    try {
      const addr = `unix:${join(dir, "execgate.sock")}`;
      assert.equal(client.resolveToken(undefined, addr), "tok-agent");
      assert.equal(client.resolveToken("", addr), ""); // an explicit "" is no token
      assert.equal(client.resolveToken("mine", addr), "mine");
      assert.equal(client.resolveToken(undefined, "127.0.0.1:7443"), "");
      assert.equal(client.resolveToken(undefined, `unix:${join(tmpdir(), "none", "s.sock")}`), "");
      process.env.EXECGATE_TOKEN = "from-env";
      assert.equal(client.resolveToken(undefined, addr), "from-env");
    } finally {
      if (saved === undefined) delete process.env.EXECGATE_TOKEN;
      else process.env.EXECGATE_TOKEN = saved;
    }
  });
});
