"""Hot reload of the policy file (see executor/policy/watch.py for how files are watched).

A changed file is validated, then swapped in whole; a bad one is refused and the
last good policy stays in force (fail closed); both are journaled. The `sandbox:`
section is fixed at startup (sandbox backends are probed and built then): a file
that changes it is refused with the reason, and takes effect on the next start.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from execgate.executor.journal.base import ReloadStore

from . import Policy, parse_policy
from .watch import FileWatcher


def policy_watcher(
    path: Path,
    current: Policy,
    apply: Callable[[Policy], None],
    reloads: ReloadStore,
    interval: float = 1.0,
) -> FileWatcher[Policy]:
    def refusal(new: Policy) -> str:
        if new.sandbox != current.sandbox:
            return "the sandbox: section changed; it takes effect on restart"
        return ""

    return FileWatcher(
        path,
        what="policy",
        parse=parse_policy,
        apply=apply,
        reloads=reloads,
        loaded=current.revision,
        refusal=refusal,
        interval=interval,
    )
