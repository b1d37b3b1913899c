"""A tool call as the daemon sees it, one frozen record per stage of the pipeline.

    CallRequest --validate--> ValidCall --authorize--> Authorized --approve--> Approved

Each stage takes the record the one before it returned and returns its own; nothing a
stage learns is written back onto the call's in-flight entry (inflight.Active keeps
only what a Cancel needs). A call refused on the way ends with the furthest record it
reached (`Reached`): its journal row and its trace say what was decided.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeAlias

from execgate.executor.core.approval import Approval
from execgate.executor.core.paths import Workspace
from execgate.executor.core.requests import CallRequest
from execgate.executor.journal.store import PolicyRecord
from execgate.executor.locks import Key, LockMode, plan
from execgate.executor.policy import Decision, PolicyInput
from execgate.executor.tools import Tool
from execgate.executor.tools.decl import SandboxDecl
from execgate.executor.tools.effects import CallEffects, unconfined

__all__ = ["Approved", "Authorized", "CallRequest", "Reached", "ValidCall"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidCall:
    """A request that passed validation: the tool exists and the arguments fit its schema."""

    request: CallRequest
    # The workspace the call works in (pipeline/workspaces.py chose it for its agent).
    workspace: Workspace
    tool: Tool
    args: dict[str, Any]
    # sha256 over the tool name and the canonical arguments; idempotency compares
    # it. Empty when the call has no idempotency key.
    request_hash: str
    timeout: float
    # Canonical paths of the path arguments, keyed by argument name.
    paths: dict[str, Path]
    # What it touches and whether it may change anything (resources.analyse).
    effects: CallEffects
    # The locks that implies (intention locks on ancestors included).
    lock_plan: Mapping[Key, LockMode]
    # Where the tool's declaration says it runs (a declared command's, an MCP
    # server's `sandbox:`); None for the built-ins.
    placement: SandboxDecl | None = None

    @property
    def may_write(self) -> bool:
        return self.effects.may_write

    def placed(self, confines: bool) -> ValidCall:
        """The call as it is scheduled where its sandbox does (`confines`) or does not
        keep it to the writes it declared: a declaration nobody enforces claims the
        whole workspace (effects.unconfined)."""
        if self.effects.confined is None or confines:
            return self
        effects = unconfined(self.effects, self.workspace)
        return replace(self, effects=effects, lock_plan=plan(effects.claims))


@dataclass(frozen=True, slots=True, kw_only=True)
class Authorized:
    """A valid call the policy decided (allow or ask; a deny is refused on this record)."""

    valid: ValidCall
    # What the policy decided on: tree tools ask again about each file with it, and
    # the sandbox is chosen by its agent and memberships.
    policy_input: PolicyInput
    decision: Decision
    # The decision as the journal keeps it (with the call, or with its approval).
    record: PolicyRecord
    # When the policy decided (epoch seconds), for the call's trace.
    span: tuple[float, float]

    @property
    def request(self) -> CallRequest:
        return self.valid.request


@dataclass(frozen=True, slots=True, kw_only=True)
class Approved:
    """An authorized call that may go to the lock queue: nothing asked, or approved."""

    authorized: Authorized
    # The approval it went through once settled (None when no rule asked).
    approval: Approval | None = None

    @property
    def valid(self) -> ValidCall:
        return self.authorized.valid

    @property
    def request(self) -> CallRequest:
        return self.authorized.valid.request


# The furthest record a call reached, for the ending that reports it (None: refused
# before the policy decided).
Reached: TypeAlias = Authorized | Approved | None
