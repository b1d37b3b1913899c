/**
 * What a run's transitions carry: THE SAME keys as the Python loop writes
 * (client/loop/record.py), so `execgate runs show` and a Python resume read a
 * TypeScript run as their own:
 *
 *     requesting_model -> validating    {"turn": {"text", "calls": [{id, name, arguments}],
 *                                       "stop_reason"}, "usage": {input_tokens,
 *                                       output_tokens, cost}}
 *     validating -> running_tools       {"calls": [{call_id, index, model_id, tool,
 *                                       arguments}], "refused": [{index, model_id, tool,
 *                                       arguments, error_class, reason}]}
 *     validating -> requesting_model    {"refused": [...]}, {"finding": ...} or {"paused": true}
 *     running_tools -> requesting_model {"results": [{call_id, status, error_class}]}
 *     running_tools <-> awaiting_approval  while calls of the batch wait for an approval
 *     terminal (a stop)                 {"rule", "figures", "evidence", "last_action", ...}
 *     validating -> completed           {"answer", "figures", "actions"}
 *
 * The daemon records a batch's end and its approval waits itself in a live step
 * (Runs.Step, with the same reasons and data); the loop appends them only for a batch it
 * reconciled on resume.
 *
 * `index` is the call's position in the model's turn: results are matched to proposed
 * calls by position, since a provider may repeat or omit its own ids.
 */

import type { Message, ToolCall, ToolResult, Turn } from "../models/base.js";
import { Outcome } from "../types.js";
import { type Observation, notRun, observe, render } from "./observe.js";
import type { Transition } from "./states.js";
import { canonicalArguments, fingerprint, type Tally } from "./tally.js";

// The reasons of a batch's end, as the daemon records them too (executor/runs/steps.py).
export const BATCH_FINISHED = "batch finished";
export const APPROVALS_SETTLED = "approvals settled";

/** A proposed call the loop sends to the daemon. */
export interface Planned {
  readonly callId: string;
  readonly index: number;
  readonly modelId: string;
  readonly tool: string;
  readonly arguments: Readonly<Record<string, unknown>>;
}

/** A proposed call the loop refused itself; it never reached the daemon. */
export interface Refused {
  readonly index: number;
  readonly modelId: string;
  readonly tool: string;
  readonly arguments: unknown;
  readonly errorClass: string;
  readonly reason: string;
}

export function plannedJson(p: Planned): Record<string, unknown> {
  return {
    call_id: p.callId,
    index: p.index,
    model_id: p.modelId,
    tool: p.tool,
    arguments: p.arguments,
  };
}

export function refusedJson(r: Refused): Record<string, unknown> {
  return {
    index: r.index,
    model_id: r.modelId,
    tool: r.tool,
    arguments: r.arguments,
    error_class: r.errorClass,
    reason: r.reason,
  };
}

export function turnJson(turn: Turn): Record<string, unknown> {
  return {
    turn: {
      text: turn.text,
      calls: turn.toolCalls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments })),
      stop_reason: turn.stopReason,
    },
    usage: {
      input_tokens: turn.usage.inputTokens,
      output_tokens: turn.usage.outputTokens,
      cost: turn.usage.cost,
    },
  };
}

/** The messages the model sees, and the figures the stop rules read. */
export class Conversation {
  // Every call that ran, with its outcome: for verifiers and terminal records.
  readonly done: [Planned, Outcome][] = [];

  constructor(
    readonly messages: Message[],
    readonly tally: Tally,
  ) {}

  addTurn(turn: Turn): void {
    const { inputTokens, outputTokens, cost } = turn.usage;
    this.tally.recordModel(inputTokens, outputTokens, cost);
    this.messages.push({ role: "assistant", text: turn.text, toolCalls: turn.toolCalls });
  }

  /**
   * One result per proposed call, in the model's order, all in one message. `ran`: the
   * calls sent, by their position in the turn.
   */
  addResults(
    turn: Turn,
    refused: readonly Refused[],
    ran: ReadonlyMap<number, readonly [Planned, Outcome]>,
    cap: number,
  ): void {
    const byIndex = new Map(refused.map((r) => [r.index, r]));
    const results: ToolResult[] = turn.toolCalls.map((call, i) => {
      const refusal = byIndex.get(i);
      let seen: Observation;
      if (refusal !== undefined) {
        seen = notRun(refusal.modelId, refusal.tool, refusal.reason, refusal.errorClass);
      } else {
        const sentCall = ran.get(i);
        if (sentCall === undefined) throw new Error(`no result for call ${i} of the turn`);
        seen = observe(sentCall[1], call.name, cap);
        this.done.push([sentCall[0], sentCall[1]]);
      }
      this.count(call.name, call.arguments, seen);
      return { callId: call.id, content: render(seen), isError: seen.isError };
    });
    this.messages.push({ role: "tool_results", results });
  }

  /** The verifier did not accept the answer: its finding goes back as an observation. */
  addFinding(finding: string): void {
    this.tally.recordResult("final_answer", {}, false, fingerprint(finding), finding);
    this.messages.push({ role: "user", text: `Your answer was not accepted: ${finding}` });
  }

  private count(tool: string, args: unknown, seen: Observation): void {
    const result = fingerprint([seen.status, seen.errorClass, seen.text]);
    this.tally.recordResult(tool, args, !seen.isError, result, `${seen.status}/${seen.errorClass}`);
  }
}

/** What the run did, for its `completed` record. */
export function actions(conv: Conversation): Record<string, unknown>[] {
  return conv.done.map(([p, o]) => ({
    call_id: p.callId,
    tool: p.tool,
    arguments: canonicalArguments(p.arguments),
    status: o.status,
  }));
}

/**
 * The calls a cancel reached: when it was asked, and when each actually stopped (two
 * moments, recorded separately; nothing is rolled back).
 */
export function stoppedCalls(conv: Conversation): Record<string, unknown>[] {
  const rows: Record<string, unknown>[] = [];
  for (const [p, o] of conv.done) {
    const asked = o.mark("cancel_requested");
    if (asked === undefined) continue;
    rows.push({
      call_id: p.callId,
      tool: p.tool,
      status: o.status,
      cancel_requested_at: asked.at,
      stopped_at: o.mark("stopped")?.at ?? null,
      stopped_how: o.stoppedHow,
    });
  }
  return rows;
}

/**
 * The sent calls with their outcomes, by position in the turn; a call with no outcome
 * (the stream ended without it) is UNKNOWN_OUTCOME.
 */
export function sent(
  planned: readonly Planned[],
  outcomes: ReadonlyMap<string, Outcome>,
): Map<number, readonly [Planned, Outcome]> {
  return new Map(
    planned.map((p) => [p.index, [p, outcomes.get(p.callId) ?? missing(p.callId)] as const]),
  );
}

/** A call sent with no outcome seen: its effect is not known. */
export function missing(callId: string): Outcome {
  return new Outcome({
    callId,
    status: "unknown_outcome",
    errorClass: "internal",
    message: "sent, but no outcome came back for it (still running, or lost)",
    field: "",
    text: "",
    structured: {},
    truncated: false,
    returnedBytes: 0,
    totalBytes: 0,
    evidence: { path: "", sandbox: "" },
    timeline: [],
    stoppedHow: "unspecified",
    replayOf: "",
  });
}

// -- rebuilding a recorded run (resume) ------------------------------------------------

type Json = Record<string, unknown>;

export function turnFrom(data: Readonly<Json>): Turn {
  const raw = data["turn"] as Json;
  const usage = data["usage"] as Json;
  const calls = (raw["calls"] as Json[]).map((c): ToolCall => ({
    id: String(c["id"]),
    name: String(c["name"]),
    arguments: c["arguments"] as Json,
  }));
  return {
    text: String(raw["text"] ?? ""),
    toolCalls: calls,
    usage: {
      inputTokens: Number(usage["input_tokens"] ?? 0),
      outputTokens: Number(usage["output_tokens"] ?? 0),
      cost: Number(usage["cost"] ?? 0),
    },
    stopReason: String(raw["stop_reason"] ?? ""),
  };
}

export function plannedFrom(data: Readonly<Json>): { planned: Planned[]; refused: Refused[] } {
  const planned = ((data["calls"] as Json[] | undefined) ?? []).map((c) => ({
    callId: String(c["call_id"]),
    index: Number(c["index"]),
    modelId: String(c["model_id"]),
    tool: String(c["tool"]),
    arguments: c["arguments"] as Json,
  }));
  const refused = ((data["refused"] as Json[] | undefined) ?? []).map((r) => ({
    index: Number(r["index"]),
    modelId: String(r["model_id"]),
    tool: String(r["tool"]),
    arguments: r["arguments"],
    errorClass: String(r["error_class"]),
    reason: String(r["reason"]),
  }));
  return { planned, refused };
}

/** Where a recorded run stands: its conversation, and the step it was in. */
export interface Rebuilt {
  readonly conversation: Conversation;
  // The last model turn and its planned calls, while validated or running.
  turn: Turn | undefined;
  planned: Planned[];
  refused: Refused[];
}

/**
 * Replay recorded transitions into a conversation (client/loop/record.py `rebuild`);
 * `outcomes`: the run's recorded call outcomes by call id.
 */
export function rebuild(
  goal: string,
  events: readonly Transition[],
  outcomes: ReadonlyMap<string, Outcome>,
  tally: Tally,
  cap: number,
): Rebuilt {
  const state: Rebuilt = {
    conversation: new Conversation([{ role: "user", text: goal }], tally),
    turn: undefined,
    planned: [],
    refused: [],
  };
  const conv = state.conversation;
  for (const moved of events) {
    const { fromState: from, toState: to, data } = moved;
    if (from === "requesting_model" && to === "validating") {
      state.turn = turnFrom(data);
      state.planned = [];
      state.refused = [];
      conv.addTurn(state.turn);
    } else if (from === "validating" && to === "running_tools") {
      ({ planned: state.planned, refused: state.refused } = plannedFrom(data));
    } else if (from === "validating" && to === "requesting_model") {
      if (data["paused"]) {
        // a paused turn is continued: the model is asked again as it stands
      } else if ("finding" in data) {
        conv.addFinding(String(data["finding"]));
      } else if (state.turn !== undefined) {
        conv.addResults(state.turn, plannedFrom(data).refused, new Map(), cap);
      }
      state.turn = undefined;
    } else if (to === "requesting_model" && state.turn !== undefined) {
      conv.addResults(state.turn, state.refused, sent(state.planned, outcomes), cap);
      state.turn = undefined;
      state.planned = [];
      state.refused = [];
    }
  }
  return state;
}
