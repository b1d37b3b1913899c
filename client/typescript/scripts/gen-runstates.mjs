// Generates src/gen/runstates.ts from the repository's proto/execgate/v1/runstates.json,
// the one definition of the run-state machine (setup.py generates the Python module from
// the same file). Run by `npm run generate`, after buf; src/gen is git-ignored.
// Plain Node, no dependency: the data file is JSON so that nothing has to parse YAML.

import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const SOURCE = join(here, "..", "..", "..", "proto", "execgate", "v1", "runstates.json");
const TARGET = join(here, "..", "src", "gen", "runstates.ts");

/** `node` without its "$..." comment keys. */
function strip(node) {
  if (node === null || typeof node !== "object" || Array.isArray(node)) return node;
  return Object.fromEntries(
    Object.entries(node)
      .filter(([k]) => !k.startsWith("$"))
      .map(([k, v]) => [k, strip(v)]),
  );
}

/** Every state's successors, in the states' order: the edges plus the two rules. */
export function expand(doc) {
  const names = doc.states.map((s) => s.name);
  const kind = Object.fromEntries(doc.states.map((s) => [s.name, s.kind]));
  const edges = strip(doc.edges);
  const resume = strip(doc.resume_into);
  const refs = (items) => {
    const out = new Set();
    for (const item of items) {
      if (item === "@resume") Object.values(resume).forEach((s) => out.add(s));
      else if (item.startsWith("@"))
        names.filter((n) => kind[n] === item.slice(1)).forEach((n) => out.add(n));
      else out.add(item);
    }
    return out;
  };
  return names.map((name) => {
    let to = new Set();
    if (kind[name] === "live")
      to = new Set([...refs(edges[name]), ...refs(doc.from_every_live_state)]);
    else if (kind[name] === "suspended") to = refs(doc.from_suspended);
    for (const t of to)
      if (!names.includes(t)) throw new Error(`${SOURCE}: ${name} -> unknown ${t}`);
    return [name, names.filter((n) => to.has(n))];
  });
}

const q = (s) => JSON.stringify(s);
const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

/** A union type of `items` ([name, node] pairs), each after its node's comment. */
function union(name, items) {
  const lines = [`export type ${name} =`];
  for (const [member, node] of items) {
    if (typeof node.$comment === "string") lines.push(`  // ${node.$comment}`);
    lines.push(`  | ${q(member)}`);
  }
  return lines.join("\n") + ";";
}

function list(name, type, items) {
  return `export const ${name}: readonly ${type}[] = [${items.map(q).join(", ")}];`;
}

/** An object literal `as const`: its keys are a type the importer can check. */
function constant(name, mapping) {
  const body = Object.entries(mapping).map(([k, v]) => `  ${q(k)}: ${q(v)},`);
  return [`export const ${name} = {`, ...body, "} as const;"].join("\n");
}

function record(name, type, mapping) {
  const body = Object.entries(mapping).map(([k, v]) => `  ${q(k)}: ${q(v)},`);
  return [`export const ${name}: Readonly<Record<${type}, string>> = {`, ...body, "};"].join("\n");
}

export function render(doc) {
  const ofKind = (...kinds) => doc.states.filter((s) => kinds.includes(s.kind));
  const members = (states) => states.map((s) => [s.name, s]);
  const names = (states) => states.map((s) => s.name);
  const refusals = Object.entries(doc.refusals).filter(([k]) => !k.startsWith("$"));
  const resume = Object.entries(strip(doc.resume_into));
  return [
    "// Generated from proto/execgate/v1/runstates.json by scripts/gen-runstates.mjs. Do not edit.",
    "// The run-state machine's data; the Python loop and the daemon read the same file.",
    "",
    "/** A run's state. */",
    union("State", members(doc.states)),
    "/** The states in which the run executes: those it can be suspended from. */",
    union("LiveState", members(ofKind("live"))),
    "/** The terminals a run is stopped into: everything terminal except success. */",
    union("StopState", members(ofKind("stop"))),
    "",
    list("STATES", "State", names(doc.states)),
    list("LIVE", "LiveState", names(ofKind("live"))),
    list("SUSPENDED", "State", names(ofKind("suspended"))),
    list("STOPS", "StopState", names(ofKind("stop"))),
    list("TERMINAL", "State", names(ofKind("stop", "success"))),
    "/** Suspended from -> resumed into. */",
    "export const RESUME_INTO: readonly (readonly [LiveState, State])[] = [",
    ...resume.map(([k, v]) => `  [${q(k)}, ${q(v)}],`),
    "];",
    "/** Every legal move: state -> the states it may move to. */",
    "export const TRANSITIONS: readonly (readonly [State, readonly State[]])[] = [",
    ...expand(doc).map(([k, v]) => `  [${q(k)}, [${v.map(q).join(", ")}]],`),
    "];",
    list("STOP_PRIORITY", "string", doc.stop_priority.rules),
    "/** runs.proto RunLimits' fields, as ts-proto names them. */",
    `export const LIMIT_KEYS = [${doc.limit_keys.keys.map((k) => q(camel(k))).join(", ")}] as const;`,
    "",
    "/** Why the loop refused a call itself; the call never reached the daemon. */",
    union("Refusal", refusals),
    "/** Keyed by the proto's ErrorClass, lower-cased (loop/observe.ts checks the keys). */",
    constant("DAEMON_HINTS", strip(doc.daemon_hints)),
    record("REFUSAL_HINTS", "Refusal", Object.fromEntries(refusals.map(([k, v]) => [k, v.hint]))),
    "/** Keyed by status; these say more than any error class. */",
    constant("STATUS_HINTS", strip(doc.status_hints)),
    "/** For an error class the client does not know: by status. */",
    constant("FALLBACK_HINTS", strip(doc.fallback_hints)),
    "",
  ].join("\n");
}

const doc = JSON.parse(readFileSync(SOURCE, "utf8"));
mkdirSync(dirname(TARGET), { recursive: true });
writeFileSync(TARGET, render(doc));
