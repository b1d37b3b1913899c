/**
 * Retrying a model request that failed for a passing reason (client/loop/retry.py): 429,
 * 5xx, 408, connection errors and timeouts are retried after an exponential backoff with
 * jitter, at least the provider's Retry-After; any other error fails at once. Bounded by
 * `attempts`, the run's deadline (a wait past it is not taken) and the stop rules
 * (checked before each retry). Every retry goes into the run's record.
 */

import { ModelError, ModelRateLimited, ModelUnavailable, type Turn } from "../models/base.js";
import type { Stop } from "./stops.js";

export interface RetryOptions {
  // Retries after the first request (0: never retry). Default 4.
  readonly attempts?: number;
  // The first backoff in seconds, doubling up to `maxS`. Defaults 0.5 and 20.
  readonly baseS?: number;
  readonly maxS?: number;
  // The backoff is drawn from [(1 - jitter) * b, b]. Default 0.5.
  readonly jitter?: number;
  // Injected for tests.
  readonly sleep?: (seconds: number) => Promise<void>;
  readonly random?: () => number;
}

/** One failed model request the loop retried (or gave up on: waitS 0). */
export interface Attempt {
  readonly retry: number;
  readonly error: string;
  readonly status: number | null;
  readonly message: string;
  readonly waitS: number;
}

export function attemptJson(a: Attempt): Record<string, unknown> {
  return {
    retry: a.retry,
    error: a.error,
    status: a.status,
    message: a.message,
    wait_s: Math.round(a.waitS * 1000) / 1000,
  };
}

export function retryable(error: ModelError): boolean {
  return error instanceof ModelRateLimited || error instanceof ModelUnavailable;
}

export function backoff(options: RetryOptions, retry: number, error: ModelError): number {
  const ceiling = Math.min(options.maxS ?? 20, (options.baseS ?? 0.5) * 2 ** (retry - 1));
  let wait = ceiling * (1 - (options.jitter ?? 0.5) * (options.random ?? Math.random)());
  if (error instanceof ModelRateLimited && error.retryAfter !== undefined) {
    wait = Math.max(wait, error.retryAfter); // the provider's word is a floor
  }
  return wait;
}

export interface Asked {
  turn?: Turn;
  error?: ModelError;
  stopped?: Stop;
  readonly retries: Attempt[];
}

const sleep = (seconds: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, seconds * 1000));

/** Call `request` until it answers, fails for good, or a bound says stop. */
export async function ask(
  request: () => Promise<Turn>,
  options: RetryOptions,
  checkStop: () => Stop | undefined,
  deadline: number | undefined,
): Promise<Asked> {
  const asked: Asked = { retries: [] };
  for (let retry = 1; ; retry++) {
    let error: ModelError;
    try {
      asked.turn = await request();
      return asked;
    } catch (err) {
      if (!(err instanceof ModelError)) throw err;
      error = err;
    }
    if (!retryable(error) || retry > (options.attempts ?? 4)) {
      asked.error = error;
      return asked;
    }
    const wait = backoff(options, retry, error);
    const status = (error as { status?: number }).status ?? null;
    const row = { retry, error: error.name, status, message: error.message.slice(0, 300) };
    if (deadline !== undefined && Date.now() / 1000 + wait >= deadline) {
      asked.retries.push({ ...row, waitS: 0 });
      asked.error = error;
      return asked;
    }
    asked.retries.push({ ...row, waitS: wait });
    await (options.sleep ?? sleep)(wait);
    const stop = checkStop();
    if (stop !== undefined) {
      asked.stopped = stop;
      return asked;
    }
  }
}
