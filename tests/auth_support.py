"""Helpers for the authentication tests: identities files, throwaway certificates, TCP addresses."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from execgate.client import TlsConfig
from execgate.executor.policy.identity import hash_token
from tests.daemon import Daemon
from tests.support import wait_until


@dataclass(frozen=True)
class Who:
    name: str
    roles: tuple[str, ...]
    token: str = ""
    cert_subject: str = ""


def write_identities(path: Path, people: list[Who]) -> Path:
    lines = ["version: 1", "identities:"]
    for who in people:
        lines += [f"  - name: {who.name}", f"    roles: [{', '.join(who.roles)}]"]
        if who.token:
            lines.append(f"    token_sha256: {hash_token(who.token)}")
        if who.cert_subject:
            lines.append(f"    cert_subject: {who.cert_subject}")
    path.write_text("\n".join(lines) + "\n")
    return path


def tcp_address(daemon: Daemon) -> str:
    """The TCP address a daemon started with `--listen 127.0.0.1:0` bound (from its ready line)."""
    found: list[str] = []

    def listening() -> bool:
        m = re.search(r"execgate listening on (.*?) \(workspace", daemon.log())
        found[:] = [a for a in m.group(1).split(", ") if not a.startswith("unix:")] if m else []
        return bool(found)

    wait_until(listening, "the daemon's ready line")
    return found[0]


class Pki:
    """A throwaway CA with a server certificate for 127.0.0.1, made with the openssl CLI.

    `client(cn)` issues client certificates; `Pki(root, "rogue")` is another CA, whose
    certificates the daemon must refuse.
    """

    def __init__(self, root: Path, name: str = "ca") -> None:
        if shutil.which("openssl") is None:
            pytest.skip("the openssl CLI is not installed")
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.ca = self.dir / "ca.pem"
        self._ca_key = self.dir / "ca.key"
        self._openssl(
            "req", "-x509", *self._new_key(self._ca_key), "-out", str(self.ca),
            "-days", "2", "-subj", f"/CN=execgate test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        self.server_cert, self.server_key = self._issue(
            "server", "localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth\n",
        )  # fmt: skip

    def client(self, cn: str, ca: Pki | None = None) -> TlsConfig:
        """A client certificate with subject CN `cn`, trusting `ca`'s (default: our) server."""
        cert, key = self._issue(f"client-{cn}", cn, "extendedKeyUsage=clientAuth\n")
        return TlsConfig((ca or self).ca, cert, key)

    def serve_args(self) -> list[str]:
        return [
            "--tls-cert", str(self.server_cert),
            "--tls-key", str(self.server_key),
            "--tls-client-ca", str(self.ca),
        ]  # fmt: skip

    def _issue(self, stem: str, cn: str, extensions: str) -> tuple[Path, Path]:
        key, csr, cert = (self.dir / f"{stem}{ext}" for ext in (".key", ".csr", ".pem"))
        ext_file = self.dir / f"{stem}.ext"
        ext_file.write_text(extensions)
        self._openssl("req", *self._new_key(key), "-out", str(csr), "-subj", f"/CN={cn}")
        self._openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self._ca_key),
            "-CAcreateserial", "-days", "2", "-out", str(cert), "-extfile", str(ext_file),
        )  # fmt: skip
        return cert, key

    @staticmethod
    def _new_key(path: Path) -> list[str]:
        return [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(path),
        ]

    def _openssl(self, *args: str) -> None:
        subprocess.run(
            ["openssl", *args], check=True, capture_output=True, cwd=self.dir, timeout=30
        )
