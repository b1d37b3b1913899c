/**
 * A minimal agent loop against a running execgate daemon, with a scripted model: the
 * TypeScript twin of examples/minimal_loop.py.
 *
 *     node dist/examples/minimal-loop.js [--addr ADDR]
 *
 * Two runs, each printed with its terminal state, its reason and the transitions the
 * daemon recorded:
 *
 * 1. The model writes a note, reads it back, then answers: the run ends `completed`.
 * 2. The model lists the workspace again and again; `maxSteps: 2` ends the run
 *    `expired` (rule max_steps) instead of letting it loop forever.
 *
 * The address defaults to $EXECGATE_ADDR, then `unix:var/execgate.sock` (`make run`); a
 * daemon with identities needs a token in $EXECGATE_TOKEN. Exit status 2: no daemon.
 */

import { parseArgs } from "node:util";

import {
  Client,
  DaemonUnavailable,
  Loop,
  type LoopResult,
  type Message,
  ScriptedModel,
  type Turn,
} from "@execgate/client";

const NOTE = "minimal_loop_note.txt";

/** The model's last step reacts to what the loop sent back: the file's content. */
function answerFromTheFile(messages: readonly Message[]): Turn {
  const last = messages.at(-1);
  const content = last?.role === "tool_results" ? (last.results[0]?.content ?? "") : "";
  const lines = content.split("\n").filter((line) => line !== "");
  return ScriptedModel.answer(`the note says: ${lines.at(-1) ?? ""}`);
}

function twoToolsThenAnAnswer(client: Client): Promise<LoopResult> {
  const model = new ScriptedModel([
    ScriptedModel.calls(["write_file", { path: NOTE, content: "hello from a loop\n" }]),
    ScriptedModel.calls(["read_file", { path: NOTE }]),
    answerFromTheFile,
  ]);
  return new Loop(client, model).run(`write ${NOTE}, read it back, say what it says`);
}

function theSameCallForever(client: Client): Promise<LoopResult> {
  const model = new ScriptedModel(Array(10).fill(ScriptedModel.calls(["list_dir", { path: "." }])));
  return new Loop(client, model, { limits: { maxSteps: 2 } }).run("list the workspace");
}

async function show(client: Client, title: string, result: LoopResult): Promise<void> {
  const rule = result.rule ? ` (rule ${result.rule})` : "";
  console.log(title);
  console.log(`  run ${result.runId} ended: ${result.state}${rule} -- ${result.reason}`);
  if (result.answer) console.log(`  answer: ${result.answer}`);
  console.log(`  steps: ${String(result.figures["steps"])}`);
  console.log("  transitions:");
  for (const e of (await client.runs.get(result.runId)).events) {
    const seq = String(e.seq).padStart(3);
    console.log(`    ${seq} ${e.fromState.padStart(17)} -> ${e.toState.padEnd(17)} ${e.reason}`);
  }
}

async function main(): Promise<number> {
  const { values } = parseArgs({ options: { addr: { type: "string" } } });
  const client = new Client({ address: values.addr });
  try {
    await show(client, "scenario 1: two tools, then an answer", await twoToolsThenAnAnswer(client));
    await show(client, "scenario 2: the same call, maxSteps: 2", await theSameCallForever(client));
  } catch (err) {
    if (!(err instanceof DaemonUnavailable)) throw err;
    console.error(err.message);
    return 2;
  } finally {
    client.close();
  }
  return 0;
}

process.exitCode = await main();
