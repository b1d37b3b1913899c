/**
 * Running one turn's calls through the daemon (client/loop/batch.py). Every call
 * carries the call id the loop fixed before sending it and the idempotency key
 * `<run>:<call id>`, so a call is never run twice.
 */

import type { Client } from "../client.js";
import { CallNotFound, RequestError } from "../errors.js";
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

/**
 * Wait on the Execute stream for calls still running or parked for an approval
 * (client/loop/batch.py `_join`): each is re-sent with its id and idempotency key and
 * joins its in-flight owner (a parked one: the same approval, never a second) or, had it
 * ended meanwhile, gets the journal's outcome; it never runs twice. A call not settled
 * within `waitS` is UNKNOWN_OUTCOME; the wait stops nothing at the daemon.
 */
async function join(
  client: Client,
  runId: string,
  planned: readonly Planned[],
  waitS: number,
): Promise<Map<string, Outcome>> {
  const seen = new Map<string, Outcome>();
  if (planned.length === 0) return seen;
  const calls = planned.map((p) => toCall(runId, p));
  try {
    for await (const event of client.execute(calls, { runId, timeout: waitS })) {
      if (event.kind === "finished") seen.set(event.callId, event.outcome);
    }
  } catch (err) {
    if (!(err instanceof RequestError && err.code === "DEADLINE_EXCEEDED")) throw err;
  }
  const outcomes = new Map<string, Outcome>();
  for (const p of planned) {
    let found = seen.get(p.callId);
    if (found?.errorClass === "duplicate_call_id") {
      // Not joinable after all: the journal has the record (read once, never polled).
      found = await recorded(client, runId, p.callId);
    }
    outcomes.set(p.callId, found ?? stillRunning(p.callId, waitS));
  }
  return outcomes;
}

/**
 * What became of calls sent by a loop that died (client/loop/batch.py `reconcile`): the
 * journal's outcome (GetCall, once per call); a call still running or parked for an
 * approval is waited for on the Execute stream (up to `waitS`, then UNKNOWN_OUTCOME); a
 * call the daemon has no record of is sent now, once, with the same id and key.
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
  const joinable: Planned[] = [];
  // A call parked for approval has no journal row until decided, yet the daemon has it.
  const parked = new Set((await client.approvals.ofRun(runId)).map((a) => a.callId));
  for (const p of planned) {
    let record;
    try {
      record = await client.getCall(p.callId, { runId });
    } catch (err) {
      if (!(err instanceof CallNotFound)) throw err;
      (parked.has(p.callId) ? joinable : unsent).push(p);
      continue;
    }
    if (record.outcome !== undefined) outcomes.set(p.callId, record.outcome);
    else joinable.push(p);
  }
  for (const [id, o] of await join(client, runId, joinable, waitS)) outcomes.set(id, o);
  if (unsent.length > 0) {
    for (const [id, o] of await runBatch(client, runId, unsent, deadline, async () => {})) {
      outcomes.set(id, o);
    }
  }
  return outcomes;
}

async function recorded(
  client: Client,
  runId: string,
  callId: string,
): Promise<Outcome | undefined> {
  try {
    return (await client.getCall(callId, { runId })).outcome;
  } catch (err) {
    if (err instanceof CallNotFound) return undefined;
    throw err;
  }
}

function stillRunning(callId: string, waited: number): Outcome {
  return new Outcome({
    callId,
    status: "unknown_outcome",
    errorClass: "timeout",
    message:
      `still running (or awaiting approval) at the daemon ${waited}s after the run ` +
      "resumed; its effect is unknown until it ends (GetCall shows it then)",
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
