"""The warm pool's rules for building and making room, with boxes that are not sandboxes:
which call waits for which build, when a call goes cold, when an idle box is closed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import pytest

from execgate.executor.sandbox import Confinement, Launch, warm_pool
from execgate.executor.sandbox.warm_pool import WarmPool


class FakeBox:
    """What the pool asks of a WarmBox."""

    def __init__(self, key: Any) -> None:
        self.key = key
        self.users = 0
        self.idle_since = time.monotonic()
        self.dead = False
        self.doomed = False
        self.closed = False

        class _Proc:
            returncode: int | None = None

        self.proc = _Proc()

    def stale(self) -> bool:
        return self.dead

    def doom(self) -> None:
        self.doomed = True

    def close(self) -> None:
        self.closed = True

    async def reap(self) -> None:
        return None


class Builds:
    """`warm_pool.build` stand-in: each build waits until released."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.release = asyncio.Event()

    async def __call__(self, key: Any, *_args: Any) -> FakeBox:
        self.started.append(key)
        await self.release.wait()
        return FakeBox(key)


def launch(run: str, workspace: str = "/w") -> Launch:
    return Launch(
        argv=("true",),
        cwd=Path(workspace),
        env={},
        stdin=None,
        workspace=Path(workspace),
        writable=False,
        marker="m",
        confinement=Confinement(),
        run_id=run,
    )


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Builds:
    fake = Builds()
    monkeypatch.setattr(warm_pool, "build", fake)
    return fake


def pool(most: int = warm_pool.MAX_SANDBOXES) -> WarmPool:
    return WarmPool(None, (), None, most)  # type: ignore[arg-type]


def test_calls_of_one_key_share_its_build_and_a_cancelled_one_leaves_it_going(
    builds: Builds,
) -> None:
    async def main() -> None:
        p = pool()
        first = asyncio.ensure_future(p.box(launch("r1"), None))  # type: ignore[arg-type]
        second = asyncio.ensure_future(p.box(launch("r1"), None))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        first.cancel()
        builds.release.set()
        box = await second
        assert builds.started == [("r1", "/w", False)]  # one build for both
        assert box is not None
        assert await p.box(launch("r1"), None) is box  # type: ignore[arg-type]

    asyncio.run(main())


def test_a_call_never_waits_for_other_keys_builds(builds: Builds) -> None:
    async def main() -> None:
        p = pool()
        waiting = [
            asyncio.ensure_future(p.box(launch(f"r{i}"), None))  # type: ignore[arg-type]
            for i in range(warm_pool.MAX_BUILDING)
        ]
        await asyncio.sleep(0)
        # Every build slot is taken by other keys: this call goes cold at once.
        assert await p.box(launch("late"), None) is None  # type: ignore[arg-type]
        builds.release.set()
        assert all(b is not None for b in await asyncio.gather(*waiting))
        assert len(builds.started) == warm_pool.MAX_BUILDING

    asyncio.run(main())


def test_a_full_pool_closes_only_a_box_idle_long_enough(builds: Builds) -> None:
    builds.release.set()

    async def main() -> None:
        p = pool(most=2)
        a = cast(FakeBox, await p.box(launch("a"), None))  # type: ignore[arg-type]
        b = cast(FakeBox, await p.box(launch("b"), None))  # type: ignore[arg-type]
        # Both just used: a new key gets a cold sandbox, neither box is closed.
        assert await p.box(launch("c"), None) is None  # type: ignore[arg-type]
        assert (a.doomed, b.doomed) == (False, False)
        # `a` idle past the bound: it makes room.
        a.idle_since -= warm_pool.EVICT_IDLE_SECONDS + 1
        c = await p.box(launch("c"), None)  # type: ignore[arg-type]
        assert c is not None
        assert (a.doomed, b.doomed) == (True, False)

    asyncio.run(main())
