/**
 * `client.runs`: the daemon's run records (proto runs.proto). A run's events are the
 * loop's `Transition`s, the same record whichever language wrote them.
 */

import * as rpb from "./gen/execgate/v1/runs.js";
import { LIMIT_KEYS as GENERATED_LIMIT_KEYS } from "./gen/runstates.js";
import { RequestError } from "./errors.js";
import { isState, type State, type Transition } from "./loop/states.js";
import type { Rpc } from "./rpc.js";
import type { Call, CallRecord, Event, Outcome } from "./types.js";
import * as wire from "./wire.js";

/** A run's bounds; unset or 0: no limit of that kind. */
export interface RunLimits {
  readonly maxSteps?: number;
  readonly maxTokens?: number;
  readonly maxCost?: number;
  readonly deadlineSeconds?: number;
  readonly maxConsecutiveErrors?: number;
  readonly maxRepeats?: number;
}

// runs.proto RunLimits' fields (proto/execgate/v1/runstates.json `limit_keys`).
const LIMIT_KEYS = GENERATED_LIMIT_KEYS satisfies readonly (keyof RunLimits)[];

/** Someone asked the run to stop (CancelRun): who, why, when (epoch seconds). */
export interface CancelNotice {
  readonly requester: string;
  readonly reason: string;
  readonly at: number;
}

export interface RunInfo {
  readonly runId: string;
  readonly goal: string;
  // The authenticated identity that started it.
  readonly owner: string;
  readonly limits: RunLimits;
  readonly model: string;
  readonly configVersion: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly state: State;
  readonly terminal: boolean;
  // The reason of the last transition (for a terminal state: why it ended).
  readonly reason: string;
  readonly lastSeq: number;
  readonly createdAt: number;
  readonly updatedAt: number;
  readonly cancel?: CancelNotice;
  // The workspace every call of the run works in.
  readonly workspace: string;
}

/** What a loop step (`Runs.step`) ended with. */
export interface StepResult {
  readonly batchId: string;
  // The calls' outcomes, in the order they were given.
  readonly outcomes: readonly Outcome[];
  // The transitions the daemon recorded for the step after the ones sent, in order:
  // awaiting_approval and back while calls waited for an approval, then the batch's end.
  readonly events: readonly Transition[];
  // The run after the step (with any cancel request).
  readonly run: RunInfo;
}

export interface StepOptions {
  // Epoch seconds: calls still running then are stopped, calls not started are REJECTED.
  readonly deadline?: number;
  // Each event of the batch as it happens (the streaming Step); unset: one answer at
  // the end (StepBatch, cheaper).
  readonly onEvent?: (event: Event) => Promise<void> | void;
}

export interface RunDetail {
  readonly run: RunInfo;
  readonly events: readonly Transition[];
  // The run's tool calls as the daemon's journal has them, oldest first.
  readonly calls: readonly CallRecord[];
}

export interface StartOptions {
  // A client-chosen id (unique); unset: the daemon picks one.
  readonly runId?: string;
  readonly limits?: RunLimits;
  readonly model?: string;
  readonly configVersion?: string;
  readonly labels?: Readonly<Record<string, string>>;
  // Where every call of the run works: one the policy gives this identity (unset: its
  // first); PermissionDenied for one it was not given.
  readonly workspace?: string;
}

export interface FindOptions {
  // May include "active" (every non-terminal state).
  readonly states?: readonly string[];
  readonly owner?: string;
  readonly limit?: number;
}

export class Runs {
  /** @internal Made by `Client`. */
  constructor(
    private readonly stub: rpb.RunsClient,
    private readonly rpc: Rpc,
  ) {}

  /** Open a run owned by this client's identity. */
  async start(goal: string, options: StartOptions = {}): Promise<RunInfo> {
    const runId = options.runId ?? "";
    const request = rpb.StartRunRequest.create({
      runId,
      goal,
      limits: limitsMessage(options.limits ?? {}),
      model: options.model ?? "",
      configVersion: options.configVersion ?? "",
      labels: { ...options.labels },
      workspace: options.workspace ?? "",
    });
    const msg = await this.rpc.unary<rpb.Run>((md, done) => this.stub.startRun(request, md, done), {
      runId,
      runOp: true,
    });
    return runInfo(msg);
  }

  /** Persist transitions (all or none); RunRefused if they do not continue the run. */
  async append(runId: string, events: Iterable<Transition>): Promise<RunInfo> {
    const request = rpb.AppendEventsRequest.create({
      runId,
      events: [...events].map(eventMessage),
    });
    const msg = await this.rpc.unary<rpb.Run>(
      (md, done) => this.stub.appendEvents(request, md, done),
      { runId, runOp: true },
    );
    return runInfo(msg);
  }

  /**
   * One loop step in one round trip (Runs.Step): persist `events` (the last one enters
   * running_tools), run `calls` (each with its call id and idempotency key), and get
   * the batch's end the daemon recorded. Sent again after a lost answer it is
   * recognised: nothing is appended or run twice, the answer is the same. RunRefused if
   * `events` do not continue the run.
   */
  async step(
    runId: string,
    events: Iterable<Transition>,
    calls: Iterable<Call>,
    options: StepOptions = {},
  ): Promise<StepResult> {
    const onEvent = options.onEvent;
    const request = rpb.StepRequest.create({
      runId,
      events: [...events].map(eventMessage),
      calls: [...calls].map(wire.toolCall),
      outcomesOnly: onEvent === undefined,
      deadline: options.deadline === undefined ? undefined : wire.timestamp(options.deadline),
    });
    if (onEvent !== undefined) return this.streamed(request, onEvent);
    const msg = await this.rpc.unary<rpb.StepResponse>(
      (md, done) => this.stub.stepBatch(request, md, done),
      { runId, runOp: true },
    );
    if (msg.run === undefined) throw new RequestError("UNKNOWN", `StepBatch ${runId}: no run`);
    return {
      batchId: msg.batchId,
      outcomes: wire.outcomes(msg),
      events: msg.events.map((e) => transition(runId, e)),
      run: runInfo(msg.run),
    };
  }

  private async streamed(
    request: rpb.StepRequest,
    onEvent: (event: Event) => Promise<void> | void,
  ): Promise<StepResult> {
    const runId = request.runId;
    const finished = new Map<number, Outcome>();
    const moved: Transition[] = [];
    let run: RunInfo | undefined;
    let batchId = "";
    const updates = this.rpc.stream(
      (md) => this.stub.step(request, md),
      (update: rpb.StepUpdate) => update,
      { runId, runOp: true },
    );
    for await (const update of updates) {
      switch (update.update?.$case) {
        case "call": {
          const event = wire.event(update.update.call);
          batchId = event.batchId;
          await onEvent(event);
          if (event.kind === "finished") finished.set(event.index, event.outcome);
          break;
        }
        case "event":
          moved.push(transition(runId, update.update.event));
          break;
        case "run":
          run = runInfo(update.update.run);
          break;
        case undefined:
          throw new RequestError("UNKNOWN", `Step ${runId}: an empty update`);
      }
    }
    if (run === undefined || finished.size !== request.calls.length) {
      throw new RequestError("UNKNOWN", `Step ${runId}: the stream ended before the step`);
    }
    const outcomes = request.calls.map((_, i) => finished.get(i) as Outcome);
    return { batchId, outcomes, events: moved, run };
  }

  /** The run with its full event history and its tool calls. */
  async get(runId: string): Promise<RunDetail> {
    const request = rpb.GetRunRequest.create({ runId });
    const msg = await this.rpc.unary<rpb.RunDetail>(
      (md, done) => this.stub.getRun(request, md, done),
      { runId, runOp: true },
    );
    if (msg.run === undefined) throw new RequestError("UNKNOWN", `GetRun ${runId}: no run`);
    return {
      run: runInfo(msg.run),
      events: msg.events.map((e) => transition(runId, e)),
      calls: msg.calls.map(wire.record),
    };
  }

  /** Runs, newest first. */
  async find(options: FindOptions = {}): Promise<RunInfo[]> {
    const request = rpb.ListRunsRequest.create({
      states: [...(options.states ?? [])],
      owner: options.owner ?? "",
      limit: options.limit ?? 100,
    });
    const msg = await this.rpc.unary<rpb.ListRunsResponse>(
      (md, done) => this.stub.listRuns(request, md, done),
      { runOp: true },
    );
    return msg.runs.map(runInfo);
  }

  /** Ask the run to stop: its tool calls are cancelled now; its loop ends it. */
  async cancel(runId: string, reason = ""): Promise<RunInfo> {
    const request = rpb.CancelRunRequest.create({ runId, reason });
    const msg = await this.rpc.unary<rpb.Run>(
      (md, done) => this.stub.cancelRun(request, md, done),
      { runId, runOp: true },
    );
    return runInfo(msg);
  }

  /** The run's events after `afterSeq`, then new ones and cancel requests, until it ends. */
  watch(runId: string, afterSeq = 0): AsyncGenerator<Transition | CancelNotice, void, undefined> {
    const request = rpb.WatchRunRequest.create({ runId, afterSeq });
    return this.rpc.stream(
      (md) => this.stub.watchRun(request, md),
      (update: rpb.RunUpdate): Transition | CancelNotice => {
        switch (update.update?.$case) {
          case "event":
            return transition(runId, update.update.event);
          case "cancel":
            return cancelNotice(update.update.cancel);
          case undefined:
            throw new RequestError("UNKNOWN", `WatchRun ${runId}: an empty update`);
        }
      },
      { runId, runOp: true },
    );
  }
}

/** A watched update is a cancel request, not a transition. */
export function isCancelNotice(update: Transition | CancelNotice): update is CancelNotice {
  return "requester" in update;
}

function state(name: string): State {
  if (!isState(name)) throw new RequestError("UNKNOWN", `the daemon sent run state ${name}`);
  return name;
}

function limitsMessage(limits: RunLimits): rpb.RunLimits {
  const set = LIMIT_KEYS.filter((k) => limits[k]).map((k) => [k, limits[k]]);
  return rpb.RunLimits.create(Object.fromEntries(set) as Partial<rpb.RunLimits>);
}

function runInfo(msg: rpb.Run): RunInfo {
  const limits = msg.limits ?? rpb.RunLimits.create();
  return {
    runId: msg.runId,
    goal: msg.goal,
    owner: msg.owner,
    limits: Object.fromEntries(LIMIT_KEYS.filter((k) => limits[k]).map((k) => [k, limits[k]])),
    model: msg.model,
    configVersion: msg.configVersion,
    labels: msg.labels,
    state: state(msg.state),
    terminal: msg.terminal,
    reason: msg.reason,
    lastSeq: msg.lastSeq,
    createdAt: wire.seconds(msg.createdAt),
    updatedAt: wire.seconds(msg.updatedAt),
    workspace: msg.workspace,
    ...(msg.cancel ? { cancel: cancelNotice(msg.cancel) } : {}),
  };
}

function cancelNotice(msg: rpb.CancelRequestRecord): CancelNotice {
  return { requester: msg.requester, reason: msg.reason, at: wire.seconds(msg.at) };
}

export function eventMessage(e: Transition): rpb.RunEvent {
  return rpb.RunEvent.create({
    seq: e.seq,
    at: wire.timestamp(e.at),
    fromState: e.fromState,
    toState: e.toState,
    reason: e.reason,
    dataJson: JSON.stringify(e.data),
  });
}

function transition(runId: string, msg: rpb.RunEvent): Transition {
  const data: unknown = JSON.parse(msg.dataJson || "{}");
  return {
    runId,
    seq: msg.seq,
    at: wire.seconds(msg.at),
    fromState: state(msg.fromState),
    toState: state(msg.toState),
    reason: msg.reason,
    data: typeof data === "object" && data !== null ? (data as Record<string, unknown>) : {},
  };
}
