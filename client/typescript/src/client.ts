/** `Client`: a connection to an execgate daemon (Executor, Approvals and Runs services). */

import { Channel } from "@grpc/grpc-js";

import * as pb from "./gen/execgate/v1/executor.js";
import { RunsClient } from "./gen/execgate/v1/runs.js";
import { Approvals } from "./approvals.js";
import { Rpc } from "./rpc.js";
import { Runs } from "./runs.js";
import {
  channelCredentials,
  channelOptions,
  resolveAddress,
  resolveToken,
  type TlsConfig,
} from "./transport.js";
import type {
  Call,
  CallPlan,
  CallRecord,
  Event,
  Outcome,
  ProviderStatus,
  Status,
  ToolSpec,
} from "./types.js";
import * as wire from "./wire.js";

export interface ClientOptions {
  // `unix:/path` or `host:port`; default $EXECGATE_ADDR, then `unix:var/execgate.sock`.
  readonly address?: string;
  // The run calls belong to unless a call says otherwise ("" = the implicit run "default").
  readonly runId?: string;
  // The bearer token of this client's identity; default $EXECGATE_TOKEN, else on a
  // Unix socket the tokens/agent.token beside it (what `make run` makes).
  readonly token?: string;
  // Certificates for a daemon's mTLS TCP listener; unset: plaintext.
  readonly tls?: TlsConfig;
  // The workspace calls work in unless a call says otherwise: one the daemon's policy
  // gives this identity ("" = its run's, else its first). Another is REJECTED
  // permission_denied, field "workspace".
  readonly workspace?: string;
}

export interface ExecuteOptions {
  readonly runId?: string;
  readonly batchId?: string;
  // The workspace the batch works in (default: the client's).
  readonly workspace?: string;
  // Epoch seconds: calls still running then are stopped (timeout); calls not started
  // by then are REJECTED (timeout).
  readonly deadline?: number;
}

export interface StreamOptions extends ExecuteOptions {
  // false: FINISHED events only (no queued/waiting/started progress).
  readonly progress?: boolean;
  // Seconds this client waits for the stream (RequestError DEADLINE_EXCEEDED after);
  // unlike `deadline` it stops nothing at the daemon.
  readonly timeout?: number;
}

export interface OneCallOptions {
  readonly runId?: string;
  readonly workspace?: string;
  readonly callId?: string;
  readonly idempotencyKey?: string;
  // Seconds.
  readonly timeout?: number;
}

export interface CancelOptions {
  // Exactly one target: a call (with its run), a batch, or a whole run (runId alone).
  readonly callId?: string;
  readonly batchId?: string;
  readonly runId?: string;
  readonly reason?: string;
  // Seconds between the polite signal and force termination (the daemon caps it).
  readonly grace?: number;
  readonly requester?: string;
}

export interface ListCallsOptions {
  readonly runId?: string;
  readonly statuses?: readonly Status[];
  readonly tool?: string;
  // Only calls in this workspace (default: any).
  readonly workspace?: string;
  // At most this many records, newest first (default 100).
  readonly limit?: number;
}

export class Client {
  readonly address: string;
  readonly runId: string;
  readonly workspace: string;
  /** Calls a policy `ask` rule parked: pending, watch, approve, deny. */
  readonly approvals: Approvals;
  /** Run records: start, append transitions, get, find, cancel, watch. */
  readonly runs: Runs;
  private readonly rpc: Rpc;
  private readonly stub: pb.ExecutorClient;
  private readonly channel: Channel;

  constructor(options: ClientOptions = {}) {
    this.address = resolveAddress(options.address);
    this.runId = options.runId ?? "";
    this.workspace = options.workspace ?? "";
    this.rpc = new Rpc(this.address, resolveToken(options.token, this.address));
    const creds = channelCredentials(options.tls);
    // One channel (one connection) for the three services.
    this.channel = new Channel(this.address, creds, channelOptions(options.tls));
    const shared = { channelOverride: this.channel };
    this.stub = new pb.ExecutorClient(this.address, creds, shared);
    this.approvals = new Approvals(new pb.ApprovalsClient(this.address, creds, shared), this.rpc);
    this.runs = new Runs(new RunsClient(this.address, creds, shared), this.rpc);
  }

  /** Close the connection; calls in flight fail. */
  close(): void {
    this.channel.close();
  }

  async listTools(): Promise<ToolSpec[]> {
    const response = await this.rpc.unary<pb.ListToolsResponse>((md, done) =>
      this.stub.listTools(pb.ListToolsRequest.create(), md, done),
    );
    return response.tools.map(wire.toolSpec);
  }

  /** The MCP servers of the daemon's tools file and their state (`execgate doctor`). */
  async listProviders(): Promise<ProviderStatus[]> {
    const response = await this.rpc.unary<pb.ListProvidersResponse>((md, done) =>
      this.stub.listProviders(pb.ListProvidersRequest.create(), md, done),
    );
    return response.providers.map(wire.providerStatus);
  }

  /**
   * Every event of the batch as it happens: queued, waiting, awaiting_approval,
   * started, finished (with the outcome). Leaving the loop early disconnects: calls
   * already started finish and are journaled; queued ones are REJECTED.
   */
  execute(
    calls: Iterable<Call>,
    options: StreamOptions = {},
  ): AsyncGenerator<Event, void, undefined> {
    const request = wire.executeRequest(calls, this.batch(options), options.progress === false);
    const wait = options.timeout;
    const callOptions = wait === undefined ? {} : { deadline: new Date(Date.now() + wait * 1000) };
    return this.rpc.stream((md) => this.stub.execute(request, md, callOptions), wire.event);
  }

  /** Run a batch (one model turn); the outcomes in the order the calls were given. */
  async executeBatch(calls: Iterable<Call>, options: ExecuteOptions = {}): Promise<Outcome[]> {
    const request = wire.executeRequest(calls, this.batch(options), true);
    const response = await this.rpc.unary<pb.ExecuteResponse>((md, done) =>
      this.stub.executeBatch(request, md, done),
    );
    return wire.outcomes(response);
  }

  /** One call: `executeOne("read_file", { path: "README.md" })`. */
  async executeOne(
    tool: string,
    args: Readonly<Record<string, unknown>> | string = {},
    options: OneCallOptions = {},
  ): Promise<Outcome> {
    const { runId, workspace, ...call } = options;
    const [outcome] = await this.executeBatch([{ tool, arguments: args, ...call }], {
      runId,
      workspace,
    });
    if (outcome === undefined) throw new Error("the daemon answered a call with no outcome");
    return outcome;
  }

  /** How the daemon would schedule these calls (locks, who waits for whom); runs nothing. */
  async explain(
    calls: Iterable<Call>,
    options: { runId?: string; workspace?: string } = {},
  ): Promise<CallPlan[]> {
    const request = wire.executeRequest(calls, this.batch(options), true);
    const response = await this.rpc.unary<pb.ExplainResponse>((md, done) =>
      this.stub.explain(request, md, done),
    );
    return response.calls.map(wire.callPlan);
  }

  /** A call's journal record: how to reconcile an unknown outcome or a lost stream. */
  async getCall(
    callId: string,
    options: { runId?: string; includeRaw?: boolean } = {},
  ): Promise<CallRecord> {
    const runId = options.runId ?? this.runId;
    const request = pb.GetCallRequest.create({
      runId,
      callId,
      includeRaw: options.includeRaw ?? false,
    });
    const msg = await this.rpc.unary<pb.CallRecord>(
      (md, done) => this.stub.getCall(request, md, done),
      { runId, callId },
    );
    return wire.record(msg);
  }

  /** Journal records, newest first, following pages until `limit` records. */
  async listCalls(options: ListCallsOptions = {}): Promise<CallRecord[]> {
    const limit = options.limit ?? 100;
    const records: CallRecord[] = [];
    let pageToken = "";
    while (records.length < limit) {
      const request = pb.ListCallsRequest.create({
        runId: options.runId ?? "",
        statuses: (options.statuses ?? []).map(wire.statusMessage),
        tool: options.tool ?? "",
        workspace: options.workspace ?? "",
        limit: Math.min(limit - records.length, 1000),
        pageToken,
      });
      const response = await this.rpc.unary<pb.ListCallsResponse>((md, done) =>
        this.stub.listCalls(request, md, done),
      );
      records.push(...response.calls.map(wire.record));
      pageToken = response.nextPageToken;
      if (!pageToken) break;
    }
    return records;
  }

  /**
   * Stop calls: one (callId), a batch, or a whole run (runId alone: no later call of
   * that run starts). Returns the ids of the calls reached.
   */
  async cancel(options: CancelOptions): Promise<string[]> {
    const request = pb.CancelRequest.create({
      runId: options.runId ?? this.runId,
      callId: options.callId ?? "",
      batchId: options.batchId ?? "",
      reason: options.reason ?? "",
      requester: options.requester ?? "",
      grace: options.grace === undefined ? undefined : wire.duration(options.grace),
    });
    const response = await this.rpc.unary<pb.CancelResponse>((md, done) =>
      this.stub.cancel(request, md, done),
    );
    return response.callIds;
  }

  private batch(options: ExecuteOptions): wire.BatchOptions {
    return {
      ...options,
      runId: options.runId ?? this.runId,
      workspace: options.workspace ?? this.workspace,
    };
  }
}
