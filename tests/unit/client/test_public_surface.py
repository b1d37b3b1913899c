"""The client's public surface: its names frozen, and no import of the daemon."""

from __future__ import annotations

from typing import Any

import execgate.client


def test_client_public_names_are_frozen() -> None:
    """Changing the public surface of `execgate.client` must be a deliberate act."""
    assert execgate.client.__all__ == [
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
        "RequestError",
        "RuleVerdict",
        "RunDetail",
        "RunInfo",
        "RunNotFound",
        "RunRefused",
        "Runs",
        "SoFar",
        "Status",
        "StopMode",
        "TlsConfig",
        "ToolSpec",
        "Unauthenticated",
        "Verdict",
    ]
    for name in execgate.client.__all__:
        assert getattr(execgate.client, name) is not None
    namespace: dict[str, Any] = {}
    exec("from execgate.client import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(execgate.client.__all__)


def test_client_does_not_import_the_daemon() -> None:
    import subprocess
    import sys

    code = (
        "import sys, execgate.client; "
        "print(sorted(m for m in sys.modules if m.startswith('execgate.executor')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == "[]"
