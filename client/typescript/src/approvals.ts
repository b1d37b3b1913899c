/** `client.approvals`: calls a policy `ask` rule parked, and their decisions. */

import * as pb from "./gen/execgate/v1/executor.js";
import type { Rpc } from "./rpc.js";
import type { Approval } from "./types.js";
import * as wire from "./wire.js";

export class Approvals {
  /** @internal Made by `Client`. */
  constructor(
    private readonly stub: pb.ApprovalsClient,
    private readonly rpc: Rpc,
  ) {}

  /** The approvals waiting for a decision, oldest first (approver, operator, admin). */
  async pending(): Promise<Approval[]> {
    const response = await this.rpc.unary<pb.ListPendingResponse>((md, done) =>
      this.stub.listPending(pb.ListPendingRequest.create(), md, done),
    );
    return response.approvals.map(wire.approval);
  }

  /** Every approval of the run in any state, oldest first: who decided, and when. */
  async ofRun(runId: string): Promise<Approval[]> {
    const request = pb.ListApprovalsRequest.create({ runId });
    const response = await this.rpc.unary<pb.ListPendingResponse>((md, done) =>
      this.stub.list(request, md, done),
    );
    return response.approvals.map(wire.approval);
  }

  /** The pending approvals, then each one as it is created or decided. */
  watch(): AsyncGenerator<Approval, void, undefined> {
    const request = pb.WatchApprovalsRequest.create();
    return this.rpc.stream((md) => this.stub.watch(request, md), wire.approval);
  }

  /**
   * Let a parked call run. PermissionDenied: not an approver of its rule, or its
   * requester; ApprovalNotPending: unknown, decided or expired.
   */
  approve(approvalId: string, comment = ""): Promise<Approval> {
    return this.decide(approvalId, true, comment);
  }

  /** Refuse a parked call: it ends REJECTED (approval_denied) with `comment`. */
  deny(approvalId: string, comment: string): Promise<Approval> {
    return this.decide(approvalId, false, comment);
  }

  private async decide(approvalId: string, approve: boolean, comment: string): Promise<Approval> {
    const request = pb.DecideRequest.create({ approvalId, approve, comment });
    const msg = await this.rpc.unary<pb.Approval>(
      (md, done) => this.stub.decide(request, md, done),
      { approvalId },
    );
    return wire.approval(msg);
  }
}
