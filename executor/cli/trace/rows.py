"""One call's time: its timeline marks cut into segments, and how it was stopped.

A call's life is cut into contiguous segments at its timeline marks:

    queued ─ approval wait ─ queued ─ lock wait ─ queued ─ running ─ stopping
    (queued)  (ask rule)     (decided) (waiting)  (granted) (started) (cancel_requested
                                                                       → stopped → finished)

Approvals have no timeline mark of their own: a call an `ask` rule parked is known by its
policy decision; its wait runs from the approval record's creation to its decision (with
who decided) when the daemon returns the run's approvals, else from the run's
`awaiting_approval` transition naming it to the call reaching the lock queue.
`execgate kills` reads the `Ladder`s.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from execgate.client import CallRecord, Mark, Outcome
from execgate.executor.core.outcomes import Phase


@dataclass(frozen=True, slots=True)
class Note:
    """What is known of a call's approval: from the approval record (exact) when the
    daemon returned it (Approvals.List), else from the run's awaiting_approval move."""

    approval_id: str
    why: str
    # When the call was parked, and (from the record) decided; relative times.
    parked: float
    decided: float | None = None
    decided_by: str = ""
    state: str = ""


# call id -> its approval note.
Notes = Mapping[str, Note]


class Segment(enum.Enum):
    QUEUED = "queued"
    APPROVAL_WAIT = "approval_wait"
    LOCK_WAIT = "lock_wait"
    RUNNING = "running"
    # From the cancel request (or deadline) through signal, grace and force to the end.
    STOPPING = "stopping"


class StopCause(enum.Enum):
    """Why the daemon stopped a running call (read from its cancel_requested mark)."""

    CANCEL = "cancel"
    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class Moment:
    """A timeline mark at a time relative to the trace's origin."""

    phase: str
    at: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Span:
    kind: Segment
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Ladder:
    """How a running call was stopped. Times are relative to the trace's origin."""

    cause: StopCause
    # The cancel_requested mark's detail: "timeout after 1.5s", "<reason> (requested by X)".
    detail: str
    requested: float
    signal: float | None
    grace_expired: float | None
    forced: float | None
    stopped: float | None
    # SIGKILL - SIGTERM: the grace the call actually had (None: not forced).
    grace_used: float | None
    force_how: str = ""


@dataclass(frozen=True, slots=True)
class ApprovalWait:
    approval_id: str
    # The rule and its reason ("rule <id>: <reason>").
    why: str
    start: float
    end: float
    # From the approval record, when known: approved/denied/expired, and by whom.
    state: str = ""
    decided_by: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One call. Times are seconds from the trace's origin; None: the mark is absent."""

    call_id: str
    tool: str
    agent: str
    arguments_json: str
    # A status value ("success", ...) or "running" while the journal has no outcome.
    status: str
    error_class: str
    message: str
    stopped_how: str
    exit_code: int | None
    signal: int | None
    oom_killed: bool | None
    survivors: int | None
    queued: float
    started: float | None
    finished: float | None
    spans: tuple[Span, ...]
    # Invariant: `lock_wait` is set exactly when a LOCK_WAIT span exists.
    lock_wait: float | None
    waited_behind: tuple[str, ...]
    approval: ApprovalWait | None
    ladder: Ladder | None
    # Every mark, in timeline order.
    marks: tuple[Moment, ...]


def call_row(
    record: CallRecord,
    origin: float,
    notes: Notes | None = None,
    *,
    open_end: float = 0.0,
) -> Row:
    """One call's row; `origin` 0 keeps epoch times (`execgate kills`)."""
    o = record.outcome
    if o is None:
        return _running_row(record, origin, open_end)
    marks = tuple(Moment(m.phase, m.at - origin, m.detail) for m in o.timeline)
    at = _first_marks(o.timeline, origin)
    queued = at.get(Phase.QUEUED, record.created_at - origin)
    note = (notes or {}).get(record.call_id)
    asked = record.policy is not None and record.policy.effect == "ask"
    approval = _approval(at, queued, note) if asked else None
    spans = _spans(at, queued, approval)
    waiting = at.get(Phase.WAITING)
    lock = next((s for s in spans if s.kind is Segment.LOCK_WAIT), None)
    return Row(
        call_id=record.call_id,
        tool=record.tool,
        agent=record.agent,
        arguments_json=record.arguments_json,
        status=o.status.value,
        error_class=o.error_class,
        message=o.message,
        stopped_how=o.stopped_how.value,
        exit_code=o.evidence.exit_code,
        signal=o.evidence.signal,
        oom_killed=o.evidence.oom_killed,
        survivors=o.evidence.survivors,
        queued=queued,
        started=at.get(Phase.STARTED),
        finished=at.get(Phase.FINISHED),
        spans=spans,
        lock_wait=lock.seconds if lock is not None else None,
        waited_behind=_behind(o) if waiting is not None else (),
        approval=approval,
        ladder=_ladder(o, at),
        marks=marks,
    )


def _running_row(record: CallRecord, origin: float, open_end: float) -> Row:
    """A call the journal has no outcome for yet: running since it was recorded."""
    start = record.created_at - origin
    return Row(
        call_id=record.call_id,
        tool=record.tool,
        agent=record.agent,
        arguments_json=record.arguments_json,
        status="running",
        error_class="",
        message="",
        stopped_how="",
        exit_code=None,
        signal=None,
        oom_killed=None,
        survivors=None,
        queued=start,
        started=None,
        finished=None,
        spans=(Span(Segment.RUNNING, start, max(open_end, start)),),
        lock_wait=None,
        waited_behind=(),
        approval=None,
        ladder=None,
        marks=(),
    )


def _first_marks(timeline: Iterable[Mark], origin: float) -> dict[Phase, float]:
    """The first time of each known phase (a daemon newer than this CLI may add phases)."""
    at: dict[Phase, float] = {}
    for m in timeline:
        try:
            at.setdefault(Phase(m.phase), m.at - origin)
        except ValueError:
            continue
    return at


def _approval(at: Mapping[Phase, float], queued: float, note: Note | None) -> ApprovalWait:
    note = note or Note("", "", queued)
    start = max(note.parked, queued)
    if note.decided is not None:  # the record's own times
        return ApprovalWait(
            note.approval_id, note.why, start, max(note.decided, start), note.state, note.decided_by
        )
    after = (Phase.WAITING, Phase.LOCK_GRANTED, Phase.STARTED, Phase.CANCEL_REQUESTED)
    end = min([at[p] for p in after if p in at] or [at.get(Phase.FINISHED, start)])
    return ApprovalWait(note.approval_id, note.why, min(start, end), end)


def _spans(
    at: Mapping[Phase, float], queued: float, approval: ApprovalWait | None
) -> tuple[Span, ...]:
    """Contiguous segments between the change points, empty ones dropped."""
    points: list[tuple[float, Segment]] = [(queued, Segment.QUEUED)]
    if approval is not None:
        points += [(approval.start, Segment.APPROVAL_WAIT), (approval.end, Segment.QUEUED)]
    if Phase.WAITING in at:
        points.append((at[Phase.WAITING], Segment.LOCK_WAIT))
        if Phase.LOCK_GRANTED in at:
            points.append((at[Phase.LOCK_GRANTED], Segment.QUEUED))
    started = at.get(Phase.STARTED)
    if started is not None:
        points.append((started, Segment.RUNNING))
        cancel = at.get(Phase.CANCEL_REQUESTED)
        if cancel is not None:
            points.append((max(cancel, started), Segment.STOPPING))
    end = max([at.get(Phase.FINISHED, queued), *(t for t, _ in points)])
    points.sort(key=lambda p: p[0])  # stable: equal times keep their causal order
    spans: list[Span] = []
    for (start, kind), (stop, _) in zip(points, [*points[1:], (end, Segment.QUEUED)], strict=True):
        if stop <= start:
            continue
        if spans and spans[-1].kind is kind:
            spans[-1] = Span(kind, spans[-1].start, stop)
        else:
            spans.append(Span(kind, start, stop))
    return tuple(spans)


def _behind(o: Outcome) -> tuple[str, ...]:
    """The calls ("run/call") a waiting mark names: "behind run/a, run/b"."""
    waits = [m.detail for m in o.timeline if m.phase == Phase.WAITING.value]
    names: list[str] = []
    for detail in waits:
        for name in detail.removeprefix("behind ").split(", "):
            if name and name not in names:
                names.append(name)
    return tuple(names)


def _ladder(o: Outcome, at: Mapping[Phase, float]) -> Ladder | None:
    requested = at.get(Phase.CANCEL_REQUESTED)
    if requested is None or Phase.STARTED not in at:
        return None
    asked = o.mark(Phase.CANCEL_REQUESTED.value)
    forced = o.mark(Phase.FORCE_TERMINATED.value)
    detail = asked.detail if asked is not None else ""
    return Ladder(
        cause=stop_cause(detail, o.error_class),
        detail=detail,
        requested=requested,
        signal=at.get(Phase.SIGNAL_SENT),
        grace_expired=at.get(Phase.GRACE_EXPIRED),
        forced=at.get(Phase.FORCE_TERMINATED),
        stopped=at.get(Phase.STOPPED),
        grace_used=_minus(at.get(Phase.FORCE_TERMINATED), at.get(Phase.SIGNAL_SENT)),
        force_how=forced.detail if forced is not None else "",
    )


def _minus(later: float | None, earlier: float | None) -> float | None:
    return later - earlier if later is not None and earlier is not None else None


def stop_cause(detail: str, error_class: str) -> StopCause:
    """Deadlines say "timeout after …"; the daemon's drain says "daemon shutting down"."""
    if "daemon shutting down" in detail:
        return StopCause.SHUTDOWN
    if error_class == "timeout" or detail.startswith("timeout"):
        return StopCause.TIMEOUT
    return StopCause.CANCEL
