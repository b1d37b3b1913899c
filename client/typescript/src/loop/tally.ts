/**
 * The run's figures: what it has spent and how its calls went, kept as separate
 * accounts (client/loop/tally.py). Steps, tokens, cost, time and failures drain at their
 * own pace, so each has its own stop rule; the tally also counts how often the *same*
 * call produced the *same* result, which tells a run treading water from one working.
 */

import { createHash } from "node:crypto";

// Bound on the human-readable lastAction / lastResult strings.
const SHORT = 200;

/** JSON with object keys sorted at every level and no spaces. */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(sortKeys(value));
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (typeof value === "object" && value !== null) {
    const entries = Object.entries(value as Record<string, unknown>).sort(([a], [b]) =>
      a < b ? -1 : a > b ? 1 : 0,
    );
    return Object.fromEntries(entries.map(([k, v]) => [k, sortKeys(v)]));
  }
  return value;
}

/** A short stable hash of a JSON value: 16 hex digits of sha256 of its canonical JSON. */
export function fingerprint(value: unknown): string {
  return createHash("sha256").update(canonicalJson(value), "utf8").digest("hex").slice(0, 16);
}

/**
 * Arguments as canonical JSON, so that equal arguments compare equal. A string is the
 * model's raw JSON text: parsed and re-serialized; text that does not parse is kept.
 */
export function canonicalArguments(args: unknown): string {
  if (typeof args === "string") {
    try {
      return canonicalJson(JSON.parse(args));
    } catch {
      return args;
    }
  }
  return canonicalJson(args);
}

function short(text: string): string {
  return text.length <= SHORT ? text : text.slice(0, SHORT - 1) + "…";
}

/** Someone authorized asked the run to stop. */
export interface CancelRequest {
  readonly who: string;
  readonly reason: string;
  // Epoch seconds: when it was asked (not when the run stopped).
  readonly at: number;
}

/** The figures a stop records; snake_case keys, as the Python loop records them. A
 * type, not an interface, so that it is a plain JSON record. */
export type Figures = {
  readonly steps: number;
  readonly input_tokens: number;
  readonly output_tokens: number;
  readonly tokens: number;
  readonly cost: number;
  readonly elapsed_s: number;
  readonly failures: number;
  readonly consecutive_errors: number;
  readonly last_action: string;
  readonly last_result: string;
};

/** What the no-progress rule reports: the most repeated (call, result). */
export interface RepeatEvidence {
  readonly tool: string;
  readonly arguments: string;
  readonly result: string;
  readonly count: number;
}

/** The figures of one run. Counters only grow; consecutiveErrors resets on success. */
export class Tally {
  // Model requests made.
  steps = 0;
  inputTokens = 0;
  outputTokens = 0;
  cost = 0;
  // Invariant: consecutiveErrors <= failures.
  consecutiveErrors = 0;
  failures = 0;
  // What the run did last and how it went, short and human-readable.
  lastAction = "";
  lastResult = "";
  // fingerprint(tool, canonical arguments, result fingerprint) -> times seen.
  readonly repeats = new Map<string, number>();
  // Invariant: undefined iff repeats is empty; else a most-repeated entry, and
  // maxRepeatKey its key in `repeats`.
  maxRepeat: RepeatEvidence | undefined;
  private maxRepeatKey = "";
  cancel: CancelRequest | undefined;

  /** `startedAt`: monotonic seconds at the start of the run (the deadline counts from here). */
  constructor(readonly startedAt: number) {}

  get tokens(): number {
    return this.inputTokens + this.outputTokens;
  }

  /** One model request was made and answered, with its usage. */
  recordModel(inputTokens: number, outputTokens: number, cost: number): void {
    if (inputTokens < 0 || outputTokens < 0 || cost < 0) {
      throw new RangeError("usage and cost cannot be negative");
    }
    this.steps += 1;
    this.inputTokens += inputTokens;
    this.outputTokens += outputTokens;
    this.cost += cost;
    this.lastAction = "model request";
    this.lastResult = `${inputTokens} tokens in, ${outputTokens} out`;
  }

  /** One tool call ended. `summary` (e.g. "failure/not_found") is for people. */
  recordResult(tool: string, args: unknown, ok: boolean, result: string, summary = ""): void {
    const canonical = canonicalArguments(args);
    this.lastAction = short(`tool ${tool} ${canonical}`);
    this.lastResult = short(summary || (ok ? "ok" : "error"));
    if (ok) {
      this.consecutiveErrors = 0;
    } else {
      this.consecutiveErrors += 1;
      this.failures += 1;
    }
    const key = fingerprint([tool, canonical, result]);
    const count = (this.repeats.get(key) ?? 0) + 1;
    this.repeats.set(key, count);
    if (key === this.maxRepeatKey || count > (this.maxRepeat?.count ?? 0)) {
      this.maxRepeatKey = key;
      this.maxRepeat = { tool, arguments: canonical, result, count };
    }
  }

  /** Record a cancel request; the first one stands (it is the one that stopped the run). */
  requestCancel(who: string, reason: string, at: number): void {
    this.cancel ??= { who, reason, at };
  }

  /** The figures a stop records, `now` on the same monotonic clock as `startedAt`. */
  figures(now: number): Figures {
    return {
      steps: this.steps,
      input_tokens: this.inputTokens,
      output_tokens: this.outputTokens,
      tokens: this.tokens,
      cost: this.cost,
      elapsed_s: Math.round((now - this.startedAt) * 1000) / 1000,
      failures: this.failures,
      consecutive_errors: this.consecutiveErrors,
      last_action: this.lastAction,
      last_result: this.lastResult,
    };
  }
}

/** Monotonic seconds (the clock stop rules and figures use). */
export function monotonic(): number {
  return performance.now() / 1000;
}
