"""The gRPC servicers: requests in, dispatcher and approvals calls, responses out.

Every method runs after the authentication interceptor admitted the caller
(`authenticate.caller()` is who asks); no call logic lives here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from execgate.executor.core import clock
from execgate.executor.core.errors import MalformedRequest
from execgate.executor.core.fanout import Lagging
from execgate.executor.core.requests import MAX_ID_CHARS, SHARED_RUN
from execgate.executor.pipeline.approve import ApprovalError, Approvals
from execgate.executor.pipeline.dispatch import Dispatcher
from execgate.executor.pipeline.events import Event, EventKind
from execgate.executor.pipeline.inflight import NotYours
from execgate.executor.policy import Policy
from execgate.executor.policy.explain import explain
from execgate.executor.policy.identity import Role
from execgate.executor.policy.model import memberships
from execgate.executor.policy.scope import scope_of
from execgate.executor.tools.mcp.server import ServerStatus
from execgate.executor.tools.toolset import trusted_of
from execgate.v1 import executor_pb2 as pb
from execgate.v1 import executor_pb2_grpc as pb_grpc

from . import wire
from .auth import caller
from .status import (
    BadArgument,
    CallNotFound,
    OutcomesDetached,
    OutcomesUnrecorded,
    PermissionDenied,
    abort_for,
)
from .wire import MAX_BATCH, BatchRequest
from .wire import MAX_REASON_CHARS as MAX_REASON_CHARS  # the limit runs_service shares
from .wirecheck import PageTokens

log = logging.getLogger("execgate.server")

# Who may explain another identity's calls (ExplainPolicy): those who read or decide them.
_EXPLAINS_ANYONE = frozenset({Role.OPERATOR, Role.APPROVER, Role.ADMIN})
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


def dispatch(
    dispatcher: Dispatcher,
    batch: BatchRequest,
    context: grpc.aio.ServicerContext[Any, Any],
    progress: bool,
) -> AsyncGenerator[Event, None]:
    """A batch's events as they happen, straight from the dispatcher: Execute and
    ExecuteBatch read it with no generator of their own between (each layer costs every
    call) and hold back what `_UNSENT` names themselves."""
    return dispatcher.execute(
        batch.run_id,
        batch.batch_id,
        batch.calls,
        agent=caller().name,
        progress=progress,
        deadline=batch.deadline,
        metadata=tuple(context.invocation_metadata() or ()),
    )


async def batch_events(
    dispatcher: Dispatcher,
    batch: BatchRequest,
    context: grpc.aio.ServicerContext[Any, Any],
    progress: bool,
) -> AsyncGenerator[Event, None]:
    """The Runs service's Step: the batch's events as they happen. Those that end a call
    without an outcome (DETACHED, UNRECORDED) are held back: once every call has ended,
    the RPC ends with an error naming them."""
    events = dispatch(dispatcher, batch, context, progress)
    unsent: list[Event] = []
    async with contextlib.aclosing(events):
        async for event in events:
            if event.kind in _UNSENT:
                unsent.append(event)
            else:
                yield event
    if unsent:
        await _abort_unsent(context, unsent)


class ExecutorService(pb_grpc.ExecutorServicer):
    def __init__(
        self, dispatcher: Dispatcher, statuses: Callable[[], Sequence[ServerStatus]]
    ) -> None:
        self.dispatcher = dispatcher
        self.pages = PageTokens()
        # The MCP servers' states (mcp_wiring.ServedServers' provider).
        self.statuses = statuses

    async def ListTools(
        self,
        request: pb.ListToolsRequest,
        context: grpc.aio.ServicerContext[pb.ListToolsRequest, pb.ListToolsResponse],
    ) -> pb.ListToolsResponse:
        toolset = self.dispatcher.toolset
        return wire.tools(
            (t.spec, toolset.providers[n], trusted_of(t)) for n, t in toolset.tools.items()
        )

    async def ListProviders(
        self,
        request: pb.ListProvidersRequest,
        context: grpc.aio.ServicerContext[pb.ListProvidersRequest, pb.ListProvidersResponse],
    ) -> pb.ListProvidersResponse:
        return wire.providers(self.statuses())

    async def Execute(
        self,
        request: pb.ExecuteRequest,
        context: grpc.aio.ServicerContext[pb.ExecuteRequest, pb.ExecuteEvent],
    ) -> AsyncIterator[pb.ExecuteEvent]:
        batch = self._batch(request)
        unsent: list[Event] = []
        events = dispatch(self.dispatcher, batch, context, not batch.outcomes_only)
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
        batch = self._batch(request)
        finished: list[Event | None] = [None] * len(batch.calls)
        unsent: list[Event] = []
        events = dispatch(self.dispatcher, batch, context, False)
        async with contextlib.aclosing(events):
            async for event in events:
                if event.kind in _UNSENT:
                    unsent.append(event)
                else:
                    finished[event.index] = event
        if unsent:
            await _abort_unsent(context, unsent)
        return wire.batch_response(batch.batch_id, finished)

    async def Explain(
        self,
        request: pb.ExecuteRequest,
        context: grpc.aio.ServicerContext[pb.ExecuteRequest, pb.ExplainResponse],
    ) -> pb.ExplainResponse:
        rows = await self.dispatcher.explain(self._batch(request).calls, agent=caller().name)
        return wire.plan(rows)

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

    def _batch(self, request: pb.ExecuteRequest) -> BatchRequest:
        """The request's calls as the dispatcher takes them; raises MalformedRequest."""
        return wire.batch_request(request, default_run=DEFAULT_RUN, new_id=self.dispatcher.new_id)

    async def Cancel(
        self,
        request: pb.CancelRequest,
        context: grpc.aio.ServicerContext[pb.CancelRequest, pb.CancelResponse],
    ) -> pb.CancelResponse:
        at = clock.now()  # the moment of the request, before anything else happens
        who = caller()
        order = wire.cancel_order(
            request,
            at=at,
            default_run=DEFAULT_RUN,
            caller=who.name,
            only_agent="" if who.holds_any(CANCELS_ANY) else who.name,
        )
        try:
            hit = await self.dispatcher.cancel(order)
        except NotYours as exc:
            await abort_for(context, exc)
        return wire.cancelled(hit)

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
        query = wire.page_query(request, caller().name)
        before = self.pages.open(request.page_token, query) if request.page_token else 0
        if request.limit < 0:
            raise MalformedRequest("out_of_range", "limit", "limit: must not be negative")
        limit = min(request.limit or 100, 1000)
        scope = scope_of(caller(), self.dispatcher.policy)
        flt = wire.call_filter(
            request, run_id=request.run_id, limit=limit, before_seq=before, agents=scope.agents
        )
        records, next_seq = await self.dispatcher.journal.list(flt)
        return wire.calls_page(records, self.pages.issue(next_seq, query) if next_seq else "")


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
        return wire.approvals(await self.approvals.pending())

    async def List(
        self,
        request: pb.ListApprovalsRequest,
        context: grpc.aio.ServicerContext[pb.ListApprovalsRequest, pb.ListPendingResponse],
    ) -> pb.ListPendingResponse:
        found = await self.approvals.of_run(request.run_id)
        scope = scope_of(caller(), self.policy(), approvals=True)
        return wire.approvals(a for a in found if scope.allows(a.requester))

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
