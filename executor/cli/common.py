"""What the client-side commands share: a client from the common flags, times and JSON.

Every command module imports this one and none imports another command's module;
`main` registers each of them (see its COMMANDS table).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import enum
import json
from typing import Any

from execgate.client import Client
from execgate.client.wire import resolve_address
from execgate.executor.policy.local_identities import cli_token

from .options import tls

__all__ = ["client", "jsonable", "print_json", "tls", "when", "when_short"]


def client(
    args: argparse.Namespace, *, run_id: str = "", identity: str = "agent", workspace: str = ""
) -> Client:
    """A client as --token, $EXECGATE_TOKEN, or else the local `identity`'s token beside
    the daemon's socket (`make run`'s, see local_identities): `agent` makes calls,
    `operator` decides approvals. `workspace`: where its calls work ("": the default)."""
    token = args.token
    if token is None:
        token = cli_token(resolve_address(args.addr), identity)
    return Client(args.addr, run_id=run_id, token=token, tls=tls(args), workspace=workspace)


def when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def when_short(seconds: float) -> str:
    """`12-02 03:44:56`: wraps at the space into a narrow column."""
    return datetime.datetime.fromtimestamp(seconds).strftime("%m-%d %H:%M:%S")


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))
