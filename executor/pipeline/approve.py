"""Approvals: a call a policy `ask` rule decided waits here for a human.

One approval is one record of the journal's approval store (`ApprovalStore`):

    pending ──Decide(approve)──> approved   the call joins the lock queue and runs
       ├──────Decide(deny)─────> denied     the call is REJECTED (approval_denied)
       └──ttl / cancel / stop──> expired    the call is REJECTED (approval_expired,
                                            or cancelled / timeout when it was stopped)

Every transition is one conditional write (`ApprovalStore.transition`: only from
pending) committed with fsync, so a decision and an expiry racing each other cannot
both win, and nothing is reported (to the parked call or to watchers) before it is
on disk.

A parked call holds no resource locks: the dispatcher parks it before it joins the
lock queue.

Restart: approvals outlive the daemon. A daemon that stops (gracefully or not)
leaves pending rows pending; a graceful stop ends the parked calls' Execute streams
with UNAVAILABLE naming them (`Detached`). The next daemon re-parks every pending
call from its row (`Dispatcher.resume_parked`): once decided it runs — or is
REJECTED — with nobody streaming it, and GetCall returns its outcome. The ttl keeps
counting while no daemon runs.
"""

from __future__ import annotations

import asyncio
import enum
import secrets
from collections.abc import AsyncGenerator, Callable
from typing import Any

from execgate.executor.core import clock
from execgate.executor.core.approval import Approval, ApprovalState, Detached
from execgate.executor.core.errors import ExecgateError, ToolError
from execgate.executor.core.fanout import Closed, Fanout
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.journal.base import ApprovalStore
from execgate.executor.journal.store import PolicyRecord
from execgate.executor.policy import Rule
from execgate.executor.policy.identity import Identity, Role
from execgate.executor.sandbox.ladder import CancelScope

from .calls import Approved, Authorized, ValidCall
from .events import Batch, EventKind

__all__ = [
    "Approval",
    "ApprovalError",
    "ApprovalState",
    "Approvals",
    "Detached",
    "Refused",
    "may_decide",
    "verdict",
]

DECIDERS = frozenset({Role.APPROVER, Role.ADMIN})


class Refused(enum.Enum):
    NOT_FOUND = "not_found"
    NOT_PENDING = "not_pending"
    FORBIDDEN = "forbidden"


class ApprovalError(ExecgateError):
    """A Decide that cannot be done; `refused` says which kind (the server maps it)."""

    def __init__(self, refused: Refused, message: str) -> None:
        super().__init__(message)
        self.refused = refused
        self.message = message


def may_decide(approval: Approval, who: Identity) -> str:
    """Why `who` may not decide `approval` ("" when it may)."""
    if not who.holds_any(DECIDERS):
        return f"{who.name} holds neither the approver nor the admin role"
    if who.name == approval.requester:
        return f"{who.name} made this call: nobody approves their own calls"
    if not any(a == who.name or a in who.roles for a in approval.approvers):
        return (
            f"rule {approval.rule_id!r} names {', '.join(approval.approvers)} as approvers; "
            f"{who.name} (roles: {', '.join(sorted(who.roles))}) is none of them"
        )
    return ""


class Approvals:
    def __init__(self, store: ApprovalStore) -> None:
        self.store = store
        # Invariant: an id here is a row in state pending whose call awaits the
        # future; the future is resolved only after the row's decision is on disk.
        self._waiting: dict[str, asyncio.Future[Approval]] = {}
        # The Watch streams, each with a bounded backlog (fanout.MAX_BACKLOG).
        self._watchers: Fanout[Approval] = Fanout()
        # Set when the daemon stops: a parked call stopped now is detached (its
        # approval stays pending for the next daemon), not expired.
        self._detaching = False

    async def park(
        self, call: ValidCall, requester: str, rule: Rule, decision: PolicyRecord | None
    ) -> Approval:
        """Write the pending row (durably); the caller then reports it and `wait`s."""
        req = call.request
        now = clock.now()
        approval = Approval(
            id="appr_" + secrets.token_hex(8),
            run_id=req.run_id,
            call_id=req.call_id,
            batch_id=req.batch_id,
            tool=req.tool,
            arguments_json=req.arguments_json,
            requester=requester,
            rule_id=rule.id,
            reason=rule.reason,
            approvers=rule.approvers,
            created_at=now,
            expires_at=now + (rule.ttl if rule.ttl is not None else 3600.0),
            state=ApprovalState.PENDING,
            idempotency_key=req.idempotency_key,
            timeout=req.timeout,
            workspace=call.workspace.name,
        )
        self._waiting[approval.id] = asyncio.get_running_loop().create_future()
        try:
            await self.store.insert(approval, decision)
        except BaseException:
            del self._waiting[approval.id]
            raise
        self._publish(approval)
        return approval

    async def gate(
        self,
        authorized: Authorized,
        batch: Batch,
        scope: CancelScope,
        ask: Rule | Approval,
        parked: Callable[[Approval], None] | None = None,
    ) -> Approved:
        """Park the call until an approver decides, the ttl passes or it is stopped; the
        call with its settled approval (`verdict` says whether it may go on), or Detached.

        `ask`: the rule that asks (a new pending row), or the call's approval a
        previous daemon left pending (waited for again). `parked` is told the
        approval just before AWAITING_APPROVAL is sent.
        """
        req = authorized.request
        if isinstance(ask, Rule):
            approval = await self.park(authorized.valid, batch.agent, ask, authorized.record)
        else:
            approval = ask
            self._waiting[approval.id] = asyncio.get_running_loop().create_future()
            # Decided between the daemon's start and now: nobody resolved the future.
            now = await self.get(approval.id)
            waiter = self._waiting[approval.id]
            if now is not None and now.state is not ApprovalState.PENDING and not waiter.done():
                waiter.set_result(now)
        if parked is not None:
            parked(approval)
        batch.emit(EventKind.AWAITING_APPROVAL, req, approval=approval)
        return Approved(authorized=authorized, approval=await self.wait(approval, scope))

    async def wait(self, approval: Approval, scope: CancelScope) -> Approval:
        """The approval once decided, expired (ttl) or given up (the call was stopped)."""
        decided = self._waiting[approval.id]
        stopped = asyncio.create_task(scope.requested.wait())
        try:
            timeout = max(approval.expires_at - clock.now(), 0.0)
            either: set[asyncio.Future[Any]] = {decided, stopped}
            await asyncio.wait(either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if decided.done():
                return decided.result()
            if scope.requested.is_set() and self._detaching:
                raise Detached(approval)
            if scope.requested.is_set():
                why = f"the call was stopped while awaiting approval: {scope.reason}"
            else:
                why = "nobody decided before the ttl passed"
            expired = await self._transition(approval.id, ApprovalState.EXPIRED, "", why)
            if expired is not None:
                return expired
            # A decision won the race: it resolves the future once it is on disk -- unless
            # it was made before this wait began; the row says which.
            if not decided.done():
                row = await self.get(approval.id)
                if row is not None and row.state is not ApprovalState.PENDING:
                    return row
            return await decided
        finally:
            stopped.cancel()
            self._waiting.pop(approval.id, None)

    async def decide(
        self, approval_id: str, *, approve: bool, comment: str, decider: Identity
    ) -> Approval:
        """Record `decider`'s decision, then let the parked call go on (or end)."""
        found = await self.get(approval_id)
        if found is None:
            raise ApprovalError(Refused.NOT_FOUND, f"no approval {approval_id!r}")
        if found.state is not ApprovalState.PENDING:
            raise ApprovalError(Refused.NOT_PENDING, _settled(found))
        why = may_decide(found, decider)
        if why:
            raise ApprovalError(Refused.FORBIDDEN, why)
        state = ApprovalState.APPROVED if approve else ApprovalState.DENIED
        decided = await self._transition(approval_id, state, decider.name, comment)
        if decided is None:  # it expired (or was decided) meanwhile
            again = await self.get(approval_id)
            assert again is not None
            raise ApprovalError(Refused.NOT_PENDING, _settled(again))
        waiter = self._waiting.get(approval_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(decided)
        return decided

    async def get(self, approval_id: str) -> Approval | None:
        return await self.store.get(approval_id)

    async def parked(self, run_id: str, call_id: str) -> Approval | None:
        """The pending approval call `call_id` of `run_id` waits for, if it is parked."""
        return await self.store.parked(run_id, call_id)

    async def pending(self) -> list[Approval]:
        return await self.store.pending()

    async def of_run(self, run_id: str) -> list[Approval]:
        return await self.store.of_run(run_id)

    async def watch(self) -> AsyncGenerator[Approval, None]:
        """Every pending approval, then every change, until `close`.

        An approval created while the pending ones are read may be sent twice. Raises
        fanout.Lagging if the stream's client falls MAX_BACKLOG changes behind.
        """
        watcher = self._watchers.subscribe()
        try:
            for approval in await self.pending():
                yield approval
            while True:
                try:
                    item = await watcher.get()
                except Closed:
                    return
                yield item
        finally:
            self._watchers.unsubscribe(watcher)

    async def heard(self, approval_id: str) -> None:
        """Another daemon sharing the journal made or decided this approval: tell the
        watchers here, and let the call parked here go on once it is decided."""
        found = await self.get(approval_id)
        if found is None:
            return
        self._publish(found)
        waiter = self._waiting.get(approval_id)
        if found.state is not ApprovalState.PENDING and waiter is not None and not waiter.done():
            waiter.set_result(found)

    async def reread(self) -> None:
        """Notices from other daemons may have been missed: look at every parked call."""
        for approval_id in list(self._waiting):
            found = await self.get(approval_id)
            waiter = self._waiting.get(approval_id)
            if found is None or found.state is ApprovalState.PENDING or waiter is None:
                continue
            if not waiter.done():
                self._publish(found)
                waiter.set_result(found)

    def waiting(self) -> int:
        """Calls parked here now."""
        return len(self._waiting)

    def detach(self) -> None:
        """From now on, a parked call that is stopped leaves its approval pending."""
        self._detaching = True

    async def abandon(self, approval: Approval, why: str) -> None:
        """Expire a pending approval whose call will not wait for it any more."""
        await self._transition(approval.id, ApprovalState.EXPIRED, "", why)

    def close(self) -> None:
        """End every Watch stream (the daemon is stopping)."""
        self._watchers.close("the daemon is stopping")

    async def _transition(
        self, approval_id: str, state: ApprovalState, by: str, comment: str
    ) -> Approval | None:
        done = await self.store.transition(approval_id, state, by, comment)
        if done is not None:
            self._publish(done)
        return done

    def _publish(self, approval: Approval) -> None:
        self._watchers.publish(approval)


def verdict(approved: Approved, scope: CancelScope) -> None:
    """Return if the call's approval let it go on; else raise its REJECTED ToolError
    (denied, expired, or stopped while it waited)."""
    ended = approved.approval
    if ended is None:  # nothing asked
        return
    where = f"approval {ended.id}, rule {ended.rule_id}"
    match ended.state:
        case ApprovalState.APPROVED:
            return
        case ApprovalState.DENIED:
            raise ToolError(
                ErrorClass.APPROVAL_DENIED,
                f"denied by {ended.decided_by} ({where}): {ended.comment or 'no comment'}",
                status=Status.REJECTED,
            )
        case ApprovalState.EXPIRED if scope.requested.is_set():
            why = ErrorClass.TIMEOUT if scope.timed_out else ErrorClass.CANCELLED
            raise ToolError(
                why,
                f"stopped before it started, awaiting approval ({where}): {scope.reason}",
                status=Status.REJECTED,
            )
        case ApprovalState.EXPIRED:
            raise ToolError(
                ErrorClass.APPROVAL_EXPIRED,
                f"nobody decided within the rule's ttl ({where})",
                status=Status.REJECTED,
            )
        case ApprovalState.PENDING:
            raise AssertionError(f"approval {ended.id} ended its wait still pending")


def _settled(a: Approval) -> str:
    by = f" by {a.decided_by}" if a.decided_by else ""
    return f"approval {a.id} is already {a.state.value}{by}" + (
        f": {a.comment}" if a.comment else ""
    )
