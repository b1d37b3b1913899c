"""core.clock: the marks' clock keeps intervals exact when the wall clock steps."""

from __future__ import annotations

import time

import pytest


def test_marks_keep_their_intervals_when_the_wall_clock_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A time sync stepping the wall clock mid-call must not bend a grace period.
    from execgate.executor.core import clock

    before = clock.now()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 10.0)
    after = clock.now()
    assert 0 <= after - before < 1.0
    assert abs(clock.now() - real()) < 1.0
