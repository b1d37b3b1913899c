"""Every outcome a client sees is journaled first, and is the outcome that can be vouched for.

A bug inside the daemon (the `fault` probe raises where it is told), a path the
kernel cannot take (too long, a component too long) and names the tools cannot
hold each end with a typed outcome that GetCall returns the same: REJECTED for a
call that never started, FAILURE for a reader, UNKNOWN_OUTCOME only for a call
that started and may write. Counted per class in CASES.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from execgate.client import Call, Client, Outcome, Status, StopMode
from execgate.executor.core.outcomes import Phase, mark
from execgate.executor.pipeline.calls import CallRequest
from execgate.executor.pipeline.endings import Endings
from execgate.executor.pipeline.events import Batch, Event, EventKind
from tests.daemon import Daemon

PATH_TOOLS = {
    "read_file": {},
    "write_file": {"content": "x"},
    "edit_file": {"old_string": "a", "new_string": "b"},
    "list_dir": {},
    "search": {"pattern": "x"},
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("journaled")
    # Everything allowed: the fault probe must reach its run.
    (root / "policy.yaml").write_text("version: 1\ndefault: allow\n")
    d = Daemon(root, "--policy", str(root / "policy.yaml")).start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def eg(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.address) as c:
        yield c


def journaled(eg: Client, out: Outcome) -> Outcome:
    """`out` is what the journal holds for its call (status, class, field, stop)."""
    record = eg.get_call(out.call_id)
    assert record.outcome is not None, record
    held = record.outcome
    assert (held.status, held.error_class, held.field) == (out.status, out.error_class, out.field)
    assert held.stopped_how is out.stopped_how
    return out


# ---------------------------------------------------------------- bugs inside the daemon


@pytest.mark.parametrize(
    ("stage", "write", "status", "stopped"),
    [
        ("analysis", False, Status.REJECTED, StopMode.NOT_STARTED),
        ("analysis", True, Status.REJECTED, StopMode.NOT_STARTED),
        ("run", False, Status.FAILURE, StopMode.COMPLETED),
        ("run", True, Status.UNKNOWN_OUTCOME, StopMode.COMPLETED),
    ],
)
def test_a_bug_inside_the_daemon_ends_with_a_journaled_outcome(
    eg: Client, daemon: Daemon, stage: str, write: bool, status: Status, stopped: StopMode
) -> None:
    out = eg.execute_one("fault", stage=stage, write=write)
    assert (out.status, out.error_class, out.stopped_how) == (status, "internal", stopped), out
    journaled(eg, out)
    assert daemon.serving()


def test_a_bug_before_the_start_in_a_batch_leaves_the_others_alone(eg: Client) -> None:
    outs = eg.execute(
        [
            Call(tool="noop", arguments={"echo": "before"}),
            Call(tool="fault", arguments={"stage": "analysis"}),
            Call(tool="noop", arguments={"echo": "after"}),
        ]
    )
    assert [o.status for o in outs] == [Status.SUCCESS, Status.REJECTED, Status.SUCCESS]
    for out in outs:
        journaled(eg, out)


# ---------------------------------------------------------------- names no file can have

LONG_PATHS = {
    "path over PATH_MAX": "a/" * 2100 + "f",
    "component over NAME_MAX": "x" * 256,
    "component over NAME_MAX, deep": "dir/" + "é" * 200 + "/f.txt",  # 400 bytes in UTF-8
    "whole path over PATH_MAX in one name": "y" * 5000,
}


@pytest.mark.parametrize("tool", sorted(PATH_TOOLS))
@pytest.mark.parametrize("case", sorted(LONG_PATHS))
def test_an_over_long_path_is_rejected_naming_the_field(eg: Client, tool: str, case: str) -> None:
    out = eg.execute_one(tool, path=LONG_PATHS[case], **PATH_TOOLS[tool])
    assert (out.status, out.error_class, out.field) == (
        Status.REJECTED,
        "invalid_argument",
        "arguments.path",
    ), out
    assert "limit" in out.message
    journaled(eg, out)


@pytest.mark.parametrize("case", sorted(LONG_PATHS))
def test_an_over_long_cwd_or_database_is_rejected(eg: Client, case: str) -> None:
    for tool, args, field in (
        ("run_command", {"argv": ["true"], "cwd": LONG_PATHS[case]}, "arguments.cwd"),
        ("sql", {"database": LONG_PATHS[case], "query": "SELECT 1"}, "arguments.database"),
    ):
        out = eg.execute_one(tool, **args)
        assert (out.status, out.error_class, out.field) == (
            Status.REJECTED,
            "invalid_argument",
            field,
        ), out
        journaled(eg, out)


def test_a_path_that_resolves_past_path_max_is_rejected(eg: Client, daemon: Daemon) -> None:
    """Short as written; through a symlink it names more than PATH_MAX bytes."""
    fd = os.open(daemon.workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(12):  # a real chain of 12 directories of 200 bytes each
            os.mkdir("c" * 200, dir_fd=fd)
            following = os.open("c" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = following
    finally:
        os.close(fd)
    chain = "/".join(["c" * 200] * 12)
    (daemon.workspace / "l0").symlink_to(f"{daemon.workspace}/{chain}")
    raw = "l0/" + "/".join(["e" * 200] * 9)
    assert len(raw) < 4096
    out = eg.execute_one("read_file", path=raw)
    assert (out.status, out.error_class, out.field) == (
        Status.REJECTED,
        "invalid_argument",
        "arguments.path",
    ), out
    journaled(eg, out)


# ---------------------------------------------------------------- a journal that fails


class _BrokenJournal:
    async def record_finished(self, *args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    async def record_refusal(self, *args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")


def test_an_outcome_the_journal_cannot_record_is_not_reported() -> None:
    """Unit (a fake journal): the call's part of the stream ends UNRECORDED, never with
    an outcome nobody could find later; the servicer turns that into INTERNAL."""

    async def scenario() -> list[EventKind]:
        batch = Batch("run", "batch", "agent")
        batch.start_turns(1)
        req = CallRequest(
            run_id="run", call_id="c1", batch_id="batch", index=0, tool="t", arguments_json="{}"
        )
        endings = Endings(_BrokenJournal())  # type: ignore[arg-type]
        await endings.crashed(req, batch, mark(Phase.QUEUED), RuntimeError("bug"), None)
        kinds = []
        while not batch.events.empty():
            kinds.append(batch.events.get_nowait().kind)
        return kinds

    assert asyncio.run(scenario()) == [EventKind.UNRECORDED]


def test_the_unrecorded_path_ends_the_rpc_with_internal() -> None:
    """The servicer's side: an UNRECORDED call aborts the RPC with INTERNAL naming it."""
    from execgate.executor.server import services

    class Aborted(Exception):
        pass

    class Context:
        async def abort(self, code: grpc.StatusCode, message: str) -> None:
            raise Aborted(code, message)

    event = Event(EventKind.UNRECORDED, "c7", "batch", 0.0)
    with pytest.raises(Aborted) as caught:
        asyncio.run(services._abort_unsent(Context(), [event]))  # type: ignore[arg-type]
    code, message = caught.value.args
    assert code is grpc.StatusCode.INTERNAL
    assert "c7" in message
    assert "GetCall" in message
