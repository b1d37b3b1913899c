/** What a run of the loop hands back, and what a verifier sees (client/loop/results.py). */

import type { RunLimits } from "../runs.js";
import type { Outcome } from "../types.js";
import type { Verification } from "./backing.js";
import type { State } from "./states.js";

/** The bounds recorded with a run when the caller sets none (the Python loop's). */
export const DEFAULT_LIMITS: RunLimits = Object.freeze({
  maxSteps: 50,
  maxConsecutiveErrors: 5,
  maxRepeats: 3,
});

/** A verifier's answer: accept the final answer, or say what is wrong with it. */
export interface Verdict {
  readonly accepted: boolean;
  readonly finding?: string;
}

/** What a verifier sees: the goal, the proposed answer, every call that ran. */
export interface SoFar {
  readonly goal: string;
  readonly answer: string;
  readonly calls: readonly (readonly [string, Readonly<Record<string, unknown>>, Outcome])[];
}

export type Verifier = (soFar: SoFar) => Verdict | Promise<Verdict>;

export interface LoopResult {
  readonly runId: string;
  readonly state: State;
  // The terminal transition's reason, and the stop rule that decided ("" if none did).
  readonly reason: string;
  readonly rule: string;
  readonly answer: string;
  // As recorded: snake_case keys (steps, tokens, cost, elapsed_s, ...), like Python's.
  readonly figures: Readonly<Record<string, unknown>>;
  readonly evidence: Readonly<Record<string, unknown>>;
  readonly completed: boolean;
  // On completed: whether a verifier backed the answer (undefined on other ends).
  readonly verification: Verification | undefined;
  // On completed: what a reader should know (failed calls, unknown outcomes).
  readonly caveats: readonly string[];
}
