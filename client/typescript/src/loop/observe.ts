/**
 * What the model sees of each tool call: a bounded text that keeps the outcome's
 * meaning, with a short hint saying what kind of next move makes sense
 * (client/loop/observe.py; the same hints, word for word).
 */

import type { ErrorClass, Outcome, Status } from "../types.js";

export const DEFAULT_CAP = 4000;
// Below this a cut text would be mostly marker.
const MIN_CAP = 64;

/** Why the loop refused a call itself; the call never reached the daemon. */
export type Refusal =
  // The model called a tool this run did not offer it.
  | "tool_not_offered"
  // An identical earlier call has an unknown outcome and nothing checked the state since.
  | "repeated_call"
  // The run stopped before this call could run.
  | "run_stopped";

/** One hint per error class the daemon emits. */
export const DAEMON_HINTS: Readonly<
  Record<Exclude<ErrorClass, "unspecified" | "unrecognized">, string>
> = {
  none: "",
  invalid_argument: "fix the arguments and call again",
  unknown_tool: "no such tool: call one of the tools you were given",
  not_found: "check the name/path; it does not exist",
  permission_denied:
    "do not retry: this is outside what the call may touch (stay inside the workspace)",
  policy_denied: "do not retry: policy forbids this call; find another way or ask the user",
  approval_denied: "do not retry: a person denied this call; find another way or ask the user why",
  approval_expired:
    "no one approved this call in time and it did not run; ask the user before trying again",
  timeout:
    "it took too long: narrow the request (smaller range, tighter pattern) or allow more " +
    "time; do not repeat it unchanged",
  cancelled: "the call was cancelled; do not retry unless asked to",
  resource_exhausted:
    "a limit was hit (size, memory): ask for less, e.g. a smaller range or fewer rows",
  sandbox_error: "the sandbox failed, not the call: do not retry now; report it",
  internal: "the daemon failed on this call: do not retry it unchanged; report it if it persists",
  interrupted: "the daemon stopped during the call and nothing changed: it is safe to call again",
  idempotency_conflict:
    "the idempotency key belongs to a different request: use a new key, or repeat the " +
    "original request exactly",
  no_match: "the old text does not occur: read the file again and copy the text exactly",
  ambiguous_match:
    "the old text occurs more than once: include more surrounding text, or replace all",
  nonzero_exit: "the command ran and failed: read its output, fix the cause, then run it again",
  duplicate_call_id: "this call id was already used in the run and did not run; use a new call id",
  io_error:
    "the file system refused (disk, directory, file type): check the path; retrying " +
    "unchanged rarely helps",
};

export const REFUSAL_HINTS: Readonly<Record<Refusal, string>> = {
  tool_not_offered: "this tool is not available in this run: use one of the tools you were given",
  repeated_call:
    "this exact call already got the same result several times: change the arguments or " +
    "the approach",
  run_stopped: "the run stopped before this call ran; it had no effect",
};

// These statuses say more than any error class, so their hint wins.
const STATUS_HINTS: Partial<Record<Status, string>> = {
  success: "",
  partial: "the result was cut: continue from where it stopped, or narrow the request",
  unknown_outcome:
    "the effect is unknown: reconcile (check the state) before repeating; do not repeat blindly",
};

// For an error class this client does not know (a newer daemon): go by the status.
const FALLBACK_REJECTED = "the call did not run: change the input before calling again";
const FALLBACK_FAILURE =
  "the call failed: read the message and change something before calling again";

const HINTS: Readonly<Record<string, string>> = { ...DAEMON_HINTS, ...REFUSAL_HINTS };

/** A short hint for the model's next move; "" when there is nothing to add. */
export function hintFor(status: Status, errorClass: string): string {
  const byStatus = STATUS_HINTS[status];
  if (byStatus !== undefined) return byStatus;
  return HINTS[errorClass] || (status === "rejected" ? FALLBACK_REJECTED : FALLBACK_FAILURE);
}

/** `text` cut to at most `cap` characters, keeping its head and tail (a command's first
 * lines say what ran, its last lines how it ended); the marker says how much was cut. */
export function bound(text: string, cap = DEFAULT_CAP): string {
  if (cap < MIN_CAP) throw new RangeError(`cap must be at least ${MIN_CAP} characters, got ${cap}`);
  if (text.length <= cap) return text;
  const room = cap - marker(text.length).length;
  const head = Math.floor((room + 1) / 2);
  const tail = room - head;
  return text.slice(0, head) + marker(text.length - room) + (tail ? text.slice(-tail) : "");
}

function marker(cut: number): string {
  return `\n[... ${cut} chars cut ...]\n`;
}

/** One call's result as the model will see it. */
export interface Observation {
  readonly callId: string;
  readonly tool: string;
  readonly status: Status;
  readonly errorClass: string;
  // Bounded (see `bound`).
  readonly text: string;
  readonly hint: string;
  // Anything but success or partial: the flag providers' tool-result blocks carry.
  readonly isError: boolean;
}

/** A compact text: status and error class, the hint, then the text. */
export function render(seen: Observation): string {
  let head: string = seen.status;
  if (seen.errorClass !== "" && seen.errorClass !== "none") head += `: ${seen.errorClass}`;
  const first = `[${head}]` + (seen.hint ? ` ${seen.hint}` : "");
  return `${first}\n${seen.text || "(no output)"}`;
}

function body(outcome: Outcome): string {
  const parts: string[] = [];
  if (outcome.message) {
    parts.push(outcome.field ? `${outcome.field}: ${outcome.message}` : outcome.message);
  }
  if (outcome.text) parts.push(outcome.text);
  else if (Object.keys(outcome.structured).length > 0) {
    parts.push(JSON.stringify(outcome.structured));
  }
  if (outcome.truncated && outcome.totalBytes) {
    parts.push(`[returned ${outcome.returnedBytes} of ${outcome.totalBytes} bytes]`);
  }
  if (outcome.replayOf) parts.push(`[the result of an earlier call, ${outcome.replayOf}]`);
  return parts.join("\n");
}

/** The observation of a call the daemon answered. */
export function observe(outcome: Outcome, tool: string, cap = DEFAULT_CAP): Observation {
  return {
    callId: outcome.callId,
    tool,
    status: outcome.status,
    errorClass: outcome.errorClass,
    text: bound(body(outcome), cap),
    hint: hintFor(outcome.status, outcome.errorClass),
    isError: outcome.status !== "success" && outcome.status !== "partial",
  };
}

/** The observation of a call the loop refused itself (status "rejected"). */
export function notRun(
  callId: string,
  tool: string,
  reason: string,
  errorClass: string,
): Observation {
  return {
    callId,
    tool,
    status: "rejected",
    errorClass,
    text: bound(reason),
    hint: hintFor("rejected", errorClass),
    isError: true,
  };
}
