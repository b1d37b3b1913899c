"""Hot reload: a changed policy file is validated, then swapped in whole; a bad one is
refused and the last good policy stays in force (fail closed).

Polled (mtime, size, inode, then the content hash), so an editor's
write-then-rename and an in-place write are both seen. Every accepted and every
refused file is journaled (`policy_events`) with its revision and, when refused,
the file:line:column error. The `sandbox:` section is fixed at startup (sandbox
backends are probed and built then): a file that changes it is refused with the
reason, and takes effect on the next start.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import PolicyError
from ..journal import Journal
from . import Policy, parse_policy

log = logging.getLogger("execgate.policy")


class PolicyWatcher:
    def __init__(
        self,
        path: Path,
        current: Policy,
        apply: Callable[[Policy], None],
        journal: Journal,
        interval: float = 1.0,
    ) -> None:
        self.path = path
        self.current = current
        self._apply = apply
        self._journal = journal
        self.interval = interval
        self._seen = _fingerprint(path)
        self._refused = ""  # revision of the last refused file: journaled once

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:  # the watcher must outlive any one bad read
                log.exception("policy reload check failed")

    async def check(self) -> bool:
        """Reload if the file changed; True if a new policy is now in force."""
        seen = _fingerprint(self.path)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            await self._refuse("", f"cannot read policy: {exc}")
            return False
        revision = hashlib.sha256(text.encode()).hexdigest()
        if revision in (self.current.revision, self._refused):
            return False
        try:
            policy = parse_policy(text, str(self.path))
        except PolicyError as exc:
            await self._refuse(revision, str(exc))
            return False
        if policy.sandbox != self.current.sandbox:
            await self._refuse(revision, "the sandbox: section changed; it takes effect on restart")
            return False
        self._apply(policy)
        self.current = policy
        self._refused = ""
        log.info("policy %s reloaded: revision %s", self.path, revision[:12])
        await self._record(revision, True, f"{len(policy.rules)} rule(s)")
        return True

    async def _refuse(self, revision: str, message: str) -> None:
        self._refused = revision
        log.error("policy reload refused, the last good policy stays in force: %s", message)
        await self._record(revision, False, message)

    async def _record(self, revision: str, accepted: bool, message: str) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO policy_events (at, source, revision, accepted, message) "
                "VALUES (?, ?, ?, ?, ?)",
                (time.time(), str(self.path), revision, int(accepted), message),
            )

        await self._journal.write(write, durable=True)


def _fingerprint(path: Path) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_mtime_ns, st.st_size, st.st_ino)
