"""`Connection.kill`: one kill of the tree, whatever the number of callers.

The process is a plain child (`sleep`, which never speaks MCP) behind a thin `Serving`
that counts what the connection asks of it; the sandboxes' own Serving are tested
with real servers in tests/integration/test_mcp_provider.py.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import mcp.types as mcp_types
import pytest

from execgate.executor.core.outcomes import ErrorClass
from execgate.executor.core.paths import Workspace
from execgate.executor.sandbox.base import Captured, Exit
from execgate.executor.tools.base import Limits, ToolContext
from execgate.executor.tools.mcp.calling import Call, call
from execgate.executor.tools.mcp.connection import (
    MAX_LISTING_BYTES,
    MAX_TOOLS,
    Connection,
    ListingTooLong,
    _list_all,
)

FIXTURE = Path(__file__).parents[2] / "fixtures" / "mcp" / "faulty_server.py"


class Plain:
    """A child process as a `Serving`: kills and releases counted, the kill slowed
    down so that callers overlap."""

    description = "plain child"

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.kills = 0
        self.releases = 0

    def stdio(self) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    async def wait(self) -> Exit:
        code = await self.proc.wait()
        return Exit(code=code if code >= 0 else None, signal=-code if code < 0 else None)

    async def finish(self) -> None:
        pass

    async def terminate(self) -> str:
        self.proc.terminate()
        return "SIGTERM"

    async def kill(self) -> str:
        self.kills += 1
        await asyncio.sleep(0.05)  # a kill takes a while: the other callers arrive
        if self.proc.returncode is None:
            self.proc.kill()
        return "SIGKILL"

    async def survivors(self) -> list[int]:
        return [] if self.proc.returncode is not None else [self.proc.pid]

    async def output(self) -> tuple[Captured, Captured]:
        return Captured(), Captured(b"stderr text", 11)

    async def release(self) -> None:
        self.releases += 1


async def _connection() -> tuple[Connection, Plain]:
    proc = await asyncio.create_subprocess_exec(
        "sleep", "60", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    plain = Plain(proc)
    return Connection(plain, "plain"), plain  # type: ignore[arg-type]  # a Serving by shape


def test_racing_kills_are_one_kill_with_one_result() -> None:
    async def main() -> None:
        conn, plain = await _connection()
        results = await asyncio.gather(conn.kill(), conn.kill(), conn.kill())
        assert results == [0, 0, 0]
        assert (plain.kills, plain.releases) == (1, 1)
        assert plain.proc.returncode is not None
        assert conn.closed.is_set()
        assert conn.stderr == "stderr text"
        assert await conn.kill() == 0  # later: the same answer, no second kill
        assert (plain.kills, plain.releases) == (1, 1)

    asyncio.run(main())


def test_a_cancelled_killer_does_not_stop_the_kill() -> None:
    async def main() -> None:
        conn, plain = await _connection()
        first = asyncio.ensure_future(conn.kill())
        second = asyncio.ensure_future(conn.kill())
        await asyncio.sleep(0.01)  # both wait on the one kill now
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await second == 0
        assert (plain.kills, plain.releases) == (1, 1)
        assert plain.proc.returncode is not None

    asyncio.run(main())


class Pages:
    """A session whose tools/list goes on for ever, `per_page` tools of `size` each."""

    def __init__(self, per_page: int, size: int) -> None:
        self.per_page = per_page
        self.size = size
        self.asked = 0

    async def list_tools(self, params: object = None) -> mcp_types.ListToolsResult:
        self.asked += 1
        tools = [
            mcp_types.Tool(
                name=f"t{self.asked}_{i}",
                description="d" * self.size,
                input_schema={"type": "object"},
            )
            for i in range(self.per_page)
        ]
        return mcp_types.ListToolsResult(tools=tools, next_cursor=str(self.asked))


@pytest.mark.parametrize(
    ("per_page", "size", "why", "pages"),
    [
        (10, 10, f"listed more than {MAX_TOOLS} tools", MAX_TOOLS // 10 + 1),
        (1, 1 << 20, f"came to more than {MAX_LISTING_BYTES >> 20} MiB", 8),
    ],
)
def test_a_listing_stops_at_its_bounds(per_page: int, size: int, why: str, pages: int) -> None:
    session = Pages(per_page, size)
    with pytest.raises(ListingTooLong, match=why):
        asyncio.run(_list_all(session))  # type: ignore[arg-type]
    assert session.asked == pages


class SlowToDie(Plain):
    """The fixture MCP server (tests/fixtures/mcp) as a `Serving` whose kill takes a while:
    the time in which a call that ended with its server must not have ended yet."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc)
        self.released_at = 0.0

    async def kill(self) -> str:
        self.kills += 1
        await asyncio.sleep(0.3)
        if self.proc.returncode is None:
            self.proc.kill()
        return "SIGKILL"

    async def release(self) -> None:
        self.releases += 1
        self.released_at = time.monotonic()


def test_a_call_whose_server_ends_under_it_ends_after_the_servers_tree() -> None:
    """The call's locks are released when its outcome is: only once the server's tree
    is killed and reaped (a writer's work could go on in what is left of it)."""

    async def main() -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(FIXTURE),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        serving = SlowToDie(proc)
        conn = Connection(serving, "faulty")  # type: ignore[arg-type]  # a Serving by shape
        await conn.wait_ready(30)
        ctx = ToolContext(workspace=Workspace(FIXTURE.parent), limits=Limits(), timeout=30)
        what = Call("faulty", "crash", "plain child")
        out = await call(conn, what, {"code": 3}, ctx, _never_forced)
        ended_at = time.monotonic()
        assert out.error_class is ErrorClass.INTERRUPTED, out
        assert serving.releases == 1, "the outcome came before the server's tree was gone"
        assert serving.released_at <= ended_at

    asyncio.run(main())


async def _never_forced(conn: Connection, why: str) -> int:
    raise AssertionError(f"no stop was asked for: {why}")
