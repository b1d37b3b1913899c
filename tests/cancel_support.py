"""Helpers of the cancellation tests (test_cancel.py, test_cancel_reach.py)."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from execgate.client import Call, Client, Outcome
from execgate.executor.sandbox import procscan
from tests.daemon import Daemon
from tests.support import comm

GRACE = 1.0
# How late the ladder may take a step it scheduled (event loop, /proc scans, docker).
SLACK = 0.5

# A shell that exits at once on SIGTERM; its `sleep` dies with the signal too.
COOPERATIVE = 'trap "exit 0" TERM; sleep 1000 & wait'
# Ignores SIGTERM, and leaves its session and process group through a double fork
# into a setsid grandchild that ignores SIGTERM as well.
STUBBORN = 'trap "" TERM; (setsid sh -c "trap \\"\\" TERM; sleep 1000" &); sleep 1000'


# ---------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Boxed:
    """A daemon on one sandbox backend, and a client of it."""

    backend: str
    daemon: Daemon
    client: Client


def new_tag() -> str:
    return uuid.uuid4().hex


def sh(script: str, call_id: str, *, tag: str = "", timeout: float | None = None) -> Call:
    arguments: dict[str, object] = {"argv": ["sh", "-c", script]}
    if tag:
        arguments["env"] = {"EG_TAG": tag}
    return Call(tool="run_command", arguments=arguments, call_id=call_id, timeout=timeout)


def work(call_id: str, path: str, *, write: bool = False, seconds: float = 0) -> Call:
    return Call(
        tool="work",
        arguments={"path": path, "write": write, "seconds": seconds},
        call_id=call_id,
    )


def tagged(tag: str, name: str | None = None) -> list[int]:
    """Live host pids whose environment has EG_TAG=tag (and whose name is `name`)."""
    pids = procscan.with_marker("EG_TAG", tag)
    if name is None:
        return pids
    return [p for p in pids if comm(p) == name]


def at(o: Outcome, phase: str) -> float:
    m = o.mark(phase)
    assert m is not None, f"no {phase!r} mark in {phases(o)}"
    return m.at


def phases(o: Outcome) -> list[str]:
    return [m.phase for m in o.timeline]


def in_order(o: Outcome, *names: str) -> None:
    """Each phase is marked, each strictly after the one before it."""
    times = [at(o, n) for n in names]
    shown = [(n, f"{t:.6f}") for n, t in zip(names, times, strict=True)]
    for earlier, later in itertools.pairwise(times):
        assert earlier < later, shown


def detail(o: Outcome, phase: str) -> str:
    m = o.mark(phase)
    assert m is not None, f"no {phase!r} mark in {phases(o)}"
    return m.detail


def journaled(client: Client, o: Outcome, run_id: str | None = None) -> Outcome:
    """The journal's record of the call agrees with the outcome the stream reported."""
    rec = client.get_call(o.call_id, run_id=run_id)
    assert not rec.running
    assert rec.outcome is not None
    assert (rec.outcome.status, rec.outcome.error_class, rec.outcome.stopped_how) == (
        o.status,
        o.error_class,
        o.stopped_how,
    )
    return rec.outcome


class AliveWatcher:
    """Samples the tagged processes in a thread; remembers the last moment one was seen."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        # Start time of the last scan that found a tagged process alive: the process
        # was alive at some moment after it.
        self.last_alive = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.time()
            if tagged(self.tag):
                self.last_alive = began
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def graced_daemon(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Daemon]:
    """A daemon on the default (`auto`) backend with a grace of GRACE seconds."""
    d = Daemon(tmp_path_factory.mktemp(name), "--grace", str(GRACE)).start()
    yield d
    if d.proc is not None and d.proc.poll() is None:
        assert d.stop() == 0
