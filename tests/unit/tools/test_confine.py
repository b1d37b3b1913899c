"""A command's declared reads and writes without a daemon: run_command's claims, the
write paths made ready (and tidied) for the sandbox, the refused-write judgement, and
what a sandbox that cannot enforce them turns the claims into."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Claim, Mode, net_key, path_key, workspace_key
from execgate.executor.tools import Limits, ToolContext, ToolOutput
from execgate.executor.tools.base import Declared
from execgate.executor.tools.command import RunCommand
from execgate.executor.tools.confine import declared_write, judged, writable
from execgate.executor.tools.effects import CallEffects, unconfined


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / "ws" / "a").mkdir(parents=True)
    (tmp_path / "ws" / "b").mkdir()
    return Workspace(tmp_path / "ws")


def effects(ws: Workspace, **args: Any) -> CallEffects:
    return RunCommand().call_effects({"argv": ["true"], **args}, {}, ws)


def test_a_command_that_declares_nothing_writes_the_whole_workspace(ws: Workspace) -> None:
    got = effects(ws)
    assert got.claims == (Claim(workspace_key(ws.lock_root), Mode.WRITE),)
    assert (got.may_write, got.confined) == (True, None)


def test_declared_paths_become_claims_the_policy_sees_and_writes_to_confine(
    ws: Workspace,
) -> None:
    (ws.root / "link").symlink_to(ws.root / "b")
    got = effects(ws, reads=["a/../a/in.txt", "link"], writes=["b/out/", "a"])
    assert [(c.key, c.mode) for c in got.claims] == [
        (path_key(ws.lock_root, "a/in.txt"), Mode.READ),
        (
            path_key(ws.lock_root, "b"),
            Mode.READ,
        ),  # the symlink, canonicalised like any path argument
        (path_key(ws.lock_root, "b/out"), Mode.WRITE),
        (path_key(ws.lock_root, "a"), Mode.WRITE),
    ]
    assert got.paths == {
        "arguments.reads[0]": ws.root / "a/in.txt",
        "arguments.reads[1]": ws.root / "b",
        "arguments.writes[0]": ws.root / "b/out",
        "arguments.writes[1]": ws.root / "a",
    }
    assert got.may_write
    assert got.confined == (
        Declared("arguments.writes[0]", "b/out/", ws.root / "b/out", True),
        Declared("arguments.writes[1]", "a", ws.root / "a", False),
    )
    reader = effects(ws, reads=["a"])
    assert (reader.may_write, reader.confined) == (False, ())


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../x", "out/x"])
def test_a_declaration_that_leaves_the_workspace_is_rejected(ws: Workspace, bad: str) -> None:
    (ws.root / "out").symlink_to("/etc")
    for key in ("reads", "writes"):
        with pytest.raises(ToolError) as info:
            effects(ws, **{key: ["a", bad]})
        err = info.value
        assert (err.status, err.error_class, err.field) == (
            Status.REJECTED,
            ErrorClass.PERMISSION_DENIED,
            f"arguments.{key}[1]",
        )


def test_a_declared_write_must_be_a_file_or_a_directory(ws: Workspace) -> None:
    os.mkfifo(ws.root / "fifo")
    with pytest.raises(ToolError) as info:
        declared_write(ws, "fifo", "arguments.writes[0]")
    assert (info.value.error_class, info.value.status) == (
        ErrorClass.INVALID_ARGUMENT,
        Status.REJECTED,
    )


def context(
    ws: Workspace, confined: tuple[Declared, ...] | None, *, confines: bool = True
) -> ToolContext:
    sandbox = SimpleNamespace(name="fake", confines_writes=confines)
    return ToolContext(ws, Limits(), 10, sandbox=sandbox, confined=confined)  # type: ignore[arg-type]


def declare(ws: Workspace, *texts: str) -> tuple[Declared, ...]:
    return tuple(declared_write(ws, t, f"arguments.writes[{i}]") for i, t in enumerate(texts))


def test_missing_write_paths_are_made_then_removed_if_untouched(ws: Workspace) -> None:
    """A file and a directory are made for the command; the ones it left as made go."""
    os.chmod(ws.root / "a", 0o775)
    declared = declare(ws, "a/idle.txt", "a/used.txt", "a/empty/", "a/kept/", "b")

    async def body() -> tuple[Path, ...] | None:
        async with writable(context(ws, declared)) as paths:
            assert (ws.root / "a/idle.txt").is_file()
            assert (ws.root / "a/empty").is_dir()
            assert (ws.root / "a/used.txt").stat().st_mode & 0o777 == 0o664  # like its dir
            (ws.root / "a/used.txt").write_text("written")
            (ws.root / "a/kept/f").write_text("x")
            return paths

    paths = asyncio.run(body())
    assert paths == tuple(d.path for d in declared)
    assert sorted(p.name for p in (ws.root / "a").iterdir()) == ["kept", "used.txt"]
    assert (ws.root / "a/used.txt").read_text() == "written"
    assert (ws.root / "b").is_dir()  # it was there: never removed


def test_a_write_path_whose_directory_is_missing_fails_before_anything_runs(
    ws: Workspace,
) -> None:
    [declared] = declare(ws, "nope/deeper/f.txt")

    async def body() -> None:
        async with writable(context(ws, (declared,))):
            raise AssertionError("the command must not run")

    with pytest.raises(ToolError) as info:
        asyncio.run(body())
    assert (info.value.error_class, info.value.field) == (
        ErrorClass.NOT_FOUND,
        "arguments.writes[0]",
    )
    assert "its directory does not exist" in info.value.message
    assert not (ws.root / "nope").exists()


def test_a_path_changed_since_validation_or_hard_linked_is_refused(ws: Workspace) -> None:
    [swapped] = declare(ws, "a/")
    os.rename(ws.root / "a", ws.root / "a-real")
    (ws.root / "a").symlink_to(ws.root / "a-real")
    [linked] = declare(ws, "b/f.txt")
    (ws.root / "b/f.txt").write_text("x")
    os.link(ws.root / "b/f.txt", ws.root / "b/g.txt")

    async def body(d: Declared) -> None:
        async with writable(context(ws, (d,))):
            raise AssertionError("the command must not run")

    for d in (swapped, linked):
        with pytest.raises(ToolError) as info:
            asyncio.run(body(d))
        assert info.value.error_class is ErrorClass.PERMISSION_DENIED, info.value


def test_a_sandbox_that_cannot_confine_is_never_given_a_declaration(ws: Workspace) -> None:
    async def body() -> None:
        async with writable(context(ws, declare(ws, "a"), confines=False)):
            raise AssertionError("the command must not run")

    with pytest.raises(ToolError) as info:
        asyncio.run(body())
    assert info.value.error_class is ErrorClass.SANDBOX_ERROR

    async def undeclared() -> tuple[Path, ...] | None:
        async with writable(context(ws, None, confines=False)) as paths:
            return paths

    assert asyncio.run(undeclared()) is None


def test_a_refused_write_is_permission_denied_naming_what_may_be_written(
    ws: Workspace,
) -> None:
    failed = ToolOutput(
        text="sh: 1: cannot create b/x: Read-only file system\n",
        error_class=ErrorClass.NONZERO_EXIT,
        message="exited with status 2",
    )
    declared = declare(ws, "a/")
    got = judged(failed, declared)
    assert got.error_class is ErrorClass.PERMISSION_DENIED
    assert got.message == (
        "exited with status 2: a write outside the declared paths was refused "
        "(Read-only file system); this call may write only a/"
    )
    assert judged(failed, None) is failed  # undeclared: a plain non-zero exit
    other = ToolOutput(text="no such file", error_class=ErrorClass.NONZERO_EXIT)
    assert judged(other, declared) is other


def test_unconfined_takes_the_whole_workspace_and_keeps_claims_on_hosts(ws: Workspace) -> None:
    narrow = CallEffects(
        (Claim(path_key(ws.lock_root, "a"), Mode.READ), Claim(net_key("example.com"), Mode.READ)),
        False,
        paths={"arguments.reads[0]": Path("/ws/a")},
        confined=(),
    )
    wide = unconfined(narrow, ws)
    assert wide.claims == (
        Claim(workspace_key(ws.lock_root), Mode.WRITE),
        Claim(net_key("example.com"), Mode.READ),
    )
    assert (wide.may_write, wide.confined, wide.paths) == (True, None, narrow.paths)
