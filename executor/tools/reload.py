"""The tool set from the tools file, at start and on every change (hot reload).

Like the policy: a changed file (or any file of a tools.d/ directory) is loaded
whole; one that does not load, clashes or needs a sandbox backend this daemon did
not start is refused, journaled in reloads with the reason, and the last good set
stays in force. An accepted set replaces the old one in one assignment; a call in
flight keeps the Tool it was validated with.

Providers beyond the file's command tools (the MCP servers) come in through
`contribute`: given the file as loaded, the providers whose tools join the set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from execgate.executor.core.errors import ToolFileError
from execgate.executor.journal.base import ReloadStore
from execgate.executor.policy.watch import FileWatcher

from .base import Tool
from .decl import ToolFile
from .toolfile import bundle, load_tools, parse_bundle, read_sources
from .toolset import ToolProvider, ToolSet

__all__ = [
    "Contribute",
    "backends_wanted",
    "default_image_needed",
    "load_toolset",
    "tools_watcher",
]

# The file as loaded -> the providers that add tools to the set (MCP servers).
# Synchronous, called while the file is parsed: the MCP servers list their tools once,
# at daemon start (server/mcp_wiring.py), and a reload serves what they listed then (a
# reload that changes `servers:` is refused there).
Contribute = Callable[[ToolFile], Sequence[ToolProvider]]


def _none(file: ToolFile) -> Sequence[ToolProvider]:
    del file
    return ()


def load_toolset(
    path: Path | None, builtins: Iterable[Tool], contribute: Contribute = _none
) -> tuple[ToolSet, ToolFile]:
    """The set the daemon starts with; ToolFileErrors (located) if the file is bad."""
    builtins = list(builtins)
    if path is None:
        return ToolSet.build(builtins), ToolFile()
    file = load_tools(path, frozenset(t.spec.name for t in builtins))
    return ToolSet.declared(builtins, file, contribute(file)), file


def backends_wanted(file: ToolFile) -> set[str]:
    """The sandbox backends the file's tools and servers name (built at start)."""
    decls = [c.sandbox for c in file.commands] + [s.sandbox for s in file.servers]
    return {d.backend for d in decls if d.backend != "default"}


def default_image_needed(file: ToolFile) -> bool:
    """Does something of the file run in docker without naming its image (a command
    tool, or a server without `sandbox.image`)? Then --docker-image must be given."""
    commands = any(c.sandbox.backend == "docker" for c in file.commands)
    return commands or any(
        s.sandbox.backend == "docker" and not s.sandbox.image for s in file.servers
    )


def tools_watcher(
    path: Path,
    current: ToolSet,
    *,
    builtins: Iterable[Tool],
    backends: Iterable[str],
    apply: Callable[[ToolSet], None],
    reloads: ReloadStore,
    contribute: Contribute = _none,
    interval: float = 1.0,
) -> FileWatcher[ToolSet]:
    builtins = list(builtins)
    reserved = frozenset(t.spec.name for t in builtins)
    running = frozenset(backends)

    def parse(text: str, source: str) -> ToolSet:
        file = parse_bundle(text, source, reserved)
        return ToolSet.declared(builtins, file, contribute(file))

    def refusal(new: ToolSet) -> str:
        for name, traits in new.traits.items():
            backend = traits.placement.backend if traits.placement is not None else "default"
            if backend not in ("default", *running):
                return f"tool {name!r}: sandbox backend {backend} is not running; restart to use it"
        return ""

    return FileWatcher(
        path,
        what="tools",
        parse=parse,
        apply=apply,
        reloads=reloads,
        loaded=current.revision,
        refusal=refusal,
        interval=interval,
        read=_read,
    )


def _read(path: Path) -> str | None:
    try:
        return bundle(read_sources(path))
    except ToolFileError:
        return None
