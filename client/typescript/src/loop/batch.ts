/**
 * Running one turn's calls through the daemon (client/loop/batch.py). Every call
 * carries the call id the loop fixed before sending it and the idempotency key
 * `<run>:<call id>`, so a call is never run twice.
 */

import type { Client } from "../client.js";
import type { Call, Event, Outcome } from "../types.js";
import type { Planned } from "./record.js";

export function toCall(runId: string, p: Planned): Call {
  return {
    tool: p.tool,
    arguments: p.arguments,
    callId: p.callId,
    idempotencyKey: `${runId}:${p.callId}`,
  };
}

/** Execute the calls as one batch, streaming; their outcomes by call id. */
export async function runBatch(
  client: Client,
  runId: string,
  planned: readonly Planned[],
  deadline: number | undefined,
  onEvent: (event: Event) => Promise<void>,
): Promise<Map<string, Outcome>> {
  const outcomes = new Map<string, Outcome>();
  const calls = planned.map((p) => toCall(runId, p));
  const options = deadline === undefined ? { runId } : { runId, deadline };
  for await (const event of client.execute(calls, options)) {
    await onEvent(event);
    if (event.kind === "finished") outcomes.set(event.callId, event.outcome);
  }
  return outcomes;
}
