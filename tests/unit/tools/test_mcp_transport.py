"""The MCP streams over a process's stdio: JSON-RPC lines in, bounded."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
from pathlib import Path

import mcp.types as mcp_types
import pytest
from mcp.shared.message import SessionMessage

from execgate.executor.tools.declguard import masks
from execgate.executor.tools.mcp.transport import (
    MAX_SERVER_REQUESTS,
    LineTooLong,
    TooManyRequests,
    _Owed,
    open_streams,
)

SECRET = 'tok"\\é-42'
HIDDEN = masks([("TOKEN", SECRET)])


async def _items(script: str, max_line: int, hidden: dict[str, str] | None = None) -> list[object]:
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", script, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    found: list[object] = []
    streams = open_streams(proc.stdin, proc.stdout, max_line=max_line, hidden=hidden)
    try:
        async with streams as (read, _write):
            async for item in read:
                found.append(item.message if hasattr(item, "message") else item)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    return found


def test_messages_are_parsed_and_garbage_is_an_error_item() -> None:
    ping = '{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
    found = asyncio.run(_items(f"echo '{ping}'; echo 'not json'; echo", 1 << 20))
    assert len(found) == 2, found
    assert isinstance(found[0], mcp_types.JSONRPCRequest)
    assert isinstance(found[1], ValueError)


def test_a_line_over_the_bound_ends_the_session() -> None:
    # 64 KiB without a newline, then a process that would go on: the reader stops.
    found = asyncio.run(_items("head -c 65536 /dev/zero | tr '\\0' x; sleep 30", 4096))
    assert len(found) == 1, found
    assert isinstance(found[0], LineTooLong)
    assert found[0].limit == 4096


def _result(text: str, structured: dict[str, object]) -> dict[str, object]:
    content = [{"type": "text", "text": text}]
    return {"content": content, "structuredContent": structured}


def test_a_secret_is_cut_from_every_message_however_it_is_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    every_char_escaped = "".join(f"\\u{ord(c):04x}" for c in SECRET)
    lines = [
        json.dumps({"jsonrpc": "2.0", "id": 1, "result": _result(SECRET, {SECRET: SECRET})}),
        # The server's own JSON text in a result: the escaped form, in the text.
        json.dumps({"jsonrpc": "2.0", "id": 2, "result": _result(json.dumps([SECRET]), {})}),
        json.dumps({"jsonrpc": "2.0", "id": 3, "error": {"code": 1, "message": "@"}}).replace(
            "@", every_char_escaped
        ),
        json.dumps(
            {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": 1, "progress": 1, "message": SECRET},
            }
        ),
        json.dumps({"jsonrpc": "2.0", "id": 4, "bogus": SECRET}),  # no JSON-RPC message
        f"not json {SECRET}",
    ]
    (tmp_path / "lines").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        found = asyncio.run(_items(f"cat {shlex.quote(str(tmp_path / 'lines'))}", 1 << 20, HIDDEN))
    assert len(found) == 6, found
    seen = [m.model_dump_json() if hasattr(m, "model_dump_json") else str(m) for m in found]
    seen += [caplog.text]
    for text in seen:
        for form in HIDDEN:
            assert form not in text, (form, text)
    assert [type(m).__name__ for m in found[:4]] == [
        "JSONRPCResponse", "JSONRPCResponse", "JSONRPCError", "JSONRPCNotification"
    ]  # fmt: skip
    for i in range(4):
        assert "[secret TOKEN]" in seen[i], seen[i]
    assert isinstance(found[4], ValueError)
    assert "[secret TOKEN]" in str(found[4])


def _request(i: int) -> SessionMessage:
    return SessionMessage(mcp_types.JSONRPCRequest(jsonrpc="2.0", id=f"r{i}", method="ping"))


def test_the_servers_unanswered_requests_are_bounded() -> None:
    owed = _Owed(max_bytes=1000)
    for i in range(MAX_SERVER_REQUESTS):
        assert owed.asked(_request(i), 10) is None
    # An answer the daemon wrote, and a request the server cancelled, are owed no more.
    owed.answered(mcp_types.JSONRPCResponse(jsonrpc="2.0", id="r0", result={}))
    cancel = mcp_types.JSONRPCNotification(
        jsonrpc="2.0", method="notifications/cancelled", params={"requestId": "r1"}
    )
    assert owed.asked(SessionMessage(cancel), 10) is None
    assert owed.asked(_request(100), 10) is None
    assert owed.asked(_request(101), 10) is None
    assert isinstance(owed.asked(_request(102), 10), TooManyRequests)


def test_the_bytes_of_unanswered_requests_are_bounded() -> None:
    owed = _Owed(max_bytes=1000)
    assert owed.asked(_request(0), 600) is None
    assert isinstance(owed.asked(_request(1), 600), TooManyRequests)
