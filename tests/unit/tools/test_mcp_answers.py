"""A call's `tools/call` on the SDK's session, against a scripted peer over memory
streams: it goes out under the daemon's id with the call's trace context (whatever
else is current), and its answer is seen even after the SDK stopped waiting."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import anyio
import mcp.types as mcp_types
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession
from mcp.shared.message import SessionMessage
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from execgate.executor.tools.mcp import calling, tracecontext
from execgate.executor.tools.mcp.answers import Answers, Expected

INFO = mcp_types.Implementation(name="test", version="1")
CALL = SpanContext(0x11, 0x22, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
STRAY = SpanContext(0x33, 0x44, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))

Peer = tuple[
    MemoryObjectSendStream[SessionMessage | Exception], MemoryObjectReceiveStream[SessionMessage]
]


@contextlib.asynccontextmanager
async def _session(answers: Answers) -> AsyncIterator[tuple[ClientSession, Peer]]:
    to_client, client_reads = anyio.create_memory_object_stream[SessionMessage | Exception](8)
    client_writes, from_client = anyio.create_memory_object_stream[SessionMessage](8)
    async with to_client, from_client, answers.session(client_reads, client_writes, INFO) as s:
        yield s, (to_client, from_client)


def _send(answers: Answers, session: ClientSession) -> tuple[asyncio.Task[object], Expected]:
    expected = answers.expect()
    current = tracecontext.current(CALL)
    with trace.use_span(NonRecordingSpan(STRAY)):  # what else might be current
        sent = session.call_tool("t", {}, meta=tracecontext.meta(current))  # type: ignore[arg-type]
        return calling._start(sent, expected, current), expected


def _answer(request_id: str) -> SessionMessage:
    result = {"content": [{"type": "text", "text": "ok"}]}
    return SessionMessage(mcp_types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result))


def test_the_call_goes_out_under_its_id_with_its_trace_context() -> None:
    async def main() -> None:
        answers = Answers()
        async with _session(answers) as (session, (to_client, from_client)):
            task, expected = _send(answers, session)
            request = (await from_client.receive()).message
            assert isinstance(request, mcp_types.JSONRPCRequest)
            assert (request.method, request.id) == ("tools/call", expected.id)
            assert request.params is not None
            traceparent = request.params["_meta"]["traceparent"]
            assert traceparent == f"00-{CALL.trace_id:032x}-{CALL.span_id:016x}-01"
            await to_client.send(_answer(expected.id))
            result = await task
            assert isinstance(result, mcp_types.CallToolResult)
            assert expected.answered.is_set()
            # The result is checked against what was listed at start (outputs.py): the
            # SDK's own check would list the server's tools again first.
            with pytest.raises(anyio.WouldBlock):
                from_client.receive_nowait()

    asyncio.run(main())


def test_an_answer_after_the_sdk_gave_up_is_still_seen() -> None:
    async def main() -> None:
        answers = Answers()
        async with _session(answers) as (session, (to_client, from_client)):
            task, expected = _send(answers, session)
            await from_client.receive()
            task.cancel()  # the SDK abandons it and sends notifications/cancelled
            with contextlib.suppress(asyncio.CancelledError):
                await task
            cancelled = (await from_client.receive()).message
            assert isinstance(cancelled, mcp_types.JSONRPCNotification)
            assert cancelled.method == "notifications/cancelled"
            assert not expected.answered.is_set()
            await to_client.send(_answer(expected.id))  # the SDK drops it; we see it
            await asyncio.wait_for(expected.answered.wait(), 5)

    asyncio.run(main())


def test_only_an_answer_to_an_expected_id_counts() -> None:
    async def main() -> None:
        answers = Answers()
        expected, forgotten = answers.expect(), answers.expect()
        assert expected.id != forgotten.id
        answers.forget(forgotten)
        ping = mcp_types.JSONRPCRequest(jsonrpc="2.0", id=expected.id, method="ping")
        note = mcp_types.JSONRPCNotification(jsonrpc="2.0", method="notifications/progress")
        for item in (SessionMessage(ping), SessionMessage(note), ValueError("not JSON")):
            answers.saw(item)
        answers.saw(_answer("someone-else"))
        answers.saw(_answer(forgotten.id))
        assert not expected.answered.is_set()
        assert not forgotten.answered.is_set()
        error = mcp_types.ErrorData(code=-32000, message="failed")
        answers.saw(
            SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=expected.id, error=error))
        )
        assert expected.answered.is_set()

    asyncio.run(main())
