/**
 * `AnthropicMessagesModel`: Anthropic's Messages API (POST {baseUrl}/v1/messages) -- the
 * twin of client/models/anthropic.py, same wire rules: `system` top-level; an assistant
 * turn as text then `tool_use` blocks; the results of one turn in ONE user message as
 * `tool_result` blocks, first, in the order of the calls; roles alternate (consecutive
 * messages of one role are merged); empty messages left out.
 */

import {
  type Message,
  type Model,
  ModelBadResponse,
  type ModelTool,
  type ToolCall,
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
import { inCallOrder } from "./openai.js";

export interface AnthropicOptions {
  // The API root, without /v1.
  readonly baseUrl?: string;
  // Sent as x-api-key; unset reads ANTHROPIC_API_KEY.
  readonly apiKey?: string;
  readonly anthropicVersion?: string;
  // The most tokens one turn may produce (the API requires it).
  readonly maxTokens?: number;
  readonly pricing?: Pricing;
  readonly timeout?: number;
}

export class AnthropicMessagesModel implements Model {
  readonly baseUrl: string;
  private readonly apiKey: string;

  constructor(
    readonly name: string,
    private readonly options: AnthropicOptions = {},
  ) {
    this.baseUrl = (options.baseUrl ?? "https://api.anthropic.com").replace(/\/+$/, "");
    this.apiKey = options.apiKey ?? process.env["ANTHROPIC_API_KEY"] ?? "";
  }

  async respond(
    messages: readonly Message[],
    tools: readonly ModelTool[],
    options: { readonly system: string },
  ): Promise<Turn> {
    const body: Record<string, unknown> = {
      model: this.name,
      max_tokens: this.options.maxTokens ?? 4096,
      messages: wireMessages(messages),
    };
    if (options.system) body["system"] = options.system;
    if (tools.length > 0) {
      body["tools"] = tools.map((t) => ({
        name: t.name,
        description: t.description,
        input_schema: t.parameters,
      }));
    }
    const doc = await postJson(`${this.baseUrl}/v1/messages`, body, {
      headers: {
        "x-api-key": this.apiKey,
        "anthropic-version": this.options.anthropicVersion ?? "2023-06-01",
      },
      model: this.name,
      timeout: this.options.timeout ?? 60,
      secret: this.apiKey,
    });
    return parseTurn(doc, this.name, this.options.pricing ?? FREE);
  }
}

export function wireMessages(messages: readonly Message[]): Doc[] {
  const wire: { role: string; content: Doc[] }[] = [];
  let calls: readonly ToolCall[] = [];
  for (const message of messages) {
    const blocks = blocksOf(message, calls);
    if (message.role === "assistant") calls = message.toolCalls;
    if (blocks.length === 0) continue;
    const role = message.role === "assistant" ? "assistant" : "user";
    const last = wire[wire.length - 1];
    if (last !== undefined && last.role === role) {
      last.content = resultsFirst([...last.content, ...blocks]);
    } else {
      wire.push({ role, content: blocks });
    }
  }
  return wire;
}

function blocksOf(message: Message, calls: readonly ToolCall[]): Doc[] {
  if (message.role === "tool_results") {
    return inCallOrder(message.results, calls).map((r) => ({
      type: "tool_result",
      tool_use_id: r.callId,
      content: r.content,
      is_error: r.isError,
    }));
  }
  const text: Doc[] = message.text ? [{ type: "text", text: message.text }] : [];
  if (message.role === "user") return text;
  return [
    ...text,
    ...message.toolCalls.map((c) => ({
      type: "tool_use",
      id: c.id,
      name: c.name,
      input: c.arguments,
    })),
  ];
}

function resultsFirst(blocks: Doc[]): Doc[] {
  return [
    ...blocks.filter((b) => b["type"] === "tool_result"),
    ...blocks.filter((b) => b["type"] !== "tool_result"),
  ];
}

function parseTurn(doc: Doc, model: string, pricing: Pricing): Turn {
  const texts: string[] = [];
  const calls: ToolCall[] = [];
  listField(doc, "content", "response", model).forEach((raw, i) => {
    const where = `content[${i}]`;
    const block = asDoc(raw, where, model);
    const type = strField(block, "type", where, model);
    if (type === "text") texts.push(strField(block, "text", where, model));
    else if (type === "tool_use") {
      calls.push({
        id: strField(block, "id", where, model),
        name: strField(block, "name", where, model),
        arguments: asDoc(block["input"], `${where}.input`, model),
      });
    } else throw new ModelBadResponse(model, `${where} has unknown type '${type}'`);
  });
  const usage = doc["usage"];
  const input = tokens(usage, "input_tokens");
  const output = tokens(usage, "output_tokens");
  return {
    text: texts.join(""),
    toolCalls: calls,
    usage: { inputTokens: input, outputTokens: output, cost: cost(pricing, input, output) },
    stopReason: String(doc["stop_reason"] ?? ""),
  };
}
