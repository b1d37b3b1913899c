"""The words of a trace: each call's phases as one sentence, the run's states and stop.

Shared by the terminal view (`cli_trace`) and the HTML page (`trace_html`).
"""

from __future__ import annotations

import datetime

from .rows import Row, Segment
from .timeline import Trace

CANCEL_GLYPH, FORCE_GLYPH = "▲", "✖"


def phases(row: Row, run_id: str) -> str:
    """queued +t → [approval wait] → [lock wait] → running → [▲ … ✖ …] → outcome."""
    parts = [f"queued +{row.queued:.3f}s"]
    if row.approval is not None:
        a = row.approval
        by = f"{a.state} by {a.decided_by}" if a.decided_by else a.state
        what = "; ".join(x for x in (a.approval_id, a.why, by) if x) or "ask rule"
        parts.append(f"approval wait {dur(a.end - a.start)} ({what})")
    if row.lock_wait is not None:
        behind = ", ".join(b.removeprefix(run_id + "/") for b in row.waited_behind)
        parts.append(f"lock wait {dur(row.lock_wait)}" + (f" behind {behind}" if behind else ""))
    running = sum(s.seconds for s in row.spans if s.kind is Segment.RUNNING)
    if row.started is not None:
        parts.append(f"running {dur(running)} from +{row.started:.3f}s")
    if row.ladder is not None:
        parts += ladder_parts(row)
    parts.append(outcome(row))
    return " → ".join(parts)


def ladder_parts(row: Row) -> list[str]:
    lad = row.ladder
    assert lad is not None
    parts = [f"{CANCEL_GLYPH} {lad.cause.value} requested +{lad.requested:.3f}s ({lad.detail})"]
    if lad.signal is not None:
        parts.append(f"SIGTERM {dur(lad.signal - lad.requested)} later")
    if lad.forced is not None and lad.grace_used is not None:
        parts.append(f"{FORCE_GLYPH} force kill after {dur(lad.grace_used)} grace")
    if lad.stopped is not None:
        parts.append(f"stopped +{lad.stopped:.3f}s")
    return parts


def outcome(row: Row) -> str:
    if row.status == "running":
        return "still running"
    text = row.status + ("" if row.error_class == "none" else f"/{row.error_class}")
    facts = [row.stopped_how] if row.stopped_how not in ("completed", "") else []
    if row.exit_code is not None:
        facts.append(f"exit {row.exit_code}")
    if row.signal is not None:
        facts.append(f"signal {row.signal}")
    if row.oom_killed:
        facts.append("OOM-killed")
    if row.survivors is not None and row.stopped_how not in ("completed", "not_started"):
        facts.append(f"survivors {row.survivors}")
    return text + (f" ({', '.join(facts)})" if facts else "")


def states(t: Trace) -> str:
    spent = " · ".join(f"{s.state} {dur(s.seconds)} x{s.entered}" for s in t.states)
    return f"transitions: {t.transitions}" + (f" · {spent}" if spent else "")


def stop_line(t: Trace) -> str:
    if t.stop is None and t.state == "no run record":
        return "no run record: calls made under this run id without the Runs service"
    if t.stop is None:
        return f"not ended: state {t.state}" + (f"; cancel asked: {t.cancel}" if t.cancel else "")
    s = t.stop
    line = f"stop: {s.state} at +{s.at:.3f}s — {s.reason}"
    if s.rule:
        line += f" (rule {s.rule}"
        line += f": {', '.join(f'{k} {v}' for k, v in s.evidence.items())})" if s.evidence else ")"
    return line + (f"; cancel asked: {t.cancel}" if t.cancel else "")


def when_zoned(seconds: float) -> str:
    """Local time with its zone, to the millisecond: `2026-12-02 03:21:48.212 UTC+00:00`."""
    moment = datetime.datetime.fromtimestamp(seconds).astimezone()
    offset = moment.strftime("%z")
    clock = moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"{clock} UTC{offset[:3]}:{offset[3:]}"


def dur(seconds: float) -> str:
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.3f}s"
