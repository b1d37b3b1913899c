/**
 * Exceptions of the client.
 *
 *     ExecgateClientError            root
 *     ├── DaemonUnavailable          nothing answers at the address (carries `address`)
 *     ├── CallNotFound               getCall for an id the journal does not have
 *     ├── ApprovalNotPending         approve/deny of an approval that does not exist or is
 *     │                              no longer pending (decided or expired)
 *     ├── Unauthenticated            the daemon does not know who we are (no token, a wrong
 *     │                              or revoked one)
 *     ├── PermissionDenied           our identity lacks the role the RPC needs
 *     ├── RunNotFound                a Runs call for a run the daemon does not have
 *     ├── RunRefused                 the daemon refused a run change: `kind` is gap,
 *     │                              duplicate, discontinuous, illegal, ended, exists, ...
 *     ├── RequestError               the daemon refused the request envelope (carries the
 *     │                              gRPC `code` name and `details`)
 *     ├── LoopError                  the loop's own faults (loop/errors.ts)
 *     └── ModelError                 a model failed to answer (loop/model.ts)
 *
 * A tool call that fails is never an exception: it is an `Outcome`. gRPC errors become
 * these classes in one place, `translate`, with the gRPC error as `cause`.
 */

import { status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";

export class ExecgateClientError extends Error {
  override name = "ExecgateClientError";
}

export class DaemonUnavailable extends ExecgateClientError {
  override name = "DaemonUnavailable";
  constructor(
    readonly address: string,
    readonly details = "",
    options?: ErrorOptions,
  ) {
    super(
      `no execgate daemon answers at ${address}; start one with \`make run\` ` +
        "(or `execgate serve`), or point EXECGATE_ADDR at it" +
        (details ? ` (${details})` : ""),
      options,
    );
  }
}

export class CallNotFound extends ExecgateClientError {
  override name = "CallNotFound";
  constructor(
    readonly runId: string,
    readonly callId: string,
    options?: ErrorOptions,
  ) {
    super(`no call '${callId}' in run '${runId || "default"}'`, options);
  }
}

export class ApprovalNotPending extends ExecgateClientError {
  override name = "ApprovalNotPending";
  constructor(
    readonly approvalId: string,
    readonly details = "",
    options?: ErrorOptions,
  ) {
    super(`approval '${approvalId}' cannot be decided: ${details}`, options);
  }
}

export class Unauthenticated extends ExecgateClientError {
  override name = "Unauthenticated";
  constructor(
    readonly address: string,
    readonly details = "",
    options?: ErrorOptions,
  ) {
    super(`the daemon at ${address} does not know who we are: ${details}`, options);
  }
}

export class PermissionDenied extends ExecgateClientError {
  override name = "PermissionDenied";
  constructor(
    readonly address: string,
    readonly details = "",
    options?: ErrorOptions,
  ) {
    super(`the daemon at ${address} refused: ${details}`, options);
  }
}

export class RunNotFound extends ExecgateClientError {
  override name = "RunNotFound";
  constructor(
    readonly runId: string,
    options?: ErrorOptions,
  ) {
    super(`no run '${runId}'`, options);
  }
}

/** `kind`: the daemon's refusal class (the text before the first colon of its details). */
export class RunRefused extends ExecgateClientError {
  override name = "RunRefused";
  readonly kind: string;
  constructor(
    readonly runId: string,
    readonly details: string,
    options?: ErrorOptions,
  ) {
    super(`run '${runId}': ${details}`, options);
    this.kind = (details.split(":", 1)[0] ?? "").trim();
  }
}

export class RequestError extends ExecgateClientError {
  override name = "RequestError";
  constructor(
    readonly code: string,
    readonly details: string,
    options?: ErrorOptions,
  ) {
    super(`${code}: ${details}`, options);
  }
}

/** What the failing RPC was about, so that `translate` can name it. */
export interface ErrorContext {
  readonly runId?: string;
  readonly callId?: string;
  readonly approvalId?: string;
  // A Runs RPC: NOT_FOUND is RunNotFound, a refused change RunRefused.
  readonly runOp?: boolean;
}

const RUN_REFUSALS: ReadonlySet<number> = new Set([
  GrpcStatus.FAILED_PRECONDITION,
  GrpcStatus.ALREADY_EXISTS,
  GrpcStatus.INVALID_ARGUMENT,
]);

function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && typeof (err as Partial<ServiceError>).code === "number";
}

/** The one place where gRPC errors become the client's exceptions. */
export function translate(err: unknown, address: string, ctx: ErrorContext = {}): Error {
  if (err instanceof ExecgateClientError || !isServiceError(err)) {
    return err instanceof Error ? err : new Error(String(err));
  }
  const { code, details } = err;
  const cause = { cause: err };
  const runId = ctx.runId ?? "";
  if (code === GrpcStatus.UNAVAILABLE) return new DaemonUnavailable(address, details, cause);
  if (ctx.runOp && code === GrpcStatus.NOT_FOUND) return new RunNotFound(runId, cause);
  if (ctx.runOp && RUN_REFUSALS.has(code)) return new RunRefused(runId, details, cause);
  if (code === GrpcStatus.NOT_FOUND && ctx.callId) {
    return new CallNotFound(runId, ctx.callId, cause);
  }
  if (
    (code === GrpcStatus.NOT_FOUND || code === GrpcStatus.FAILED_PRECONDITION) &&
    ctx.approvalId
  ) {
    return new ApprovalNotPending(ctx.approvalId, details, cause);
  }
  if (code === GrpcStatus.UNAUTHENTICATED) return new Unauthenticated(address, details, cause);
  if (code === GrpcStatus.PERMISSION_DENIED) return new PermissionDenied(address, details, cause);
  return new RequestError(GrpcStatus[code] ?? "UNKNOWN", details, cause);
}
