"""The run-state machine as the daemon checks it: a run's recorded moves, and whether a
move may follow them.

The table is data, defined once in proto/execgate/v1/runstates.json and generated into
`execgate.v1.runstates` at build time; the client loops (Python and TypeScript) are built
from the same file, so a history any of them writes is one the daemon accepts, and the
daemon never imports the client. The rules checked here are the Python loop's
`Machine.record` rules, word for word in their messages:

- a record of this run, with the next seq (no gap, no duplicate),
- starting from the state the run is in,
- along an edge of the table; a suspended run (`waiting`) resumes only into the state it
  left (`RESUME_INTO`), or stops.

Exceptions:

    ExecgateError        (core.errors)
    └── BrokenHistory    recorded moves that cannot be one run's history; carries
                         `run_id`, `seq`, `kind` (a `Breakage`) and `detail`
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from execgate.v1.runstates import LIMIT_KEYS, RESUME_INTO, STOPS, TERMINAL, TRANSITIONS, State

from .errors import ExecgateError

__all__ = [
    "LIMIT_KEYS",
    "TERMINAL",
    "Breakage",
    "BrokenHistory",
    "History",
    "State",
    "Transition",
]


@dataclass(frozen=True, slots=True)
class Transition:
    """One move of one run, as the Runs service stores it (runs.proto `RunEvent`).

    `seq` counts the run's moves from 1 without gaps.
    """

    run_id: str
    seq: int
    # Wall-clock seconds since the epoch.
    at: float
    from_state: State
    to_state: State
    reason: str
    # JSON values only.
    data: dict[str, Any] = field(default_factory=dict)


class Breakage(enum.StrEnum):
    """How a history is broken (the Runs service's refusal kinds of the same names)."""

    # A record of another run.
    FOREIGN = "foreign"
    # A seq was skipped: at least one move is missing.
    GAP = "gap"
    # A seq seen before (a record written twice, or out of order).
    DUPLICATE = "duplicate"
    # The record's from-state is not the state the run was in.
    DISCONTINUOUS = "discontinuous"
    # The table (or the resume rule) has no such edge.
    ILLEGAL = "illegal"


class BrokenHistory(ExecgateError):
    def __init__(self, run_id: str, seq: int | None, kind: Breakage, detail: str) -> None:
        where = f"run {run_id!r}" + (f" seq {seq}" if seq is not None else "")
        super().__init__(f"{where}: {kind.value} history: {detail}")
        self.run_id = run_id
        self.seq = seq
        self.kind = kind
        self.detail = detail


class History:
    """Where one run's recorded moves have left it; `record` takes the next one."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.state = State.CREATED
        # Invariant: next_seq == 1 + the number of moves recorded.
        self.next_seq = 1
        # Invariant: not None exactly while the state is WAITING; the state suspended from.
        self.suspended_from: State | None = None

    @classmethod
    def replay(cls, run_id: str, moves: Iterable[Transition]) -> History:
        """The run after `moves`, each checked in order (`BrokenHistory` if one breaks it)."""
        history = cls(run_id)
        for moved in moves:
            history.record(moved)
        return history

    def record(self, moved: Transition) -> None:
        """Take the run's next move, or raise `BrokenHistory` and change nothing."""
        self._check(moved)
        self.suspended_from = moved.from_state if moved.to_state is State.WAITING else None
        self.state = moved.to_state
        self.next_seq = moved.seq + 1

    def _check(self, moved: Transition) -> None:
        def broken(kind: Breakage, detail: str) -> BrokenHistory:
            return BrokenHistory(self.run_id, moved.seq, kind, detail)

        if moved.run_id != self.run_id:
            raise broken(Breakage.FOREIGN, f"a record of run {moved.run_id!r}")
        if moved.seq < self.next_seq:
            raise broken(Breakage.DUPLICATE, f"expected seq {self.next_seq}")
        if moved.seq > self.next_seq:
            raise broken(Breakage.GAP, f"expected seq {self.next_seq}")
        if moved.from_state is not self.state:
            detail = f"starts from {moved.from_state.value}, the run was {self.state.value}"
            raise broken(Breakage.DISCONTINUOUS, detail)
        if illegal := self._illegal(moved.to_state):
            raise broken(Breakage.ILLEGAL, illegal)

    def _illegal(self, to: State) -> str:
        """Why `to` may not follow now ("" if it may): the loop's IllegalTransition text."""
        move = f"illegal transition {self.state.value} -> {to.value}"
        if to not in TRANSITIONS[self.state]:
            return move
        if self.state is State.WAITING and to not in STOPS:
            assert self.suspended_from is not None
            resume = RESUME_INTO[self.suspended_from]
            if to is not resume:
                left = self.suspended_from.value
                return f"{move}: suspended from {left}, resumes into {resume.value}"
        return ""
