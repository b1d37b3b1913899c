"""A run as rows of time: what each call spent its time on, and how the run ended.

Pure: `trace(detail)` turns a `RunDetail` (GetRun: the run, its transitions, its calls)
into a `Trace` that `cli_trace` draws in a terminal and `trace_html` as a page. Nothing
here talks to a daemon or a terminal. A call's row is `timeline_calls.call_row`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from execgate.client import Approval, RunDetail
from execgate.client.loop.states import TERMINAL, State, Transition

from .rows import Note, Row, call_row


@dataclass(frozen=True, slots=True)
class StateTime:
    state: str
    seconds: float
    entered: int


@dataclass(frozen=True, slots=True)
class Stop:
    """The run's terminal transition: state, reason, the stop rule that fired ("" if none)."""

    state: str
    reason: str
    rule: str
    at: float
    evidence: Mapping[str, object]
    # A completion's backing ("verified by NAME: finding", "unverified"; "" for other ends
    # and for runs recorded before completions said), and what a reader should know.
    backing: str = ""
    caveats: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    run_id: str
    goal: str
    owner: str
    model: str
    state: str
    # Epoch seconds every other time is relative to: the run's start.
    origin: float
    # The last moment the trace knows of (relative).
    end: float
    rows: tuple[Row, ...]
    transitions: int
    states: tuple[StateTime, ...]
    # None while the run has not ended.
    stop: Stop | None
    cancel: str = ""


def trace(detail: RunDetail, records: Iterable[Approval] = ()) -> Trace:
    """`records`: the run's approvals (Approvals.List), for exact waits and deciders."""
    run = detail.run
    starts = [t for t in (run.created_at, *(e.at for e in detail.events[:1])) if t > 0]
    starts += [c.created_at for c in detail.calls]
    origin = min(starts, default=0.0)
    notes = approvals(detail.events, origin, records)
    last = max([run.updated_at, *(e.at for e in detail.events)], default=origin) - origin
    rows = tuple(call_row(c, origin, notes, open_end=last) for c in detail.calls)
    end = max([last, *(r.finished or r.queued for r in rows)], default=0.0)
    cancel = run.cancel
    return Trace(
        run_id=run.run_id,
        goal=run.goal,
        owner=run.owner,
        model=run.model,
        state=run.state.value,
        origin=origin,
        end=max(end, 0.0),
        rows=rows,
        transitions=len(detail.events),
        states=time_by_state(detail.events),
        stop=_stop(detail.events, origin),
        cancel=f"{cancel.reason} (by {cancel.requester})" if cancel is not None else "",
    )


def approvals(
    events: Iterable[Transition], origin: float, records: Iterable[Approval] = ()
) -> dict[str, Note]:
    """call id -> its approval: from the records when given, else from the run's
    awaiting_approval moves."""
    found: dict[str, Note] = {}
    for e in events:
        call_id = e.data.get("call_id")
        if e.to_state is State.AWAITING_APPROVAL and isinstance(call_id, str):
            found[call_id] = Note(str(e.data.get("approval_id", "")), e.reason, e.at - origin)
    for a in records:
        decided = a.decided_at - origin if a.decided_at is not None else None
        why = f"rule {a.rule_id}: {a.reason}"
        found[a.call_id] = Note(
            a.approval_id, why, a.created_at - origin, decided, a.decided_by, a.state.value
        )
    return found


def time_by_state(events: Iterable[Transition]) -> tuple[StateTime, ...]:
    """Seconds the run spent in each state it entered, in order of first entry."""
    spent: dict[str, list[float]] = {}
    ordered = list(events)
    if not ordered:  # a run only calls used has no transitions
        return ()
    for e, after in zip(ordered, [*ordered[1:], None], strict=True):
        if e.to_state in TERMINAL:
            continue
        entry = spent.setdefault(e.to_state.value, [0.0, 0])
        entry[0] += (after.at - e.at) if after is not None else 0.0
        entry[1] += 1
    return tuple(StateTime(state, s, int(n)) for state, (s, n) in spent.items())


def _stop(events: tuple[Transition, ...], origin: float) -> Stop | None:
    if not events or events[-1].to_state not in TERMINAL:
        return None
    last = events[-1]
    evidence = last.data.get("evidence")
    return Stop(
        state=last.to_state.value,
        reason=last.reason,
        rule=str(last.data.get("rule", "")),
        at=last.at - origin,
        evidence=evidence if isinstance(evidence, dict) else {},
        backing=_backing(last.data.get("verification")),
        caveats=tuple(str(c) for c in last.data.get("caveats", ()) if isinstance(c, str)),
    )


def _backing(check: object) -> str:
    if not isinstance(check, dict):
        return ""
    if not check.get("verified"):
        return "unverified: no verifier ran"
    finding = f": {check['finding']}" if check.get("finding") else ""
    return f"verified by {check.get('verifier')}{finding}"
