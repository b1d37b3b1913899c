/**
 * Running one turn's calls through the daemon (client/loop/batch.py). Every call
 * carries the call id the loop fixed before sending it and the idempotency key
 * `<run>:<call id>`, so a call is never run twice.
 */

import type { Client } from "../client.js";
import { CallNotFound } from "../errors.js";
import { type Call, type Event, Outcome } from "../types.js";
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

const POLL_MS = 50;

/**
 * What became of calls sent by a loop that died (client/loop/batch.py `reconcile`): the
 * journal's outcome; a call still running is waited for (up to `waitS`, then
 * UNKNOWN_OUTCOME); a call the daemon has no record of is sent now, once, with the same
 * id and idempotency key.
 */
export async function reconcile(
  client: Client,
  runId: string,
  planned: readonly Planned[],
  waitS: number,
  deadline: number | undefined,
): Promise<Map<string, Outcome>> {
  const outcomes = new Map<string, Outcome>();
  const unsent: Planned[] = [];
  for (const p of planned) {
    const found = await settled(client, runId, p.callId, waitS);
    if (found === undefined) unsent.push(p);
    else outcomes.set(p.callId, found);
  }
  if (unsent.length > 0) {
    for (const [id, o] of await runBatch(client, runId, unsent, deadline, async () => {})) {
      outcomes.set(id, o);
    }
  }
  return outcomes;
}

async function settled(
  client: Client,
  runId: string,
  callId: string,
  waitS: number,
): Promise<Outcome | undefined> {
  const giveUp = Date.now() + waitS * 1000;
  for (;;) {
    let record;
    try {
      record = await client.getCall(callId, { runId });
    } catch (err) {
      if (err instanceof CallNotFound) return undefined;
      throw err;
    }
    if (record.outcome !== undefined) return record.outcome;
    if (Date.now() >= giveUp) return stillRunning(callId, waitS);
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

function stillRunning(callId: string, waited: number): Outcome {
  return new Outcome({
    callId,
    status: "unknown_outcome",
    errorClass: "timeout",
    message:
      `still running at the daemon ${waited}s after the run resumed; its effect is ` +
      "unknown until it ends (GetCall shows it then)",
    field: "",
    text: "",
    structured: {},
    truncated: false,
    returnedBytes: 0,
    totalBytes: 0,
    evidence: { path: "", sandbox: "" },
    timeline: [],
    stoppedHow: "unspecified",
    replayOf: "",
  });
}
