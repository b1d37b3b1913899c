"""The durable write path (docs/architecture.md): a write_file is staged while its intent
is journaled, and nothing of it shows before the intent is durable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from execgate.client import Call, Client, Status
from tests.daemon import Daemon, scaled

ROOT = Path(__file__).resolve().parents[2]


def write(call_id: str, path: str, content: str) -> Call:
    return Call(tool="write_file", call_id=call_id, arguments={"path": path, "content": content})


def test_a_write_whose_intent_cannot_land_changes_nothing(daemon: Daemon, client: Client) -> None:
    # The second call's tool is started while its intent is written; the intent fails
    # (the id is taken), so the staged file must never be renamed into place, nor its
    # new directory made.
    first = client.run(write("w1", "notes/a.txt", "first"))
    assert first.status is Status.SUCCESS, first.message
    again = client.run(write("w1", "notes/a.txt", "second"))
    assert again.status is Status.REJECTED
    assert again.error_class == "duplicate_call_id"
    assert (daemon.workspace / "notes" / "a.txt").read_text() == "first"
    elsewhere = client.run(write("w1", "fresh/dir/b.txt", "second"))
    assert elsewhere.error_class == "duplicate_call_id"
    assert not (daemon.workspace / "fresh").exists()
    assert sorted(p.name for p in (daemon.workspace / "notes").iterdir()) == ["a.txt"]
    record = client.get_call("w1")
    assert record.outcome is not None
    assert record.outcome.status is Status.SUCCESS  # the original, untouched


def test_concurrent_writes_each_end_journaled_as_reported(daemon: Daemon, client: Client) -> None:
    calls = [write(f"c{i}", f"many/f{i % 8}.txt", f"content {i}") for i in range(64)]
    outcomes = client.execute(calls)
    assert all(o.status is Status.SUCCESS for o in outcomes), [o.message for o in outcomes]
    for call, outcome in zip(calls, outcomes, strict=True):
        record = client.get_call(call.call_id)
        assert record.outcome is not None
        assert record.outcome.status is outcome.status
        assert record.outcome.evidence == outcome.evidence
    # Writes to one file ran in proposal order: the last one stands.
    for f in range(8):
        assert (daemon.workspace / "many" / f"f{f}.txt").read_text() == f"content {56 + f}"


@pytest.mark.slow
def test_kill_minus_nine_loses_no_reported_outcome(tmp_path: Path) -> None:
    # bench/crashloop.py: a daemon killed with SIGKILL while 8 clients write, restarted,
    # every reported outcome checked against the journal and every file against its rows.
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "crashloop.py"),
            "--rounds",
            "3",
            "--tmp",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("PASS")
