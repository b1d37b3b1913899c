/**
 * The run-state data file (proto/execgate/v1/runstates.json) read on its own, to check
 * the generated tables against: the edge rules expanded here, independently of
 * scripts/gen-runstates.mjs.
 */

import { readFileSync } from "node:fs";
import { join } from "node:path";

import { repoRoot } from "./daemon.js";

export interface StateEntry {
  readonly name: string;
  readonly kind: "live" | "suspended" | "success" | "stop";
}

export interface RunStates {
  readonly states: readonly StateEntry[];
  readonly [key: string]: unknown;
}

export function runstates(): RunStates {
  const path = join(repoRoot(), "proto", "execgate", "v1", "runstates.json");
  return JSON.parse(readFileSync(path, "utf8")) as RunStates;
}

/** `node`'s keys but its "$..." comments. */
export function withoutComments(node: unknown): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(node as Record<string, unknown>).filter(([k]) => !k.startsWith("$")),
  );
}

export function ofKind(doc: RunStates, ...kinds: string[]): string[] {
  return doc.states.filter((s) => kinds.includes(s.kind)).map((s) => s.name);
}

/** state -> its successors, sorted: a live state's edges and `from_every_live_state`,
 * waiting's `from_suspended` ("@resume": resume_into's values, "@<kind>": its states). */
export function expandEdges(doc: RunStates): [string, string[]][] {
  const edges = withoutComments(doc["edges"]) as Record<string, string[]>;
  const resume = Object.values(withoutComments(doc["resume_into"])) as string[];
  const refs = (items: unknown): string[] =>
    (items as string[]).flatMap((item) =>
      item === "@resume" ? resume : item.startsWith("@") ? ofKind(doc, item.slice(1)) : [item],
    );
  return doc.states.map((s): [string, string[]] => {
    const to =
      s.kind === "live"
        ? [...(edges[s.name] ?? []), ...refs(doc["from_every_live_state"])]
        : s.kind === "suspended"
          ? refs(doc["from_suspended"])
          : [];
    return [s.name, [...new Set(to)].sort()];
  });
}
