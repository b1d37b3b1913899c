/**
 * A real execgate daemon in a child process, on a Unix socket in a temporary
 * directory (the TypeScript twin of tests/daemon.py). `.venv/bin/execgate` of this
 * repository (`make install`), or $EXECGATE_BIN.
 */

import { type ChildProcess, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root: the nearest ancestor of this file with proto/execgate/v1. */
export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "proto", "execgate", "v1"))) {
    const up = dirname(dir);
    if (up === dir) throw new Error("not inside the execgate repository");
    dir = up;
  }
  return dir;
}

export function execgateBin(): string {
  return process.env["EXECGATE_BIN"] ?? join(repoRoot(), ".venv", "bin", "execgate");
}

/** An identity of the daemon's identities file: a bearer token or a certificate's CN. */
export interface Who {
  readonly name: string;
  readonly roles: readonly string[];
  readonly token?: string;
  readonly certSubject?: string;
}

export function identitiesYaml(people: readonly Who[]): string {
  const lines = ["version: 1", "identities:"];
  for (const who of people) {
    lines.push(`  - name: ${who.name}`, `    roles: [${who.roles.join(", ")}]`);
    if (who.token) {
      lines.push(`    token_sha256: ${createHash("sha256").update(who.token).digest("hex")}`);
    }
    if (who.certSubject) lines.push(`    cert_subject: ${who.certSubject}`);
  }
  return lines.join("\n") + "\n";
}

export interface DaemonOptions {
  // An identities file (and so tokens) for the daemon.
  readonly people?: readonly Who[];
  // Policy file text (default: the shipped policy), or a function of the daemon's root
  // directory giving it (a policy naming directories of its own).
  readonly policy?: string | ((root: string) => string);
  // Also listen on a loopback TCP port (needs `people`).
  readonly tcp?: boolean;
  readonly args?: readonly string[];
}

const READY = /execgate listening on (.*?) \(workspace/;

// The user a root daemon's process sandbox runs commands as (the workspace's owner if that
// is not root, else nobody): as in tests/daemon.py, a root test run gives it the workspace,
// group 0 and group-writable (bwrap's capability-less root writes it too).
const RUN_AS_UID = 65534;

function reachableWorkspace(root: string, workspace: string): void {
  if (process.getuid?.() !== 0) return;
  chownSync(workspace, RUN_AS_UID, 0);
  chmodSync(workspace, 0o2775);
  chmodSync(root, 0o711); // mkdtemp makes it 0700: the run-as user must pass through
}

export class Daemon {
  readonly workspace: string;
  readonly stateDir: string;
  readonly address: string;
  // The loopback TCP address, with `tcp`.
  tcpAddress = "";
  private output = "";
  private proc: ChildProcess | undefined;
  private args: string[] = [];

  private constructor(readonly root: string) {
    this.workspace = join(root, "workspace");
    this.stateDir = join(root, "state");
    this.address = `unix:${join(this.stateDir, "execgate.sock")}`;
  }

  /** Start a daemon and wait for its ready line. */
  static async start(options: DaemonOptions = {}): Promise<Daemon> {
    const d = new Daemon(mkdtempSync(join(tmpdir(), "execgate-ts-")));
    mkdirSync(d.workspace);
    reachableWorkspace(d.root, d.workspace);
    const args = [
      "serve",
      "--workspace",
      d.workspace,
      "--state-dir",
      d.stateDir,
      "--test-tools",
      "--sandbox",
      "process",
      ...(options.args ?? []),
    ];
    if (options.people) {
      writeFileSync(join(d.root, "identities.yaml"), identitiesYaml(options.people));
      args.push("--identities", join(d.root, "identities.yaml"));
    }
    if (options.policy !== undefined) {
      const text = typeof options.policy === "string" ? options.policy : options.policy(d.root);
      writeFileSync(join(d.root, "policy.yaml"), text);
      args.push("--policy", join(d.root, "policy.yaml"));
    }
    if (options.tcp) args.push("--listen", d.address, "--listen", "127.0.0.1:0");
    await d.spawn(args);
    return d;
  }

  log(): string {
    return this.output;
  }

  /** SIGTERM and wait (the daemon drains and exits), then start it again on the same
   * state directory and workspace, and wait for its ready line. */
  async restart(): Promise<void> {
    const proc = this.proc;
    if (proc !== undefined && proc.exitCode === null && proc.signalCode === null) {
      const exited = new Promise((resolve) => proc.once("exit", resolve));
      proc.kill("SIGTERM");
      await exited;
    }
    this.output = "";
    await this.spawn(this.args);
  }

  private spawn(args: string[], timeoutMs = 30_000): Promise<void> {
    this.args = args;
    const proc = spawn(execgateBin(), args, { cwd: this.root, stdio: ["ignore", "pipe", "pipe"] });
    this.proc = proc;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error(`daemon not ready after ${timeoutMs} ms:\n${this.output}`));
      }, timeoutMs);
      const take = (chunk: Buffer): void => {
        this.output += chunk.toString();
        const ready = READY.exec(this.output);
        if (ready === null) return;
        clearTimeout(timer);
        const addresses = (ready[1] ?? "").split(", ");
        this.tcpAddress = addresses.find((a) => !a.startsWith("unix:")) ?? "";
        resolve();
      };
      proc.stdout?.on("data", take);
      proc.stderr?.on("data", take);
      proc.on("error", (err) => {
        clearTimeout(timer);
        reject(err);
      });
      proc.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`daemon exited with ${code}:\n${this.output}`));
      });
    });
  }

  /** SIGTERM and wait (the daemon drains and exits), then remove its directory. */
  async stop(): Promise<number | null> {
    const proc = this.proc;
    let code: number | null = null;
    if (proc !== undefined && proc.exitCode === null && proc.signalCode === null) {
      const exited = new Promise<number | null>((resolve) => proc.once("exit", resolve));
      proc.kill("SIGTERM");
      const timer = setTimeout(() => proc.kill("SIGKILL"), 30_000);
      code = await exited;
      clearTimeout(timer);
    }
    rmSync(this.root, { recursive: true, force: true });
    return code;
  }
}

/** Wait for observable state: `check` is polled until it is true (or `timeoutMs`). */
export async function waitUntil(
  check: () => boolean | Promise<boolean>,
  what: string,
  timeoutMs = 10_000,
): Promise<void> {
  const give = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > give) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
