/**
 * The TypeScript client against a real daemon: every outcome status, the event stream,
 * cancel, approvals, the journal, TCP with a bearer token, the errors.
 *
 * Identities: `bot` and `hasty` are agents (a policy limit gives hasty's commands 0.5 s),
 * `alice` is an approver. The policy allows everything, asks a human before `touch`.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  ApprovalNotPending,
  type Call,
  CallNotFound,
  Client,
  DaemonUnavailable,
  type Event,
  type Outcome,
  PermissionDenied,
  RequestError,
  Unauthenticated,
} from "@execgate/client";

import { Daemon, waitUntil, type Who } from "./support/daemon.js";

const PEOPLE: Who[] = [
  { name: "bot", roles: ["agent"], token: "bot-" + "b".repeat(40) },
  { name: "hasty", roles: ["agent"], token: "hasty-" + "h".repeat(40) },
  { name: "alice", roles: ["approver"], token: "alice-" + "a".repeat(40) },
];
const TOKEN = Object.fromEntries(PEOPLE.map((p) => [p.name, p.token]));
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
    ttl: 60
    reason: touching needs a human
limits:
  - {tools: [run_command], agents: [hasty], timeout_s: 0.5, grace_s: 0.2}
`;
const OUTPUT_CAP = 1024;

let daemon: Daemon;
const clients: Client[] = [];

function as(who: string, address = daemon.address): Client {
  const client = new Client({ address, token: TOKEN[who] ?? who });
  clients.push(client);
  return client;
}

async function collect(events: AsyncIterable<Event>): Promise<Event[]> {
  const seen: Event[] = [];
  for await (const e of events) seen.push(e);
  return seen;
}

function finished(events: readonly Event[], callId: string): Outcome {
  const e = events.find((x) => x.kind === "finished" && x.callId === callId);
  assert.ok(e?.kind === "finished", `no finished event for ${callId}`);
  return e.outcome;
}

function phases(o: Outcome): string[] {
  return o.timeline.map((m) => m.phase);
}

function sh(script: string, callId: string): Call {
  return { tool: "run_command", arguments: { argv: ["sh", "-c", script] }, callId };
}

before(async () => {
  daemon = await Daemon.start({
    people: PEOPLE,
    policy: POLICY,
    tcp: true,
    args: ["--output-cap", String(OUTPUT_CAP)],
  });
});

after(async () => {
  for (const c of clients) c.close();
  await daemon.stop();
});

describe("outcomes", () => {
  test("success: a write and its read-back, with evidence", async () => {
    const bot = as("bot");
    const content = "hello from typescript\n";
    const wrote = await bot.executeOne("write_file", {
      path: "notes/a.txt",
      content,
      create_dirs: true,
    });
    assert.equal(wrote.status, "success", wrote.message);
    assert.equal(wrote.errorClass, "none");
    assert.ok(wrote.ok);
    assert.equal(wrote.evidence.bytesWritten, Buffer.byteLength(content));
    assert.equal(wrote.evidence.sha256Before, "");
    assert.equal(wrote.evidence.sha256After, createHash("sha256").update(content).digest("hex"));
    assert.equal(readFileSync(join(daemon.workspace, "notes/a.txt"), "utf8"), content);
    assert.deepEqual(phases(wrote).slice(-2), ["started", "finished"]);

    const read = await bot.executeOne("read_file", { path: "notes/a.txt" });
    assert.equal(read.status, "success");
    assert.equal(read.text, content);
    assert.equal(read.stoppedHow, "completed");
  });

  test("failure: a command that exits non-zero", async () => {
    const [o] = await as("bot").executeBatch([sh("echo oops >&2; exit 3", "fail-1")], {
      runId: "outcomes",
    });
    assert.ok(o);
    assert.equal(o.status, "failure");
    assert.equal(o.errorClass, "nonzero_exit");
    assert.equal(o.evidence.exitCode, 3);
    assert.equal(o.stoppedHow, "completed");
    assert.match(o.text, /oops/);
  });

  test("rejected: a path outside the workspace, an unknown tool; neither started", async () => {
    const bot = as("bot");
    const outside = await bot.executeOne("read_file", { path: "../../etc/passwd" });
    assert.equal(outside.status, "rejected");
    assert.equal(outside.errorClass, "permission_denied");
    assert.equal(outside.field, "arguments.path");
    assert.equal(outside.stoppedHow, "not_started");
    assert.ok(outside.mark("started") === undefined, phases(outside).join(","));

    const unknown = await bot.executeOne("format_disk", {});
    assert.equal(unknown.status, "rejected");
    assert.equal(unknown.errorClass, "unknown_tool");
  });

  test("partial: a read over the daemon's output cap", async () => {
    const big = "x".repeat(80) + "\n";
    writeFileSync(join(daemon.workspace, "big.txt"), big.repeat(100));
    const o = await as("bot").executeOne("read_file", { path: "big.txt" });
    assert.equal(o.status, "partial");
    assert.ok(o.truncated);
    assert.equal(o.totalBytes, big.length * 100);
    assert.ok(o.returnedBytes > 0 && o.returnedBytes <= OUTPUT_CAP, String(o.returnedBytes));
    assert.ok(Buffer.byteLength(o.text) <= OUTPUT_CAP);
  });

  test("unknown_outcome: a writing command stopped by a policy timeout", async () => {
    const stubborn = sh("trap '' TERM; sleep 30", "slow-1");
    const [o] = await as("hasty").executeBatch([stubborn], { runId: "outcomes-timeout" });
    assert.ok(o);
    assert.equal(o.status, "unknown_outcome", o.message);
    assert.equal(o.errorClass, "timeout");
    assert.equal(o.stoppedHow, "force_terminated");
    const started = o.mark("started");
    const asked = o.mark("cancel_requested");
    assert.ok(started && asked, phases(o).join(","));
    assert.match(asked.detail, /^timeout after 0\.5s/);
    const ran = asked.at - started.at;
    assert.ok(ran >= 0.45 && ran < 3, `ran ${ran}s before the policy stopped it`);
    for (const phase of ["signal_sent", "grace_expired", "force_terminated", "stopped"]) {
      assert.ok(o.mark(phase as never), `no ${phase} in ${phases(o).join(",")}`);
    }
  });
});

describe("the event stream", () => {
  test("each call goes queued, started, finished, with its index in the batch", async () => {
    const calls: Call[] = [
      { tool: "write_file", arguments: { path: "s.txt", content: "1" }, callId: "w" },
      { tool: "read_file", arguments: { path: "s.txt" }, callId: "r" },
    ];
    const events = await collect(as("bot").execute(calls, { runId: "stream" }));
    for (const [index, id] of ["w", "r"].entries()) {
      const mine = events.filter((e) => e.callId === id);
      assert.deepEqual(
        mine.map((e) => e.kind).filter((k) => k !== "waiting"),
        ["queued", "started", "finished"],
      );
      assert.ok(mine.every((e) => e.index === index));
    }
    // The read waits for the write to the same file (proposal order).
    assert.equal(finished(events, "r").text, "1");
    const waiting = events.find((e) => e.kind === "waiting");
    assert.ok(waiting?.kind === "waiting" && waiting.callId === "r", "the read waits");
    assert.deepEqual(waiting.blockedBy, ["stream/w"]);
  });

  test("progress: false sends the finished events only", async () => {
    const events = await collect(
      as("bot").execute([{ tool: "noop", arguments: { echo: "hi" } }], { progress: false }),
    );
    assert.deepEqual(
      events.map((e) => e.kind),
      ["finished"],
    );
  });
});

describe("cancel", () => {
  test("a running call is stopped: unknown_outcome cancelled, cooperatively", async () => {
    const bot = as("bot");
    const stream = bot.execute([sh("sleep 30", "long-1")], { runId: "cancel" });
    const seen: Event[] = [];
    for await (const e of stream) {
      seen.push(e);
      if (e.kind === "started") {
        const reached = await bot.cancel({ runId: "cancel", callId: "long-1", reason: "enough" });
        assert.deepEqual(reached, ["long-1"]);
      }
    }
    const o = finished(seen, "long-1");
    assert.equal(o.status, "unknown_outcome"); // run_command may write
    assert.equal(o.errorClass, "cancelled");
    assert.equal(o.stoppedHow, "cooperative");
    assert.match(o.mark("cancel_requested")?.detail ?? "", /enough/);
  });

  test("cancelling a run stops its call and rejects the ones queued behind it", async () => {
    const bot = as("bot");
    const calls = [sh("sleep 30", "c1"), sh("true", "c2")]; // both claim the workspace
    const seen: Event[] = [];
    for await (const e of bot.execute(calls, { runId: "cancel-run" })) {
      seen.push(e);
      if (e.kind === "started" && e.callId === "c1") await bot.cancel({ runId: "cancel-run" });
    }
    assert.equal(finished(seen, "c1").errorClass, "cancelled");
    const queued = finished(seen, "c2");
    assert.equal(queued.status, "rejected");
    assert.equal(queued.errorClass, "cancelled");
  });
});

describe("disconnecting", () => {
  test("leaving the stream early: the started call finishes, the queued one is rejected", async () => {
    const bot = as("bot");
    const calls = [sh("sleep 0.5; echo done", "d1"), sh("echo never", "d2")];
    for await (const e of bot.execute(calls, { runId: "disconnect" })) {
      if (e.kind === "started" && e.callId === "d1") break; // cancels the RPC
    }
    const settled = async (callId: string): Promise<Outcome> => {
      let outcome: Outcome | undefined;
      await waitUntil(async () => {
        const record = await bot.getCall(callId, { runId: "disconnect" }).catch((err: unknown) => {
          if (err instanceof CallNotFound) return undefined; // not journaled yet
          throw err;
        });
        outcome = record?.outcome;
        return outcome !== undefined;
      }, `${callId} to be journaled`);
      assert.ok(outcome);
      return outcome;
    };
    const ran = await settled("d1");
    assert.equal(ran.status, "success");
    assert.equal(ran.text.trim(), "done");
    const queued = await settled("d2");
    assert.equal(queued.status, "rejected");
    assert.equal(queued.errorClass, "cancelled");
  });
});

describe("approvals", () => {
  async function park(
    callId: string,
    file: string,
  ): Promise<{ approvalId: string; rest: AsyncGenerator<Event, void> }> {
    const rest = as("bot").execute(
      [{ tool: "run_command", arguments: { argv: ["touch", file] }, callId }],
      { runId: "approvals" },
    );
    // Step by step: a for-await that returned early would close the stream.
    for (let next = await rest.next(); !next.done; next = await rest.next()) {
      const e = next.value;
      if (e.kind === "awaiting_approval") {
        assert.equal(e.ruleId, "touching");
        assert.equal(e.reason, "touching needs a human");
        assert.ok(e.expiresAt !== undefined && e.expiresAt > Date.now() / 1000);
        return { approvalId: e.approvalId, rest };
      }
      assert.notEqual(e.kind, "started", "the call started before anyone approved it");
    }
    throw new Error(`${callId} never awaited approval`);
  }

  test("a parked call runs once an approver approves it", async () => {
    const { approvalId, rest } = await park("ask-1", "approved.txt");
    const alice = as("alice");
    const pending = await alice.approvals.pending();
    const mine = pending.find((a) => a.approvalId === approvalId);
    assert.ok(mine, "the approval is pending");
    assert.equal(mine.requester, "bot");
    assert.equal(mine.callId, "ask-1");
    assert.equal(mine.state, "pending");
    assert.ok(!existsSync(join(daemon.workspace, "approved.txt")));
    for await (const a of alice.approvals.watch()) {
      // The watch starts with every pending approval; leaving it ends the RPC.
      if (a.approvalId !== approvalId) continue;
      assert.equal(a.state, "pending");
      assert.equal(a.tool, "run_command");
      assert.deepEqual(JSON.parse(a.argumentsJson), { argv: ["touch", "approved.txt"] });
      break;
    }

    const decided = await alice.approvals.approve(approvalId, "fine by me");
    assert.equal(decided.state, "approved");
    assert.equal(decided.decidedBy, "alice");
    const events = await collect({ [Symbol.asyncIterator]: () => rest });
    const o = finished(events, "ask-1");
    assert.equal(o.status, "success", o.message);
    assert.ok(existsSync(join(daemon.workspace, "approved.txt")));

    const record = await as("bot").getCall("ask-1", { runId: "approvals" });
    assert.equal(record.policy?.effect, "ask");
    assert.deepEqual(record.policy?.ruleIds, ["touching"]);
  });

  test("a denied call is rejected; it cannot be decided twice; an agent may not decide", async () => {
    const { approvalId, rest } = await park("ask-2", "denied.txt");
    await assert.rejects(as("bot").approvals.approve(approvalId), PermissionDenied);
    await assert.rejects(as("bot").approvals.pending(), PermissionDenied);
    const decided = await as("alice").approvals.deny(approvalId, "not today");
    assert.equal(decided.state, "denied");
    const o = finished(await collect({ [Symbol.asyncIterator]: () => rest }), "ask-2");
    assert.equal(o.status, "rejected");
    assert.equal(o.errorClass, "approval_denied");
    assert.ok(!existsSync(join(daemon.workspace, "denied.txt")));
    await assert.rejects(as("alice").approvals.approve(approvalId), (err: unknown) => {
      assert.ok(err instanceof ApprovalNotPending);
      assert.equal(err.approvalId, approvalId);
      return true;
    });
  });
});

describe("the journal", () => {
  test("getCall and listCalls carry the caller's identity; a key replays", async () => {
    const bot = as("bot");
    const call = { path: "journal.txt", content: "once" };
    const first = await bot.executeOne("write_file", call, {
      runId: "journal",
      callId: "j1",
      idempotencyKey: "journal-key",
    });
    assert.equal(first.status, "success");
    const again = await bot.executeOne("write_file", call, {
      runId: "journal",
      callId: "j2",
      idempotencyKey: "journal-key",
    });
    assert.equal(again.replayOf, "j1");

    const record = await bot.getCall("j1", { runId: "journal" });
    assert.equal(record.agent, "bot");
    assert.equal(record.tool, "write_file");
    assert.deepEqual(JSON.parse(record.argumentsJson), call);
    assert.equal(record.idempotencyKey, "journal-key");
    assert.equal(record.running, false);
    assert.equal(record.outcome?.status, "success");
    assert.ok(record.mayWrite);

    const listed = await bot.listCalls({ runId: "journal", statuses: ["success"] });
    assert.ok(listed.some((r) => r.callId === "j1" && r.agent === "bot"));
    await assert.rejects(bot.getCall("nope", { runId: "journal" }), CallNotFound);
  });

  test("explain: the lock plan of a batch, without running it", async () => {
    const plans = await as("bot").explain([
      { tool: "write_file", arguments: { path: "plan.txt", content: "x" }, callId: "p1" },
      { tool: "read_file", arguments: { path: "plan.txt" }, callId: "p2" },
      { tool: "run_command", arguments: { argv: ["touch", "t"] }, callId: "p3" },
    ]);
    assert.deepEqual(
      plans.map((p) => p.callId),
      ["p1", "p2", "p3"],
    );
    const [write, read, touch] = plans;
    assert.ok(write && read && touch);
    assert.ok(write.mayWrite && !read.mayWrite);
    assert.ok(write.claims.some(([key, mode]) => key.endsWith("/plan.txt") && mode === "write"));
    assert.deepEqual(read.waitsFor, ["p1"]);
    assert.ok(touch.needsApproval);
    assert.ok(!existsSync(join(daemon.workspace, "plan.txt")));
  });
});

describe("connecting", () => {
  test("TCP with a bearer token; a wrong or missing token is Unauthenticated", async () => {
    assert.ok(daemon.tcpAddress, daemon.log());
    const o = await as("bot", daemon.tcpAddress).executeOne("noop", { echo: "over tcp" });
    assert.equal(o.text, "over tcp");
    const record = await as("bot", daemon.tcpAddress).getCall(o.callId);
    assert.equal(record.agent, "bot");
    await assert.rejects(as("wrong-token", daemon.tcpAddress).listTools(), Unauthenticated);
    const anonymous = new Client({ address: daemon.tcpAddress, token: "" });
    clients.push(anonymous);
    await assert.rejects(anonymous.listTools(), Unauthenticated);
  });

  test("EXECGATE_ADDR and EXECGATE_TOKEN are the defaults", async () => {
    const saved = { addr: process.env["EXECGATE_ADDR"], token: process.env["EXECGATE_TOKEN"] };
    process.env["EXECGATE_ADDR"] = daemon.tcpAddress;
    process.env["EXECGATE_TOKEN"] = TOKEN["hasty"];
    try {
      const client = new Client();
      clients.push(client);
      assert.equal(client.address, daemon.tcpAddress);
      const o = await client.executeOne("noop", {}, { runId: "env" });
      assert.equal((await client.getCall(o.callId, { runId: "env" })).agent, "hasty");
    } finally {
      for (const [k, v] of [
        ["EXECGATE_ADDR", saved.addr],
        ["EXECGATE_TOKEN", saved.token],
      ] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  test("the tools, with schemas and effects", async () => {
    const tools = new Map((await as("bot").listTools()).map((t) => [t.name, t]));
    const read = tools.get("read_file");
    assert.ok(read?.readOnly && !read.destructive);
    assert.ok(tools.get("run_command")?.destructive);
    assert.deepEqual((read.inputSchema["required"] as string[]).includes("path"), true);
  });

  test("DaemonUnavailable when nothing listens; RequestError for a refused envelope", async () => {
    const nobody = new Client({ address: `unix:${join(daemon.root, "nothing.sock")}` });
    clients.push(nobody);
    await assert.rejects(nobody.listTools(), (err: unknown) => {
      assert.ok(err instanceof DaemonUnavailable);
      assert.match(err.message, /no execgate daemon answers at unix:\//);
      return true;
    });
    const tooMany = Array.from({ length: 1001 }, () => ({ tool: "noop" }));
    await assert.rejects(as("bot").executeBatch(tooMany), (err: unknown) => {
      assert.ok(err instanceof RequestError, String(err));
      assert.equal(err.code, "INVALID_ARGUMENT");
      return true;
    });
  });
});
