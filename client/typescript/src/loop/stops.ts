/**
 * Stop rules: each bound on a run is its own small object, and `StopRules` composes
 * them in priority order (client/loop/stops.py). A rule looks at the `Tally` and stays
 * silent or returns a `Stop`: its name, the terminal state, a sentence saying why, the
 * run's figures and the evidence. A stop never ends a run `completed`.
 *
 * `StopRules.first` runs before each model request, so `MaxSteps(n)` means "at most n
 * model requests"; all rules but max_steps run again before a turn's calls are sent.
 */

import { STOP_PRIORITY } from "../gen/runstates.js";
import type { StopState } from "./states.js";
import type { Figures, Tally } from "./tally.js";

export interface Stop {
  readonly rule: string;
  readonly state: StopState;
  readonly reason: string;
  readonly figures: Figures;
  readonly evidence: Readonly<Record<string, unknown>>;
}

export interface StopRule {
  readonly name: string;
  /** A `Stop` if the run must end; `now` is monotonic seconds, like `tally.startedAt`. */
  check(tally: Tally, now: number): Stop | undefined;
}

function positive(value: number, what: string): void {
  if (!(value > 0)) throw new RangeError(`${what} must be positive, got ${value}`);
}

/** Python's `:g` for the figures people read. */
function g(n: number): string {
  return String(Number(n.toPrecision(6)));
}

/** An authorized actor asked the run to stop. */
export class Cancelled implements StopRule {
  readonly name = "cancelled";

  check(tally: Tally, now: number): Stop | undefined {
    const req = tally.cancel;
    if (req === undefined) return undefined;
    const evidence = { who: req.who, reason: req.reason, requested_at: req.at };
    const reason = `cancelled by ${req.who}` + (req.reason ? `: ${req.reason}` : "");
    return { rule: this.name, state: "cancelled", reason, figures: tally.figures(now), evidence };
  }
}

/** The run may last `seconds` of wall time from its start (monotonic clock). */
export class Deadline implements StopRule {
  readonly name = "deadline";

  constructor(readonly seconds: number) {
    positive(seconds, "deadline seconds");
  }

  check(tally: Tally, now: number): Stop | undefined {
    const elapsed = now - tally.startedAt;
    if (elapsed < this.seconds) return undefined;
    return {
      rule: this.name,
      state: "expired",
      reason: `${elapsed.toFixed(1)}s elapsed; the deadline is ${this.seconds}s`,
      figures: tally.figures(now),
      evidence: { limit_s: this.seconds, elapsed_s: elapsed },
    };
  }
}

/** The run may use `n` tokens, input and output together. */
export class MaxTokens implements StopRule {
  readonly name = "max_tokens";

  constructor(readonly n: number) {
    positive(n, "max_tokens");
  }

  check(tally: Tally, now: number): Stop | undefined {
    if (tally.tokens < this.n) return undefined;
    return {
      rule: this.name,
      state: "budget_exhausted",
      reason: `${tally.tokens} tokens used; the budget is ${this.n}`,
      figures: tally.figures(now),
      evidence: { limit: this.n, tokens: tally.tokens },
    };
  }
}

/** The run may cost `limit` (in whatever unit the model reports). */
export class MaxCost implements StopRule {
  readonly name = "max_cost";

  constructor(readonly limit: number) {
    positive(limit, "max_cost");
  }

  check(tally: Tally, now: number): Stop | undefined {
    if (tally.cost < this.limit) return undefined;
    return {
      rule: this.name,
      state: "budget_exhausted",
      reason: `cost ${g(tally.cost)} reached the budget ${g(this.limit)}`,
      figures: tally.figures(now),
      evidence: { limit: this.limit, cost: tally.cost },
    };
  }
}

/** A run may make at most `n` model requests: fires once `n` have been made. */
export class MaxSteps implements StopRule {
  readonly name = "max_steps";

  constructor(readonly n: number) {
    positive(n, "max_steps");
  }

  check(tally: Tally, now: number): Stop | undefined {
    if (tally.steps < this.n) return undefined;
    return {
      rule: this.name,
      state: "expired",
      reason: `${tally.steps} model requests made; the run may make at most ${this.n}`,
      figures: tally.figures(now),
      evidence: { limit: this.n, steps: tally.steps },
    };
  }
}

/** `n` tool calls in a row ended in error: the run has failed. */
export class MaxConsecutiveErrors implements StopRule {
  readonly name = "max_consecutive_errors";

  constructor(readonly n: number) {
    positive(n, "max_consecutive_errors");
  }

  check(tally: Tally, now: number): Stop | undefined {
    const count = tally.consecutiveErrors;
    if (count < this.n) return undefined;
    return {
      rule: this.name,
      state: "failed",
      reason: `${count} tool calls failed in a row (at most ${this.n}); last: ${tally.lastResult}`,
      figures: tally.figures(now),
      evidence: {
        limit: this.n,
        count,
        last_action: tally.lastAction,
        last_result: tally.lastResult,
      },
    };
  }
}

/**
 * The same call got the same result more than `maxRepeats` times: ask a human.
 * Repeating a call is fine (polling); the same answer to the same question again and
 * again is treading water.
 */
export class NoProgress implements StopRule {
  readonly name = "no_progress";

  constructor(readonly maxRepeats: number) {
    positive(maxRepeats, "max_repeats");
  }

  check(tally: Tally, now: number): Stop | undefined {
    const most = tally.maxRepeat;
    if (most === undefined || most.count <= this.maxRepeats) return undefined;
    return {
      rule: this.name,
      state: "escalated",
      reason:
        `${most.tool} returned the same result ${most.count} times for the same ` +
        `arguments (at most ${this.maxRepeats} allowed)`,
      figures: tally.figures(now),
      evidence: { ...most, limit: this.maxRepeats },
    };
  }
}

/**
 * The order in which rules decide when several fire at once: a cancel (a person's
 * instruction) first; then the hard resources, time, tokens and cost, the step cap;
 * judgements about the run's behaviour last, repeated errors (a fact) before no
 * progress (a heuristic). Data: `stop_priority` in proto/execgate/v1/runstates.json.
 */
export const PRIORITY: readonly string[] = STOP_PRIORITY;

/** The bounds `StopRules.default` builds; unset leaves a bound out. */
export interface StopBounds {
  readonly maxSteps?: number;
  readonly maxTokens?: number;
  readonly maxCost?: number;
  readonly deadlineSeconds?: number;
  readonly maxConsecutiveErrors?: number;
  readonly maxRepeats?: number;
}

/** Rules in PRIORITY order (rules with other names after them, as given). */
export class StopRules {
  readonly rules: readonly StopRule[];

  constructor(rules: readonly StopRule[]) {
    const names = rules.map((r) => r.name);
    if (new Set(names).size !== names.length) {
      throw new RangeError(`one rule per name, got ${names.join(", ")}`);
    }
    const rank = (r: StopRule): number => {
      const i = PRIORITY.indexOf(r.name);
      return i < 0 ? PRIORITY.length : i;
    };
    this.rules = [...rules].sort((a, b) => rank(a) - rank(b));
  }

  /** The stop of the highest-priority rule that fires; `skip`: rule names not checked now. */
  first(tally: Tally, now: number, skip: readonly string[] = []): Stop | undefined {
    for (const rule of this.rules) {
      if (skip.includes(rule.name)) continue;
      const stop = rule.check(tally, now);
      if (stop !== undefined) return stop;
    }
    return undefined;
  }

  /** The usual set from a run's bounds. Cancellation is always honoured. */
  static default(bounds: StopBounds): StopRules {
    const rules: StopRule[] = [new Cancelled()];
    if (bounds.deadlineSeconds) rules.push(new Deadline(bounds.deadlineSeconds));
    if (bounds.maxTokens) rules.push(new MaxTokens(bounds.maxTokens));
    if (bounds.maxCost) rules.push(new MaxCost(bounds.maxCost));
    if (bounds.maxSteps) rules.push(new MaxSteps(bounds.maxSteps));
    if (bounds.maxConsecutiveErrors)
      rules.push(new MaxConsecutiveErrors(bounds.maxConsecutiveErrors));
    if (bounds.maxRepeats) rules.push(new NoProgress(bounds.maxRepeats));
    return new StopRules(rules);
  }
}
