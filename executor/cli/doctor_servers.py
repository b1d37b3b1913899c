"""`execgate doctor`'s MCP part: each server of the running daemon's tools file, its
state (running, restarts, last error, tool count), from its ListProviders RPC.

The daemon is asked when `--addr` or $EXECGATE_ADDR names one, or when `make run`'s
socket (var/execgate.sock) exists; otherwise the doctor only probes the sandboxes.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from execgate.client import ExecgateClientError, ProviderStatus
from execgate.client.wire import DEFAULT_ADDRESS

from . import common


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--addr", help="the daemon whose MCP servers to show (default: see docs)")
    p.add_argument("--token", default=None, help="bearer token (default: $EXECGATE_TOKEN)")
    p.add_argument("--tls-ca", type=Path, metavar="PEM", help="CA of the daemon's cert")
    p.add_argument("--tls-cert", type=Path, metavar="PEM", help="your client certificate")
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")


def wanted(args: argparse.Namespace) -> bool:
    if args.addr or os.environ.get("EXECGATE_ADDR"):
        return True
    return Path(DEFAULT_ADDRESS.removeprefix("unix:")).exists()


def fetch(args: argparse.Namespace) -> tuple[list[ProviderStatus], str]:
    """The daemon's servers, or ([], why it could not be asked)."""
    try:
        with common.client(args, identity="operator") as client:
            return client.list_providers(), ""
    except ExecgateClientError as exc:
        return [], str(exc)


def state(s: ProviderStatus) -> str:
    """running: a process is up; failed: it never served a tool and says why; idle:
    started on its next call."""
    if s.running:
        return "running"
    return "failed" if s.last_error and not s.tools else "idle"


def as_json(servers: list[ProviderStatus], error: str) -> dict[str, Any]:
    return {
        "mcp_servers": [{**asdict(s), "state": state(s)} for s in servers],
        "mcp_error": error,
    }


def show(servers: list[ProviderStatus], error: str) -> None:
    if error:
        print(f"mcp servers: cannot ask the daemon: {error}")
        return
    if not servers:
        print("mcp servers: none declared")
        return
    print("mcp servers:")
    width = max(len(s.provider) for s in servers)
    for s in servers:
        line = f"  {s.provider:<{width}}  {state(s):<7}  processes {s.running}"
        line += f"  restarts {s.restarts}  tools {s.tools}"
        print(line + (f"  last error: {s.last_error}" if s.last_error else ""))
