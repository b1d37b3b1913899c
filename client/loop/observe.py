"""What the model sees of each tool call: a bounded text that keeps the outcome's meaning.

Flattening every ending into "something went wrong" makes the model guess whether to
retry. So each observation keeps the status and error class, and adds a short hint saying
what kind of next move makes sense: fix and call again, look elsewhere, do not retry, or
-- for an unknown outcome -- reconcile before doing anything twice.

Error classes come from the daemon (the proto's `ErrorClass`, lower-cased by
`execgate.client.wire`) or from the loop itself (`Refusal`), for calls it never sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from execgate.v1.runstates import DAEMON_HINTS, FALLBACK_HINTS, REFUSAL_HINTS, STATUS_HINTS, Refusal

from ..types import Outcome, Status

__all__ = [
    "DAEMON_HINTS",
    "DEFAULT_CAP",
    "REFUSAL_HINTS",
    "Observation",
    "Refusal",
    "bound",
    "hint_for",
    "not_run",
    "observe",
]

DEFAULT_CAP = 4000
# Below this a cut text would be mostly marker.
_MIN_CAP = 64


# The hints, and the loop's own refusals, are data: proto/execgate/v1/runstates.json,
# generated into execgate.v1.runstates (the TypeScript loop's are generated from the same file).
# `DAEMON_HINTS`: one hint per error class the daemon emits (the proto's ErrorClass, minus
# unspecified). `REFUSAL_HINTS`: one per `Refusal`.
# These statuses say more than any error class, so their hint wins.
_STATUS_HINTS: Mapping[str, str] = STATUS_HINTS
# For an error class this client does not know (a newer daemon): go by the status.
_FALLBACK: Mapping[str, str] = FALLBACK_HINTS
_HINTS: Mapping[str, str] = {**DAEMON_HINTS, **{r.value: h for r, h in REFUSAL_HINTS.items()}}


def hint_for(status: str, error_class: str) -> str:
    """A short hint for the model's next move; "" when there is nothing to add."""
    if status in _STATUS_HINTS:
        return _STATUS_HINTS[status]
    return _HINTS.get(error_class) or _FALLBACK.get(status, _FALLBACK[Status.FAILURE.value])


def bound(text: str, cap: int = DEFAULT_CAP) -> str:
    """`text` cut to at most `cap` characters, keeping its head and tail.

    The middle gives way: a command's first lines say what ran, its last lines how it
    ended. The marker says how many characters were cut.
    """
    if cap < _MIN_CAP:
        raise ValueError(f"cap must be at least {_MIN_CAP} characters, got {cap}")
    if len(text) <= cap:
        return text
    # The marker's length depends on the count it shows; size it with the worst case.
    room = cap - len(_marker(len(text)))
    head = (room + 1) // 2
    tail = room - head
    return text[:head] + _marker(len(text) - room) + (text[-tail:] if tail else "")


def _marker(cut: int) -> str:
    return f"\n[... {cut} chars cut ...]\n"


@dataclass(frozen=True)
class Observation:
    """One call's result as the model will see it."""

    call_id: str
    tool: str
    status: str
    error_class: str
    # Bounded (see `bound`).
    text: str
    hint: str
    # Anything but success or partial: the flag providers' tool-result blocks carry.
    is_error: bool

    def render(self) -> str:
        """A compact text: status and error class, the hint, then the text."""
        head = self.status
        if self.error_class not in ("", "none"):
            head += f": {self.error_class}"
        lines = [f"[{head}]" + (f" {self.hint}" if self.hint else "")]
        lines.append(self.text or "(no output)")
        return "\n".join(lines)


def _body(outcome: Outcome) -> str:
    parts: list[str] = []
    if outcome.message:
        parts.append(f"{outcome.field}: {outcome.message}" if outcome.field else outcome.message)
    if outcome.text:
        parts.append(outcome.text)
    elif outcome.structured:
        parts.append(json.dumps(outcome.structured, ensure_ascii=False, sort_keys=True))
    if outcome.truncated and outcome.total_bytes:
        parts.append(f"[returned {outcome.returned_bytes} of {outcome.total_bytes} bytes]")
    if outcome.replay_of:
        parts.append(f"[the result of an earlier call, {outcome.replay_of}]")
    return "\n".join(parts)


def observe(outcome: Outcome, tool: str, *, cap: int = DEFAULT_CAP) -> Observation:
    """The observation of a call the daemon answered."""
    status = outcome.status.value
    return Observation(
        call_id=outcome.call_id,
        tool=tool,
        status=status,
        error_class=outcome.error_class,
        text=bound(_body(outcome), cap),
        hint=hint_for(status, outcome.error_class),
        is_error=outcome.status not in (Status.SUCCESS, Status.PARTIAL),
    )


def not_run(call_id: str, tool: str, reason: str, error_class: str) -> Observation:
    """The observation of a call the loop refused itself (status "rejected").

    `error_class` is a `Refusal`, or a daemon class when the loop checks the same thing
    (e.g. "invalid_argument" for arguments that are not JSON).
    """
    status = Status.REJECTED.value
    return Observation(
        call_id=call_id,
        tool=tool,
        status=status,
        error_class=str(error_class),
        text=bound(reason),
        hint=hint_for(status, error_class),
        is_error=True,
    )
