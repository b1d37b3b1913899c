/**
 * The TypeScript agent of tests/integration/test_cross_language.py: a Loop whose scripted model
 * increments workspace/counter.txt `--increments` times, one `run_command` per step.
 *
 *     EXECGATE_TOKEN=... node dist/test/support/counter-agent.js --addr ADDR [--increments N]
 *
 * It connects, prints "ready", waits for a line on stdin (so that the Python agent can
 * start at the same moment), runs, and prints the result as one JSON line.
 */

import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

import { Client, Loop, ScriptedModel } from "@execgate/client";

const INCREMENT = ["sh", "-c", "n=$(cat counter.txt); echo $((n+1)) > counter.txt"];

const { values } = parseArgs({
  options: { addr: { type: "string" }, increments: { type: "string", default: "10" } },
});
const client = new Client({ address: values.addr });
try {
  await client.listTools(); // connected and authenticated before the start line
  console.log("ready");
  const lines = createInterface({ input: process.stdin });
  await new Promise((resolve) => lines.once("line", resolve));
  lines.close();

  const n = Number(values.increments);
  const model = new ScriptedModel([
    ...Array.from({ length: n }, () => ScriptedModel.calls(["run_command", { argv: INCREMENT }])),
    ScriptedModel.answer(`incremented ${n} times`),
  ]);
  // Every increment gets the same (empty) result: that is the job, not a lack of progress.
  const loop = new Loop(client, model, { limits: { maxRepeats: n + 1 } });
  const result = await loop.run(`increment counter.txt ${n} times`);
  console.log(JSON.stringify(result));
} finally {
  client.close();
}
