"""Typed outcomes: the closed sets and records every call ends in.

An `Outcome` is what the daemon records in the journal and reports to the caller.
Every call gets exactly one. These types mirror `execgate.v1` but are plain frozen
dataclasses; `wire` converts at the edge.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, replace

from . import clock


class Status(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    REJECTED = "rejected"
    PARTIAL = "partial"
    UNKNOWN_OUTCOME = "unknown_outcome"


class ErrorClass(enum.Enum):
    NONE = "none"
    INVALID_ARGUMENT = "invalid_argument"
    UNKNOWN_TOOL = "unknown_tool"
    NOT_FOUND = "not_found"
    PERMISSION_DENIED = "permission_denied"
    POLICY_DENIED = "policy_denied"
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_EXPIRED = "approval_expired"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    SANDBOX_ERROR = "sandbox_error"
    INTERNAL = "internal"
    INTERRUPTED = "interrupted"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    NO_MATCH = "no_match"
    AMBIGUOUS_MATCH = "ambiguous_match"
    NONZERO_EXIT = "nonzero_exit"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    IO_ERROR = "io_error"
    # An MCP server's tool answered `isError`: it ran and said it failed.
    TOOL_ERROR = "tool_error"


class StopMode(enum.Enum):
    NOT_STARTED = "not_started"
    COMPLETED = "completed"
    COOPERATIVE = "cooperative"
    FORCE_TERMINATED = "force_terminated"
    INTERRUPTED = "interrupted"


class Phase(enum.Enum):
    QUEUED = "queued"
    LOCK_GRANTED = "lock_granted"
    STARTED = "started"
    CANCEL_REQUESTED = "cancel_requested"
    SIGNAL_SENT = "signal_sent"
    GRACE_EXPIRED = "grace_expired"
    FORCE_TERMINATED = "force_terminated"
    STOPPED = "stopped"
    FINISHED = "finished"
    RECOVERED = "recovered"
    WAITING = "waiting"


@dataclass(frozen=True, slots=True)
class Mark:
    """One moment in a call's life. `at` is wall-clock seconds since the epoch."""

    phase: Phase
    at: float
    detail: str = ""


def mark(phase: Phase, detail: str = "") -> Mark:
    return Mark(phase, clock.now(), detail)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The bounded view of a result that goes back to the model."""

    text: str = ""
    structured_json: str = ""
    truncated: bool = False
    returned_bytes: int = 0
    total_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Evidence:
    exit_code: int | None = None
    signal: int | None = None
    bytes_written: int | None = None
    bytes_read: int | None = None
    sha256_before: str | None = None
    sha256_after: str | None = None
    path: str = ""
    sandbox: str = ""
    oom_killed: bool | None = None
    survivors: int | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Status
    error_class: ErrorClass = ErrorClass.NONE
    message: str = ""
    field: str = ""
    result: ToolResult = dataclasses.field(default_factory=ToolResult)
    evidence: Evidence = dataclasses.field(default_factory=Evidence)
    timeline: tuple[Mark, ...] = ()
    stopped_how: StopMode = StopMode.COMPLETED

    def with_marks(self, *marks: Mark) -> Outcome:
        return replace(self, timeline=self.timeline + marks)


def rejected(error_class: ErrorClass, message: str, field: str = "") -> Outcome:
    """An outcome for a call that is guaranteed never to have started."""
    return Outcome(
        status=Status.REJECTED,
        error_class=error_class,
        message=message,
        field=field,
        stopped_how=StopMode.NOT_STARTED,
    )
