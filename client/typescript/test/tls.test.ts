/**
 * A daemon's mTLS TCP listener: the client's certificate says who it is (its CN is an
 * identity's `cert_subject`); without the client certificate there is no connection.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client, DaemonUnavailable, Unauthenticated } from "@execgate/client";

import { Daemon } from "./support/daemon.js";
import { Pki } from "./support/pki.js";

let daemon: Daemon;
// By name: the daemon's certificate is for localhost and 127.0.0.1, and TLS checks a
// name (Node warns when the server name is an IP address).
let address: string;
let pki: Pki;
let certs: string;
const clients: Client[] = [];

function connect(options: ConstructorParameters<typeof Client>[0]): Client {
  const client = new Client(options);
  clients.push(client);
  return client;
}

before(async () => {
  certs = mkdtempSync(join(tmpdir(), "execgate-ts-pki-"));
  pki = new Pki(certs);
  daemon = await Daemon.start({
    people: [{ name: "certbot", roles: ["agent"], certSubject: "certbot.example" }],
    tcp: true,
    args: pki.serveArgs(),
  });
  address = daemon.tcpAddress.replace("127.0.0.1", "localhost");
});

after(async () => {
  for (const c of clients) c.close();
  await daemon.stop();
  rmSync(certs, { recursive: true, force: true });
});

test("a client certificate is the identity over mTLS", async () => {
  const eg = connect({ address, tls: pki.client("certbot.example"), token: "" });
  const o = await eg.executeOne("noop", { echo: "over mtls" }, { runId: "tls" });
  assert.equal(o.text, "over mtls");
  assert.equal((await eg.getCall(o.callId, { runId: "tls" })).agent, "certbot");
});

test("a certificate no identity names is Unauthenticated; plaintext gets no connection", async () => {
  const stranger = connect({ address, tls: pki.client("stranger.example"), token: "" });
  await assert.rejects(stranger.listTools(), Unauthenticated);
  const plain = connect({ address, token: "" });
  await assert.rejects(plain.listTools(), DaemonUnavailable);
});
