/**
 * A throwaway CA with a server certificate for 127.0.0.1 and client certificates, made
 * with the openssl CLI (the TypeScript twin of tests/auth_support.py's Pki).
 */

import { execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

export class Pki {
  readonly dir: string;
  readonly ca: string;
  readonly serverCert: string;
  readonly serverKey: string;
  private readonly caKey: string;

  constructor(root: string, name = "ca") {
    this.dir = join(root, name);
    mkdirSync(this.dir, { recursive: true });
    this.ca = join(this.dir, "ca.pem");
    this.caKey = join(this.dir, "ca.key");
    this.openssl(
      "req",
      "-x509",
      ...newKey(this.caKey),
      "-out",
      this.ca,
      "-days",
      "2",
      "-subj",
      `/CN=execgate test ${name}`,
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-addext",
      "keyUsage=critical,keyCertSign,cRLSign",
    );
    [this.serverCert, this.serverKey] = this.issue(
      "server",
      "localhost",
      "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    );
  }

  /** A client certificate with subject CN `cn`: the TlsConfig of a Client. */
  client(cn: string): { ca: string; cert: string; key: string } {
    const [cert, key] = this.issue(`client-${cn}`, cn, "extendedKeyUsage=clientAuth\n");
    return { ca: this.ca, cert, key };
  }

  serveArgs(): string[] {
    return ["--tls-cert", this.serverCert, "--tls-key", this.serverKey, "--tls-client-ca", this.ca];
  }

  private issue(stem: string, cn: string, extensions: string): [string, string] {
    const [key, csr, cert, ext] = [".key", ".csr", ".pem", ".ext"].map((e) =>
      join(this.dir, stem + e),
    );
    writeFileSync(ext as string, extensions);
    this.openssl("req", ...newKey(key as string), "-out", csr as string, "-subj", `/CN=${cn}`);
    this.openssl(
      "x509",
      "-req",
      "-in",
      csr as string,
      "-CA",
      this.ca,
      "-CAkey",
      this.caKey,
      "-CAcreateserial",
      "-days",
      "2",
      "-out",
      cert as string,
      "-extfile",
      ext as string,
    );
    return [cert as string, key as string];
  }

  private openssl(...args: string[]): void {
    execFileSync("openssl", args, { cwd: this.dir, stdio: "pipe", timeout: 30_000 });
  }
}

function newKey(path: string): string[] {
  return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", path];
}
