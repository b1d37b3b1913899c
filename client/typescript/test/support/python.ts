/** Ask the Python client (this repository's .venv) for a value, to compare the two. */

import { execFileSync } from "node:child_process";
import { join } from "node:path";

import { repoRoot } from "./daemon.js";

/** Run `code` (Python that prints one JSON value) and parse what it printed. */
export function pythonJson(code: string, input = ""): unknown {
  const python = process.env["EXECGATE_PYTHON"] ?? join(repoRoot(), ".venv", "bin", "python");
  const out = execFileSync(python, ["-c", code], { input, encoding: "utf8" });
  return JSON.parse(out);
}
