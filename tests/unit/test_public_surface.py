"""The public surface of every package, frozen: each package's `__init__` has `__all__`,
and its names are the ones listed here (a change to a package's surface is a change to
this file, seen in review). Every name listed can be imported from its package.

Rooms of the daemon whose modules are imported directly export nothing from their
`__init__` (an empty `__all__`), which keeps `execgate --help` from loading them.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

EXPECTED: dict[str, list[str]] = {
    "execgate.executor": [],
    "execgate.executor.cli": [],
    "execgate.executor.cli.trace": [],
    "execgate.executor.core": [],
    "execgate.executor.journal": [],
    "execgate.executor.journal.pg": [],
    "execgate.executor.locks": [
        "Abandoned",
        "BackendClosed",
        "Claim",
        "FileLockManager",
        "Key",
        "Lease",
        "LockBackend",
        "LockEntry",
        "LockError",
        "LockManager",
        "LockMode",
        "Mode",
        "NoLocks",
        "Snapshot",
        "WaitInfo",
        "combine",
        "compatible",
        "explain",
        "net_key",
        "path_key",
        "plan",
        "plans_conflict",
        "table_key",
        "workspace_key",
    ],
    "execgate.executor.pipeline": [],
    "execgate.executor.policy": [
        "Bound",
        "CallLimits",
        "Decision",
        "Effect",
        "Grant",
        "Over",
        "Policy",
        "PolicyError",
        "PolicyInput",
        "Quota",
        "ReadGrant",
        "Rule",
        "SandboxRule",
        "default_policy_path",
        "load_policy",
        "parse_policy",
        "path_glob",
    ],
    "execgate.executor.runs": [],
    "execgate.executor.sandbox": [
        "Captured",
        "Confinement",
        "Exit",
        "Launch",
        "MARKER_ENV",
        "Probe",
        "ProgramNotExecutable",
        "ProgramNotFound",
        "Running",
        "Sandbox",
        "SandboxError",
        "Serving",
    ],
    "execgate.executor.server": [],
    "execgate.executor.telemetry": [],
    "execgate.executor.tools": [
        "CancelScope",
        "Limits",
        "Mode",
        "ResourceKind",
        "ResourceTemplate",
        "Tool",
        "ToolContext",
        "ToolOutput",
        "ToolSpec",
        "builtin_tools",
    ],
    "execgate.executor.tools.mcp": ["McpProvider", "McpTool", "ServerStatus"],
    "execgate.client": [
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
    ],
    # Imports neither framework: the adapters are its modules, imported by name
    # (their own surfaces: tests/unit/client/test_integrations.py).
    "execgate.client.integrations": [],
    "execgate.client.loop": [
        "Breakage",
        "BrokenHistory",
        "CancelRequest",
        "Cancelled",
        "Deadline",
        "IllegalTransition",
        "LoopError",
        "Machine",
        "MaxConsecutiveErrors",
        "MaxCost",
        "MaxSteps",
        "MaxTokens",
        "NoProgress",
        "Observation",
        "Refusal",
        "State",
        "Stop",
        "StopRule",
        "StopRules",
        "TERMINAL",
        "TRANSITIONS",
        "Tally",
        "Transition",
        "canonical_arguments",
        "check_transition",
        "fingerprint",
        "hint_for",
        "not_run",
        "observe",
    ],
    "execgate.client.mcpbridge": [
        "BadMeta",
        "Bridge",
        "BridgeConfig",
        "BridgeError",
        "IDEMPOTENCY_META",
        "NotLoopback",
        "StreamEnded",
        "serve_http",
        "serve_stdio",
    ],
    "execgate.client.models": [
        "AnthropicMessagesModel",
        "Message",
        "Model",
        "ModelBadResponse",
        "ModelError",
        "ModelRateLimited",
        "ModelRequestRejected",
        "ModelTool",
        "ModelUnavailable",
        "OpenAIChatModel",
        "Pricing",
        "ScriptExhausted",
        "ScriptedModel",
        "ToolCall",
        "ToolResult",
        "Turn",
        "Usage",
    ],
}


def _packages(top: str) -> list[str]:
    root = importlib.import_module(top)
    found = [top]
    for info in pkgutil.walk_packages(root.__path__, top + "."):
        if info.ispkg:
            found.append(info.name)
    return found


def test_every_package_is_listed() -> None:
    found = set(_packages("execgate.executor") + _packages("execgate.client"))
    assert sorted(found - set(EXPECTED)) == [], "packages to add to EXPECTED"
    assert sorted(set(EXPECTED) - found) == [], "packages in EXPECTED that no longer exist"


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_all_is_frozen(package: str) -> None:
    module = importlib.import_module(package)
    declared = getattr(module, "__all__", None)
    assert declared is not None, f"{package}/__init__.py has no __all__"
    assert len(declared) == len(set(declared)), f"{package}.__all__ lists a name twice"
    added = sorted(set(declared) - set(EXPECTED[package]))
    removed = sorted(set(EXPECTED[package]) - set(declared))
    assert (added, removed) == ([], []), (
        f"{package}.__all__ changed: added {added}, removed {removed}; if on purpose, "
        "update EXPECTED in tests/unit/test_public_surface.py"
    )
    assert EXPECTED[package] == sorted(EXPECTED[package]), "keep EXPECTED sorted"


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_every_name_in_all_imports(package: str) -> None:
    module = importlib.import_module(package)
    missing = []
    for name in module.__all__:
        if hasattr(module, name):
            continue
        try:  # a submodule listed in __all__
            importlib.import_module(f"{package}.{name}")
        except ImportError:
            missing.append(name)
    assert not missing, f"{package}.__all__ names what it does not have: {missing}"


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_star_import_gives_exactly_all(package: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {package} import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(importlib.import_module(package).__all__)
