"""A write stopped by a cancel: atomic_write leaves the file untouched, and write_file's
outcome says the write provably did not happen."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status, StopMode
from execgate.executor.core.paths import Workspace
from execgate.executor.pipeline import results
from execgate.executor.sandbox.ladder import CancelScope
from execgate.executor.tools import Limits, ToolContext, fileio
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


def _visible(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("tmpfile", [True, False], ids=["o_tmpfile", "named_temp"])
@pytest.mark.parametrize(
    ("where", "made"), [("f.txt", set()), ("new/dir/f.txt", {"new", "new/dir", "new/dir/f.txt"})]
)
def test_nothing_is_visible_before_the_effect_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmpfile: bool, where: str, made: set[str]
) -> None:
    if not tmpfile:  # a filesystem without O_TMPFILE: the temp file is named, after the gate
        monkeypatch.setattr(fileio, "_stage", lambda *_args: None)
    ws = Workspace(tmp_path)
    (tmp_path / "f.txt").write_text("old")
    before = _visible(tmp_path)
    at_gate: list[set[str]] = []
    atomic_write(
        ws,
        tmp_path / where,
        b"new",
        "arguments.path",
        make_dirs=True,
        hard_links_ok=False,
        before_effect=lambda: at_gate.append(_visible(tmp_path)),
    )
    assert at_gate == [before]  # called once, and nothing had changed by then
    assert (tmp_path / where).read_text() == "new"
    assert _visible(tmp_path) == before | made  # and no temp file left


@pytest.mark.parametrize("where", ["f.txt", "new/f.txt"])
def test_a_refusing_gate_leaves_everything_as_it_was(tmp_path: Path, where: str) -> None:
    ws = Workspace(tmp_path)
    (tmp_path / "f.txt").write_text("old")
    before = _visible(tmp_path)

    def refuse() -> None:
        raise ToolError(ErrorClass.INTERNAL, "the intent could not be journaled")

    with pytest.raises(ToolError):
        atomic_write(
            ws,
            tmp_path / where,
            b"new",
            "arguments.path",
            make_dirs=True,
            hard_links_ok=False,
            before_effect=refuse,
        )
    assert _visible(tmp_path) == before
    assert (tmp_path / "f.txt").read_text() == "old"
