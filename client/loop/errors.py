"""Exceptions of the loop core.

    ExecgateClientError          root of the client (execgate.client.errors)
    └── LoopError                root of execgate.client.loop
        ├── IllegalTransition    a move the transition table (or the resume rule) forbids;
        │                        carries `from_state`, `to_state`
        └── BrokenHistory        recorded transitions that cannot be one run's history;
                                 carries `run_id`, `seq`, `kind` (a `Breakage`)

Both are programming or storage faults, never a tool's failure: a tool that fails is an
Outcome, and a run that must stop is a `Stop`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from ..errors import ExecgateClientError

if TYPE_CHECKING:
    from .states import State


class LoopError(ExecgateClientError):
    """Root of the loop core's exceptions."""


class IllegalTransition(LoopError):
    def __init__(self, from_state: State, to_state: State, detail: str = "") -> None:
        message = f"illegal transition {from_state.value} -> {to_state.value}"
        super().__init__(f"{message}: {detail}" if detail else message)
        self.from_state = from_state
        self.to_state = to_state
        self.detail = detail


class Breakage(enum.StrEnum):
    """How a recorded history is broken."""

    # A transition record that does not parse (missing key, wrong type, unknown state).
    MALFORMED = "malformed"
    # A record of another run.
    FOREIGN = "foreign"
    # A seq was skipped: at least one transition is missing.
    GAP = "gap"
    # A seq seen before (a record written twice, or out of order).
    DUPLICATE = "duplicate"
    # The record's from-state is not the state the run was in.
    DISCONTINUOUS = "discontinuous"
    # The edge itself is illegal (the IllegalTransition is chained as __cause__).
    ILLEGAL = "illegal"


class BrokenHistory(LoopError):
    def __init__(self, run_id: str, seq: int | None, kind: Breakage, detail: str) -> None:
        where = f"run {run_id!r}" + (f" seq {seq}" if seq is not None else "")
        super().__init__(f"{where}: {kind.value} history: {detail}")
        self.run_id = run_id
        self.seq = seq
        self.kind = kind
        self.detail = detail
