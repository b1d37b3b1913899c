"""The cancellation ladder (executor.sandbox.ladder.supervise), without a daemon.

It is driven with a scripted fake `Running`:
these tests pin its decisions (cooperative vs force, marks and their order, the
grace it grants, what it reports about survivors). The real processes, namespaces
and containers are tested through the daemon in integration/test_cancel.py,
security/test_sandbox_probes.py and integration/test_docker_sandbox.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import execgate.executor.sandbox.ladder as ladder_module
from execgate.executor.core.outcomes import ErrorClass, Phase, StopMode
from execgate.executor.sandbox import Captured, Exit
from execgate.executor.sandbox.ladder import CancelScope, grace_for, supervise
from tests.fakeclock import FakeClock


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The ladder's grace periods, deadlines and marks on a fake clock: no test sleeps."""
    clock = FakeClock()
    clock.install(monkeypatch, ladder_module)
    return clock


class FakeRunning:
    """A call that exits `exit_after` seconds after SIGTERM (never, if None), and whose
    `stragglers` processes outlive the main one until killed."""

    description = "fake"

    def __init__(self, exit_after: float | None, stragglers: int = 0) -> None:
        self.exit_after = exit_after
        self.stragglers = stragglers
        self.exited = asyncio.Event()
        self.log: list[str] = []

    async def wait(self) -> Exit:
        await self.exited.wait()
        return Exit(None, 15) if "kill" not in self.log else Exit(None, 9)

    async def terminate(self) -> str:
        self.log.append("terminate")
        if self.exit_after is not None:
            asyncio.get_running_loop().call_later(self.exit_after, self.exited.set)
        return "SIGTERM to fake"

    async def kill(self) -> str:
        self.log.append("kill")
        self.stragglers = 0
        self.exited.set()
        return "SIGKILL to fake"

    async def finish(self) -> None:
        self.log.append("finish")

    async def survivors(self) -> list[int]:
        return list(range(self.stragglers))

    async def output(self) -> tuple[Captured, Captured]:
        return Captured(), Captured()

    async def release(self) -> None:
        self.log.append("release")


def ladder(fake: FakeClock, running: FakeRunning, scope: CancelScope, **kw: Any) -> Any:
    async def go() -> Any:
        task = asyncio.ensure_future(
            supervise(
                running,
                scope,
                time_limit=kw.get("time_limit", 30),
                grace=kw.get("grace", 0.3),
                max_grace=kw.get("max_grace", 1),
            )
        )
        await asyncio.sleep(0.01)
        if kw.get("cancel", True):
            scope.cancel("stop please", kw.get("ask_grace"), requester="tester")
        return await task

    return fake.run(asyncio.wait_for(go(), 10))


def phases(stopped: Any) -> list[Phase]:
    return [m.phase for m in stopped.marks]


def test_cooperative_stop_marks_and_mode(fake: FakeClock) -> None:
    scope = CancelScope()
    stopped = ladder(fake, FakeRunning(exit_after=0.01), scope)
    assert stopped.how is StopMode.COOPERATIVE
    assert stopped.reason is ErrorClass.CANCELLED
    assert phases(stopped) == [Phase.CANCEL_REQUESTED, Phase.SIGNAL_SENT, Phase.STOPPED]
    first = stopped.marks[0]
    assert first.at == scope.requested_at  # the request's time, not when the ladder saw it
    assert first.detail == "stop please (requested by tester)"
    assert stopped.survivors == 0


def test_force_when_the_main_process_ignores_the_signal(fake: FakeClock) -> None:
    running = FakeRunning(exit_after=None)
    stopped = ladder(fake, running, CancelScope(), grace=0.2)
    assert stopped.how is StopMode.FORCE_TERMINATED
    assert phases(stopped) == [
        Phase.CANCEL_REQUESTED,
        Phase.SIGNAL_SENT,
        Phase.GRACE_EXPIRED,
        Phase.FORCE_TERMINATED,
        Phase.STOPPED,
    ]
    by_phase = {m.phase: m for m in stopped.marks}
    waited = by_phase[Phase.GRACE_EXPIRED].at - by_phase[Phase.SIGNAL_SENT].at
    assert 0.18 <= waited < 0.5
    assert by_phase[Phase.FORCE_TERMINATED].detail == "SIGKILL to fake"
    assert stopped.exit.signal == 9
    assert running.log[:2] == ["terminate", "kill"]


def test_stragglers_make_a_cooperative_exit_a_forced_one(fake: FakeClock) -> None:
    # The main process stops politely, but a grandchild it left keeps running: the
    # call did not stop cooperatively, and the grandchild is killed after the grace.
    running = FakeRunning(exit_after=0.01, stragglers=2)
    stopped = ladder(fake, running, CancelScope(), grace=0.2)
    assert stopped.how is StopMode.FORCE_TERMINATED
    assert "kill" in running.log
    assert stopped.survivors == 0


def test_a_slow_survivor_scan_does_not_stretch_the_grace(fake: FakeClock) -> None:
    # The main process exits at once but the scan for what it left hangs (a /proc read
    # stuck on a loaded machine): the grace still ends on time and the kill follows.
    class SlowScan(FakeRunning):
        async def survivors(self) -> list[int]:
            if "kill" not in self.log:
                await asyncio.sleep(5)
            return []

    stopped = ladder(fake, SlowScan(exit_after=0.01), CancelScope(), grace=0.2)
    by_phase = {m.phase: m for m in stopped.marks}
    assert stopped.how is StopMode.FORCE_TERMINATED
    waited = by_phase[Phase.GRACE_EXPIRED].at - by_phase[Phase.SIGNAL_SENT].at
    assert 0.18 <= waited < 0.5, waited


def test_reported_survivors_when_nothing_kills_them(fake: FakeClock) -> None:
    class Immortal(FakeRunning):
        async def kill(self) -> str:
            self.exited.set()
            return "SIGKILL (ignored)"

    running = Immortal(exit_after=None, stragglers=3)
    import execgate.executor.sandbox.ladder as cancel_mod

    old = cancel_mod.REAP_SECONDS
    cancel_mod.REAP_SECONDS = 0.2
    try:
        stopped = ladder(fake, running, CancelScope(), grace=0.05)
    finally:
        cancel_mod.REAP_SECONDS = old
    assert stopped.survivors == 3
    assert stopped.marks[-1].detail.startswith("3 survived")


def test_timeout_takes_the_same_path_with_reason_timeout(fake: FakeClock) -> None:
    stopped = ladder(
        fake, FakeRunning(exit_after=0.01), CancelScope(), time_limit=0.1, cancel=False
    )
    assert stopped.how is StopMode.COOPERATIVE
    assert stopped.reason is ErrorClass.TIMEOUT
    assert stopped.marks[0].detail == "timeout after 0.1s"


def test_deadline_cancel_is_a_timeout(fake: FakeClock) -> None:
    scope = CancelScope()

    async def go() -> Any:
        task = asyncio.ensure_future(
            supervise(FakeRunning(0.01), scope, time_limit=30, grace=1, max_grace=1)
        )
        await asyncio.sleep(0.01)
        scope.cancel("run deadline passed", timed_out=True)
        return await task

    assert fake.run(go()).reason is ErrorClass.TIMEOUT


def test_completed_call_is_finished_not_signalled(fake: FakeClock) -> None:
    running = FakeRunning(exit_after=None)

    async def go() -> Any:
        task = asyncio.ensure_future(
            supervise(running, CancelScope(), time_limit=30, grace=1, max_grace=1)
        )
        await asyncio.sleep(0.01)
        running.exited.set()
        return await task

    stopped = fake.run(go())
    assert stopped.how is StopMode.COMPLETED
    assert stopped.marks == ()
    assert running.log == ["finish"]


def test_grace_asked_by_the_canceller_is_capped() -> None:
    scope = CancelScope()
    scope.cancel("x", 500.0)
    assert grace_for(scope, 2.0, 60.0) == 60.0
    other = CancelScope()
    other.cancel("x", -3.0)
    assert grace_for(other, 2.0, 60.0) == 0.0
    default = CancelScope()
    default.cancel("x")
    assert grace_for(default, 2.0, 60.0) == 2.0


def test_force_ends_a_running_grace_period(fake: FakeClock) -> None:
    running = FakeRunning(exit_after=None)
    scope = CancelScope()

    async def go() -> Any:
        task = asyncio.ensure_future(
            supervise(running, scope, time_limit=30, grace=30, max_grace=60)
        )
        await asyncio.sleep(0.01)
        scope.cancel("shutdown")
        await asyncio.sleep(0.05)
        scope.force("second signal")
        return await task

    started = fake.monotonic()
    stopped = fake.run(asyncio.wait_for(go(), 5))
    assert fake.monotonic() - started < 2  # not the 30 s grace
    assert stopped.how is StopMode.FORCE_TERMINATED
    grace_mark = next(m for m in stopped.marks if m.phase is Phase.GRACE_EXPIRED)
    assert grace_mark.detail == "forced: no grace"


def test_the_stop_time_is_when_the_backend_saw_the_process_end(fake: FakeClock) -> None:
    class Early(FakeRunning):
        async def wait(self) -> Exit:
            await self.exited.wait()
            await asyncio.sleep(0.2)  # the exit status arrives late (dockerd)
            return Exit(0, None, False, at=self.ended_at)

        async def terminate(self) -> str:
            def end() -> None:
                self.ended_at = fake.now()  # the wall clock, on the fake clock
                self.exited.set()

            asyncio.get_running_loop().call_later(0.01, end)
            return "SIGTERM"

    running = Early(exit_after=None)
    stopped = ladder(fake, running, CancelScope(), grace=1)
    stop = stopped.marks[-1]
    assert stop.phase is Phase.STOPPED
    assert stop.at == running.ended_at  # not the 0.2 s later the status came
