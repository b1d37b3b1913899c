/**
 * The model interface the loop talks to, in the project's own types
 * (client/models/base.py). A `Model` turns a conversation and the tools on offer into
 * one `Turn`: text, the tool calls it proposes, and what the turn used.
 */

import { ExecgateClientError } from "../errors.js";

/** A call the model proposes; `id` is the provider's ("call_abc", "toolu_01..."). */
export interface ToolCall {
  readonly id: string;
  readonly name: string;
  readonly arguments: Readonly<Record<string, unknown>>;
}

/** What goes back to the model for one proposed call. */
export interface ToolResult {
  readonly callId: string;
  // Bounded text the loop prepared.
  readonly content: string;
  readonly isError: boolean;
}

/**
 * One message of a conversation. `toolCalls` belong to assistant turns only; `results`
 * to tool_results messages only, which hold ALL the results of one assistant turn.
 */
export type Message =
  | { readonly role: "user"; readonly text: string }
  | { readonly role: "assistant"; readonly text: string; readonly toolCalls: readonly ToolCall[] }
  | { readonly role: "tool_results"; readonly results: readonly ToolResult[] };

/** A tool offered to the model; `parameters` is a JSON Schema object. */
export interface ModelTool {
  readonly name: string;
  readonly description: string;
  readonly parameters: Readonly<Record<string, unknown>>;
}

export interface Usage {
  readonly inputTokens: number;
  readonly outputTokens: number;
  // In the caller's currency unit.
  readonly cost: number;
}

export const NO_USAGE: Usage = Object.freeze({ inputTokens: 0, outputTokens: 0, cost: 0 });

/** One response of a model. No calls: a final answer (still a proposal the loop checks). */
export interface Turn {
  readonly text: string;
  readonly toolCalls: readonly ToolCall[];
  readonly usage: Usage;
  // The provider's finish/stop reason, verbatim ("tool_calls", "end_turn", ...).
  readonly stopReason: string;
}

/**
 * Why a turn stopped, in the project's terms (client/models/base.py `Ending`): only
 * "end" can end a run completed; every other kind has its own path (docs/loop.md).
 */
export type Ending = "end" | "tool_use" | "paused" | "truncated" | "refused" | "unknown";

/** The providers' stop reasons, lower-cased; "" (a server that says nothing) is "end". */
export const ENDINGS: Readonly<Record<string, Ending>> = Object.freeze({
  "": "end",
  stop: "end",
  end_turn: "end",
  stop_sequence: "end",
  tool_calls: "tool_use",
  tool_use: "tool_use",
  function_call: "tool_use",
  pause_turn: "paused",
  length: "truncated",
  max_tokens: "truncated",
  model_context_window_exceeded: "truncated",
  refusal: "refused",
  content_filter: "refused",
});

/** The kind of a provider's stop reason; "unknown" for one not in ENDINGS. */
export function endingOf(stopReason: string): Ending {
  const key = stopReason.trim().toLowerCase();
  return Object.hasOwn(ENDINGS, key) ? (ENDINGS[key] as Ending) : "unknown";
}

/** A final answer: no calls, and the model ended the turn itself. */
export function isFinal(turn: Turn): boolean {
  return turn.toolCalls.length === 0 && endingOf(turn.stopReason) === "end";
}

/** What the loop needs of a model: a name and one method. */
export interface Model {
  readonly name: string;
  /** The model's next turn; rejects with a `ModelError` saying what went wrong. */
  respond(
    messages: readonly Message[],
    tools: readonly ModelTool[],
    options: { readonly system: string },
  ): Promise<Turn>;
}

/** Root of the model errors: the loop ends a run `failed` (rule model_error) on one. */
export class ModelError extends ExecgateClientError {
  override name = "ModelError";
  constructor(
    readonly model: string,
    message: string,
    options?: ErrorOptions,
  ) {
    super(`model '${model}': ${message}`, options);
  }
}

/** Nothing answered usefully: connection refused, timeout, 408, 5xx (529 too); retry later. */
export class ModelUnavailable extends ModelError {
  override name = "ModelUnavailable";
  constructor(
    model: string,
    readonly reason: string,
    readonly status?: number,
    options?: ErrorOptions,
  ) {
    super(model, `unavailable: ${reason}`, options);
  }
}

/** 429; `retryAfter` seconds when the provider said. */
export class ModelRateLimited extends ModelError {
  override name = "ModelRateLimited";
  readonly status = 429;
  constructor(
    model: string,
    readonly retryAfter: number | undefined,
    readonly providerMessage = "",
  ) {
    const wait = retryAfter !== undefined ? `retry after ${retryAfter}s` : "no retry-after";
    super(model, `rate limited (429, ${wait})` + (providerMessage ? `: ${providerMessage}` : ""));
  }
}

/** Any other 4xx: the request is wrong (key, model, schema); retrying will not help. */
export class ModelRequestRejected extends ModelError {
  override name = "ModelRequestRejected";
  constructor(
    model: string,
    readonly status: number,
    readonly providerMessage: string,
    readonly errorType = "",
  ) {
    const kind = errorType ? ` ${errorType}` : "";
    super(model, `request rejected (HTTP ${status}${kind}): ${providerMessage}`);
  }
}

/** A 2xx whose body cannot be used. */
export class ModelBadResponse extends ModelError {
  override name = "ModelBadResponse";
  constructor(
    model: string,
    readonly what: string,
  ) {
    super(model, `bad response: ${what}`);
  }
}

/** A ScriptedModel was asked for more turns than its script has. */
export class ScriptExhausted extends ModelError {
  override name = "ScriptExhausted";
  constructor(
    model: string,
    readonly turns: number,
  ) {
    super(model, `the script has ${turns} turn(s) and all were used`);
  }
}
