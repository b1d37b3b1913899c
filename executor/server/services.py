"""The gRPC servicers: requests in, dispatcher and approvals calls, responses out.

Every method runs after the authentication interceptor admitted the caller
(`authenticate.caller()` is who asks); no call logic lives here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from execgate.executor.core import clock
from execgate.executor.core.errors import MalformedRequest
from execgate.executor.core.fanout import Lagging
from execgate.executor.core.requests import MAX_ID_CHARS, SHARED_RUN
from execgate.executor.pipeline.approve import ApprovalError, Approvals
from execgate.executor.pipeline.calls import CallRequest
from execgate.executor.pipeline.dispatch import Dispatcher
from execgate.executor.pipeline.events import Event, EventKind
from execgate.executor.pipeline.inflight import CancelOrder, NotYours
from execgate.executor.policy import Policy
from execgate.executor.policy.explain import explain
from execgate.executor.policy.identity import Role
from execgate.executor.policy.model import memberships
from execgate.executor.policy.scope import scope_of
from execgate.v1 import executor_pb2 as pb
from execgate.v1 import executor_pb2_grpc as pb_grpc

from . import wire, wirecheck
from .auth import caller
from .status import (
    BadArgument,
    CallNotFound,
    OutcomesDetached,
    OutcomesUnrecorded,
    PermissionDenied,
    abort_for,
)
from .wirecheck import PageTokens

log = logging.getLogger("execgate.server")

MAX_BATCH = 1000
# Who may explain another identity's calls (ExplainPolicy): those who read or decide them.
_EXPLAINS_ANYONE = frozenset({Role.OPERATOR, Role.APPROVER, Role.ADMIN})
# Longest cancel `reason` and `requester` taken (characters). They are kept in memory
# while the run is barred (inflight.RunBar), in every stopped call's timeline and in
# the journal, so a Cancel carrying megabytes of them is refused, naming the field.
MAX_REASON_CHARS = 1024
# Who may cancel anyone's calls; an agent cancels only its own.
CANCELS_ANY = frozenset({Role.OPERATOR, Role.ADMIN})
DEFAULT_RUN = SHARED_RUN


# Calls whose part of the stream ends without an outcome event: the RPC ends with an
# error naming them instead.
_UNSENT = frozenset({EventKind.DETACHED, EventKind.UNRECORDED})


async def _abort_unsent(context: grpc.aio.ServicerContext[Any, Any], unsent: list[Event]) -> None:
    lost = [e.call_id for e in unsent if e.kind is EventKind.UNRECORDED]
    if lost:
        await abort_for(context, OutcomesUnrecorded(lost))
    # The rest were parked: the daemon stopped while they awaited approval.
    parked = [(e.call_id, e.approval.id) for e in unsent if e.approval is not None]
    await abort_for(context, OutcomesDetached(parked))


class ExecutorService(pb_grpc.ExecutorServicer):
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.pages = PageTokens()

    async def ListTools(
        self,
        request: pb.ListToolsRequest,
        context: grpc.aio.ServicerContext[pb.ListToolsRequest, pb.ListToolsResponse],
    ) -> pb.ListToolsResponse:
        return pb.ListToolsResponse(
            tools=[wire.tool_spec(t.spec) for t in self.dispatcher.tools.values()]
        )

    async def Execute(
        self,
        request: pb.ExecuteRequest,
        context: grpc.aio.ServicerContext[pb.ExecuteRequest, pb.ExecuteEvent],
    ) -> AsyncIterator[pb.ExecuteEvent]:
        run_id, batch_id, calls = await self._batch(request, context)
        events = self.dispatcher.execute(
            run_id,
            batch_id,
            calls,
            agent=caller().name,
            progress=not request.outcomes_only,
            deadline=_deadline(request),
            metadata=tuple(context.invocation_metadata() or ()),
        )
        unsent: list[Event] = []
        async with contextlib.aclosing(events):
            async for event in events:
                if event.kind in _UNSENT:
                    unsent.append(event)
                else:
                    yield wire.event(event)
        if unsent:
            await _abort_unsent(context, unsent)

    async def ExecuteBatch(
        self,
        request: pb.ExecuteRequest,
        context: grpc.aio.ServicerContext[pb.ExecuteRequest, pb.ExecuteResponse],
    ) -> pb.ExecuteResponse:
        run_id, batch_id, calls = await self._batch(request, context)
        finished: list[pb.ExecuteEvent] = [pb.ExecuteEvent()] * len(calls)
        events = self.dispatcher.execute(
            run_id,
            batch_id,
            calls,
            agent=caller().name,
            progress=False,
            deadline=_deadline(request),
            metadata=tuple(context.invocation_metadata() or ()),
        )
        unsent: list[Event] = []
        async with contextlib.aclosing(events):
            async for event in events:
                if event.kind in _UNSENT:
                    unsent.append(event)
                else:
                    finished[event.index] = wire.event(event)
        if unsent:
            await _abort_unsent(context, unsent)
        return pb.ExecuteResponse(batch_id=batch_id, outcomes=finished)

    async def Explain(
        self,
        request: pb.ExecuteRequest,
        context: grpc.aio.ServicerContext[pb.ExecuteRequest, pb.ExplainResponse],
    ) -> pb.ExplainResponse:
        _, _, calls = await self._batch(request, context)
        rows = await self.dispatcher.explain(calls, agent=caller().name)
        root = str(self.dispatcher.workspace.root)
        return pb.ExplainResponse(calls=[wire.call_plan(r, root) for r in rows])

    async def ExplainPolicy(
        self,
        request: pb.ExplainPolicyRequest,
        context: grpc.aio.ServicerContext[pb.ExplainPolicyRequest, pb.ExplainPolicyResponse],
    ) -> pb.ExplainPolicyResponse:
        who = caller()
        others = bool(request.agent and request.agent != who.name)
        if (others or request.groups or request.roles) and not who.holds_any(_EXPLAINS_ANYONE):
            await abort_for(
                context,
                PermissionDenied(
                    f"{who.name} explains only its own calls (agent, groups and roles are its "
                    "identity's); explaining another's needs operator, approver or admin"
                ),
            )
        if not request.tool or len(request.tool) > MAX_ID_CHARS:
            await abort_for(context, BadArgument("tool", "tool: required, a tool name"))
        if max(len(request.paths), len(request.tables), len(request.hosts)) > MAX_BATCH:
            await abort_for(context, BadArgument("paths", "paths: too many"))
        given = others or bool(request.groups or request.roles)
        member_of = memberships(request.groups, request.roles) if given else who.memberships()
        try:
            call = wire.policy_input(request, request.agent or who.name, member_of)
        except ValueError as exc:
            await abort_for(context, BadArgument("", str(exc)))
        return wire.explanation(explain(self.dispatcher.policy, call))

    async def _batch(
        self, request: pb.ExecuteRequest, context: grpc.aio.ServicerContext[pb.ExecuteRequest, Any]
    ) -> tuple[str, str, list[CallRequest]]:
        """The request's calls as the dispatcher takes them; aborts a malformed envelope."""
        if len(request.calls) > MAX_BATCH:
            raise MalformedRequest(
                "too_large",
                "calls",
                f"calls: {len(request.calls)} calls; a batch holds at most {MAX_BATCH}",
            )
        if len(request.batch_id) > MAX_ID_CHARS:
            raise MalformedRequest(
                "too_large", "batch_id", f"batch_id: longer than {MAX_ID_CHARS} characters"
            )
        run_id = request.run_id or DEFAULT_RUN
        batch_id = request.batch_id or self.dispatcher.new_id("batch")
        calls = [
            wire.call_request(
                c,
                run_id=run_id,
                batch_id=batch_id,
                index=i,
                call_id=c.call_id or self.dispatcher.new_id("call"),
            )
            for i, c in enumerate(request.calls)
        ]
        return run_id, batch_id, calls

    async def Cancel(
        self,
        request: pb.CancelRequest,
        context: grpc.aio.ServicerContext[pb.CancelRequest, pb.CancelResponse],
    ) -> pb.CancelResponse:
        if not (request.run_id or request.call_id or request.batch_id):
            raise MalformedRequest(
                "missing", "call_id", "name a run_id, a call_id or a batch_id to cancel"
            )
        at = clock.now()  # the moment of the request, before anything else happens
        for name in ("reason", "requester"):
            if len(getattr(request, name)) > MAX_REASON_CHARS:
                raise MalformedRequest(
                    "too_large", name, f"{name}: longer than {MAX_REASON_CHARS} characters"
                )
        grace = wirecheck.duration(request.grace, "grace") if request.HasField("grace") else None
        # A call id is unique within its run (default: the implicit run); a batch or a
        # run is a target by itself, so a batch in any run is reached without its run.
        run_id = request.run_id or (DEFAULT_RUN if request.call_id else "")
        who = caller()
        order = CancelOrder(
            run_id=run_id,
            call_id=request.call_id,
            batch_id=request.batch_id,
            reason=request.reason or "cancelled by client",
            grace=grace,
            requester=_requester(request.requester),
            at=at,
            only_agent="" if who.holds_any(CANCELS_ANY) else who.name,
        )
        try:
            hit = await self.dispatcher.cancel(order)
        except NotYours as exc:
            await abort_for(context, exc)
        return pb.CancelResponse(call_ids=hit)

    async def GetCall(
        self,
        request: pb.GetCallRequest,
        context: grpc.aio.ServicerContext[pb.GetCallRequest, pb.CallRecord],
    ) -> pb.CallRecord:
        run_id = request.run_id or DEFAULT_RUN
        rec = await self.dispatcher.journal.get(
            run_id, request.call_id, include_raw=request.include_raw
        )
        if rec is None:
            # A parked call is journaled as its approval until it is decided.
            parked = await self.dispatcher.approvals.parked(run_id, request.call_id)
            if parked is not None and self._readable(parked.requester, run_id):
                tool = self.dispatcher.tools.get(parked.tool)
                # The tool's own answer: the call is validated again when it is decided.
                return wire.parked_record(parked, may_write=tool is None or tool.spec.may_write)
        # Another agent's call is answered as a missing one: its existence is not ours to tell.
        if rec is None or not self._readable(rec.agent, rec.run_id):
            await abort_for(context, CallNotFound(run_id, request.call_id))
        return wire.record(rec)

    def _readable(self, agent: str, run_id: str) -> bool:
        """A call the caller may read: its own (or in scope), or in a run it owns."""
        scope = scope_of(caller(), self.dispatcher.policy)
        owner = self.dispatcher.run_owners.get(run_id)
        return scope.allows(agent) or (owner is not None and scope.allows(owner))

    async def ListCalls(
        self,
        request: pb.ListCallsRequest,
        context: grpc.aio.ServicerContext[pb.ListCallsRequest, pb.ListCallsResponse],
    ) -> pb.ListCallsResponse:
        query = _query(request, caller().name)
        before = self.pages.open(request.page_token, query) if request.page_token else 0
        if request.limit < 0:
            raise MalformedRequest("out_of_range", "limit", "limit: must not be negative")
        limit = min(request.limit or 100, 1000)
        scope = scope_of(caller(), self.dispatcher.policy)
        flt = wire.call_filter(
            request, run_id=request.run_id, limit=limit, before_seq=before, agents=scope.agents
        )
        records, next_seq = await self.dispatcher.journal.list(flt)
        return pb.ListCallsResponse(
            calls=[wire.record(r) for r in records],
            next_page_token=self.pages.issue(next_seq, query) if next_seq else "",
        )


class ApprovalsService(pb_grpc.ApprovalsServicer):
    def __init__(self, approvals: Approvals, policy: Callable[[], Policy]) -> None:
        self.approvals = approvals
        # The policy in force (hot reloaded): its `reads:` widens what agents see.
        self.policy = policy

    async def ListPending(
        self,
        request: pb.ListPendingRequest,
        context: grpc.aio.ServicerContext[pb.ListPendingRequest, pb.ListPendingResponse],
    ) -> pb.ListPendingResponse:
        pending = await self.approvals.pending()
        return pb.ListPendingResponse(approvals=[wire.approval(a) for a in pending])

    async def List(
        self,
        request: pb.ListApprovalsRequest,
        context: grpc.aio.ServicerContext[pb.ListApprovalsRequest, pb.ListPendingResponse],
    ) -> pb.ListPendingResponse:
        found = await self.approvals.of_run(request.run_id)
        scope = scope_of(caller(), self.policy(), approvals=True)
        return pb.ListPendingResponse(
            approvals=[wire.approval(a) for a in found if scope.allows(a.requester)]
        )

    async def Watch(
        self,
        request: pb.WatchApprovalsRequest,
        context: grpc.aio.ServicerContext[pb.WatchApprovalsRequest, pb.Approval],
    ) -> AsyncIterator[pb.Approval]:
        try:
            async with contextlib.aclosing(self.approvals.watch()) as changes:
                async for approval in changes:
                    yield wire.approval(approval)
        except Lagging as exc:
            await abort_for(context, exc)

    async def Decide(
        self,
        request: pb.DecideRequest,
        context: grpc.aio.ServicerContext[pb.DecideRequest, pb.Approval],
    ) -> pb.Approval:
        try:
            decided = await self.approvals.decide(
                request.approval_id,
                approve=request.approve,
                comment=request.comment,
                decider=caller(),
            )
        except ApprovalError as err:
            log.warning("refused Decide of %s by %s: %s", request.approval_id, caller().name, err)
            await abort_for(context, err)
        return wire.approval(decided)


def _requester(claimed: str) -> str:
    """Who cancels: the authenticated caller; what the body claims is kept as a claim."""
    name = caller().name
    return f"{name} (says: {claimed})" if claimed and claimed != name else name


def _deadline(request: pb.ExecuteRequest) -> float | None:
    return (
        wirecheck.timestamp(request.deadline, "deadline") if request.HasField("deadline") else None
    )


def _query(request: pb.ListCallsRequest, who: str) -> bytes:
    """What a page token is bound to: the filter (not the page size) and the caller."""
    shape = pb.ListCallsRequest()
    shape.CopyFrom(request)
    shape.ClearField("page_token")
    shape.ClearField("limit")
    return who.encode() + b"\0" + shape.SerializeToString(deterministic=True)
