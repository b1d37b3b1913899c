/**
 * How the client reaches the daemon and says who it is: the address, the channel,
 * the bearer token. The same defaults as the Python client (client/_transport.py).
 */

import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";

import { type ChannelCredentials, type ChannelOptions, credentials, Metadata } from "@grpc/grpc-js";

export const ADDRESS_ENV = "EXECGATE_ADDR";
export const TOKEN_ENV = "EXECGATE_TOKEN";
/** What `make run` listens on, relative to the working directory. */
export const DEFAULT_ADDRESS = "unix:var/execgate.sock";

export const CHANNEL_OPTIONS: ChannelOptions = {
  "grpc.max_receive_message_length": 64 * 1024 * 1024,
  "grpc.max_send_message_length": 64 * 1024 * 1024,
};

/** PEM files for an mTLS connection to a daemon's TCP listener. */
export interface TlsConfig {
  // The CA that signed the daemon's certificate.
  readonly ca: string;
  // This client's certificate (the daemon maps its subject CN to an identity) and key.
  readonly cert: string;
  readonly key: string;
  // The name to check the daemon's certificate against, when not the address's host.
  readonly serverName?: string;
}

/**
 * `address`, then $EXECGATE_ADDR, then `unix:var/execgate.sock`; a relative Unix
 * socket path is made absolute (against the working directory).
 */
export function resolveAddress(address?: string): string {
  const chosen = address || process.env[ADDRESS_ENV] || DEFAULT_ADDRESS;
  if (chosen.startsWith("unix:") && !chosen.startsWith("unix:/")) {
    return "unix:" + resolve(chosen.slice("unix:".length));
  }
  return chosen;
}

/**
 * `token`, else $EXECGATE_TOKEN, else the agent token a local daemon keeps beside its
 * Unix socket (`make run`: var/tokens/agent.token, owner-only), else "" (fine on a
 * daemon without identities). `address` is the resolved address.
 */
export function resolveToken(token?: string, address = ""): string {
  let chosen = token ?? process.env[TOKEN_ENV] ?? "";
  if (token === undefined && !chosen && address.startsWith("unix:")) {
    const socket = address.slice("unix:".length);
    try {
      chosen = readFileSync(join(dirname(socket), "tokens", "agent.token"), "utf8");
    } catch {
      chosen = "";
    }
  }
  return chosen.trim();
}

/** Sent with every call. Never logged or put in an exception by this package. */
export function callMetadata(token: string): Metadata {
  const metadata = new Metadata();
  if (token) metadata.set("authorization", `Bearer ${token}`);
  return metadata;
}

export function channelCredentials(tls?: TlsConfig): ChannelCredentials {
  if (tls === undefined) return credentials.createInsecure();
  return credentials.createSsl(readFileSync(tls.ca), readFileSync(tls.key), readFileSync(tls.cert));
}

export function channelOptions(tls?: TlsConfig): ChannelOptions {
  if (!tls?.serverName) return CHANNEL_OPTIONS;
  return { ...CHANNEL_OPTIONS, "grpc.ssl_target_name_override": tls.serverName };
}
