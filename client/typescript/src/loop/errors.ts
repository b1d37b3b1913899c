/**
 * Exceptions of the loop.
 *
 *     ExecgateClientError          root of the client (errors.ts)
 *     └── LoopError                root of the loop
 *         └── IllegalTransition    a move the transition table (or the resume rule)
 *                                  forbids; carries `fromState`, `toState`
 *
 * A programming fault, never a tool's failure: a tool that fails is an Outcome, and a
 * run that must stop is a `Stop`.
 */

import { ExecgateClientError } from "../errors.js";
import type { State } from "./states.js";

export class LoopError extends ExecgateClientError {
  override name = "LoopError";
}

export class IllegalTransition extends LoopError {
  override name = "IllegalTransition";
  constructor(
    readonly fromState: State,
    readonly toState: State,
    readonly detail = "",
  ) {
    const message = `illegal transition ${fromState} -> ${toState}`;
    super(detail ? `${message}: ${detail}` : message);
  }
}
