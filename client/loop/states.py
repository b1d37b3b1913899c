"""The run's state machine: its states, the legal moves between them, and the record of a move.

A run is a state machine, not a conversation: the transcript is input for the model, but
what the run is doing (and why it stopped) lives here, as data the daemon can persist and a
restarted client can replay. The model *proposes*; every proposal -- tool calls or a final
answer -- passes the `validating` gate, and only the harness moves the run.

The table is data, defined once in proto/execgate/v1/runstates.json and generated into
`execgate.v1.runstates` at build time (the daemon's Runs service and the TypeScript loop
read the same file). Edges (every other pair is illegal; `TRANSITIONS` is the table):

    from               to                  when
    -----------------  ------------------  -----------------------------------------------
    created            requesting_model    the run starts: the first model request
    requesting_model   validating          the model replied; every reply is a proposal
                                           (calls, or a final answer) and is checked
    validating         running_tools       at least one proposed call passed validation
    validating         awaiting_approval   a passed call needs a human's yes first
    validating         requesting_model    nothing runs: every call was refused, or the
                                           final answer was not accepted; the refusals go
                                           back to the model as observations
    validating         completed           the final answer was accepted (the only way in)
    awaiting_approval  running_tools       approved (some or all); the rest are observations
    awaiting_approval  requesting_model    all denied or expired: observations go back
    running_tools      requesting_model    the batch ended; its results are observations
    running_tools      awaiting_approval   the daemon parked a call of the batch (`ask` rule)
    any live state     waiting             suspended: the run persists and stops executing
    waiting            its resume state    resumed, see `RESUME_INTO`
    any non-terminal   failed, cancelled,  a stop rule (or the harness) ended the run;
                       budget_exhausted,   waiting included: a deadline or a cancel can
                       expired, escalated  end a suspended run
    terminal           (nothing)           terminal states are final

Decisions:

- No self-loops. A rejected final answer does not go requesting_model -> requesting_model:
  it is a proposal refused at the gate, recorded as validating -> requesting_model, exactly
  like a batch of refused calls. So every model request follows a recorded edge into
  `requesting_model`, and `completed` is reachable only through validation.
- Only `validating` may complete. Hitting a bound is never success: the stop states are
  reachable from everywhere, `completed` from one place.
- A suspended run resumes into the state it left (`RESUME_INTO`), so suspending cannot be
  used to skip a step (requesting_model -> waiting -> running_tools would bypass validation).
  The table allows the union of resume states; `Machine` enforces the one that applies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The table's data, generated from proto/execgate/v1/runstates.json (see the docstring).
from execgate.v1.runstates import LIVE, RESUME_INTO, STOPS, TERMINAL, TRANSITIONS, State

from .errors import Breakage, BrokenHistory, IllegalTransition

__all__ = [
    "LIVE",
    "RESUME_INTO",
    "STOPS",
    "TERMINAL",
    "TRANSITIONS",
    "BrokenHistory",
    "IllegalTransition",
    "Machine",
    "State",
    "Transition",
    "check_transition",
]


def check_transition(from_state: State, to_state: State) -> None:
    """Raise `IllegalTransition` unless the table has the edge."""
    if to_state not in TRANSITIONS[from_state]:
        raise IllegalTransition(from_state, to_state)


_JSON_KEYS = frozenset({"run_id", "seq", "time", "from", "to", "reason", "data"})


@dataclass(frozen=True)
class Transition:
    """One move of one run: the event persisted to the daemon.

    `seq` counts the run's transitions from 1 without gaps, so a reader can tell a complete
    history from one with records missing or written twice.
    """

    run_id: str
    seq: int
    # Wall-clock seconds since the epoch (a record for people and other hosts).
    at: float
    from_state: State
    to_state: State
    reason: str
    # JSON values only: what the move was about (call ids, the stop's figures, ...).
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "time": self.at,
            "from": self.from_state.value,
            "to": self.to_state.value,
            "reason": self.reason,
            "data": self.data,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Transition:
        """Parse a record; anything off (keys, types, state names) is `BrokenHistory`."""
        run_id = obj.get("run_id") if isinstance(obj.get("run_id"), str) else "?"
        seq = obj.get("seq") if _is_int(obj.get("seq")) else None

        def broken(detail: str) -> BrokenHistory:
            return BrokenHistory(str(run_id), seq, Breakage.MALFORMED, detail)

        if set(obj) != _JSON_KEYS:
            raise broken(f"keys {sorted(obj)}, expected {sorted(_JSON_KEYS)}")
        if not isinstance(obj["run_id"], str) or seq is None:
            raise broken("run_id must be a string and seq an integer")
        if not (_is_int(obj["time"]) or isinstance(obj["time"], float)):
            raise broken("time must be a number")
        if not isinstance(obj["reason"], str) or not isinstance(obj["data"], dict):
            raise broken("reason must be a string and data an object")
        try:
            from_state, to_state = State(obj["from"]), State(obj["to"])
        except ValueError as exc:
            raise broken(str(exc)) from exc
        return cls(
            run_id=obj["run_id"],
            seq=seq,
            at=float(obj["time"]),
            from_state=from_state,
            to_state=to_state,
            reason=obj["reason"],
            data=dict(obj["data"]),
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Machine:
    """One run's current state; the only way to change it is `advance`."""

    def __init__(self, run_id: str, *, clock: Callable[[], float] = time.time) -> None:
        self.run_id = run_id
        self._clock = clock
        self._state = State.CREATED
        # Invariant: next_seq == 1 + the number of transitions made (or replayed).
        self._next_seq = 1
        # Invariant: not None exactly while the state is WAITING; the state suspended from.
        self._suspended_from: State | None = None

    @property
    def state(self) -> State:
        return self._state

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def suspended_from(self) -> State | None:
        return self._suspended_from

    def check(self, to: State) -> None:
        """Raise `IllegalTransition` if `to` is not a legal move now (table + resume rule)."""
        check_transition(self._state, to)
        if self._state is State.WAITING and to not in STOPS:
            assert self._suspended_from is not None
            resume = RESUME_INTO[self._suspended_from]
            if to is not resume:
                detail = f"suspended from {self._suspended_from.value}, resumes into {resume.value}"
                raise IllegalTransition(self._state, to, detail)

    def advance(
        self,
        to: State,
        reason: str,
        data: Mapping[str, Any] | None = None,
        *,
        at: float | None = None,
    ) -> Transition:
        """Move to `to` and return the record to persist; on an illegal move nothing changes."""
        self.check(to)
        moved = Transition(
            run_id=self.run_id,
            seq=self._next_seq,
            at=self._clock() if at is None else at,
            from_state=self._state,
            to_state=to,
            reason=reason,
            data=dict(data or {}),
        )
        self._apply(moved)
        return moved

    def _apply(self, moved: Transition) -> None:
        self._suspended_from = moved.from_state if moved.to_state is State.WAITING else None
        self._state = moved.to_state
        self._next_seq = moved.seq + 1

    @classmethod
    def replay(cls, run_id: str, transitions: Iterable[Transition]) -> Machine:
        """Rebuild a run from its recorded transitions, in order, checking every one.

        Raises `BrokenHistory` if a record belongs to another run, a seq is skipped or
        repeated, a record does not start where the previous one ended, or an edge is illegal.
        """
        machine = cls(run_id)
        for moved in transitions:
            machine.record(moved)
        return machine

    def record(self, moved: Transition) -> None:
        """Take a transition made elsewhere (a record being appended to this run's
        history): checked as `replay` checks it, `BrokenHistory` if it does not fit."""
        self._check_record(moved)
        self._apply(moved)

    def _check_record(self, moved: Transition) -> None:
        def broken(kind: Breakage, detail: str) -> BrokenHistory:
            return BrokenHistory(self.run_id, moved.seq, kind, detail)

        if moved.run_id != self.run_id:
            raise broken(Breakage.FOREIGN, f"a record of run {moved.run_id!r}")
        if moved.seq < self._next_seq:
            raise broken(Breakage.DUPLICATE, f"expected seq {self._next_seq}")
        if moved.seq > self._next_seq:
            raise broken(Breakage.GAP, f"expected seq {self._next_seq}")
        if moved.from_state is not self._state:
            detail = f"starts from {moved.from_state.value}, the run was {self._state.value}"
            raise broken(Breakage.DISCONTINUOUS, detail)
        try:
            self.check(moved.to_state)
        except IllegalTransition as exc:
            raise broken(Breakage.ILLEGAL, str(exc)) from exc
