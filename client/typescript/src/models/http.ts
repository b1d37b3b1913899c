/**
 * POST JSON to a model provider; the one place HTTP failures become `ModelError`s
 * (client/models/_http.py). 429 → ModelRateLimited (Retry-After read); 408 and 5xx →
 * ModelUnavailable; other 4xx → ModelRequestRejected; connection errors and timeouts →
 * ModelUnavailable; a 2xx body that is not a JSON object → ModelBadResponse. The api key
 * (`secret`) is redacted from any text that goes into an error.
 */

import {
  ModelBadResponse,
  ModelRateLimited,
  ModelRequestRejected,
  ModelUnavailable,
} from "./base.js";

const SNIPPET = 300;

export interface PostOptions {
  readonly headers: Readonly<Record<string, string>>;
  readonly model: string;
  // Seconds for the whole exchange.
  readonly timeout: number;
  readonly secret?: string;
}

export async function postJson(
  url: string,
  body: unknown,
  options: PostOptions,
): Promise<Record<string, unknown>> {
  const { model, timeout } = options;
  const redact = (text: string): string =>
    options.secret ? text.split(options.secret).join("[redacted]") : text;
  let response: Response;
  let raw: string;
  try {
    response = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json", ...options.headers },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeout * 1000),
    });
    raw = await response.text();
  } catch (err) {
    const why = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
    const cause =
      err instanceof Error && err.cause instanceof Error ? ` (${err.cause.message})` : "";
    throw new ModelUnavailable(model, redact(`cannot reach ${url}: ${why}${cause}`));
  }
  if (!response.ok) throw statusError(response, raw, model, redact);
  let doc: unknown;
  try {
    doc = JSON.parse(raw);
  } catch {
    throw new ModelBadResponse(
      model,
      `the body is not JSON: ${JSON.stringify(redact(snippet(raw)))}`,
    );
  }
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) {
    throw new ModelBadResponse(model, "the body is JSON but not an object");
  }
  return doc as Record<string, unknown>;
}

function statusError(
  response: Response,
  raw: string,
  model: string,
  redact: (text: string) => string,
): ModelRateLimited | ModelUnavailable | ModelRequestRejected {
  const [errorType, message] = providerError(raw);
  const said = redact(message);
  const status = response.status;
  if (status === 429)
    return new ModelRateLimited(model, retryAfter(response.headers.get("retry-after")), said);
  if (status >= 500 || status === 408) {
    const kind = errorType ? ` ${errorType}` : "";
    return new ModelUnavailable(model, `HTTP ${status}${kind}: ${said}`, status);
  }
  return new ModelRequestRejected(model, status, said, errorType);
}

/** (type, message) from an OpenAI, Anthropic or local-server error body. */
function providerError(raw: string): [string, string] {
  let doc: unknown;
  try {
    doc = JSON.parse(raw);
  } catch {
    return ["", snippet(raw)];
  }
  const error =
    typeof doc === "object" && doc !== null ? (doc as Record<string, unknown>)["error"] : undefined;
  if (typeof error === "object" && error !== null) {
    const e = error as Record<string, unknown>;
    return [String(e["type"] ?? ""), String(e["message"] ?? snippet(raw))];
  }
  if (typeof error === "string") return ["", error];
  return ["", snippet(raw)];
}

/** Seconds from a Retry-After header: a number of seconds, or an HTTP date. */
export function retryAfter(value: string | null): number | undefined {
  if (!value) return undefined;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds);
  const when = Date.parse(value);
  return Number.isNaN(when) ? undefined : Math.max(0, (when - Date.now()) / 1000);
}

function snippet(raw: string): string {
  const text = raw.trim();
  return text.length <= SNIPPET ? text : text.slice(0, SNIPPET) + "…";
}

// -- reading a response ---------------------------------------------------------------

export type Doc = Record<string, unknown>;

export function asDoc(value: unknown, where: string, model: string): Doc {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ModelBadResponse(model, `${where} is not an object`);
  }
  return value as Doc;
}

export function listField(doc: Doc, key: string, where: string, model: string): unknown[] {
  const value = doc[key];
  if (!Array.isArray(value)) throw new ModelBadResponse(model, `${where}.${key} is not a list`);
  return value;
}

export function strField(doc: Doc, key: string, where: string, model: string): string {
  const value = doc[key];
  if (typeof value !== "string")
    throw new ModelBadResponse(model, `${where}.${key} is not a string`);
  return value;
}

export function tokens(usage: unknown, key: string): number {
  if (typeof usage !== "object" || usage === null) return 0;
  const value = (usage as Doc)[key];
  return typeof value === "number" && Number.isInteger(value) && value >= 0 ? value : 0;
}

/** Prices per million tokens, in the caller's currency unit. */
export interface Pricing {
  readonly input: number;
  readonly output: number;
}

export const FREE: Pricing = Object.freeze({ input: 0, output: 0 });

export function cost(pricing: Pricing, input: number, output: number): number {
  return (input * pricing.input + output * pricing.output) / 1_000_000;
}
