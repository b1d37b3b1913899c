"""From what a tool produced to the Outcome the caller sees: the one place statuses are decided."""

from __future__ import annotations

import json

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import (
    ErrorClass,
    Mark,
    Outcome,
    Phase,
    Status,
    StopMode,
    ToolResult,
)
from execgate.executor.tools import ToolOutput

OMITTED = json.dumps({"omitted": "structured result over the output cap; see the journal"})


def bound(text: str, cap: int) -> tuple[str, bool, int]:
    """Cut `text` to at most `cap` UTF-8 bytes on a character boundary."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= cap:
        return text, False, len(data)
    cut = data[:cap].decode("utf-8", errors="ignore")
    return cut, True, len(cut.encode("utf-8"))


def from_output(out: ToolOutput, *, may_write: bool, cap: int, marks: tuple[Mark, ...]) -> Outcome:
    text, cut, returned = bound(out.text, cap)
    # Uncut, the returned bytes are all of them: encode a second time only when cut.
    total = len(out.text.encode("utf-8", errors="replace")) if cut else returned
    structured = json.dumps(out.structured, ensure_ascii=False, separators=(",", ":"))
    if len(structured.encode("utf-8", errors="replace")) > cap:
        structured, cut = OMITTED, True
    truncated = out.truncated or cut
    result = ToolResult(
        text=text,
        structured_json=structured,
        truncated=truncated,
        returned_bytes=returned,
        total_bytes=out.total_bytes if out.total_bytes is not None else total,
    )
    status, error, message = _status(out, may_write=may_write, truncated=truncated)
    return Outcome(
        status=status,
        error_class=error,
        message=message,
        result=result,
        evidence=out.evidence,
        timeline=marks + out.marks,
        stopped_how=out.stopped_how,
    )


def _status(out: ToolOutput, *, may_write: bool, truncated: bool) -> tuple[Status, ErrorClass, str]:
    if out.stopped_how is not StopMode.COMPLETED:
        # Interrupted: a reader changed nothing; a writer may have done anything,
        # unless it proves it rolled back.
        unknown = may_write and not out.rolled_back
        status = Status.UNKNOWN_OUTCOME if unknown else Status.FAILURE
        return status, out.error_class, out.message
    if out.error_class is not ErrorClass.NONE:
        return Status.FAILURE, out.error_class, out.message
    if truncated:
        return Status.PARTIAL, ErrorClass.NONE, "result truncated at the output cap"
    return Status.SUCCESS, ErrorClass.NONE, out.message


def from_error(err: ToolError, marks: tuple[Mark, ...]) -> Outcome:
    status = err.status
    if status is Status.REJECTED and any(m.phase is Phase.STARTED for m in marks):
        # REJECTED promises "never started"; a tool that refuses once running (a path
        # swapped under it) changed nothing, which is FAILURE.
        status = Status.FAILURE
    stopped = StopMode.NOT_STARTED if status is Status.REJECTED else StopMode.COMPLETED
    return Outcome(
        status=status,
        error_class=err.error_class,
        message=err.message,
        field=err.field,
        timeline=marks,
        stopped_how=stopped,
    )


def from_crash(
    exc: BaseException, *, started: bool, may_write: bool, marks: tuple[Mark, ...]
) -> Outcome:
    """Something unexpected was raised (a bug): the outcome is what can be vouched for.

    Never started: REJECTED (nothing ran). Started and read-only: FAILURE (nothing
    can have changed). Started and may write: UNKNOWN_OUTCOME (reconcile).
    """
    where = "tool" if started else "daemon, before the call started,"
    message = f"the {where} failed unexpectedly: {type(exc).__name__}: {exc}"[:500]
    if not started:
        return Outcome(
            status=Status.REJECTED,
            error_class=ErrorClass.INTERNAL,
            message=message,
            timeline=marks,
            stopped_how=StopMode.NOT_STARTED,
        )
    status = Status.UNKNOWN_OUTCOME if may_write else Status.FAILURE
    return Outcome(status=status, error_class=ErrorClass.INTERNAL, message=message, timeline=marks)
