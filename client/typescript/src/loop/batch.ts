/**
 * Running one turn's calls through the daemon (client/loop/batch.py). Every call
 * carries the call id the loop fixed before sending it and the idempotency key
 * `<run>:<call id>`, so a call is never run twice.
 */

import type { Client } from "../client.js";
import { CallNotFound, RequestError } from "../errors.js";
import { type Call, type Event, Outcome } from "../types.js";
import { missing, type Planned } from "./record.js";

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
 * Wait on the Execute stream for calls still running (client/loop/batch.py `_join`): each
 * is re-sent with its id and idempotency key and joins its in-flight owner (or, had it
 * ended meanwhile, gets the journal's outcome); it never runs twice. Only for calls the
 * policy allowed outright (a re-sent `ask` call that ended meanwhile would ask again).
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
      found = await settled(client, runId, p.callId, waitS);
    }
    outcomes.set(p.callId, found ?? stillRunning(p.callId, waitS));
  }
  return outcomes;
}

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
  const joinable: Planned[] = [];
  for (const p of planned) {
    let record;
    try {
      record = await client.getCall(p.callId, { runId });
    } catch (err) {
      if (!(err instanceof CallNotFound)) throw err;
      unsent.push(p);
      continue;
    }
    if (record.outcome !== undefined) outcomes.set(p.callId, record.outcome);
    else if (record.policy?.effect === "allow") joinable.push(p);
    else
      outcomes.set(p.callId, (await settled(client, runId, p.callId, waitS)) ?? missing(p.callId));
  }
  for (const [id, o] of await join(client, runId, joinable, waitS)) outcomes.set(id, o);
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
