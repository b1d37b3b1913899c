"""The calls in flight and how a Cancel reaches them.

Every call is registered here from the moment it is proposed until its outcome is
recorded. A Cancel is journaled first ("cancel requested": time, requester,
reason, target), then every targeted call's cancel scope is set: a queued call
never starts (REJECTED, cancelled), a running one goes down the ladder in
`executor.cancel`. Cancelling a whole run also bars the run: no call of it starts
afterwards, across daemon restarts (the journal keeps the bar).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from execgate.executor.core.approval import Approval
from execgate.executor.core.errors import ExecgateError
from execgate.executor.core.requests import SHARED_RUN
from execgate.executor.journal.base import CancelStore, RunRecordStore
from execgate.executor.journal.records import CancelRecord, RunClaim
from execgate.executor.sandbox.ladder import CancelScope

from .events import Batch


@dataclass(slots=True)
class Active:
    """A call between QUEUED and FINISHED: what a Cancel (and a re-sent request) needs
    to reach it. What its stages decided flows through them as values (calls.py), never
    through here. `started` flips once, when it starts to run."""

    scope: CancelScope
    # The very batch object it came in (its run, batch ids and agent live there).
    batch: Batch
    started: bool = False
    # The approval it was parked for (set when parked, kept once decided): the same
    # request re-sent meanwhile follows this call instead of asking again (resend).
    parked: Approval | None = None
    # Set once the call's outcome is recorded (or it detached) and it leaves the table.
    ended: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelOrder:
    """One Cancel request. Empty run_id with a batch: that batch in any run."""

    run_id: str
    call_id: str = ""
    batch_id: str = ""
    reason: str
    grace: float | None = None
    requester: str = ""
    at: float
    # Set for a caller who may stop only its own calls (an agent, not an operator or
    # admin): the identity name every targeted call must belong to.
    only_agent: str = ""

    @property
    def whole_run(self) -> bool:
        return bool(self.run_id) and not self.call_id and not self.batch_id


@dataclass(frozen=True, slots=True)
class RunBar:
    at: float
    reason: str
    requester: str


class NotYours(ExecgateError):
    """A caller who may stop only its own calls (`agent`) named someone else's."""

    def __init__(self, agent: str, message: str) -> None:
        super().__init__(message)
        self.agent = agent
        self.message = message


class InFlight:
    def __init__(self, cancels: CancelStore, runs: RunRecordStore) -> None:
        self.cancels = cancels
        self.runs = runs
        self.calls: dict[tuple[str, str], Active] = {}
        self.barred: dict[str, RunBar] = {
            run: RunBar(c.at, c.reason, c.requester) for run, c in cancels.barred_runs().items()
        }

    async def cancel(self, order: CancelOrder) -> list[str]:
        """Record the request, then reach every targeted call; returns their ids.
        Raises NotYours (recording nothing) when `order.only_agent` is not theirs."""
        if order.only_agent:
            await self._check_owner(order, [a for _, a in self._targets(order, anyones=True)])
        # The bar goes up before the (durable, so slow) write: a call of the run that
        # arrives meanwhile must not start. It signals nothing, so the request is
        # still on record before anything is done to a call.
        fresh = order.whole_run and order.run_id not in self.barred
        if fresh:
            self.barred[order.run_id] = RunBar(order.at, order.reason, order.requester)
        try:
            await self.cancels.record(_record(order))
        except BaseException:
            if fresh:
                del self.barred[order.run_id]
            raise
        # Looked up again: calls may have arrived while the request was written.
        targets = self._targets(order)
        for _, active in targets:
            active.scope.cancel(order.reason, order.grace, requester=order.requester, at=order.at)
        return [call for call, _ in targets]

    def heard(self, rec: CancelRecord) -> list[str]:
        """A Cancel another daemon sharing the journal recorded (and checked): bar its
        run if it names a whole run, and reach the targeted calls running here (only
        the requester's own, when it may stop no one else's)."""
        order = CancelOrder(
            run_id=rec.run_id,
            call_id=rec.call_id,
            batch_id=rec.batch_id,
            reason=rec.reason,
            grace=rec.grace,
            requester=rec.requester,
            at=rec.at,
            only_agent=rec.only_agent,
        )
        if order.whole_run and order.run_id not in self.barred:
            self.barred[order.run_id] = RunBar(order.at, order.reason, order.requester)
        targets = self._targets(order)
        for _, active in targets:
            active.scope.cancel(order.reason, order.grace, requester=order.requester, at=order.at)
        return [call for call, _ in targets]

    def _targets(self, order: CancelOrder, *, anyones: bool = False) -> list[tuple[str, Active]]:
        """(call id, call) of each in-flight call the order names and may reach (with
        `anyones`: also those of other agents, which an `only_agent` order may not)."""
        return [
            (call, active)
            for (run, call), active in list(self.calls.items())
            if _aims(order, run, call, active)
            and (anyones or not order.only_agent or active.batch.agent == order.only_agent)
        ]

    async def _check_owner(self, order: CancelOrder, targets: list[Active]) -> None:
        me = order.only_agent
        others = sorted({a.batch.agent for a in targets} - {me})
        if others:
            raise NotYours(
                me,
                f"{me} may cancel only its own calls; the target includes calls by "
                f"{', '.join(others)} (an operator or admin may cancel them)",
            )
        if order.whole_run:
            # Barring a run stops its future calls too: the run must be the caller's.
            why = _not_owner(await self.runs.claim(order.run_id), order.run_id, me)
            if why:
                raise NotYours(me, f"{me} may not cancel run {order.run_id!r}: {why}")

    def cancel_all(self, reason: str) -> None:
        for active in list(self.calls.values()):
            active.scope.cancel(reason)

    def force_all(self, reason: str) -> None:
        for active in list(self.calls.values()):
            active.scope.force(reason)

    def abandon(self, batch: Batch, reason: str, *, timed_out: bool = False) -> None:
        """Stop the calls of this batch (this very object: ids come from clients) not started."""
        for active in list(self.calls.values()):
            if active.batch is batch and not active.started:
                active.scope.cancel(reason, timed_out=timed_out)


def _aims(order: CancelOrder, run: str, call: str, active: Active) -> bool:
    if (order.run_id and run != order.run_id) or (order.call_id and call != order.call_id):
        return False
    return not order.batch_id or active.batch.batch_id == order.batch_id


def _not_owner(claim: RunClaim, run_id: str, agent: str) -> str:
    """Why `agent` does not own `run_id` ("" if it does): it started the run (the runs
    table), or, for a run never started, every call recorded in it is the agent's.
    The implicit shared run, and a run nobody has used, belong to no agent."""
    if claim.owner is not None:
        return "" if claim.owner == agent else f"it was started by {claim.owner}"
    if run_id == SHARED_RUN:
        return "it is the shared implicit run (an operator or admin may cancel it)"
    if not claim.agents:
        return "nothing is recorded in it (start runs with Runs.StartRun to own them)"
    others = sorted(claim.agents - {agent})
    return f"it has calls by {', '.join(others)}" if others else ""


def _record(order: CancelOrder) -> CancelRecord:
    return CancelRecord(
        at=order.at,
        requester=order.requester,
        reason=order.reason,
        run_id=order.run_id,
        batch_id=order.batch_id,
        call_id=order.call_id,
        grace=order.grace,
        only_agent=order.only_agent,
    )
