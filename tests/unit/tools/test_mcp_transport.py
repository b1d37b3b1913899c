"""The MCP streams over a process's stdio: JSON-RPC lines in, bounded."""

from __future__ import annotations

import asyncio

import mcp.types as mcp_types

from execgate.executor.tools.mcp.transport import LineTooLong, open_streams


async def _items(script: str, max_line: int) -> list[object]:
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", script, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    found: list[object] = []
    try:
        async with open_streams(proc.stdin, proc.stdout, max_line=max_line) as (read, _write):
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
