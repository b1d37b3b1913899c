"""Virtual time for unit tests of asyncio code: grace periods and deadlines without sleeping.

`FakeClock.run(coro)` runs `coro` on an event loop whose clock is the fake one. The clock
stands still while anything is ready to run; when every task waits on a timer (a sleep, a
`wait_for` timeout, a `call_later`), it jumps straight to the next one. A 30 s grace then
takes no real time, and the intervals a test measures are exact.

`install(monkeypatch, *modules)` makes the daemon's reads of time follow the fake clock for
the test: `core.clock.now` (every timeline mark), and `time.monotonic` / `time.time` as the
given modules see them (their module global `time`).

Only for code that waits on the event loop alone: a jump does not wait for work in another
thread (`asyncio.to_thread`) or process, so do not use it for those.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Coroutine
from types import ModuleType
from typing import Any, TypeVar

import pytest

from execgate.executor.core import clock as core_clock

T = TypeVar("T")

# Real seconds the loop may sit with nothing ready and no timer before the test is declared
# deadlocked (only another thread could still wake it, and fake-clock tests have none).
IDLE_SECONDS = 10.0


class FakeClock:
    """A monotonic clock that moves only when the loop has nothing else to do (or on
    `advance`), and a wall clock that keeps a fixed offset from it."""

    def __init__(self, *, start: float = 1000.0, wall_at_start: float | None = None) -> None:
        self._now = start
        self._wall_offset = (time.time() if wall_at_start is None else wall_at_start) - start

    def monotonic(self) -> float:
        return self._now

    def now(self) -> float:
        """Wall-clock seconds since the epoch, on the fake clock (what `core.clock.now` gives)."""
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self._now += seconds

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """`asyncio.run(coro)` on a loop that runs on this clock."""
        with asyncio.Runner(loop_factory=lambda: _VirtualLoop(self)) as runner:
            return runner.run(coro)

    def install(self, monkeypatch: pytest.MonkeyPatch, *modules: ModuleType) -> None:
        """For this test: `core.clock.now` reads this clock, and so do `time.monotonic` and
        `time.time` in each of `modules` (which must `import time`)."""
        monkeypatch.setattr(core_clock, "now", self.now)
        shim = _TimeShim(self)
        for module in modules:
            assert getattr(module, "time", None) is time, f"{module.__name__} has no `import time`"
            monkeypatch.setattr(module, "time", shim)


class _TimeShim:
    """The `time` module, but for `monotonic` and `time`, which read a FakeClock."""

    def __init__(self, fake: FakeClock) -> None:
        self.monotonic = fake.monotonic
        self.time = fake.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without blocking; where the loop would block until its next timer, the fake
    clock jumps to that timer instead."""

    def __init__(self, fake: FakeClock) -> None:
        super().__init__()
        self._fake = fake

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only I/O from outside could still come
            ready = super().select(IDLE_SECONDS)
            if not ready:
                raise RuntimeError(f"fake clock: nothing ready and no timer for {IDLE_SECONDS}s")
            return ready
        self._fake.advance(timeout)
        return []


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, fake: FakeClock) -> None:
        self._fake = fake
        super().__init__(_JumpingSelector(fake))

    def time(self) -> float:
        return self._fake.monotonic()
