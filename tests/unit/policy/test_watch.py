"""FileWatcher reads a changed file only once it has held still for one interval: a file
caught half-written (truncated, then written) that happens to parse is never applied."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from execgate.executor.policy.watch import FileWatcher


class Reloads:
    def __init__(self) -> None:
        self.records: list[tuple[str, bool, str]] = []

    async def record(self, path: str, revision: str, *, accepted: bool, message: str) -> None:
        self.records.append((revision, accepted, message))


def _watcher(path: Path, applied: list[str], reloads: Reloads) -> FileWatcher[str]:
    return FileWatcher(
        path,
        what="test",
        parse=lambda text, source: text,
        apply=applied.append,
        reloads=reloads,  # type: ignore[arg-type]  # the one method the watcher calls
        loaded="",
    )


def _write(path: Path, text: str, stamp: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))  # a distinct mtime whatever the clock's resolution


def test_a_change_is_applied_once_the_file_held_still_for_one_look(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    _write(path, "v1", 1_000_000_000)
    applied: list[str] = []
    reloads = Reloads()
    w = _watcher(path, applied, reloads)

    async def looks() -> list[bool]:
        found = [await w.check(), await w.check()]  # first look; held still: applied
        _write(path, "", 2_000_000_000)  # the editor truncated the file ...
        found.append(await w.check())  # ... and this look caught it mid-write
        _write(path, "v2", 3_000_000_000)  # ... then wrote it whole
        found += [await w.check(), await w.check()]
        return found

    assert asyncio.run(looks()) == [False, True, False, False, True]
    assert applied == ["v1", "v2"]  # the empty, half-written file was never applied
    assert [accepted for _, accepted, _ in reloads.records] == [True, True]
