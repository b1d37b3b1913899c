"""dirsync: concurrent writers in one directory share its fsync, and each returns only
once a fsync begun after it arrived has finished."""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

import pytest

from execgate.executor.tools import dirsync
from tests.daemon import scaled


class Recorder:
    """os.fsync for dirsync: logs when each fsync starts and ends on one clock of steps;
    the first one is held until `gate` is set."""

    def __init__(self, fail: set[int] | None = None) -> None:
        self.clock = itertools.count()
        self.lock = threading.Lock()
        self.spans: list[tuple[int, int]] = []
        self.fail = fail or set()
        self.gate = threading.Event()
        self.first_started = threading.Event()

    def tick(self) -> int:
        with self.lock:
            return next(self.clock)

    def fsync(self, fd: int) -> None:
        start = self.tick()
        self.first_started.set()
        assert self.gate.wait(10)
        index = len(self.spans)
        self.spans.append((start, self.tick()))
        if index in self.fail:
            raise OSError(5, "Input/output error")


def _users(path: Path) -> int:
    st = os.stat(path)
    entry = dirsync._dirs.get((st.st_dev, st.st_ino))
    return entry.users if entry else 0


def test_writers_share_fsyncs_and_each_is_covered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = Recorder()
    monkeypatch.setattr(dirsync.os, "fsync", rec.fsync)
    calls: list[tuple[int, int]] = []

    def writer() -> None:
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            arrived = rec.tick()
            dirsync.sync(fd)
            calls.append((arrived, rec.tick()))
        finally:
            os.close(fd)

    first = threading.Thread(target=writer)
    first.start()
    assert rec.first_started.wait(10)
    others = [threading.Thread(target=writer) for _ in range(15)]
    for t in others:
        t.start()
    deadline = time.monotonic() + scaled(10)
    while _users(tmp_path) < 16:  # every writer is waiting behind the held fsync
        assert time.monotonic() < deadline
        time.sleep(0.001)
    rec.gate.set()
    for t in (first, *others):
        t.join(10)
    assert len(calls) == 16
    # The held fsync covers the first writer only; one more covers the other fifteen.
    assert len(rec.spans) == 2
    for arrived, returned in calls:  # an fsync begun after it arrived ended before it left
        assert any(arrived < start and end < returned for start, end in rec.spans)
    assert not dirsync._dirs  # nothing kept once nobody waits


def test_a_failed_fsync_fails_the_writers_it_alone_covered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = Recorder(fail={0})
    rec.gate.set()
    monkeypatch.setattr(dirsync.os, "fsync", rec.fsync)
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="Input/output"):
            dirsync.sync(fd)
        dirsync.sync(fd)  # the next fsync succeeds: this call is covered
    finally:
        os.close(fd)
    assert len(rec.spans) == 2
