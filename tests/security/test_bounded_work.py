"""Bounded work: a small request must not make the daemon build or read something huge.

`edit_file` with `replace_all` can multiply a file's size; the result is refused up
front past the file cap (the daemon's --file-cap, tightened by the policy's
`limits: file_cap_kb`), and the file stays as it was. `read_file` of a file with no
newline reads the output cap, not the file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import psutil
import pytest

from execgate.client import Client, Outcome, Status
from tests.daemon import Daemon

CAP = 1 << 20  # the daemon's --file-cap in these tests
POLICY = """\
version: 1
default: allow
limits:
  - {tools: [edit_file], agents: [local], file_cap_kb: 512}
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("bounded")
    (root / "policy.yaml").write_text("version: 1\ndefault: allow\n")
    d = Daemon(root, "--file-cap", str(CAP), "--policy", str(root / "policy.yaml")).start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def eg(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.address) as c:
        yield c


def exhausted(eg: Client, out: Outcome, field: str) -> None:
    assert (out.status, out.error_class, out.field) == (
        Status.FAILURE,
        "resource_exhausted",
        field,
    ), out
    assert "limit" in out.message
    record = eg.get_call(out.call_id)
    assert record.outcome is not None
    assert record.outcome.status is Status.FAILURE


def test_replace_all_past_the_cap_is_refused_before_anything_is_written(
    eg: Client, daemon: Daemon
) -> None:
    path = daemon.workspace / "grow.txt"
    path.write_text("a" * 10_000)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    # 10,000 one-byte matches become 200 bytes each: 2 MB, over the 1 MiB cap.
    out = eg.execute_one(
        "edit_file", path="grow.txt", old_string="a", new_string="b" * 200, replace_all=True
    )
    exhausted(eg, out, "arguments.new_string")
    assert str(2_000_000) in out.message
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_replace_all_within_the_cap_is_done(eg: Client, daemon: Daemon) -> None:
    (daemon.workspace / "fits.txt").write_text("a" * 1000)
    out = eg.execute_one(
        "edit_file", path="fits.txt", old_string="a", new_string="bb", replace_all=True
    )
    assert out.status is Status.SUCCESS, out
    assert (daemon.workspace / "fits.txt").read_text() == "bb" * 1000


def test_a_file_over_the_cap_is_not_read_whole_for_an_edit(eg: Client, daemon: Daemon) -> None:
    big = daemon.workspace / "big.txt"
    with big.open("wb") as fh:
        fh.truncate(CAP + 1)
    out = eg.execute_one("edit_file", path="big.txt", old_string="x", new_string="y")
    exhausted(eg, out, "arguments.path")


def test_the_policy_tightens_the_cap(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("bounded-policy")
    (root / "policy.yaml").write_text(POLICY)
    d = Daemon(root, "--file-cap", str(CAP), "--policy", str(root / "policy.yaml")).start()
    try:
        (d.workspace / "mid.txt").write_text("a" * 1000)
        with Client(d.address) as c:
            # 600 KB: within the daemon's 1 MiB, over the policy's 512 KiB.
            out = c.execute_one(
                "edit_file", path="mid.txt", old_string="a", new_string="b" * 600, replace_all=True
            )
            exhausted(c, out, "arguments.new_string")
    finally:
        d.stop()


def test_read_file_of_a_file_without_newlines_reads_the_cap_not_the_file(
    eg: Client, daemon: Daemon
) -> None:
    sparse = daemon.workspace / "one-line.bin"
    with sparse.open("wb") as fh:
        fh.truncate(2 << 30)  # 2 GiB of zeros, no newline, no disk used
    assert daemon.proc is not None
    proc = psutil.Process(daemon.proc.pid)
    before = proc.memory_info().rss
    out = eg.execute_one("read_file", path="one-line.bin")
    grew = proc.memory_info().rss - before
    assert out.status is Status.PARTIAL, out
    assert out.truncated
    assert grew < 256 << 20, f"the daemon grew by {grew >> 20} MiB reading one capped line"
    os.unlink(sparse)
