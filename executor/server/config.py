"""The daemon's configuration: embedded defaults that `make run` uses as they are."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from execgate.executor.core import ranges
from execgate.executor.core.errors import ConfigError
from execgate.executor.sandbox.registry import CHOICES as SANDBOXES
from execgate.executor.sandbox.registry import SandboxConfig
from execgate.executor.tools import Limits
from execgate.executor.tools.base import check_limits

DEFAULT_STATE_DIR = Path("var")
DEFAULT_WORKSPACE = Path("workspace")
SOCKET_NAME = "execgate.sock"
JOURNAL_NAME = "journal.db"
LOCK_BACKENDS = ("inprocess", "filelock", "postgresql", "none")
# A lock space's name (it travels in the lock table's notifications).
LOCK_SPACE = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Listener:
    """Either a Unix socket path or a TCP host and port."""

    unix_path: Path | None = None
    host: str = ""
    port: int = 0

    @property
    def grpc_address(self) -> str:
        if self.unix_path is not None:
            return f"unix:{self.unix_path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        if self.unix_path is not None or self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_listener(text: str) -> Listener:
    """`unix:PATH` or `HOST:PORT` (IPv6 as `[::1]:PORT`)."""
    if text.startswith("unix:"):
        path = text.removeprefix("unix:").removeprefix("//")
        if not path:
            raise ConfigError("listen address 'unix:' needs a path")
        return Listener(unix_path=Path(path).absolute())
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"listen address {text!r} is neither unix:PATH nor HOST:PORT")
    return Listener(host=host.strip("[]"), port=int(port))


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsFiles:
    """PEM files that make every TCP listener mTLS (client certificates required)."""

    # The daemon's certificate (chain) and its private key.
    cert: Path
    key: Path
    # The CA that signed the clients' certificates; no other client gets through.
    client_ca: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    # Where the journal and the default socket live (created 0700).
    state_dir: Path = DEFAULT_STATE_DIR
    # The root every tool works in (created if missing).
    workspace: Path = DEFAULT_WORKSPACE
    # Listeners; empty means the Unix socket `state_dir/execgate.sock`.
    listen: tuple[Listener, ...] = ()
    # Policy file; None means the shipped policies/default.yaml.
    policy: Path | None = None
    # Tools file or tools.d/ directory (declared command tools, MCP servers); None:
    # the built-in tools only. Reloaded like the policy.
    tools: Path | None = None
    limits: Limits = field(default_factory=Limits)
    # Serve gRPC server reflection (off by default: it tells strangers the API).
    reflection: bool = False
    # Serve the `noop` probe tool (benchmarks, smoke tests).
    test_tools: bool = False
    # Lock backend: "inprocess" (default), "filelock" (several daemons on one host
    # sharing a workspace), or "none" (test-only: no scheduling; needs test_tools).
    locks: str = "inprocess"
    # Where the filelock backend keeps its table; default: per workspace under
    # ~/.cache/execgate/locks/.
    lock_dir: Path | None = None
    # The journal: "" is SQLite in state_dir; a postgresql:// URL is a database several
    # daemons share (journal/pg/; docs/deploy.md).
    journal: str = ""
    # Seconds this daemon's lease in a shared (PostgreSQL) journal lasts unrenewed: a
    # daemon that died is reaped (its calls settled, its locks freed) within about this.
    lease: float = 10.0
    # The postgresql lock backend's lock space: daemons with the same one share a lock
    # table. Default: derived from the workspace's real path (as the filelock default);
    # set it when hosts mount one shared workspace at different paths.
    lock_space: str = ""
    # Permit a plaintext TCP listener on a non-loopback address (no --tls-*): tokens
    # then cross the network in clear, so only on a network you trust.
    allow_remote: bool = False
    # Identities file (see identity.py); required for any TCP listener. None: only
    # Unix sockets, whose callers are all the built-in identity `local`.
    identities: Path | None = None
    # mTLS for the TCP listeners; None: TCP is plaintext (tokens only).
    tls: TlsFiles | None = None
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    # Seconds between checks of the policy file for changes (hot reload).
    policy_reload: float = 1.0

    def listeners(self) -> tuple[Listener, ...]:
        if self.listen:
            return self.listen
        return (Listener(unix_path=(self.state_dir / SOCKET_NAME).absolute()),)

    def shared_lock_dir(self) -> Path:
        """The filelock backend's directory: every daemon on this workspace agrees on it."""
        if self.lock_dir is not None:
            return self.lock_dir
        root = os.path.realpath(self.workspace)
        digest = hashlib.sha256(root.encode()).hexdigest()[:16]
        return Path.home() / ".cache" / "execgate" / "locks" / digest

    def lock_space_name(self) -> str:
        """The postgresql lock backend's space: every daemon on this workspace agrees."""
        if self.lock_space:
            return self.lock_space
        root = os.path.realpath(self.workspace)
        return "ws-" + hashlib.sha256(root.encode()).hexdigest()[:16]

    def check(self) -> None:
        check_limits(self.limits)
        ranges.Range(low=1.0, high=3600).check("lease", self.lease)
        if self.lock_space and not LOCK_SPACE.fullmatch(self.lock_space):
            raise ConfigError(
                f"--lock-space {self.lock_space!r}: 1 to 100 letters, digits or . _ : -"
            )
        if self.locks == "postgresql" and not self.journal:
            raise ConfigError(
                "--locks postgresql keeps its lock table in the journal's database: "
                "it needs --journal postgresql://..."
            )
        ranges.Range(high=3600, positive=True).check("policy_reload", self.policy_reload)
        if self.sandbox.default not in SANDBOXES:
            raise ConfigError(f"--sandbox must be one of {', '.join(SANDBOXES)}")
        if self.sandbox.default == "docker" and not self.sandbox.docker_image:
            raise ConfigError("--sandbox docker needs --docker-image")
        if self.locks not in LOCK_BACKENDS:
            raise ConfigError(f"--locks must be one of {', '.join(LOCK_BACKENDS)}")
        if self.locks == "none" and not self.test_tools:
            raise ConfigError(
                "--locks none turns the scheduler off; it is for tests only and needs --test-tools"
            )
        self._check_listeners()

    def _check_listeners(self) -> None:
        """TCP needs identities; off loopback it also needs TLS (or --allow-remote)."""
        tcp = [lst for lst in self.listeners() if lst.unix_path is None]
        if self.tls is not None and not tcp:
            raise ConfigError("--tls-cert/--tls-key/--tls-client-ca: there is no TCP --listen")
        for lst in tcp:
            if self.identities is None:
                raise ConfigError(
                    f"refusing to listen on {lst.grpc_address}: a TCP listener needs an "
                    "identities file (--identities FILE) so that callers authenticate"
                )
            if not lst.is_loopback and self.tls is None and not self.allow_remote:
                raise ConfigError(
                    f"refusing to listen on {lst.grpc_address}: not loopback and not TLS; "
                    "pass --tls-cert/--tls-key/--tls-client-ca, or --allow-remote if the "
                    "network is trusted (tokens then cross it in clear)"
                )
