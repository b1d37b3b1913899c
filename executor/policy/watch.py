"""Hot reload of a configuration file: a changed file is validated, then swapped in
whole; a bad one is refused and the last good version stays in force (fail closed).

Polled (mtime, size, inode, then the content hash), so an editor's
write-then-rename and an in-place write are both seen. Every accepted and every
refused version is journaled (`policy_events`: source, revision, accepted, and
the file:line:column reason when refused). Used for the policy file and the
identities file, and for the tools file or tools.d/ directory (`read` gives the
text of a directory's files as one; a directory's fingerprint covers every file).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from execgate.executor.core.errors import ExecgateError
from execgate.executor.journal.base import ReloadStore

log = logging.getLogger("execgate.reload")

T = TypeVar("T")


class FileWatcher(Generic[T]):
    """`parse(text, source)` builds a new T or raises ExecgateError; `refusal(new)`
    says why an otherwise valid file cannot be taken now ("" to accept it);
    `apply(new)` puts it in force; `loaded`: the revision in force at start."""

    def __init__(
        self,
        path: Path,
        *,
        what: str,
        parse: Callable[[str, str], T],
        apply: Callable[[T], None],
        reloads: ReloadStore,
        loaded: str,
        refusal: Callable[[T], str] = lambda new: "",
        interval: float = 1.0,
        read: Callable[[Path], str | None] | None = None,
    ) -> None:
        self.path = path
        self.what = what
        self._parse = parse
        self._apply = apply
        self._refusal = refusal
        self._reloads = reloads
        self._read = read or _read
        self.interval = interval
        # Nothing seen yet: the first check compares the file with what is in force
        # (`loaded`: the sha256 of the text the daemon started with), so an edit made
        # while the daemon was starting is not missed.
        self._seen: tuple[int, ...] = (0, 0, 0)
        self._looked: tuple[int, ...] = (0, 0, 0)  # the fingerprint at the last look
        self.revision = loaded
        self._refused = ""  # revision of the last refused file: journaled once

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:  # the watcher must outlive any one bad read
                log.exception("%s reload check failed", self.what)

    async def check(self) -> bool:
        """Reload if the file changed; True if a new version is now in force."""
        seen = _fingerprint(self.path)
        if seen != self._looked:
            # Still being written (an editor that truncates, then writes): a file is
            # read only once it has held still for one interval, so a half-written
            # one that happens to parse is never put in force.
            self._looked = seen
            return False
        if seen == self._seen:
            return False
        self._seen = seen
        text = self._read(self.path)
        if text is None:
            await self._refuse("", f"cannot read {self.path}")
            return False
        revision = _revision(text)
        if revision in (self.revision, self._refused):
            return False
        try:
            new = self._parse(text, str(self.path))
        except ExecgateError as exc:
            await self._refuse(revision, str(exc))
            return False
        why = self._refusal(new)
        if why:
            await self._refuse(revision, why)
            return False
        self._apply(new)
        self.revision, self._refused = revision, ""
        log.info("%s %s reloaded: revision %s", self.what, self.path, revision[:12])
        await self._record(revision, True, "accepted")
        return True

    async def _refuse(self, revision: str, message: str) -> None:
        self._refused = revision
        log.error("%s reload refused, the last good one stays in force: %s", self.what, message)
        await self._record(revision, False, message)

    async def _record(self, revision: str, accepted: bool, message: str) -> None:
        await self._reloads.record(str(self.path), revision, accepted=accepted, message=message)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _revision(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _fingerprint(path: Path) -> tuple[int, ...]:
    """(mtime, size, inode) of the file; of the directory and each `*.yaml` in it."""
    try:
        st = os.stat(path)
        found = [st.st_mtime_ns, st.st_size, st.st_ino]
        if path.is_dir():
            for entry in sorted(path.glob("*.yaml")):
                st = os.stat(entry)
                found += [st.st_mtime_ns, st.st_size, st.st_ino]
    except OSError:
        return (0, 0, 0)
    return tuple(found)
