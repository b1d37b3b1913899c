"""A write stopped by a cancel: atomic_write leaves the file untouched, and write_file's
outcome says the write provably did not happen."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from execgate.executor.core.outcomes import ErrorClass, Status, StopMode
from execgate.executor.core.paths import Workspace
from execgate.executor.pipeline import results
from execgate.executor.sandbox.ladder import CancelScope
from execgate.executor.tools import Limits, ToolContext
from execgate.executor.tools.fileio import WriteAbandoned, atomic_write
from execgate.executor.tools.files import WriteFile


def test_write_stopped_before_the_rename_leaves_the_file_untouched(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(WriteAbandoned):
        atomic_write(
            ws,
            target,
            b"new",
            "arguments.path",
            make_dirs=False,
            hard_links_ok=False,
            stop=lambda: True,
        )
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]  # no temp file left


def test_cancelled_write_file_is_a_known_failure(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    scope = CancelScope()
    scope.cancel("user stop")
    ctx = ToolContext(ws, Limits(), 5.0, scope)
    out = asyncio.run(WriteFile().run({"path": "a.txt", "content": "x"}, ctx))
    assert not (tmp_path / "a.txt").exists()
    outcome = results.from_output(out, may_write=True, cap=1000, marks=())
    # A write that may have happened would be UNKNOWN_OUTCOME; this one provably did not.
    assert outcome.status is Status.FAILURE
    assert outcome.error_class is ErrorClass.CANCELLED
    assert outcome.stopped_how is StopMode.COOPERATIVE
