"""Group fsync of a directory: concurrent writes in one directory share its fsync.

After a write renames its file into place it needs a directory fsync that *started
after* the rename to have finished (then the rename is on disk). When 32 writers
rename into one directory, one fsync started after all their renames covers them
all: the first to arrive while none is running starts one; writers arriving while
one runs wait for it and for the next one, which one of them starts and the others
share -- the journal writer's group commit, for directory entries.

A directory is known by (st_dev, st_ino): every writer holds its own descriptor of
it, and fsync of any of them flushes the same inode.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Dir:
    cond: threading.Condition = field(default_factory=threading.Condition)
    started: int = 0  # fsyncs begun on this directory
    finished: int = 0  # of those, the ones done (they run one at a time)
    running: bool = False
    users: int = 0  # writers inside sync(): the entry is dropped at 0
    succeeded: int = -1  # the last fsync that did not fail (its index)
    error: OSError | None = None  # the last one that failed


_dirs: dict[tuple[int, int], _Dir] = {}
_dirs_lock = threading.Lock()


def sync(dir_fd: int) -> None:
    """Return once a fsync of the directory begun after this call has finished (raises
    its OSError)."""
    st = os.fstat(dir_fd)
    key = (st.st_dev, st.st_ino)
    with _dirs_lock:
        entry = _dirs.setdefault(key, _Dir())
        entry.users += 1
    try:
        _covered(entry, dir_fd)
    finally:
        with _dirs_lock:
            entry.users -= 1
            if not entry.users:
                del _dirs[key]


def _covered(d: _Dir, dir_fd: int) -> None:
    with d.cond:
        need = d.started  # the fsync that begins next is the first to cover this call
        while d.finished <= need:
            if d.running:
                d.cond.wait()
                continue
            d.running, index = True, d.started
            d.started += 1
            d.cond.release()
            try:
                os.fsync(dir_fd)
            except OSError as exc:
                d.error = exc
            else:
                d.succeeded = index
            finally:
                d.cond.acquire()
                d.running, d.finished = False, index + 1
                d.cond.notify_all()
        if d.succeeded < need:  # every fsync begun since this call failed
            assert d.error is not None
            raise d.error
