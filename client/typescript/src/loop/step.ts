/**
 * One run of the TypeScript `Loop` in progress (client/loop/step.py): the cycle of
 * model request, validation and tool batch, and the moves that persist each step.
 */

import type { ModelTool, Turn } from "../models/base.js";
import type { RunInfo } from "../runs.js";
import type { Outcome } from "../types.js";
import { caveats, failReason, failRule, pathOf, UNVERIFIED, type Verification } from "./backing.js";
import { reconcile, toCall } from "./batch.js";
import type { Loop } from "./driver.js";
import { checkCalls } from "./gate.js";
import {
  actions,
  APPROVALS_SETTLED,
  BATCH_FINISHED,
  type Conversation,
  type Planned,
  plannedJson,
  type Rebuilt,
  type Refused,
  refusedJson,
  sent,
  stoppedCalls,
  turnJson,
} from "./record.js";
import type { LoopResult, Verdict } from "./results.js";
import { ask, attemptJson } from "./retry.js";
import type { Machine, State, Transition } from "./states.js";
import type { Stop, StopRules } from "./stops.js";
import { type Figures, monotonic } from "./tally.js";

type Data = Readonly<Record<string, unknown>>;

/** The result a recorded terminal transition describes. */
export function resultOf(runId: string, events: readonly Transition[]): LoopResult {
  const last = events[events.length - 1] as Transition;
  const data = last.data;
  return {
    runId,
    state: last.toState,
    reason: last.reason,
    rule: String(data["rule"] ?? ""),
    answer: String(data["answer"] ?? ""),
    figures: (data["figures"] as Figures | undefined) ?? {},
    evidence: (data["evidence"] as Data | undefined) ?? {},
    completed: last.toState === "completed",
    verification: data["verification"] as Verification | undefined,
    caveats: (data["caveats"] as string[] | undefined) ?? [],
  };
}

// Bounds whose crossing request may have bought the final answer: the answer is taken.
const PAID_FOR: readonly string[] = ["max_tokens", "max_cost"];

/** One run in progress: the machine, the conversation, and the daemon's view. */
export class RunInProgress {
  private readonly runId: string;
  // Transitions made but not yet appended (see `move`'s `hold`).
  private held: Transition[] = [];
  // Epoch seconds, passed to Execute: the daemon stops calls still running then.
  private readonly deadline: number | undefined;

  constructor(
    private readonly loop: Loop,
    private info: RunInfo,
    private readonly conv: Conversation,
    private readonly machine: Machine,
    private readonly stops: StopRules,
  ) {
    this.runId = info.runId;
    const seconds = info.limits.deadlineSeconds ?? loop.limits.deadlineSeconds;
    this.deadline = seconds ? info.createdAt + seconds : undefined;
  }

  private get cap(): number {
    return this.loop.options.resultCap ?? 4000;
  }

  async go(rebuilt?: Rebuilt): Promise<LoopResult> {
    if (rebuilt !== undefined) {
      const ended = await this.continue(rebuilt);
      if (ended !== undefined) return ended;
    }
    if (this.machine.state === "created") await this.move("requesting_model", "run started");
    for (;;) {
      const ended = await this.cycle();
      if (ended !== undefined) return ended;
    }
  }

  /** Pick up a recorded run where it stood. */
  private async continue(rebuilt: Rebuilt): Promise<LoopResult | undefined> {
    if (this.machine.state === "waiting") {
      // Suspended: resume into the state it left (the machine enforces which).
      const { events } = await this.loop.client.runs.get(this.runId);
      const from = events[events.length - 1]?.fromState ?? "requesting_model";
      await this.move(from === "created" ? "requesting_model" : from, "resumed");
    }
    const state = this.machine.state;
    const turn = rebuilt.turn;
    if (state === "validating" && turn !== undefined) return this.validate(turn);
    if ((state === "running_tools" || state === "awaiting_approval") && turn !== undefined) {
      const waitS = this.loop.options.reconcileWaitS ?? 60;
      const outcomes = await reconcile(
        this.loop.client,
        this.runId,
        rebuilt.planned,
        waitS,
        this.deadline,
      );
      await this.batchDone(turn, rebuilt.planned, rebuilt.refused, outcomes);
    }
    return undefined;
  }

  /** One model request and what follows from it. */
  private async cycle(): Promise<LoopResult | undefined> {
    const stop = this.stop();
    if (stop !== undefined) return this.end(stop);
    const tools = await this.loop.offered();
    const system = this.loop.options.system ?? "";
    const asked = await ask(
      () => this.loop.model.respond(this.conv.messages, tools, { system }),
      this.loop.options.retry ?? {},
      () => this.stop(),
      this.deadline,
    );
    const retries = asked.retries.length > 0 ? { retries: asked.retries.map(attemptJson) } : {};
    if (asked.stopped !== undefined) return this.end(asked.stopped, undefined, retries);
    const turn = asked.turn;
    if (turn === undefined) {
      const message = asked.error?.message ?? "";
      return this.fail("model_error", `the model failed: ${message}`, {
        error: message,
        ...retries,
      });
    }
    this.conv.addTurn(turn);
    // A final answer's move is appended at once: its reply may carry a cancel request,
    // which must win over completing. Calls' moves wait for the next one.
    const data = { ...turnJson(turn), ...retries };
    await this.move("validating", "model replied", data, pathOf(turn) === "calls");
    return this.validate(turn);
  }

  private async validate(turn: Turn): Promise<LoopResult | undefined> {
    // A bound the model request just crossed (tokens, cost), the clock or a cancel ends
    // the run before its calls are sent. An answer the crossing request already bought
    // is taken (verified as usual), the overrun recorded. max_steps counts model
    // requests: it is checked before the next one.
    const path = pathOf(turn);
    const stop = this.stop(["max_steps"]);
    if (stop !== undefined && !(path === "answer" && PAID_FOR.includes(stop.rule))) {
      return this.end(stop, turn);
    }
    if (path === "answer") return this.answer(turn.text, stop);
    if (path === "fail") return this.turnFailed(turn);
    if (path === "continue") {
      await this.move("requesting_model", "the model paused its turn", { paused: true });
      return undefined;
    }
    const offered = new Set((await this.loop.offered()).map((t) => t.name));
    const { planned, refused } = await checkCalls(
      turn,
      offered,
      this.conv,
      this.loop.client,
      this.runId,
    );
    if (planned.length === 0) {
      const data = { refused: refused.map(refusedJson) };
      await this.move("requesting_model", "every proposed call was refused", data);
      this.conv.addResults(turn, refused, new Map(), this.cap);
      return undefined;
    }
    const data = { calls: planned.map(plannedJson), refused: refused.map(refusedJson) };
    const outcomes = await this.step(`${planned.length} call(s) sent`, data, planned);
    this.conv.addResults(turn, refused, sent(planned, outcomes), this.cap);
    return undefined; // the stop rules look at the batch before the next model request
  }

  /**
   * `validating -> running_tools` (with the turn's move held for it) and the batch, in
   * one round trip (Runs.Step): the daemon records the moves, the batch's end and any
   * approval waits before it answers, as `batchDone` and `move` would.
   */
  private async step(
    reason: string,
    data: Data,
    planned: readonly Planned[],
  ): Promise<Map<string, Outcome>> {
    this.held.push(this.machine.advance("running_tools", reason, data));
    const opening = this.held;
    this.held = [];
    const calls = planned.map((p) => toCall(this.runId, p));
    const onEvent = this.loop.options.onEvent;
    const done = await this.loop.client.runs.step(this.runId, opening, calls, {
      ...(this.deadline === undefined ? {} : { deadline: this.deadline }),
      ...(onEvent === undefined ? {} : { onEvent }),
    });
    for (const moved of done.events) this.machine.record(moved); // checked: ours continued
    await this.persisted([...opening, ...done.events], done.run);
    return new Map(planned.map((p, i) => [p.callId, done.outcomes[i] as Outcome]));
  }

  /** A truncated, refused or unreadable turn: failed with its rule; its calls never run. */
  private turnFailed(turn: Turn): Promise<LoopResult> {
    const data: Record<string, unknown> = { stop_reason: turn.stopReason, text: turn.text };
    if (turn.toolCalls.length > 0) {
      data["not_run"] = turn.toolCalls.map((c) => ({ name: c.name, arguments: c.arguments }));
    }
    return this.fail(failRule(turn), failReason(turn), data);
  }

  /**
   * A resumed batch's end, appended by the loop: the record the daemon writes at the end
   * of a live step (executor/runs/steps.py), with the reconciled outcomes.
   */
  private async batchDone(
    turn: Turn,
    planned: readonly Planned[],
    refused: readonly Refused[],
    outcomes: ReadonlyMap<string, Outcome>,
  ): Promise<void> {
    const ran = sent(planned, outcomes);
    this.conv.addResults(turn, refused, ran, this.cap);
    if (this.machine.state === "awaiting_approval") {
      await this.move("running_tools", APPROVALS_SETTLED);
    }
    const results = [...ran.values()].map(([p, o]) => ({
      call_id: p.callId,
      status: o.status,
      error_class: o.errorClass,
    }));
    await this.move("requesting_model", BATCH_FINISHED, { results });
  }

  private async answer(answer: string, overrun?: Stop): Promise<LoopResult | undefined> {
    let verdict = await this.verify(answer);
    if (verdict.accepted) {
      const detail = await this.loop.client.runs.get(this.runId);
      const pending = detail.calls.filter((c) => c.running).map((c) => c.callId);
      if (pending.length === 0) {
        const figures: Record<string, unknown> = { ...this.figures() };
        if (overrun !== undefined) figures["overrun"] = { rule: overrun.rule, ...overrun.evidence };
        const verifier = this.loop.options.verifier;
        const verification: Verification =
          verifier === undefined
            ? UNVERIFIED
            : {
                verifier: verifier.name || "verifier",
                verified: true,
                finding: verdict.finding ?? "",
              };
        const data = {
          answer,
          figures,
          actions: actions(this.conv),
          verification,
          caveats: caveats(this.conv.done),
        };
        return this.terminal("completed", "final answer accepted", data, "", answer);
      }
      verdict = { accepted: false, finding: `calls still pending: ${pending.join(", ")}` };
    }
    const finding = verdict.finding ?? "";
    if (this.loop.options.onRejectedAnswer === "fail") {
      const verification = {
        verifier: this.loop.options.verifier?.name ?? "",
        verified: false,
        finding,
      };
      return this.fail("verifier", finding, { answer, verification });
    }
    await this.move("requesting_model", "answer not accepted", { finding });
    this.conv.addFinding(finding);
    return undefined;
  }

  private async verify(answer: string): Promise<Verdict> {
    const verifier = this.loop.options.verifier;
    if (verifier === undefined) return { accepted: true };
    const calls = this.conv.done.map(([p, o]) => [p.tool, p.arguments, o] as const);
    return verifier({ goal: this.info.goal, answer, calls });
  }

  // -- moving and ending -------------------------------------------------------------

  /**
   * Advance and persist before anything else happens; note any cancel request. `hold`:
   * the next step is local (validating a turn touches nothing outside), so the move is
   * appended together with the one that follows it -- before any call is sent or the
   * run ends. A client dying in between loses the model's turn, never an action.
   */
  private async move(to: State, reason: string, data: Data = {}, hold = false): Promise<void> {
    this.held.push(this.machine.advance(to, reason, data));
    if (hold) return;
    const moved = this.held;
    this.held = [];
    await this.persisted(moved, await this.loop.client.runs.append(this.runId, moved));
  }

  /** The daemon holds `moved` now: tell the watchers; note any cancel request. */
  private async persisted(moved: readonly Transition[], info: RunInfo): Promise<void> {
    this.info = info;
    for (const each of moved) await this.loop.options.onTransition?.(each);
    const cancel = this.info.cancel;
    if (cancel !== undefined)
      this.conv.tally.requestCancel(cancel.requester, cancel.reason, cancel.at);
  }

  private stop(skip: readonly string[] = []): Stop | undefined {
    return this.stops.first(this.conv.tally, monotonic(), skip);
  }

  private end(stop: Stop, unrun?: Turn, extra: Data = {}): Promise<LoopResult> {
    const data: Record<string, unknown> = {
      rule: stop.rule,
      figures: stop.figures,
      evidence: stop.evidence,
      last_action: this.conv.tally.lastAction,
      ...extra,
    };
    if (unrun !== undefined && unrun.toolCalls.length > 0) {
      // Proposed, never sent.
      data["not_run"] = unrun.toolCalls.map((c) => ({ name: c.name, arguments: c.arguments }));
    }
    if (stop.state === "cancelled") {
      data["stopped_calls"] = stoppedCalls(this.conv);
      data["rolled_back"] = false; // stopping undoes nothing a call already did
    }
    return this.terminal(stop.state, stop.reason, data, stop.rule);
  }

  private fail(rule: string, reason: string, extra: Data): Promise<LoopResult> {
    const data = {
      rule,
      figures: this.figures(),
      ...extra,
      last_action: this.conv.tally.lastAction,
    };
    return this.terminal("failed", reason, data, rule);
  }

  private async terminal(
    state: State,
    reason: string,
    data: Data,
    rule = "",
    answer = "",
  ): Promise<LoopResult> {
    await this.move(state, reason, data);
    return {
      runId: this.runId,
      state,
      reason,
      rule,
      answer,
      figures: (data["figures"] as Figures | undefined) ?? this.figures(),
      evidence: (data["evidence"] as Data | undefined) ?? {},
      completed: state === "completed",
      verification: data["verification"] as Verification | undefined,
      caveats: (data["caveats"] as string[] | undefined) ?? [],
    };
  }

  private figures(): Figures {
    return this.conv.tally.figures(monotonic());
  }
}
