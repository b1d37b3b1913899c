"""The bridge: an MCP server whose every request is a call on an execgate daemon.

    tools/list              -> ListTools (each time: the daemon reloads its tools)
    tools/call              -> Execute of one call, under the bridge's identity, in the
                               session's run and the configured workspace; its
                               events -> notifications/progress
    notifications/cancelled -> Cancel of that call (the daemon's grace-then-force ladder)

Nothing is decided here: policy, approvals, scheduling, sandbox, journal and traces are
the daemon's, exactly as for any client. A call's outcome reaches the MCP client only
after the daemon journaled it.

Sessions. Over stdio a connection is one session, named by a random id when it opens.
Over streamable HTTP each MCP session (the `Mcp-Session-Id` header) is one, named by a
hash of that header (the header itself is a credential of the HTTP session and stays out
of the journal); a request without one (stateless HTTP) is a session of its own. The
session's calls go to the run `mcp-<session>` unless `run_id` is configured.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from .._async import AsyncClient
from .._transport import TlsConfig
from ..errors import ExecgateClientError
from ..types import Call, Event, EventKind, Outcome
from . import keys, results
from .errors import BadMeta, StreamEnded
from .progress import Teller
from .tools import mcp_tool

__all__ = ["Bridge", "BridgeConfig"]

log = logging.getLogger("execgate.mcp")

INSTRUCTIONS = (
    "These tools run through execgate: the operator's policy may refuse a call or hold it "
    "for a human's approval, and every call is sandboxed and journaled. A result with "
    "isError starts with the execgate status (REJECTED, FAILURE, PARTIAL, UNKNOWN_OUTCOME), "
    "the error class and why. UNKNOWN_OUTCOME: the call may have changed something; "
    "reconcile before retrying, never repeat it blindly."
)
# The HTTP header that names a streamable HTTP session.
SESSION_HEADER = "mcp-session-id"


@dataclass(frozen=True, slots=True, kw_only=True)
class BridgeConfig:
    """How the bridge reaches the daemon, and as whom.

    Args:
        address: the daemon (None: $EXECGATE_ADDR, else `make run`'s socket).
        token: the bridge's bearer token (None: $EXECGATE_TOKEN, else the `agent`
            token beside a local daemon's socket).
        tls: mTLS files for a daemon's TCP listener.
        run_id: the run every session's calls go to ("": `mcp-<session>`, one per session).
        workspace: the workspace every call works in ("": the run's, else the identity's
            first). The daemon checks it call by call: one the identity was not given is
            a REJECTED outcome naming it, an error result like any refusal.
        cancel_grace: seconds a cancelled call gets to stop before it is killed (None:
            the daemon's default).
        heartbeat: seconds between progress notifications while a call waits for a lock
            or an approver.
    """

    address: str | None = None
    token: str | None = None
    tls: TlsConfig | None = None
    run_id: str = ""
    workspace: str = ""
    cancel_grace: float | None = None
    heartbeat: float = 10.0


@dataclass(frozen=True, slots=True)
class Origin:
    """What one served connection (stdio) or one HTTP app shares: a random id."""

    id: str


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    run_id: str
    # HTTP: a client may post a request again (an answer lost); its call id is its key.
    # Over a pipe a message arrives once, and a key costs the daemon a journal lookup.
    redelivers: bool


class Bridge:
    """The MCP server (`server`) in front of one daemon connection. Close it (or use
    `async with`) to close the connection; create it inside the event loop."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self._client = AsyncClient(
            config.address, token=config.token, tls=config.tls, workspace=config.workspace
        )
        self.server: Server[Origin] = Server(
            "execgate",
            version=_version(),
            instructions=INSTRUCTIONS,
            lifespan=self._lifespan,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.server.add_notification_handler(
            "notifications/cancelled", types.CancelledNotificationParams, self._cancelled
        )

    @property
    def address(self) -> str:
        return self._client.address

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> Bridge:
        return self

    async def __aexit__(
        self, *exc: type[BaseException] | BaseException | TracebackType | None
    ) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def _lifespan(self, server: Server[Origin]) -> AsyncIterator[Origin]:
        origin = Origin(secrets.token_hex(6))
        log.info(
            "execgate mcp: session origin %s, daemon %s, workspace %s",
            origin.id,
            self.address,
            self.config.workspace or "(the run's, else the identity's first)",
        )
        yield origin

    async def _list_tools(
        self, ctx: ServerRequestContext[Origin], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            specs = await self._client.list_tools()
        except ExecgateClientError as exc:
            raise MCPError(INTERNAL_ERROR, str(exc)) from exc
        return types.ListToolsResult(tools=[mcp_tool(s) for s in specs])

    async def _call_tool(
        self, ctx: ServerRequestContext[Origin], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        session = self._session(ctx)
        assert ctx.request_id is not None  # a request, not a notification
        own_id = keys.call_id(session.id, ctx.request_id)
        try:
            key = keys.idempotency_key(params.meta, own_id if session.redelivers else "")
        except BadMeta as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from exc
        call = Call(
            tool=params.name,
            arguments=params.arguments or {},
            call_id=own_id,
            idempotency_key=key,
        )
        try:
            if _wants_progress(params.meta):
                outcome = await self._run_told(ctx, call, session.run_id)
            else:
                outcome = await self._run(call, session.run_id)
        except ExecgateClientError as exc:
            raise MCPError(INTERNAL_ERROR, _lost(exc, call, session.run_id)) from exc
        return results.call_result(outcome, session.run_id)

    async def _run(self, call: Call, run_id: str) -> Outcome:
        """The outcome alone. On Execute's stream, not the (slightly cheaper) unary
        ExecuteBatch: a unary grpc.aio call cancelled under the SDK's cancel scope (the
        client's notifications/cancelled) raised a cancellation the scope did not absorb,
        which ended the whole session (tests/integration/test_mcp_bridge.py, the cancels)."""
        async for event in self._client.stream([call], run_id=run_id, progress=False):
            if event.outcome is not None:
                return event.outcome
        raise StreamEnded("the daemon's stream ended without an outcome")

    async def _run_told(
        self, ctx: ServerRequestContext[Origin], call: Call, run_id: str
    ) -> Outcome:
        """`_run`, telling the client what the call is doing (and, while it waits, that
        it still is, every `heartbeat` seconds)."""
        teller = Teller()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._heartbeat, ctx, teller)
            try:
                async for event in self._client.stream([call], run_id=run_id):
                    if event.outcome is not None:
                        return event.outcome
                    approvers = await self._approvers(event, run_id)
                    message = teller.tell(event, approvers)
                    if message is not None:
                        await ctx.session.report_progress(teller.step(), None, message)
            finally:
                tg.cancel_scope.cancel()
        raise StreamEnded("the daemon's stream ended without an outcome")

    async def _heartbeat(self, ctx: ServerRequestContext[Origin], teller: Teller) -> None:
        began = time.monotonic()
        while True:
            await anyio.sleep(self.config.heartbeat)
            message = teller.still(time.monotonic() - began)
            if message is not None:
                await ctx.session.report_progress(teller.step(), None, message)

    async def _approvers(self, event: Event, run_id: str) -> tuple[str, ...]:
        """Who may decide the approval an AWAITING_APPROVAL event names (the journal's
        record of the call says); () for other events, or if it cannot be read."""
        if event.kind is not EventKind.AWAITING_APPROVAL:
            return ()
        try:
            record = await self._client.get_call(event.call_id, run_id=run_id)
        except ExecgateClientError as exc:
            log.warning("execgate mcp: approvers of %s unknown: %s", event.call_id, exc)
            return ()
        return record.approvers

    async def _cancelled(
        self, ctx: ServerRequestContext[Origin], params: types.CancelledNotificationParams
    ) -> None:
        """The client gave up on a request: stop the call it started. (The SDK has
        already cancelled the request's handler, which drops the Execute stream; that
        alone stops only calls not yet started.) A request that started no call, or
        whose call has ended, is reached by nothing."""
        if params.request_id is None:
            return
        session = self._session(ctx)
        target = keys.call_id(session.id, params.request_id)
        reason = "cancelled by the MCP client" + (f": {params.reason}" if params.reason else "")
        try:
            reached = await self._client.cancel(
                call_id=target,
                run_id=session.run_id,
                reason=reason,
                grace=self.config.cancel_grace,
            )
        except ExecgateClientError as exc:
            log.warning("execgate mcp: cancel of %s failed: %s", target, exc)
            return
        log.info("execgate mcp: cancel of %s reached %s", target, reached or "nothing")

    def _session(self, ctx: ServerRequestContext[Origin]) -> Session:
        origin = ctx.lifespan_context
        if ctx.request is None:  # stdio: the connection is the session
            sid = origin.id
        elif (header := _header(ctx.request, SESSION_HEADER)) is not None:
            sid = hashlib.sha256(f"{origin.id}:{header}".encode()).hexdigest()[:12]
        else:  # stateless HTTP: each request on its own
            sid = secrets.token_hex(6)
        return Session(sid, self.config.run_id or f"mcp-{sid}", redelivers=ctx.request is not None)


def _wants_progress(meta: Mapping[str, Any] | None) -> bool:
    return meta is not None and meta.get("progress_token") is not None


def _header(request: object, name: str) -> str | None:
    headers = getattr(request, "headers", None)
    value = headers.get(name) if headers is not None else None
    return value if isinstance(value, str) and value else None


def _lost(exc: ExecgateClientError, call: Call, run_id: str) -> str:
    return (
        f"{exc}. Call {call.call_id} (run {run_id}) may have run: its outcome, if any, is in "
        f"the daemon's journal (`execgate calls show {call.call_id} --run {run_id}`)"
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("execgate")
    except PackageNotFoundError:
        return "unknown"
