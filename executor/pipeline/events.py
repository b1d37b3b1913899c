"""What an Execute stream carries: per-call events, and the batch that collects them."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.trace import SpanContext

from execgate.executor.core import clock
from execgate.executor.core.approval import Approval
from execgate.executor.core.outcomes import Outcome
from execgate.executor.policy import Decision

from .calls import CallRequest, Reached, ValidCall


class EventKind(enum.Enum):
    QUEUED = "queued"
    WAITING = "waiting"
    # A policy `ask` rule parked it until an approver decides (no locks held).
    AWAITING_APPROVAL = "awaiting_approval"
    STARTED = "started"
    # The running call's tool reported progress (an MCP server's notification).
    PROGRESS = "progress"
    FINISHED = "finished"
    # Never sent: the daemon is stopping while the call awaits approval, which stays
    # pending for the next daemon (see approve.py). Ends the call's part of the stream.
    DETACHED = "detached"
    # Never sent: the call's outcome could not be journaled (the journal failed), so
    # it is not reported either; the RPC ends with INTERNAL naming the call.
    UNRECORDED = "unrecorded"


# At most one PROGRESS event per call in this many seconds; a message cut to this length.
PROGRESS_EVERY = 0.1
PROGRESS_MESSAGE_CHARS = 1024

# The events that end a call's part of a stream.
ENDS = frozenset({EventKind.FINISHED, EventKind.DETACHED, EventKind.UNRECORDED})


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    call_id: str
    batch_id: str
    at: float
    # The call's position in its batch: how duplicate call ids are told apart.
    index: int = 0
    outcome: Outcome | None = None
    replay_of: str = ""
    # WAITING only: the rendered keys it conflicts on, and the owners it waits for.
    waiting: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    # AWAITING_APPROVAL only: the pending approval.
    approval: Approval | None = None
    # PROGRESS only: (progress, total or 0, message).
    progress: tuple[float, float, str] | None = None


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One call of an Explain: its validated form (or why it would be REJECTED)."""

    request: CallRequest
    call: ValidCall | None
    rejected: Outcome | None
    # Earlier calls of the batch it conflicts with, so would wait for.
    waits_for: tuple[str, ...]
    # The policy decision it would get (None when validation refused it first).
    decision: Decision | None = None


@dataclass(slots=True)
class Batch:
    """One Execute request in flight: its calls' events, in the order they happen."""

    run_id: str
    batch_id: str
    agent: str
    # False: the caller wants FINISHED events only; progress events are not built.
    progress: bool = True
    # The run's deadline (wall clock), if the request set one.
    deadline: float | None = None
    # The batch span's context (telemetry.attach): what its running calls pass on as
    # their trace (ToolContext.trace). None until attached.
    trace: SpanContext | None = None
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    # Told of every FINISHED outcome, reported or not, with the furthest stage record
    # the call reached (tracing builds the call's spans).
    on_finished: Callable[[CallRequest, Outcome, Reached], None] | None = None
    # turns[i] is set once calls 0..i have all asked for their locks (or ended
    # without): call i+1 asks only after that, so the lock queue sees the batch in
    # proposal order even when some calls take longer to validate (sql reads a
    # schema in a worker thread). Invariant: turns[i] set implies turns[i-1] set.
    turns: list[asyncio.Event] = field(default_factory=list)
    # done[i]: call i itself is past the point where order matters.
    done: list[bool] = field(default_factory=list)

    def start_turns(self, count: int) -> None:
        self.turns = [asyncio.Event() for _ in range(count)]
        self.done = [False] * count

    async def my_turn(self, index: int) -> None:
        if index > 0:
            await self.turns[index - 1].wait()

    def pass_turn(self, index: int) -> None:
        """Call `index` is queued for its locks, or will never be: let the next ones go."""
        self.done[index] = True
        i = index
        while i < len(self.turns) and self.done[i] and (i == 0 or self.turns[i - 1].is_set()):
            self.turns[i].set()
            i += 1

    def progress_of(self, req: CallRequest) -> Callable[[float, float | None, str], None]:
        """A running call's progress reporter: a PROGRESS event at most every
        PROGRESS_EVERY seconds (a tool that reports in a tight loop must not fill the
        stream's queue); reports in between are dropped."""
        last = [0.0]

        def report(progress: float, total: float | None, message: str) -> None:
            now = time.monotonic()
            if now - last[0] < PROGRESS_EVERY:
                return
            last[0] = now
            done = (float(progress), float(total or 0.0), message[:PROGRESS_MESSAGE_CHARS])
            self.emit(EventKind.PROGRESS, req, progress=done)

        return report

    def emit(
        self,
        kind: EventKind,
        req: CallRequest,
        outcome: Outcome | None = None,
        replay_of: str = "",
        waiting: tuple[tuple[str, ...], tuple[str, ...]] | None = None,
        approval: Approval | None = None,
        reached: Reached = None,
        progress: tuple[float, float, str] | None = None,
    ) -> None:
        if self.progress or kind in ENDS:
            at = clock.now()
            event = Event(
                kind,
                req.call_id,
                self.batch_id,
                at,
                req.index,
                outcome,
                replay_of,
                waiting,
                approval,
                progress,
            )
            self.events.put_nowait(event)
        # After the event is queued: the stream's task is woken first, so what
        # on_finished schedules (the call's spans) runs after the reply is sent.
        if kind is EventKind.FINISHED and outcome is not None and self.on_finished is not None:
            self.on_finished(req, outcome, reached)
