"""Admit: whether a call may start now, and its idempotency key claimed before it joins
the lock queue.

`refusal` is checked once a call is authorized and again after an approval: the
daemon is not stopping, the run was not cancelled (barred), the run (if started
through the Runs service) is the caller's and has not ended, and the batch's deadline
has not passed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Mark, Status

from . import results
from .calls import Approved
from .endings import Endings
from .events import Batch
from .idempotency import Idempotency
from .inflight import RunBar


def refusal(
    run_id: str,
    batch: Batch,
    *,
    closing: bool,
    barred: Mapping[str, RunBar],
    owners: Mapping[str, str],
    ended: Mapping[str, str],
) -> ToolError | None:
    """The REJECTED error of a call that must not start now; None if it may."""
    if closing:
        return ToolError(
            ErrorClass.CANCELLED, "the daemon is shutting down", status=Status.REJECTED
        )
    bar = barred.get(run_id)
    if bar is not None:
        why = f"was cancelled ({bar.reason}); start a new run"
        return _run_error(run_id, ErrorClass.CANCELLED, why)
    owner = owners.get(run_id)
    if owner is not None and owner != batch.agent:
        return _run_error(
            run_id, ErrorClass.PERMISSION_DENIED, f"was started by {owner}; only its calls join it"
        )
    state = ended.get(run_id)
    if state is not None:
        return _run_error(run_id, ErrorClass.CANCELLED, f"has ended ({state}); start a new run")
    if batch.deadline is not None and time.time() >= batch.deadline:
        return ToolError(
            ErrorClass.TIMEOUT, "the run's deadline has passed", status=Status.REJECTED
        )
    return None


def _run_error(run_id: str, error_class: ErrorClass, what: str) -> ToolError:
    return ToolError(error_class, f"run {run_id!r} {what}", field="run_id", status=Status.REJECTED)


async def claim(
    approved: Approved, batch: Batch, queued: Mark, idempotency: Idempotency, endings: Endings
) -> bool:
    """Claim the call's idempotency key: False once the call has ended (the key holds an
    outcome, replayed; or a different request's, refused)."""
    call, req = approved.valid, approved.request
    try:
        replay = await idempotency.claim(
            batch.agent,
            req.idempotency_key,
            call.request_hash,
            req.run_id,
            req.call_id,
            on_join=lambda: batch.pass_turn(req.index),  # a joiner takes no locks
        )
    except ToolError as err:
        outcome = results.from_error(err, (queued,))
        await endings.reject(req, batch, outcome, reached=approved)
        return False
    if replay is not None:
        await endings.replay(call, batch, replay, approved)
        return False
    return True
