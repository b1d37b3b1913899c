"""The file-lock backend: several daemons (processes) on one host share one lock table.

The process tests run this module as a script
(`python -m tests.integration.test_filelock_locks hammer ...` from the repository root):
each worker is a separate "daemon" with its own FileLockManager.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execgate.executor.locks import (
    Abandoned,
    BackendClosed,
    Claim,
    FileLockManager,
    Key,
    LockError,
    LockMode,
    WaitInfo,
    path_key,
    plan,
)
from execgate.executor.tools import Mode
from tests.unit.locks.test_locks import Run, calls

SHARED = "shared.txt"
ROOT = "/w"  # the workspace the keys are in (a lock table needs no directory behind it)


def W(path: str) -> dict[Key, LockMode]:
    return plan([Claim(path_key(ROOT, path), Mode.WRITE)])


def R(path: str) -> dict[Key, LockMode]:
    return plan([Claim(path_key(ROOT, path), Mode.READ)])


def run_async(fn: Callable[[], Awaitable[None]], timeout: float = 20) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(fn(), timeout=timeout)

    asyncio.run(bounded())


async def until(predicate: Callable[[], bool], limit: float = 5) -> None:
    """Wait on observable state (polling it), at most `limit` seconds."""
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.002)


# ---------------------------------------------------------------- worker processes


def worker_hammer(lock_dir: str, log: str, name: str, rounds: int, barrier: str) -> None:
    """Write-lock the shared file `rounds` times, logging the held section's start and end."""
    waits = 0

    def count(info: WaitInfo) -> None:
        nonlocal waits
        waits += 1

    async def main(mgr: FileLockManager, fd: int) -> None:
        for i in range(rounds):
            async with await mgr.acquire(f"{name}:{i}", W(SHARED), on_wait=count):
                os.write(fd, f"start {name} {i} {time.monotonic()}\n".encode())
                await asyncio.sleep(random.uniform(0.0005, 0.003))
                os.write(fd, f"end {name} {i} {time.monotonic()}\n".encode())
            await asyncio.sleep(random.uniform(0, 0.002))

    with FileLockManager(lock_dir, instance_id=name) as mgr:
        Path(barrier, name).touch()
        while len(os.listdir(barrier)) < 2:  # both daemons up before the first call
            time.sleep(0.002)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        asyncio.run(main(mgr, fd))
        os.close(fd)
    print(f"waits {waits}", flush=True)


def worker_hold(lock_dir: str, instance_id: str) -> None:
    """Write-lock the shared file, say so, and keep it until killed."""

    async def main() -> None:
        mgr = FileLockManager(lock_dir, instance_id=instance_id)
        await mgr.acquire(f"{instance_id}:hold", W(SHARED))
        print("held", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())


def worker_once(lock_dir: str, instance_id: str) -> None:
    """Take the shared file's write lock once and leave (exit 0 means it was granted)."""

    async def main() -> None:
        with FileLockManager(lock_dir, instance_id=instance_id) as mgr:
            lease = await asyncio.wait_for(mgr.acquire(f"{instance_id}:once", W(SHARED)), 5)
            lease.release()
        print("granted", flush=True)

    asyncio.run(main())


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.test_filelock_locks", *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Worker processes, killed at the end of the test whatever happened."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


# ---------------------------------------------------------------- across processes


def test_two_daemons_never_hold_conflicting_locks_at_once(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    lock_dir, log, barrier = tmp_path / "locks", tmp_path / "log", tmp_path / "barrier"
    barrier.mkdir()
    rounds = 15
    for name in ("d1", "d2"):
        procs.append(spawn("hammer", str(lock_dir), str(log), name, str(rounds), str(barrier)))
    outs = [p.communicate(timeout=30)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    # The two really contended (a test that cannot fail is a defect).
    assert sum(int(out.split()[1]) for out in outs) > 0

    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 2 * 2 * rounds
    # Appends are atomic: every start must be followed by its own end, nothing between.
    for start, end in zip(lines[::2], lines[1::2], strict=True):
        assert start[0] == "start"
        assert end[0] == "end"
        assert start[1:3] == end[1:3]
    # And by the clock (CLOCK_MONOTONIC is one clock for every process on the host).
    pairs = zip(lines[::2], lines[1::2], strict=True)
    spans = sorted((float(s[3]), float(e[3])) for s, e in pairs)
    for (_, left), (right, _) in itertools.pairwise(spans):
        assert left <= right
    assert {line[1] for line in lines} == {"d1", "d2"}


def test_a_killed_daemon_does_not_block_the_others(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    lock_dir = str(tmp_path / "locks")
    holder = spawn("hold", lock_dir, "d1")
    procs.append(holder)
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"

    async def body() -> None:
        infos: list[WaitInfo] = []
        with FileLockManager(lock_dir, instance_id="d2") as mgr:
            waiter = asyncio.create_task(mgr.acquire("d2:w", W(SHARED), on_wait=infos.append))
            await until(lambda: bool(infos))
            assert infos[0].blockers == ("d1:hold",)
            assert not waiter.done()
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
            lease = await asyncio.wait_for(waiter, 5)  # the dead holder's entry is purged
            lease.release()
            assert mgr.snapshot().holders == ()

    run_async(body)

    # Restarted with the same instance id, killed while holding again; a daemon
    # that starts afterwards (nobody else is looking at the table) still gets in.
    again = spawn("hold", lock_dir, "d1")
    procs.append(again)
    assert again.stdout is not None
    assert again.stdout.readline() == "held\n"
    again.send_signal(signal.SIGKILL)
    again.wait()
    restarted = spawn("once", lock_dir, "d3")
    procs.append(restarted)
    out, _ = restarted.communicate(timeout=15)
    assert (restarted.returncode, out) == (0, "granted\n")


# ---------------------------------------------------------------- two daemons, one process


def test_cancel_while_waiting_leaves_no_entry(tmp_path: Path) -> None:
    async def body() -> None:
        with (
            FileLockManager(tmp_path, instance_id="a") as a,
            FileLockManager(tmp_path, instance_id="b") as b,
        ):
            lease = await a.acquire("a:1", W(SHARED))
            cancel = asyncio.Event()
            waiter = asyncio.create_task(b.acquire("b:1", W(SHARED), cancel=cancel))
            await until(lambda: len(a.snapshot().waiters) == 1)
            cancel.set()
            with pytest.raises(Abandoned):
                await waiter
            assert a.snapshot().waiters == ()
            # A waiting task that is cancelled leaves nothing behind either.
            task = asyncio.create_task(b.acquire("b:2", W(SHARED)))
            await until(lambda: len(a.snapshot().waiters) == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert a.snapshot().waiters == ()
            lease.release()
            assert a.snapshot().holders == ()
            # A cancel event already set never queues.
            with pytest.raises(Abandoned):
                await b.acquire("b:3", W(SHARED), cancel=cancel)

    run_async(body)


def test_fifo_per_conflict_across_daemons(tmp_path: Path) -> None:
    async def body() -> None:
        with (
            FileLockManager(tmp_path, instance_id="a") as a,
            FileLockManager(tmp_path, instance_id="b") as b,
        ):
            r1 = await a.acquire("r1", R(SHARED))
            w2 = asyncio.create_task(b.acquire("w2", W(SHARED)))
            await until(lambda: len(a.snapshot().waiters) == 1)
            infos: list[WaitInfo] = []
            r3 = asyncio.create_task(a.acquire("r3", R(SHARED), on_wait=infos.append))
            free = await a.acquire("free", W("other.txt"))  # conflicts with nobody: at once
            await until(lambda: len(a.snapshot().waiters) == 2)
            assert infos == [WaitInfo((path_key(ROOT, SHARED),), ("w2",))]
            snap = b.snapshot()
            assert [(e.owner, e.instance) for e in snap.holders] == [("r1", "a"), ("free", "a")]
            assert [e.owner for e in snap.waiters] == ["w2", "r3"]
            r1.release()
            lease2 = await asyncio.wait_for(w2, 5)
            assert not r3.done()
            lease2.release()
            (await asyncio.wait_for(r3, 5)).release()
            free.release()
            assert a.snapshot().holders == ()

    run_async(body)


def test_fair_order_and_caps_across_daemons(tmp_path: Path) -> None:
    """The table keeps the fair order of decide.Turns: daemon b's agent, arriving after
    six of daemon a's agent's exclusive calls, stands third. A cap counts one daemon's
    grants: agent x at its cap of 1 on daemon a waits, the same name on b does not."""

    async def body() -> None:
        with (
            FileLockManager(tmp_path, instance_id="a") as a,
            FileLockManager(tmp_path, instance_id="b") as b,
        ):
            first = await a.acquire("a0", W("."), flow="x")
            flood = [asyncio.create_task(a.acquire(f"a{i}", W("."), flow="x")) for i in (1, 2)]
            await until(lambda: len(a.snapshot().waiters) == 2)
            more = [asyncio.create_task(a.acquire(f"a{i}", W("."), flow="x")) for i in (3, 4)]
            await until(lambda: len(a.snapshot().waiters) == 4)
            quick = asyncio.create_task(b.acquire("b0", R(SHARED), flow="y"))
            await until(lambda: len(a.snapshot().waiters) == 5)
            assert [e.owner for e in b.snapshot().waiters] == ["a1", "a2", "b0", "a3", "a4"]
            first.release()
            for task in (*flood, quick, *more):
                (await asyncio.wait_for(task, 5)).release()
            infos: list[WaitInfo] = []
            one = await a.acquire("p", R("p"), flow="x", cap=1)
            capped = asyncio.create_task(
                a.acquire("q", R("q"), flow="x", cap=1, on_wait=infos.append)
            )
            other = await asyncio.wait_for(b.acquire("r", R("r"), flow="x", cap=1), 5)
            await until(lambda: bool(infos))
            assert infos == [WaitInfo((), (), capped=1)]
            assert not capped.done()
            one.release()
            (await asyncio.wait_for(capped, 5)).release()
            other.release()
            assert a.snapshot().holders == a.snapshot().waiters == ()

    run_async(body)


def test_a_table_made_before_fair_order_gains_its_columns(tmp_path: Path) -> None:
    """A lock directory an older daemon made: the columns of the fair order are added in
    place, and an entry it left (tag 0) stands first."""
    old = sqlite3.connect(tmp_path / "table.db")
    old.execute(
        "CREATE TABLE entries (ticket INTEGER PRIMARY KEY AUTOINCREMENT, instance TEXT NOT "
        "NULL, owner TEXT NOT NULL, plan TEXT NOT NULL, granted INTEGER NOT NULL DEFAULT 0)"
    )
    old.commit()
    old.close()

    async def body() -> None:
        with FileLockManager(tmp_path, instance_id="a") as a:
            lease = await a.acquire("a0", W(SHARED), flow="x", cap=1)
            assert [(e.owner, e.flow, e.cap) for e in a.snapshot().holders] == [("a0", "x", 1)]
            lease.release()

    run_async(body)
    with closing(sqlite3.connect(tmp_path / "table.db")) as db:
        names = [row[1] for row in db.execute("PRAGMA table_info(entries)")]
    assert names[-3:] == ["flow", "cap", "tag"]


def test_close_drops_the_instance_and_its_entries(tmp_path: Path) -> None:
    async def body() -> None:
        with FileLockManager(tmp_path, instance_id="b") as b:
            a = FileLockManager(tmp_path, instance_id="a")
            with pytest.raises(LockError, match="in use"):
                FileLockManager(tmp_path, instance_id="a")
            lease = await a.acquire("a:1", W(SHARED))
            waiter = asyncio.create_task(a.acquire("a:2", W(SHARED)))
            await until(lambda: len(b.snapshot().waiters) == 1)
            a.close()
            with pytest.raises(BackendClosed):
                await waiter
            lease.release()  # a no-op now
            assert b.snapshot().holders == ()
            (await b.acquire("b:1", W(SHARED))).release()
            with pytest.raises(BackendClosed):
                await a.acquire("a:3", W(SHARED))
            assert not (tmp_path / "instances" / "a.lock").exists()

    run_async(body)


def test_lock_dir_is_private(tmp_path: Path) -> None:
    with FileLockManager(tmp_path / "new" / "locks"):
        pass
    for d in (tmp_path / "new" / "locks", tmp_path / "new" / "locks" / "instances"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


# ---------------------------------------------------------------- the rule, at random


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=calls(), seed=st.integers(0, 2**32 - 1))
def test_random_schedules_keep_the_rule_across_daemons(
    tmp_path_factory: pytest.TempPathFactory, specs: list[Any], seed: int
) -> None:
    lock_dir = tmp_path_factory.mktemp("locks")

    async def body() -> None:
        with (
            FileLockManager(lock_dir, poll=(0.001, 0.01)) as a,
            FileLockManager(lock_dir, poll=(0.001, 0.01)) as b,
        ):
            run = Run([a, b], specs, random.Random(seed))
            await run.drive()
            assert a.snapshot().holders == a.snapshot().waiters == ()

    run_async(body)


if __name__ == "__main__":
    match sys.argv[1]:
        case "hammer":
            worker_hammer(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
        case "hold":
            worker_hold(sys.argv[2], sys.argv[3])
        case "once":
            worker_once(sys.argv[2], sys.argv[3])
