/**
 * `ScriptedModel`: a model that plays a script, for tests and examples
 * (client/models/scripted.py).
 *
 *     const model = new ScriptedModel([
 *       ScriptedModel.calls(["read_file", { path: "a.txt" }]),
 *       (messages) => ScriptedModel.answer("done"),
 *     ]);
 *
 * A step is a `Turn`, or a function of the messages that returns one (to react to the
 * results the loop sent back). Calls without an id get "call_1", "call_2", ... unique
 * across the script. Past the last step, `respond` rejects with `ScriptExhausted`.
 */

import {
  type Message,
  type ModelTool,
  type Model,
  NO_USAGE,
  ScriptExhausted,
  type ToolCall,
  type Turn,
  type Usage,
} from "./base.js";

export type Step = Turn | ((messages: readonly Message[]) => Turn | Promise<Turn>);

/** A proposed call: [tool name, arguments]. */
export type CallSpec = readonly [string, Readonly<Record<string, unknown>>];

export class ScriptedModel implements Model {
  // One entry per respond(), in order: the messages and the tools it was given.
  readonly requests: (readonly Message[])[] = [];
  readonly toolsOffered: (readonly ModelTool[])[] = [];
  private readonly script: Iterator<Step>;
  // Steps played; `remaining` is known only for an array script.
  private played = 0;
  private readonly size: number | undefined;
  private readonly idsUsed = new Set<string>();
  private idCounter = 0;

  constructor(
    script: Iterable<Step>,
    readonly name = "scripted",
  ) {
    // Read lazily, one step per respond(): an endless generator is fine.
    this.script = script[Symbol.iterator]();
    this.size = Array.isArray(script) ? script.length : undefined;
  }

  /** A turn proposing these calls; ids are assigned when played. */
  static calls(...calls: readonly CallSpec[]): Turn {
    return {
      text: "",
      toolCalls: calls.map(([name, args]) => ({ id: "", name, arguments: { ...args } })),
      usage: NO_USAGE,
      stopReason: "tool_calls",
    };
  }

  /** A final turn: text and no calls. */
  /** A turn with text and no calls: an answer unless `stopReason` says otherwise. */
  static answer(text: string, usage: Usage = NO_USAGE, stopReason = "stop"): Turn {
    return { text, toolCalls: [], usage, stopReason };
  }

  /** Steps not yet played; undefined when the script is not an array. */
  get remaining(): number | undefined {
    return this.size === undefined ? undefined : this.size - this.played;
  }

  async respond(messages: readonly Message[], tools: readonly ModelTool[]): Promise<Turn> {
    this.requests.push([...messages]);
    this.toolsOffered.push([...tools]);
    const next = this.script.next();
    if (next.done === true) throw new ScriptExhausted(this.name, this.played);
    const step = next.value;
    this.played += 1;
    const turn = typeof step === "function" ? await step([...messages]) : step;
    return { ...turn, toolCalls: turn.toolCalls.map((c) => this.withId(c)) };
  }

  private withId(call: ToolCall): ToolCall {
    let id = call.id;
    while (!id) {
      this.idCounter += 1;
      const candidate = `call_${this.idCounter}`;
      if (!this.idsUsed.has(candidate)) id = candidate;
    }
    this.idsUsed.add(id);
    return { ...call, id };
  }
}
