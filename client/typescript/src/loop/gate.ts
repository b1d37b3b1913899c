/**
 * The loop's own check of a model turn's calls, before any reaches the daemon
 * (client/loop/gate.py). Refused here, each becoming a `notRun` observation: a tool the
 * run does not offer, and a blind repeat of a call whose outcome is unknown -- until the
 * journal settles it (GetCall) or a later call of the run succeeded (the model looked).
 */

import type { Client } from "../client.js";
import { CallNotFound } from "../errors.js";
import type { Turn } from "../models/base.js";
import type { Outcome } from "../types.js";
import type { Conversation, Planned, Refused } from "./record.js";
import { canonicalArguments } from "./tally.js";

/** The calls to send (ids fixed now: s<step>c<n>) and the ones refused. */
export async function checkCalls(
  turn: Turn,
  offered: ReadonlySet<string>,
  conv: Conversation,
  client: Client,
  runId: string,
): Promise<{ planned: Planned[]; refused: Refused[] }> {
  const planned: Planned[] = [];
  const refused: Refused[] = [];
  const step = conv.tally.steps;
  for (const [i, call] of turn.toolCalls.entries()) {
    const base = { index: i, modelId: call.id, tool: call.name, arguments: call.arguments };
    if (!offered.has(call.name)) {
      const tools = [...offered].sort().join(", ");
      const reason = `'${call.name}' is not a tool offered: ${tools}`;
      refused.push({ ...base, errorClass: "tool_not_offered", reason });
      continue;
    }
    const earlier = await unreconciled(conv, call.name, call.arguments, client, runId);
    if (earlier !== "") {
      const reason =
        `an identical earlier call (${earlier}) has an unknown outcome: check the ` +
        "state it would have changed before repeating it";
      refused.push({ ...base, errorClass: "repeated_call", reason });
      continue;
    }
    planned.push({ ...base, callId: `s${step}c${i + 1}` });
  }
  return { planned, refused };
}

/**
 * The id of the last identical call if its outcome is still unknown and nothing
 * succeeded after it; "" when the call may go.
 */
async function unreconciled(
  conv: Conversation,
  tool: string,
  args: unknown,
  client: Client,
  runId: string,
): Promise<string> {
  const key = canonicalArguments(args);
  const done = conv.done;
  for (let i = done.length - 1; i >= 0; i--) {
    const [planned, outcome] = done[i] as [Planned, Outcome];
    if (planned.tool !== tool || canonicalArguments(planned.arguments) !== key) continue;
    if (outcome.status !== "unknown_outcome") return "";
    const fresh = await journalOutcome(client, runId, planned.callId);
    if (fresh !== undefined && fresh.status !== "unknown_outcome") {
      done[i] = [planned, fresh];
      return "";
    }
    const checked = done.slice(i + 1).some(([, o]) => o.status === "success");
    return checked ? "" : planned.callId;
  }
  return "";
}

async function journalOutcome(
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
