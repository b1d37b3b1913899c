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

export function isFinal(turn: Turn): boolean {
  return turn.toolCalls.length === 0;
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
