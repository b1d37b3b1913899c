"""A path component swapped with a symlink to the outside, over and over, while calls run.

`Swapper(a, b)` runs a separate process that exchanges `a` and `b` atomically with
renameat2(RENAME_EXCHANGE) in a tight loop, so at any instant one name is the real
file or directory and the other the symlink: exactly the check-then-use race an
attacker with write access to the workspace can run against a tool.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType

_LOOP = r"""
import ctypes, os, random, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b = (os.fsencode(p) for p in sys.argv[1:3])
AT_FDCWD, RENAME_EXCHANGE = -100, 2
if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
    sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
print("swapping", flush=True)
n = 1
while True:
    libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    n += 1
    # Bursts of back-to-back exchanges (microsecond windows) between pauses of up to
    # a millisecond or two (calls that open several files then see one state whole).
    if n % 64 == 0:
        time.sleep(random.random() * 0.002)
"""


class Swapper:
    """Context manager: `a` and `b` trade places continuously while the block runs;
    on exit they are left as they were before it (an even number of exchanges)."""

    def __init__(self, a: Path, b: Path) -> None:
        self.a, self.b = a, b
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Swapper:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LOOP, str(self.a), str(self.b)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "swapping":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise RuntimeError(f"the swapper did not start: {err}")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.communicate(timeout=10)  # reaps it and closes its pipes
        if self.a.is_symlink() and not self.b.is_symlink():
            exchange(self.a, self.b)


def exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2", str(a))
