/**
 * `Loop`: the agent loop, run against the daemon as an explicit state machine -- the
 * TypeScript twin of client/loop/driver.py, making the same moves with the same data.
 *
 * Each step is a transition persisted to the daemon (Runs.AppendEvents) before the
 * next one begins; the stop rules are checked before every model request, and (all but
 * max_steps) again before a turn's calls are sent; the first rule to fire ends the run,
 * once, with its figures. A final answer completes the run only if the verifier (if
 * any) accepts it and no call of the run is pending. The AppendEvents reply carries any
 * CancelRun request, so a cancel is seen within one transition.
 */

import type { Client } from "../client.js";
import type { Model, ModelTool } from "../models/base.js";
import type { RunLimits } from "../runs.js";
import type { Event, Outcome } from "../types.js";
import { Conversation, rebuild } from "./record.js";
import { DEFAULT_LIMITS, type LoopResult, type Verifier } from "./results.js";
import type { RetryOptions } from "./retry.js";
import { Machine, TERMINAL, type Transition } from "./states.js";
import { resultOf, RunInProgress } from "./step.js";
import { StopRules } from "./stops.js";
import { monotonic, Tally } from "./tally.js";

export interface LoopOptions {
  // The stop rules; default StopRules.default(limits).
  readonly stops?: StopRules;
  // Recorded with the run; without `stops`, merged over DEFAULT_LIMITS and enforced.
  readonly limits?: RunLimits;
  // Checks a final answer against the run's record; unset accepts it.
  readonly verifier?: Verifier;
  // "observe" sends the verifier's finding back to the model; "fail" ends the run failed.
  readonly onRejectedAnswer?: "observe" | "fail";
  readonly system?: string;
  // The daemon tools offered to the model (unset: all of them).
  readonly tools?: readonly string[];
  // Characters of each tool result the model sees.
  readonly resultCap?: number;
  readonly configVersion?: string;
  // On resume, how long to wait for a call still running (seconds, default 60).
  readonly reconcileWaitS?: number;
  // How transient model errors (429, 5xx, connection) are retried.
  readonly retry?: RetryOptions;
  // Called with each transition once persisted, and each event of the run's calls.
  readonly onTransition?: (moved: Transition) => void | Promise<void>;
  readonly onEvent?: (event: Event) => void | Promise<void>;
}

/** Runs a model against the daemon's tools until a stop rule or a verified answer. */
export class Loop {
  readonly limits: RunLimits;
  readonly stops: StopRules;
  private tools: readonly ModelTool[] | undefined;

  constructor(
    readonly client: Client,
    readonly model: Model,
    readonly options: LoopOptions = {},
  ) {
    this.limits = options.stops ? { ...options.limits } : { ...DEFAULT_LIMITS, ...options.limits };
    this.stops = options.stops ?? StopRules.default(this.limits);
  }

  /** Start a run for `goal` and drive it to a terminal state. */
  async run(goal: string, options: { runId?: string } = {}): Promise<LoopResult> {
    const info = await this.client.runs.start(goal, {
      runId: options.runId ?? "",
      limits: this.limits,
      model: this.model.name,
      configVersion: this.options.configVersion ?? "",
      labels: { client: "typescript" },
      // The run works where the client's calls do ("": its owner's first workspace).
      workspace: this.client.workspace,
    });
    const tally = new Tally(monotonicStart(info.createdAt));
    const conv = new Conversation([{ role: "user", text: goal }], tally);
    return new RunInProgress(this, info, conv, new Machine(info.runId), this.stops).go();
  }

  /** Continue a recorded run from its transitions and its calls in the journal. */
  async resume(runId: string): Promise<LoopResult> {
    const detail = await this.client.runs.get(runId);
    const machine = Machine.replay(runId, detail.events);
    if (TERMINAL.has(machine.state)) return resultOf(runId, detail.events);
    const outcomes = new Map<string, Outcome>();
    for (const c of detail.calls) if (c.outcome !== undefined) outcomes.set(c.callId, c.outcome);
    const tally = new Tally(monotonicStart(detail.run.createdAt));
    const ask = detail.run.cancel;
    if (ask !== undefined) tally.requestCancel(ask.requester, ask.reason, ask.at);
    const cap = this.options.resultCap ?? 4000;
    const rebuilt = rebuild(detail.run.goal, detail.events, outcomes, tally, cap);
    // The run keeps the bounds it was started with (unless this Loop brings rules).
    const stops = this.options.stops ?? StopRules.default(detail.run.limits);
    const run = new RunInProgress(this, detail.run, rebuilt.conversation, machine, stops);
    return run.go(rebuilt);
  }

  /** The tools offered to the model (listed from the daemon once). */
  async offered(): Promise<readonly ModelTool[]> {
    if (this.tools === undefined) {
      const wanted = this.options.tools;
      const specs = await this.client.listTools();
      this.tools = specs
        .filter((s) => wanted === undefined || wanted.includes(s.name))
        .map((s) => ({ name: s.name, description: s.description, parameters: s.inputSchema }));
    }
    return this.tools;
  }
}

/** The run's start on the monotonic clock (the deadline counts from its creation). */
function monotonicStart(createdAt: number): number {
  return monotonic() - Math.max(Date.now() / 1000 - createdAt, 0);
}
