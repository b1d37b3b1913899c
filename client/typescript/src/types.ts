/**
 * The client's own types: what an agent developer handles. No protobuf leaks out of
 * here; `wire.ts` converts at the edge. Names and meanings follow the Python client
 * (client/types.py); fields are camelCase, values (statuses, error classes) the same
 * lower-case names.
 */

/** How a call ended (the proto's OutcomeStatus, lower-cased). */
export type Status = "success" | "failure" | "rejected" | "partial" | "unknown_outcome";

export const STATUSES: readonly Status[] = [
  "success",
  "failure",
  "rejected",
  "partial",
  "unknown_outcome",
];

/**
 * Why a call did not succeed ("none" on success). The proto's ErrorClass, lower-cased;
 * `wire.ts` checks at compile time that this list and the proto agree. "unspecified"
 * and "unrecognized" (a class newer than this client) are never sent by a daemon this
 * client was built against.
 */
export type ErrorClass =
  | "none"
  | "invalid_argument"
  | "unknown_tool"
  | "not_found"
  | "permission_denied"
  | "policy_denied"
  | "approval_denied"
  | "approval_expired"
  | "timeout"
  | "cancelled"
  | "resource_exhausted"
  | "sandbox_error"
  | "internal"
  | "interrupted"
  | "idempotency_conflict"
  | "no_match"
  | "ambiguous_match"
  | "nonzero_exit"
  | "duplicate_call_id"
  | "io_error"
  | "tool_error"
  | "unspecified"
  | "unrecognized";

/** How the work of a call stopped. */
export type StopMode =
  "unspecified" | "not_started" | "completed" | "cooperative" | "force_terminated" | "interrupted";

/** A moment of a call's timeline. */
export type Phase =
  | "unspecified"
  | "queued"
  | "lock_granted"
  | "started"
  | "cancel_requested"
  | "signal_sent"
  | "grace_expired"
  | "force_terminated"
  | "stopped"
  | "finished"
  | "recovered"
  | "waiting";

/** A moment in a call's life: its phase and when (epoch seconds). */
export interface Mark {
  readonly phase: Phase;
  readonly at: number;
  readonly detail: string;
}

/** What the daemon saw, for reconciliation and audit. Unset: not measured. */
export interface Evidence {
  readonly exitCode?: number;
  readonly signal?: number;
  readonly bytesWritten?: number;
  readonly bytesRead?: number;
  // sha256 of a written file before and after the call ("" = did not exist).
  readonly sha256Before?: string;
  readonly sha256After?: string;
  readonly path: string;
  // The sandbox a process-based call ran in ("process", "bwrap", "docker").
  readonly sandbox: string;
  readonly oomKilled?: boolean;
  // Processes of the call found alive after it was stopped (0: verified none left).
  readonly survivors?: number;
}

/** The fields of an Outcome. */
export interface OutcomeFields {
  readonly callId: string;
  readonly status: Status;
  readonly errorClass: ErrorClass;
  readonly message: string;
  // The offending argument or request field ("arguments.path"), "" when none.
  readonly field: string;
  // The bounded result meant for the model.
  readonly text: string;
  readonly structured: Readonly<Record<string, unknown>>;
  readonly truncated: boolean;
  readonly returnedBytes: number;
  readonly totalBytes: number;
  readonly evidence: Evidence;
  readonly timeline: readonly Mark[];
  readonly stoppedHow: StopMode;
  // Set when the daemon answered from its journal (idempotency key): the call that ran.
  readonly replayOf: string;
}

/** How one call ended. A tool call that fails is an Outcome, never an exception. */
export class Outcome implements OutcomeFields {
  // Assigned from `fields` in the constructor (declared, so nothing else initializes them).
  declare readonly callId: string;
  declare readonly status: Status;
  declare readonly errorClass: ErrorClass;
  declare readonly message: string;
  declare readonly field: string;
  declare readonly text: string;
  declare readonly structured: Readonly<Record<string, unknown>>;
  declare readonly truncated: boolean;
  declare readonly returnedBytes: number;
  declare readonly totalBytes: number;
  declare readonly evidence: Evidence;
  declare readonly timeline: readonly Mark[];
  declare readonly stoppedHow: StopMode;
  declare readonly replayOf: string;

  constructor(fields: OutcomeFields) {
    Object.assign(this, fields);
    Object.freeze(this);
  }

  get ok(): boolean {
    return this.status === "success";
  }

  /** The first mark of `phase` in the timeline, if any. */
  mark(phase: Phase): Mark | undefined {
    return this.timeline.find((m) => m.phase === phase);
  }
}

/** A tool call to send. `arguments` may be an object or the model's raw JSON text. */
export interface Call {
  readonly tool: string;
  readonly arguments?: Readonly<Record<string, unknown>> | string;
  // Unique within the run; "" lets the daemon assign one.
  readonly callId?: string;
  // The same key with the same request returns the recorded outcome instead of running again.
  readonly idempotencyKey?: string;
  // Seconds; the daemon caps it at its own maximum.
  readonly timeout?: number;
}

export interface ToolSpec {
  readonly name: string;
  readonly description: string;
  // JSON Schema of the call's arguments object.
  readonly inputSchema: Readonly<Record<string, unknown>>;
  readonly readOnly: boolean;
  readonly destructive: boolean;
  readonly idempotent: boolean;
  // "builtin", "command" (declared in the tools file) or "mcp:SERVER".
  readonly provider: string;
  // The effects are believed (the daemon's, the operator's, a trusted server's); false:
  // an untrusted server's tool, scheduled as a writer whatever it says.
  readonly annotationsTrusted: boolean;
}

/** One MCP server of the daemon's tools file, now (`Client.listProviders`). */
export interface ProviderStatus {
  readonly provider: string; // "mcp:git"
  // Live processes (0: not started yet, or stopped between calls).
  readonly running: number;
  readonly restarts: number;
  readonly lastError: string; // "" if it never failed
  readonly tools: number; // tools of it served
}

export type EventKind =
  "queued" | "waiting" | "awaiting_approval" | "started" | "progress" | "finished";

interface EventBase {
  readonly callId: string;
  readonly batchId: string;
  // Epoch seconds.
  readonly at: number;
  // The call's position in the batch, from 0 (tells duplicate call ids apart).
  readonly index: number;
}

/** One step of a call in an Execute stream. */
export type Event =
  | (EventBase & { readonly kind: "queued" })
  | (EventBase & { readonly kind: "started" })
  | (EventBase & {
      readonly kind: "waiting";
      // The resources it conflicts on, and the calls ("run/call") it waits for.
      readonly keys: readonly string[];
      readonly blockedBy: readonly string[];
    })
  | (EventBase & {
      // A policy rule asks a human first: decide `approvalId` (client.approvals).
      readonly kind: "awaiting_approval";
      readonly approvalId: string;
      readonly ruleId: string;
      readonly reason: string;
      readonly expiresAt?: number;
    })
  | (EventBase & {
      // The running call's tool reported progress (an MCP server's notification).
      readonly kind: "progress";
      readonly progress: number;
      // 0: the tool did not say.
      readonly total: number;
      readonly message: string;
    })
  | (EventBase & { readonly kind: "finished"; readonly outcome: Outcome });

export interface PolicyDecision {
  // "allow", "ask" or "deny".
  readonly effect: string;
  readonly ruleIds: readonly string[];
  readonly revision: string;
  // Shadow-mode rules that matched ("rule_id:effect"): logged, not enforced.
  readonly shadow: readonly string[];
  // effect "ask" in an Explain: who may approve (identity names or roles).
  readonly approvers: readonly string[];
}

/** A call as the daemon's journal holds it. */
export interface CallRecord {
  readonly runId: string;
  readonly callId: string;
  readonly batchId: string;
  readonly tool: string;
  readonly argumentsJson: string;
  readonly idempotencyKey: string;
  // Who asked (from authentication, never from the request).
  readonly agent: string;
  readonly mayWrite: boolean;
  readonly createdAt: number;
  readonly running: boolean;
  // Unset while the call is still running.
  readonly outcome?: Outcome;
  readonly replayOf: string;
  readonly rawResult: string;
  // Unset for a call refused before the policy decided.
  readonly policy?: PolicyDecision;
  // The workspace it worked in ("" for a call refused before one was chosen that
  // named none).
  readonly workspace: string;
}

export type AccessMode = "read" | "write" | "unspecified";

/** How the daemon would schedule one call of a batch (Explain); nothing runs. */
export interface CallPlan {
  readonly callId: string;
  readonly index: number;
  readonly tool: string;
  readonly mayWrite: boolean;
  // [key, mode]: what the call touches, e.g. ["file:/ws/a.txt", "read"].
  readonly claims: readonly (readonly [string, AccessMode])[];
  // [key, mode] with modes IS, IX, S, SIX, X: the locks that implies.
  readonly locks: readonly (readonly [string, string])[];
  // Earlier calls of the batch it would wait for.
  readonly waitsFor: readonly string[];
  // Set when the call would be REJECTED before scheduling.
  readonly rejected?: Outcome;
  readonly policy?: PolicyDecision;
  // It would be parked until an approver decides (policy effect "ask").
  readonly needsApproval: boolean;
}

export type ApprovalState = "pending" | "approved" | "denied" | "expired" | "unspecified";

/** A call a policy `ask` rule parked until an approver decides. */
export interface Approval {
  readonly approvalId: string;
  readonly runId: string;
  readonly callId: string;
  readonly batchId: string;
  readonly tool: string;
  readonly argumentsJson: string;
  // Who made the call; it may not decide it.
  readonly requester: string;
  readonly ruleId: string;
  readonly reason: string;
  // Identity names or roles that may decide.
  readonly approvers: readonly string[];
  readonly createdAt: number;
  readonly expiresAt: number;
  readonly state: ApprovalState;
  readonly decidedBy: string;
  readonly comment: string;
  readonly decidedAt?: number;
  // The workspace the parked call works in.
  readonly workspace: string;
}
