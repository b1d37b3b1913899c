"""execgate's Python client: send an agent's tool calls to the daemon, get typed outcomes.

    from execgate.client import Client, Call
    with Client() as eg:
        outcome = eg.execute_one("read_file", path="README.md")
        print(outcome.status, outcome.text)

`execgate.client` never imports the daemon; the contract between them is the proto.
"""

from ._async import AsyncClient
from ._sync import Client
from ._transport import TlsConfig
from .errors import (
    ApprovalNotPending,
    CallNotFound,
    DaemonUnavailable,
    ExecgateClientError,
    PermissionDenied,
    RequestError,
    RunNotFound,
    RunRefused,
    Unauthenticated,
)
from .loop.driver import Loop
from .loop.results import LoopResult, SoFar, Verdict
from .runs import CancelNotice, RunDetail, RunInfo, Runs, StepResult
from .types import (
    Approval,
    ApprovalState,
    Call,
    CallPlan,
    CallRecord,
    Event,
    EventKind,
    Evidence,
    Mark,
    Outcome,
    PolicyDecision,
    PolicyExplanation,
    ProviderStatus,
    RuleVerdict,
    Status,
    StopMode,
    ToolSpec,
)

__all__ = [
    "Approval",
    "ApprovalNotPending",
    "ApprovalState",
    "AsyncClient",
    "Call",
    "CallNotFound",
    "CallPlan",
    "CallRecord",
    "CancelNotice",
    "Client",
    "DaemonUnavailable",
    "Event",
    "EventKind",
    "Evidence",
    "ExecgateClientError",
    "Loop",
    "LoopResult",
    "Mark",
    "Outcome",
    "PermissionDenied",
    "PolicyDecision",
    "PolicyExplanation",
    "ProviderStatus",
    "RequestError",
    "RuleVerdict",
    "RunDetail",
    "RunInfo",
    "RunNotFound",
    "RunRefused",
    "Runs",
    "SoFar",
    "Status",
    "StepResult",
    "StopMode",
    "TlsConfig",
    "ToolSpec",
    "Unauthenticated",
    "Verdict",
]
