"""PidWatch on a real process: it sees the process end and signals through the pidfd.

Not a unit test: it waits (polling, with a bound) for a real process to die."""

from __future__ import annotations

import asyncio
import time


def test_pidwatch_sees_the_end_and_signals_through_the_pidfd() -> None:
    import signal
    import subprocess

    from execgate.executor.sandbox.pidwatch import PidWatch

    proc = subprocess.Popen(["sleep", "30"])

    async def go() -> tuple[float | None, float]:
        watch = PidWatch(proc.pid)
        assert watch.gone_at is None
        sent = time.time()
        assert watch.send(signal.SIGTERM)
        for _ in range(200):
            if watch.gone_at is not None:
                break
            await asyncio.sleep(0.005)
        watch.close()
        assert not watch.send(signal.SIGTERM)  # closed: no signal can reach a reused pid
        return watch.gone_at, sent

    gone_at, sent = asyncio.run(go())
    assert proc.wait(5) == -signal.SIGTERM
    assert gone_at is not None
    assert sent <= gone_at < sent + 1
