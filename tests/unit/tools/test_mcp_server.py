"""`Server`'s backoff on the fake clock: failed starts (a launcher that raises, so no
process is involved) wait 0.5 s doubling to 30 s, a caller whose deadline ends first is
told at once, and failures far apart start the count over. The same count serves
crashes (tests/integration/test_mcp_lifecycle.py has a real crash loop)."""

from __future__ import annotations

import pytest

from execgate.executor.core.paths import Workspace
from execgate.executor.sandbox import Confinement, Launch, SandboxError
from execgate.executor.tools.decl import ServerDecl
from execgate.executor.tools.mcp import server as server_module
from execgate.executor.tools.mcp.server import (
    STABLE_SECONDS,
    Placement,
    PoolKey,
    Server,
    ServerDown,
)
from tests.fakeclock import FakeClock


class Nowhere:
    """A sandbox no process is ever started in (the launcher refuses first)."""

    name = "nowhere"

    async def start(self, launch: Launch) -> None:
        raise AssertionError(f"no start was to reach the sandbox: {launch}")


# The workspace the pool keys name (nothing is ever started in it).
NO_WORKSPACE = Workspace("/")


def refuse(_placement: Placement, _workspace: Workspace) -> Launch:
    raise SandboxError("no such program")


def place(_tool: str, _agent: str) -> Placement:
    return Placement(Nowhere(), Confinement())  # type: ignore[arg-type]  # never started


async def retry_after_failing(server: Server, key: PoolKey) -> float:
    """Start (waiting out any backoff) and fail; then the backoff a hurried caller is told."""
    with pytest.raises(ServerDown, match="no such program"):
        async with server.use(key, 600):
            pass
    with pytest.raises(ServerDown, match="next try in") as hurried:
        async with server.use(key, 0.1):
            pass
    return hurried.value.retry_in


def test_failed_starts_back_off_doubling_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClock()
    fake.install(monkeypatch, server_module)

    async def main() -> None:
        server = Server(ServerDecl(name="x", command="x"), refuse, place)
        key = server.key_for("", "local", server.place("x.*", "local"), NO_WORKSPACE)
        waits = [await retry_after_failing(server, key) for _ in range(8)]
        assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
        assert server.last_error == "no such program"
        fake.advance(STABLE_SECONDS + 31)  # long after the last failure: not a loop
        assert await retry_after_failing(server, key) == 0.5
        state = server.status()
        assert (state.running, state.restarts) == (0, 0)  # failed starts are no restarts

    fake.run(main())
