"""Resource analysis: which resources a call touches, and whether it reads or writes them.

Built-in tools declare resource templates in their spec (read_file: READ on the
file named by `path`; list_dir/search: READ on the directory tree; write_file:
WRITE on the file). A tool that knows more from its arguments -- `sql` parses the
statement -- implements `call_effects` and answers per call.

A command (`run_command`, a declared command tool) claims the whole workspace for
writing unless it declares the paths it reads and writes. A declaration is only
believed where the sandbox enforces it (`CallEffects.confined`): the workspace
read-only but for the declared write paths. Where the sandbox cannot (`process`),
the pipeline takes the claims back to the whole workspace (`unconfined`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Claim, Key, Mode, path_key, workspace_key

from .base import Declared, ResourceKind, Tool


@dataclass(frozen=True, slots=True)
class CallEffects:
    """What one call touches. `may_write` decides UNKNOWN_OUTCOME vs FAILURE if interrupted."""

    claims: tuple[Claim, ...]
    may_write: bool
    # Tool-specific analysis handed to the tool when it runs (ToolContext.analysis),
    # so it runs with exactly what it was scheduled with.
    detail: Any = None
    # Paths the analysis resolved (a declared tool's effects), by where they were
    # declared: the policy's `paths:` rules see them beside the path arguments.
    paths: Mapping[str, Path] = field(default_factory=dict)
    # Not None: the claims are a command's declaration, true only if the sandbox keeps
    # the workspace read-only but for these paths (empty: all of it read-only).
    confined: tuple[Declared, ...] | None = None


def unconfined(effects: CallEffects, workspace: Workspace) -> CallEffects:
    """A declaration the sandbox cannot enforce: the whole workspace written, as by a
    command that declared nothing (claims outside it, on hosts, stay)."""
    root = workspace_key(workspace.lock_root)
    others = tuple(c for c in effects.claims if not _inside(root, c.key))
    return CallEffects((Claim(root, Mode.WRITE), *others), True, effects.detail, effects.paths)


def _inside(root: Key, key: Key) -> bool:
    return key == root or root.is_ancestor_of(key)


@runtime_checkable
class AnalysedTool(Protocol):
    """A tool whose effects depend on its arguments beyond its static templates.

    Validation runs `call_effects` in a worker thread (`sql` reads its database's
    schema), unless the tool says `quick_analysis = True`: no more than resolving
    paths and reading its arguments, which validation does on the event loop for
    every call anyway (run_command, declared commands, MCP tools: the thread hop
    would cost more than the analysis).
    """

    def call_effects(
        self, args: dict[str, Any], paths: Mapping[str, Path], workspace: Workspace
    ) -> CallEffects: ...


def quick(tool: Tool) -> bool:
    """Does the tool's analysis run on the event loop (`AnalysedTool`'s docstring)?"""
    return bool(getattr(tool, "quick_analysis", False))


def analyse(
    tool: Tool,
    args: dict[str, Any],
    paths: Mapping[str, Path],
    workspace: Workspace,
    analysed: bool | None = None,
) -> CallEffects:
    """The call's claims: the tool's own analysis if it has one, else its templates.
    `analysed`: whether it is an AnalysedTool, when the caller knows (toolset.Traits)."""
    if analysed if analysed is not None else isinstance(tool, AnalysedTool):
        return cast(AnalysedTool, tool).call_effects(args, paths, workspace)
    claims = []
    for template in tool.spec.resources:
        if template.kind is ResourceKind.WORKSPACE:
            key = workspace_key(workspace.lock_root)
        else:
            key = file_key(workspace, paths[template.argument])
        claims.append(Claim(key, template.mode))
    return CallEffects(tuple(claims), tool.spec.may_write)


def file_key(workspace: Workspace, path: Path) -> Key:
    """The lock key of a canonical path inside the workspace."""
    return path_key(workspace.lock_root, workspace.relative(path))
