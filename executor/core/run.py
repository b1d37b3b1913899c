"""A run as the daemon records it (runs.proto `Run`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .requests import DEFAULT_WORKSPACE
from .runstate import TERMINAL, State


@dataclass(frozen=True, slots=True)
class CancelAsk:
    requester: str
    reason: str
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    run_id: str
    goal: str
    owner: str
    limits: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    config_version: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    state: str = State.CREATED.value
    reason: str = ""
    last_seq: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    cancel: CancelAsk | None = None
    # The workspace its calls work in (bound at StartRun; pipeline/workspaces.py).
    workspace: str = DEFAULT_WORKSPACE

    @property
    def terminal(self) -> bool:
        return State(self.state) in TERMINAL
