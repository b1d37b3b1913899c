/**
 * A local stand-in for a model provider's HTTP API (the twin of tests/model_server.py):
 * answers each POST with the next queued reply (often a recorded-shape fixture from
 * tests/fixtures/models/) and records every request. Nothing leaves 127.0.0.1.
 */

import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";

import { repoRoot } from "./daemon.js";

export interface Reply {
  readonly status?: number;
  readonly body: unknown;
  readonly headers?: Readonly<Record<string, string>>;
}

export interface Recorded {
  readonly path: string;
  readonly headers: Readonly<Record<string, string | string[] | undefined>>;
  readonly body: Record<string, unknown>;
}

export function fixture(name: string): Record<string, unknown> {
  const path = join(repoRoot(), "tests", "fixtures", "models", `${name}.json`);
  return JSON.parse(readFileSync(path, "utf8")) as Record<string, unknown>;
}

export class ProviderServer {
  readonly replies: Reply[] = [];
  readonly requests: Recorded[] = [];
  private constructor(private readonly server: Server) {}

  static async start(): Promise<ProviderServer> {
    const server = createServer();
    const provider = new ProviderServer(server);
    server.on("request", (req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        provider.requests.push({
          path: req.url ?? "",
          headers: req.headers,
          body: JSON.parse(Buffer.concat(chunks).toString("utf8")) as Record<string, unknown>,
        });
        const reply = provider.replies.shift() ?? {
          status: 599,
          body: { error: { message: "the test queued no reply" } },
        };
        const raw = JSON.stringify(reply.body);
        res.writeHead(reply.status ?? 200, {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(raw),
          ...reply.headers,
        });
        res.end(raw);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return provider;
  }

  get url(): string {
    const { port } = this.server.address() as AddressInfo;
    return `http://127.0.0.1:${port}`;
  }

  reply(body: unknown, status = 200, headers: Record<string, string> = {}): void {
    this.replies.push({ status, body, headers });
  }

  reset(): void {
    this.replies.length = 0;
    this.requests.length = 0;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
