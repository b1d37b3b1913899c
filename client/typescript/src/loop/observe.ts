/**
 * What the model sees of each tool call: a bounded text that keeps the outcome's
 * meaning, with a short hint saying what kind of next move makes sense
 * (client/loop/observe.py; the hints come from the same data file, runstates.json).
 */

import * as data from "../gen/runstates.js";
import type { Refusal } from "../gen/runstates.js";
import type { ErrorClass, Outcome, Status } from "../types.js";

export const DEFAULT_CAP = 4000;
// Below this a cut text would be mostly marker.
const MIN_CAP = 64;

// The hints and the loop's own refusals are data: proto/execgate/v1/runstates.json,
// generated into src/gen/runstates.ts (the Python loop's come from the same file).
export type { Refusal } from "../gen/runstates.js";

/** One hint per error class the daemon emits. */
export const DAEMON_HINTS: Readonly<
  Record<Exclude<ErrorClass, "unspecified" | "unrecognized">, string>
> = data.DAEMON_HINTS;

export const REFUSAL_HINTS: Readonly<Record<Refusal, string>> = data.REFUSAL_HINTS;

// These statuses say more than any error class, so their hint wins.
const STATUS_HINTS: Partial<Record<Status, string>> = data.STATUS_HINTS;

// For an error class this client does not know (a newer daemon): go by the status.
const FALLBACK_REJECTED: string = data.FALLBACK_HINTS.rejected;
const FALLBACK_FAILURE: string = data.FALLBACK_HINTS.failure;

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
