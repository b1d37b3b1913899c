/**
 * The two shapes of call the services use, as promises and async iterators, with the
 * bearer token on every call and gRPC errors translated (errors.ts) in one place.
 */

import type { ClientReadableStream, Metadata, ServiceError } from "@grpc/grpc-js";

import { type ErrorContext, translate } from "./errors.js";
import { callMetadata } from "./transport.js";

export type Done<T> = (err: ServiceError | null, response: T) => void;

/** Who we are and where the daemon is, shared by the service wrappers of one client. */
export class Rpc {
  constructor(
    readonly address: string,
    private readonly token: string,
  ) {}

  /** A unary RPC: `invoke` starts it with the call's metadata and a completion callback. */
  unary<T>(invoke: (metadata: Metadata, done: Done<T>) => unknown, ctx?: ErrorContext): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      invoke(callMetadata(this.token), (err, response) => {
        if (err) reject(translate(err, this.address, ctx));
        else resolve(response);
      });
    });
  }

  /**
   * A server stream, message by message. Leaving the loop early (break, throw)
   * cancels the RPC: the daemon then treats it as a client disconnect.
   */
  async *stream<M, T>(
    open: (metadata: Metadata) => ClientReadableStream<M>,
    convert: (msg: M) => T,
    ctx?: ErrorContext,
  ): AsyncGenerator<T, void, undefined> {
    const call = open(callMetadata(this.token));
    let ended = false;
    try {
      for await (const msg of call as AsyncIterable<M>) yield convert(msg);
      ended = true;
    } catch (err) {
      ended = true;
      throw translate(err, this.address, ctx);
    } finally {
      if (!ended) call.cancel();
    }
  }
}
