/**
 * The run's state machine: its states, the legal moves between them, and the record
 * of a move. The table is data, defined once in proto/execgate/v1/runstates.json and
 * generated into src/gen/runstates.ts at build time; the Python loop and the daemon,
 * which checks every appended transition, are built from the same file.
 *
 *     created -> requesting_model -> validating -> running_tools -> requesting_model ...
 *                                       |  \-> awaiting_approval (a call an `ask` rule parked)
 *                                       \-> completed (only from validating)
 *     any non-terminal -> failed | cancelled | budget_exhausted | expired | escalated
 *     any live state -> waiting -> the state it left
 */

import * as data from "../gen/runstates.js";
import type { State } from "../gen/runstates.js";
import { IllegalTransition } from "./errors.js";

export type { State, StopState } from "../gen/runstates.js";

/** The terminals a run is stopped into: everything terminal except success. */
export const STOPS: ReadonlySet<State> = new Set<State>(data.STOPS);
export const TERMINAL: ReadonlySet<State> = new Set<State>(data.TERMINAL);

/** Suspended from -> resumed into (`created` has not started, so it resumes by starting). */
export const RESUME_INTO: ReadonlyMap<State, State> = new Map<State, State>(data.RESUME_INTO);

export const TRANSITIONS: ReadonlyMap<State, ReadonlySet<State>> = new Map(
  data.TRANSITIONS.map(([from, to]): [State, ReadonlySet<State>] => [from, new Set(to)]),
);

export const STATES: readonly State[] = data.STATES;

export function isState(value: string): value is State {
  return (STATES as readonly string[]).includes(value);
}

/** Throw `IllegalTransition` unless the table has the edge. */
export function checkTransition(from: State, to: State): void {
  if (!TRANSITIONS.get(from)?.has(to)) throw new IllegalTransition(from, to);
}

/**
 * One move of one run: the event persisted to the daemon. `seq` counts the run's
 * transitions from 1 without gaps. `data` holds JSON values only, with the keys the
 * Python loop writes (loop/record.ts), so `execgate runs show` reads either language.
 */
export interface Transition {
  readonly runId: string;
  readonly seq: number;
  // Wall-clock epoch seconds.
  readonly at: number;
  readonly fromState: State;
  readonly toState: State;
  readonly reason: string;
  readonly data: Readonly<Record<string, unknown>>;
}

/** One run's current state; the only way to change it is `advance`. */
export class Machine {
  private current: State = "created";
  // Invariant: nextSeq === 1 + the number of transitions made.
  private next = 1;
  // Invariant: set exactly while the state is "waiting": the state suspended from.
  private suspendedFrom: State | undefined;

  constructor(
    readonly runId: string,
    private readonly clock: () => number = () => Date.now() / 1000,
  ) {}

  get state(): State {
    return this.current;
  }

  get nextSeq(): number {
    return this.next;
  }

  /** Throw `IllegalTransition` if `to` is not a legal move now (table + resume rule). */
  check(to: State): void {
    checkTransition(this.current, to);
    if (this.current === "waiting" && !STOPS.has(to) && this.suspendedFrom !== undefined) {
      const resume = RESUME_INTO.get(this.suspendedFrom);
      if (to !== resume) {
        throw new IllegalTransition(
          this.current,
          to,
          `suspended from ${this.suspendedFrom}, resumes into ${resume}`,
        );
      }
    }
  }

  /**
   * Rebuild a run from its recorded transitions, checking each: seq without gaps, each
   * starting where the previous one ended, each edge legal (`IllegalTransition` if not).
   */
  static replay(runId: string, transitions: readonly Transition[]): Machine {
    const machine = new Machine(runId);
    for (const moved of transitions) machine.record(moved);
    return machine;
  }

  /**
   * Take a transition made elsewhere (the daemon's moves of a step): checked as `replay`
   * checks it, `IllegalTransition` if it does not follow; on a refusal nothing changes.
   */
  record(moved: Transition): void {
    if (moved.runId !== this.runId || moved.seq !== this.next || moved.fromState !== this.current) {
      throw new IllegalTransition(
        moved.fromState,
        moved.toState,
        `record ${moved.seq} of run ${moved.runId} does not follow seq ${this.next - 1} (${this.current})`,
      );
    }
    this.check(moved.toState);
    this.suspendedFrom = moved.toState === "waiting" ? this.current : undefined;
    this.current = moved.toState;
    this.next += 1;
  }

  /** Move to `to` and return the record to persist; on an illegal move nothing changes. */
  advance(to: State, reason: string, data: Readonly<Record<string, unknown>> = {}): Transition {
    this.check(to);
    const moved: Transition = {
      runId: this.runId,
      seq: this.next,
      at: this.clock(),
      fromState: this.current,
      toState: to,
      reason,
      data: { ...data },
    };
    this.suspendedFrom = to === "waiting" ? this.current : undefined;
    this.current = to;
    this.next += 1;
    return moved;
  }
}
