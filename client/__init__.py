"""execgate's Python client: send an agent's tool calls to the daemon, get typed outcomes.

    from execgate.client import Client, Call
    with Client() as eg:
        outcome = eg.execute_one("read_file", path="README.md")
        print(outcome.status, outcome.text)

`execgate.client` never imports the daemon; the contract between them is the proto.
"""

from ._async import AsyncClient
from ._sync import Client
from .errors import CallNotFound, DaemonUnavailable, ExecgateClientError, RequestError
from .types import (
    Call,
    CallPlan,
    CallRecord,
    Event,
    EventKind,
    Evidence,
    Mark,
    Outcome,
    Status,
    StopMode,
    ToolSpec,
)

__all__ = [
    "AsyncClient",
    "Call",
    "CallNotFound",
    "CallPlan",
    "CallRecord",
    "Client",
    "DaemonUnavailable",
    "Event",
    "EventKind",
    "Evidence",
    "ExecgateClientError",
    "Mark",
    "Outcome",
    "RequestError",
    "Status",
    "StopMode",
    "ToolSpec",
]
