"""A call an `ask` rule decided, re-sent (same call id, or same idempotency key): a
resumed client does this to learn what became of it. It never opens a second
approval and never runs twice.

Finished already: answered from the journal before any approval step, as an allowed
call is by its idempotency claim -- the recorded outcome (`replay_of`), or
duplicate_call_id for a re-sent id without its key. Still parked (or approved and
running): the new stream joins the call in flight -- it gets the same
AWAITING_APPROVAL, then the one outcome the call records (or DETACHED with it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import Phase, mark
from execgate.executor.journal.base import CallStore
from execgate.executor.journal.store import CallRecord

from . import results
from .calls import Authorized, CallRequest
from .endings import Endings
from .events import Batch, EventKind
from .idempotency import Replay, check_hash

if TYPE_CHECKING:
    from .inflight import Active


async def answered(
    authorized: Authorized, batch: Batch, journal: CallStore, endings: Endings
) -> bool:
    """Answer a re-sent `ask` call whose original finished; False if there is none."""
    call, req = authorized.valid, authorized.request
    if req.idempotency_key:
        owner = await journal.by_idempotency_key(batch.agent, req.idempotency_key)
        if owner is not None and owner.outcome is not None:
            try:
                check_hash(owner.request_hash, call.request_hash)
            except ToolError as err:
                outcome = results.from_error(err, (mark(Phase.QUEUED),))
                await endings.reject(req, batch, outcome, reached=authorized)
                return True
            found = Replay(owner.outcome, owner.call_id, owner.run_id)
            await endings.replay(call, batch, found, authorized)
            return True
    same = await journal.get(req.run_id, req.call_id)
    if same is None:
        return False
    if same.outcome is not None and req.idempotency_key and _same_request(req, batch, same):
        # Refused (denied, expired): its row keeps no key; the same request asks again.
        await endings.replay(call, batch, Replay(same.outcome, req.call_id, req.run_id), authorized)
        return True
    await endings.refuse_duplicate(req, batch, mark(Phase.QUEUED), authorized)
    return True


async def join_parked(req: CallRequest, batch: Batch, active: Active, journal: CallStore) -> bool:
    """Follow the in-flight call `active` that went through an approval, for the same
    request re-sent; False (nothing sent) if it did not or the request differs."""
    approval = active.parked
    if approval is None or not req.idempotency_key or active.batch.agent != batch.agent:
        return False  # keys are scoped to the agent: nobody else follows its call
    if (approval.tool, approval.arguments_json, approval.idempotency_key) != (
        req.tool,
        req.arguments_json,
        req.idempotency_key,
    ) or req.workspace not in ("", approval.workspace):
        return False
    batch.emit(EventKind.AWAITING_APPROVAL, req, approval=approval)
    await active.ended.wait()
    found = await journal.get(req.run_id, req.call_id)
    if found is None or found.outcome is None:  # detached: the daemon is stopping
        batch.emit(EventKind.DETACHED, req, approval=approval)
        return True
    batch.emit(EventKind.FINISHED, req, outcome=found.outcome, replay_of=req.call_id)
    return True


def _same_request(req: CallRequest, batch: Batch, recorded: CallRecord) -> bool:
    """The same agent's same request (another agent's outcome is never replayed to it)."""
    return (recorded.agent, recorded.tool, recorded.arguments_json, recorded.workspace) == (
        batch.agent,
        req.tool,
        req.arguments_json,
        req.workspace,
    )
