/**
 * Protobuf at the client's edge: the generated `execgate.v1` messages (src/gen, made
 * by ts-proto at build time) to the client's own types (types.ts) and back. Nothing
 * else in the package touches a generated message.
 */

import * as pb from "./gen/execgate/v1/executor.js";
import type { Duration } from "./gen/google/protobuf/duration.js";
import type { Timestamp } from "./gen/google/protobuf/timestamp.js";
import { RequestError } from "./errors.js";
import {
  type AccessMode,
  type Approval,
  type ApprovalState,
  type Call,
  type CallPlan,
  type CallRecord,
  type ErrorClass,
  type Event,
  type Evidence,
  type Mark,
  Outcome,
  type Phase,
  type PolicyDecision,
  type ProviderStatus,
  type Status,
  STATUSES,
  type StopMode,
  type ToolSpec,
} from "./types.js";

// -- enums: the proto's names, prefix removed, lower-cased (as the Python client does)

/** "ERROR_CLASS_NOT_FOUND" -> "not_found"; ts-proto's "UNRECOGNIZED" -> "unrecognized". */
type Named<E extends string, P extends string> = E extends `${P}${infer R}`
  ? Lowercase<R>
  : Lowercase<E>;

function named<E extends string, P extends string>(value: E, prefix: P): Named<E, P> {
  const bare = value.startsWith(prefix) ? value.slice(prefix.length) : value;
  return bare.toLowerCase() as Named<E, P>;
}

// Compile-time checks: the hand-written unions of types.ts name exactly the proto's values.
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const protoAgrees: [
  Same<Named<`${pb.ErrorClass}`, "ERROR_CLASS_">, ErrorClass>,
  Same<Named<`${pb.StopMode}`, "STOP_MODE_">, StopMode | "unrecognized">,
  Same<Named<`${pb.Phase}`, "PHASE_">, Phase | "unrecognized">,
  Same<Named<`${pb.ApprovalState}`, "APPROVAL_STATE_">, ApprovalState | "unrecognized">,
  Same<Named<`${pb.OutcomeStatus}`, "OUTCOME_STATUS_">, Status | "unspecified" | "unrecognized">,
] = [true, true, true, true, true];
void protoAgrees;

function status(value: pb.OutcomeStatus): Status {
  const name = named(value, "OUTCOME_STATUS_");
  if (!(STATUSES as readonly string[]).includes(name)) {
    // The contract: the daemon never sends a zero value. A status this client does not
    // know cannot be handled safely, so it is an error, not a guess.
    throw new RequestError("UNKNOWN", `the daemon sent outcome status ${value}`);
  }
  return name as Status;
}

/** A known value, or "unspecified" for one newer than this client. */
function known<T extends string>(name: T | "unrecognized"): T | "unspecified" {
  return name === "unrecognized" ? "unspecified" : name;
}

// -- time

export function seconds(ts: Timestamp | undefined): number {
  return ts === undefined ? 0 : ts.seconds + ts.nanos / 1e9;
}

export function timestamp(epochSeconds: number): Timestamp {
  const whole = Math.floor(epochSeconds);
  const nanos = Math.min(999_999_999, Math.round((epochSeconds - whole) * 1e9));
  return { seconds: whole, nanos };
}

export function duration(secs: number): Duration {
  const whole = Math.trunc(secs);
  return { seconds: whole, nanos: Math.round((secs - whole) * 1e9) };
}

// -- messages in

function evidence(ev: pb.Evidence | undefined): Evidence {
  if (ev === undefined) return { path: "", sandbox: "" };
  const optional = {
    exitCode: ev.exitCode,
    signal: ev.signal,
    bytesWritten: ev.bytesWritten,
    bytesRead: ev.bytesRead,
    sha256Before: ev.sha256Before,
    sha256After: ev.sha256After,
    oomKilled: ev.oomKilled,
    survivors: ev.survivors,
  };
  const set = Object.entries(optional).filter(([, v]) => v !== undefined);
  return { path: ev.path, sandbox: ev.sandbox, ...Object.fromEntries(set) };
}

function mark(m: pb.TimelineMark): Mark {
  return { phase: known(named(m.phase, "PHASE_")), at: seconds(m.at), detail: m.detail };
}

function parseObject(text: string): Record<string, unknown> {
  if (!text) return {};
  const value: unknown = JSON.parse(text);
  return typeof value === "object" && value !== null ? (value as Record<string, unknown>) : {};
}

export function outcome(msg: pb.Outcome | undefined, callId: string, replayOf = ""): Outcome {
  if (msg === undefined) throw new RequestError("UNKNOWN", `no outcome for call ${callId}`);
  const result = msg.result;
  return new Outcome({
    callId,
    status: status(msg.status),
    errorClass: named(msg.errorClass, "ERROR_CLASS_"),
    message: msg.message,
    field: msg.field,
    text: result?.text ?? "",
    structured: parseObject(result?.structuredJson ?? ""),
    truncated: result?.truncated ?? false,
    returnedBytes: result?.returnedBytes ?? 0,
    totalBytes: result?.totalBytes ?? 0,
    evidence: evidence(msg.evidence),
    timeline: msg.timeline.map(mark),
    stoppedHow: known(named(msg.stoppedHow, "STOP_MODE_")),
    replayOf,
  });
}

export function event(msg: pb.ExecuteEvent): Event {
  const base = {
    callId: msg.callId,
    batchId: msg.batchId,
    at: seconds(msg.time),
    index: msg.index,
  };
  const kind = msg.kind;
  switch (kind?.$case) {
    case "queued":
      return { ...base, kind: "queued" };
    case "started":
      return { ...base, kind: "started" };
    case "waiting":
      return {
        ...base,
        kind: "waiting",
        keys: kind.waiting.keys,
        blockedBy: kind.waiting.blockedBy,
      };
    case "awaitingApproval": {
      const asked = kind.awaitingApproval;
      return {
        ...base,
        kind: "awaiting_approval",
        approvalId: asked.approvalId,
        ruleId: asked.ruleId,
        reason: asked.reason,
        ...(asked.expiresAt ? { expiresAt: seconds(asked.expiresAt) } : {}),
      };
    }
    case "progress":
      return {
        ...base,
        kind: "progress",
        progress: kind.progress.progress,
        total: kind.progress.total,
        message: kind.progress.message,
      };
    case "finished":
      return {
        ...base,
        kind: "finished",
        outcome: outcome(kind.finished.outcome, msg.callId, kind.finished.replayOfCallId),
      };
    case undefined:
      throw new RequestError("UNKNOWN", `an event of call ${msg.callId} without a kind`);
  }
}

/** The outcomes of an ExecuteBatch (or a StepBatch), in proposal order. */
export function outcomes(response: { readonly outcomes: readonly pb.ExecuteEvent[] }): Outcome[] {
  return response.outcomes.map((e) => {
    const finished = e.kind?.$case === "finished" ? e.kind.finished : undefined;
    return outcome(finished?.outcome, e.callId, finished?.replayOfCallId);
  });
}

export function toolSpec(msg: pb.ToolSpec): ToolSpec {
  return {
    name: msg.name,
    description: msg.description,
    inputSchema: parseObject(msg.inputSchemaJson || "{}"),
    readOnly: msg.effects?.readOnly ?? false,
    destructive: msg.effects?.destructive ?? false,
    idempotent: msg.effects?.idempotent ?? false,
    provider: msg.provider || "builtin",
    annotationsTrusted: msg.annotationsTrusted,
  };
}

export function providerStatus(msg: pb.ProviderStatus): ProviderStatus {
  return {
    provider: msg.provider,
    running: msg.running,
    restarts: msg.restarts,
    lastError: msg.lastError,
    tools: msg.tools,
  };
}

function policy(msg: pb.PolicyDecision | undefined): { policy?: PolicyDecision } {
  if (msg === undefined) return {};
  const { effect, ruleIds, revision, shadow, approvers } = msg;
  return { policy: { effect, ruleIds, revision, shadow, approvers } };
}

export function record(msg: pb.CallRecord): CallRecord {
  const finished = msg.state === pb.CallState.CALL_STATE_FINISHED;
  return {
    runId: msg.runId,
    callId: msg.callId,
    batchId: msg.batchId,
    tool: msg.tool,
    argumentsJson: msg.argumentsJson,
    idempotencyKey: msg.idempotencyKey,
    agent: msg.agent,
    mayWrite: msg.mayWrite,
    createdAt: seconds(msg.createdAt),
    running: !finished,
    ...(finished ? { outcome: outcome(msg.outcome, msg.callId, msg.replayOfCallId) } : {}),
    replayOf: msg.replayOfCallId,
    rawResult: msg.rawResult,
    workspace: msg.workspace,
    ...policy(msg.policy),
  };
}

export function callPlan(p: pb.CallPlan): CallPlan {
  const decided = policy(p.policy);
  return {
    callId: p.callId,
    index: p.index,
    tool: p.tool,
    mayWrite: p.mayWrite,
    claims: p.claims.map((c) => [c.key, known<AccessMode>(named(c.mode, "ACCESS_MODE_"))] as const),
    locks: p.locks.map((l) => [l.key, named(l.mode, "LOCK_MODE_").toUpperCase()] as const),
    waitsFor: p.waitsFor,
    ...(p.rejected ? { rejected: outcome(p.rejected, p.callId) } : {}),
    ...decided,
    needsApproval: decided.policy?.effect === "ask",
  };
}

export function approval(msg: pb.Approval): Approval {
  return {
    approvalId: msg.approvalId,
    runId: msg.runId,
    callId: msg.callId,
    batchId: msg.batchId,
    tool: msg.tool,
    argumentsJson: msg.argumentsJson,
    requester: msg.requester,
    ruleId: msg.ruleId,
    reason: msg.reason,
    approvers: msg.approvers,
    createdAt: seconds(msg.createdAt),
    expiresAt: seconds(msg.expiresAt),
    state: known(named(msg.state, "APPROVAL_STATE_")),
    decidedBy: msg.decidedBy,
    comment: msg.comment,
    workspace: msg.workspace,
    ...(msg.decidedAt ? { decidedAt: seconds(msg.decidedAt) } : {}),
  };
}

// -- messages out

export function toolCall(call: Call): pb.ToolCall {
  const args = call.arguments ?? {};
  return pb.ToolCall.create({
    callId: call.callId ?? "",
    tool: call.tool,
    argumentsJson: typeof args === "string" ? args : JSON.stringify(args),
    idempotencyKey: call.idempotencyKey ?? "",
    timeout: call.timeout === undefined ? undefined : duration(call.timeout),
  });
}

export interface BatchOptions {
  // The run the calls belong to ("" = the daemon's implicit run "default").
  readonly runId: string;
  readonly batchId?: string;
  // Epoch seconds: calls still running then are stopped, calls not started are REJECTED.
  readonly deadline?: number;
  // The workspace the calls work in ("" = the run's, else the caller's first).
  readonly workspace?: string;
}

export function executeRequest(
  calls: Iterable<Call>,
  opts: BatchOptions,
  outcomesOnly: boolean,
): pb.ExecuteRequest {
  return pb.ExecuteRequest.create({
    runId: opts.runId,
    batchId: opts.batchId ?? "",
    outcomesOnly,
    calls: [...calls].map(toolCall),
    deadline: opts.deadline === undefined ? undefined : timestamp(opts.deadline),
    workspace: opts.workspace ?? "",
  });
}

const STATUS_NAMES: Record<Status, pb.OutcomeStatus> = {
  success: pb.OutcomeStatus.OUTCOME_STATUS_SUCCESS,
  failure: pb.OutcomeStatus.OUTCOME_STATUS_FAILURE,
  rejected: pb.OutcomeStatus.OUTCOME_STATUS_REJECTED,
  partial: pb.OutcomeStatus.OUTCOME_STATUS_PARTIAL,
  unknown_outcome: pb.OutcomeStatus.OUTCOME_STATUS_UNKNOWN_OUTCOME,
};

export function statusMessage(s: Status): pb.OutcomeStatus {
  return STATUS_NAMES[s];
}
