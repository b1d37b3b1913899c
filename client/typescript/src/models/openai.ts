/**
 * `OpenAIChatModel`: the OpenAI Chat Completions API, and servers that speak it (vLLM,
 * llama.cpp's server, Ollama) -- the twin of client/models/openai.py, same wire rules:
 * the system prompt first; an assistant turn's calls as `tool_calls` with JSON-string
 * arguments; one `tool` message per result in the order of the calls; an error result's
 * content prefixed with `ERROR: ` (the API has no error flag).
 */

import {
  type Message,
  type Model,
  ModelBadResponse,
  type ModelTool,
  type ToolCall,
  type ToolResult,
  type Turn,
} from "./base.js";
import {
  asDoc,
  cost,
  type Doc,
  FREE,
  listField,
  postJson,
  type Pricing,
  strField,
  tokens,
} from "./http.js";

export const ERROR_PREFIX = "ERROR: ";

export interface OpenAIOptions {
  // The API root, up to and including /v1.
  readonly baseUrl?: string;
  // Sent as a Bearer token; unset reads OPENAI_API_KEY; "" sends none.
  readonly apiKey?: string;
  readonly pricing?: Pricing;
  // Seconds for the whole exchange.
  readonly timeout?: number;
  readonly maxTokens?: number;
  // Merged into the request body last (temperature, seed, ...).
  readonly extraBody?: Readonly<Record<string, unknown>>;
}

export class OpenAIChatModel implements Model {
  readonly baseUrl: string;
  private readonly apiKey: string;

  constructor(
    readonly name: string,
    private readonly options: OpenAIOptions = {},
  ) {
    this.baseUrl = (options.baseUrl ?? "https://api.openai.com/v1").replace(/\/+$/, "");
    this.apiKey = options.apiKey ?? process.env["OPENAI_API_KEY"] ?? "";
  }

  async respond(
    messages: readonly Message[],
    tools: readonly ModelTool[],
    options: { readonly system: string },
  ): Promise<Turn> {
    const body: Record<string, unknown> = {
      model: this.name,
      messages: wireMessages(messages, options.system),
    };
    if (tools.length > 0) {
      body["tools"] = tools.map((t) => ({
        type: "function",
        function: { name: t.name, description: t.description, parameters: t.parameters },
      }));
    }
    if (this.options.maxTokens !== undefined) body["max_tokens"] = this.options.maxTokens;
    Object.assign(body, this.options.extraBody ?? {});
    const doc = await postJson(`${this.baseUrl}/chat/completions`, body, {
      headers: this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : {},
      model: this.name,
      timeout: this.options.timeout ?? 60,
      secret: this.apiKey,
    });
    return parseTurn(doc, this.name, this.options.pricing ?? FREE);
  }
}

/** The results of one turn in the order of that turn's calls. */
export function inCallOrder(
  results: readonly ToolResult[],
  calls: readonly ToolCall[],
): ToolResult[] {
  const order = new Map(calls.map((c, i) => [c.id, i]));
  return [...results].sort((a, b) => (order.get(a.callId) ?? 0) - (order.get(b.callId) ?? 0));
}

export function wireMessages(messages: readonly Message[], system = ""): Doc[] {
  const wire: Doc[] = system ? [{ role: "system", content: system }] : [];
  let calls: readonly ToolCall[] = [];
  for (const message of messages) {
    if (message.role === "user") {
      wire.push({ role: "user", content: message.text });
    } else if (message.role === "assistant") {
      calls = message.toolCalls;
      wire.push(
        calls.length === 0
          ? { role: "assistant", content: message.text }
          : {
              role: "assistant",
              content: message.text || null,
              tool_calls: calls.map((c) => ({
                id: c.id,
                type: "function",
                function: { name: c.name, arguments: JSON.stringify(c.arguments) },
              })),
            },
      );
    } else {
      for (const r of inCallOrder(message.results, calls)) {
        const content = r.isError ? ERROR_PREFIX + r.content : r.content;
        wire.push({ role: "tool", tool_call_id: r.callId, content });
      }
    }
  }
  return wire;
}

function parseTurn(doc: Doc, model: string, pricing: Pricing): Turn {
  const choices = listField(doc, "choices", "response", model);
  if (choices.length === 0) throw new ModelBadResponse(model, "response.choices is empty");
  const choice = asDoc(choices[0], "choices[0]", model);
  const message = asDoc(choice["message"], "choices[0].message", model);
  let text = message["content"];
  if (text !== null && text !== undefined && typeof text !== "string") {
    throw new ModelBadResponse(model, "message.content is not a string");
  }
  const rawCalls = message["tool_calls"] ?? [];
  if (!Array.isArray(rawCalls))
    throw new ModelBadResponse(model, "message.tool_calls is not a list");
  let stopReason = String(choice["finish_reason"] ?? "");
  const refusal = message["refusal"];
  if (typeof refusal === "string" && refusal) {
    // A refusal says "stop", yet is no answer.
    text = refusal;
    stopReason = "refusal";
  }
  const usage = doc["usage"];
  const input = tokens(usage, "prompt_tokens");
  const output = tokens(usage, "completion_tokens");
  return {
    text: (text as string | null | undefined) ?? "",
    toolCalls: rawCalls.map((c, i) => toolCall(c, i, model)),
    usage: { inputTokens: input, outputTokens: output, cost: cost(pricing, input, output) },
    stopReason,
  };
}

function toolCall(raw: unknown, index: number, model: string): ToolCall {
  const where = `message.tool_calls[${index}]`;
  const call = asDoc(raw, where, model);
  const id = strField(call, "id", where, model);
  const fn = asDoc(call["function"], `${where}.function`, model);
  const name = strField(fn, "name", `${where}.function`, model);
  const args = fn["arguments"];
  if (typeof args === "object" && args !== null && !Array.isArray(args)) {
    return { id, name, arguments: args as Doc };
  }
  if (typeof args !== "string") {
    throw new ModelBadResponse(model, `tool call '${id}': arguments is not a string`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(args || "{}");
  } catch {
    throw new ModelBadResponse(model, `tool call '${id}': arguments are not JSON`);
  }
  return { id, name, arguments: asDoc(parsed, `tool call '${id}' arguments`, model) };
}
