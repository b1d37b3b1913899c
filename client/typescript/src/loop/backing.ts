/**
 * What backs a completion, and what a turn's stop reason leads to
 * (client/loop/backing.py): the verifier that accepted the answer (or "unverified"),
 * the caveats (failed calls, unknown outcomes left unreconciled); and each turn's path.
 */

import { endingOf, type Turn } from "../models/base.js";
import type { Outcome } from "../types.js";
import type { Planned } from "./record.js";
import { canonicalArguments } from "./tally.js";

export type Path = "answer" | "calls" | "continue" | "fail";

export function pathOf(turn: Turn): Path {
  const ending = endingOf(turn.stopReason);
  const calls = turn.toolCalls.length > 0;
  switch (ending) {
    case "truncated":
    case "refused":
    case "unknown":
      return "fail"; // a cut-off turn's calls may have cut-off arguments: none runs
    case "paused":
      return calls ? "calls" : "continue";
    case "end":
    case "tool_use":
      if (calls) return "calls";
      return ending === "end" ? "answer" : "fail";
  }
}

/** The rule a failing turn ends the run with. */
export function failRule(turn: Turn): string {
  const ending = endingOf(turn.stopReason);
  return ending === "truncated"
    ? "truncated"
    : ending === "refused"
      ? "refused"
      : "unexpected_stop";
}

export function failReason(turn: Turn): string {
  const said = turn.stopReason || "(none)";
  switch (endingOf(turn.stopReason)) {
    case "truncated":
      return `the model's turn was cut off (stop reason ${said}): not an answer`;
    case "refused":
      return `the provider refused the turn (stop reason ${said}): not an answer`;
    default:
      return `the model's turn stopped for a reason the loop cannot act on: ${said}`;
  }
}

/** Whether a verifier backed the answer: `verifier` "" means none was configured. */
export interface Verification {
  readonly verifier: string;
  readonly verified: boolean;
  readonly finding: string;
}

export const UNVERIFIED: Verification = Object.freeze({
  verifier: "",
  verified: false,
  finding: "no verifier was configured",
});

export function caveats(done: readonly (readonly [Planned, Outcome])[]): string[] {
  const failed: string[] = [];
  const unknown: string[] = [];
  done.forEach(([p, o], i) => {
    if (o.status === "success" || retriedOk(done, i)) return;
    (o.status === "unknown_outcome" ? unknown : failed).push(`${p.callId} ${p.tool} ${o.status}`);
  });
  const notes: string[] = [];
  if (failed.length > 0) {
    notes.push(`answer followed ${failed.length} failed call(s): ${failed.join(", ")}`);
  }
  if (unknown.length > 0) {
    notes.push(
      `${unknown.length} call(s) with an unknown outcome left unreconciled: ${unknown.join(", ")}`,
    );
  }
  return notes;
}

function retriedOk(done: readonly (readonly [Planned, Outcome])[], i: number): boolean {
  const [planned] = done[i] as readonly [Planned, Outcome];
  const key = planned.tool + "\0" + canonicalArguments(planned.arguments);
  return done
    .slice(i + 1)
    .some(
      ([p, o]) => p.tool + "\0" + canonicalArguments(p.arguments) === key && o.status === "success",
    );
}
