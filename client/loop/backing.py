"""What backs a completion, and what a turn's stop reason leads to.

A `completed` run says what stands behind it: whether a verifier ran, which one, and what
it found (`Verification`); and what a reader should know before trusting it (`caveats`):
calls of the run that did not succeed, and calls whose effect is still unknown. Without a
verifier a completion is *unverified*, and the record, `execgate runs show` and the trace
page say so.

A turn's `Ending` decides its path (docs/loop.md, "Why a turn stopped"): only a turn the
model ended itself can be an answer; a truncated, refused or unknown ending ends the run
`failed` with its own rule; a paused turn is continued.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..models.base import Ending, Turn
from ..types import Outcome, Status
from .record import Planned
from .tally import canonical_arguments

__all__ = ["Path", "Verification", "caveats", "path_of", "verifier_name"]


class Path(enum.Enum):
    """What the loop does with a model turn."""

    ANSWER = "answer"
    CALLS = "calls"
    CONTINUE = "continue"
    # End the run `failed`, with the rule named by `FAIL_RULES`.
    FAIL = "fail"


FAIL_RULES = {
    Ending.TRUNCATED: "truncated",
    Ending.REFUSED: "refused",
    Ending.UNKNOWN: "unexpected_stop",
    # tool_use with no call the adapter could read.
    Ending.TOOL_USE: "unexpected_stop",
}


def path_of(turn: Turn) -> Path:
    ending = turn.ending
    match ending:
        case Ending.TRUNCATED | Ending.REFUSED | Ending.UNKNOWN:
            # A cut-off turn's calls may have cut-off arguments: none of them runs.
            return Path.FAIL
        case Ending.PAUSED:
            return Path.CALLS if turn.tool_calls else Path.CONTINUE
        case Ending.END | Ending.TOOL_USE:
            if turn.tool_calls:
                return Path.CALLS
            return Path.ANSWER if ending is Ending.END else Path.FAIL


def fail_reason(turn: Turn) -> str:
    said = turn.stop_reason or "(none)"
    match turn.ending:
        case Ending.TRUNCATED:
            return f"the model's turn was cut off (stop reason {said}): not an answer"
        case Ending.REFUSED:
            return f"the provider refused the turn (stop reason {said}): not an answer"
        case _:
            return f"the model's turn stopped for a reason the loop cannot act on: {said}"


@dataclass(frozen=True, slots=True)
class Verification:
    """Whether a verifier backed the answer: `verifier` "" means none was configured."""

    verifier: str
    verified: bool
    finding: str = ""

    @property
    def label(self) -> str:
        return f"verified by {self.verifier}" if self.verified else "unverified"

    def to_json(self) -> dict[str, Any]:
        return {"verifier": self.verifier, "verified": self.verified, "finding": self.finding}

    @classmethod
    def from_json(cls, data: Any) -> Verification | None:
        if not isinstance(data, dict):
            return None
        return cls(
            str(data.get("verifier", "")), bool(data.get("verified")), str(data.get("finding", ""))
        )


UNVERIFIED = Verification("", False, "no verifier was configured")


def verifier_name(verifier: object) -> str:
    """A function's name; for a callable object, its class's name."""
    name = getattr(verifier, "__name__", "") or type(verifier).__name__
    return str(name)


def caveats(done: Sequence[tuple[Planned, Outcome]]) -> list[str]:
    """What a reader of a completion should know: calls that did not succeed (and were
    not followed by the same call succeeding), and UNKNOWN_OUTCOMEs left unreconciled."""
    failed: list[str] = []
    unknown: list[str] = []
    for i, (planned, outcome) in enumerate(done):
        if outcome.status is Status.SUCCESS or _retried_ok(done, i):
            continue
        (unknown if outcome.status is Status.UNKNOWN_OUTCOME else failed).append(
            f"{planned.call_id} {planned.tool} {outcome.status.value}"
        )
    notes = []
    if failed:
        notes.append(f"answer followed {len(failed)} failed call(s): " + ", ".join(failed))
    if unknown:
        notes.append(
            f"{len(unknown)} call(s) with an unknown outcome left unreconciled: "
            + ", ".join(unknown)
        )
    return notes


def _retried_ok(done: Sequence[tuple[Planned, Outcome]], i: int) -> bool:
    planned = done[i][0]
    key = (planned.tool, canonical_arguments(planned.arguments))
    return any(
        (p.tool, canonical_arguments(p.arguments)) == key and o.status is Status.SUCCESS
        for p, o in done[i + 1 :]
    )
