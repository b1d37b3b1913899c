"""A tool call as the daemon sees it, from request to validated call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CallRequest", "ValidCall"]

from execgate.executor.core.requests import CallRequest
from execgate.executor.locks import Key, LockMode
from execgate.executor.tools import Tool
from execgate.executor.tools.effects import CallEffects


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidCall:
    """A request that passed validation: the tool exists and the arguments fit its schema."""

    request: CallRequest
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

    @property
    def may_write(self) -> bool:
        return self.effects.may_write
