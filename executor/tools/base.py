"""What a tool is: a spec the world can read, and an async `run`.

A tool receives arguments that already passed its JSON Schema, and a context with
the workspace, the limits and the call's cancel scope. It returns a `ToolOutput`
or raises `ToolError`; it never builds an Outcome itself (`dispatch` does, so
statuses are decided in one place).
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from opentelemetry.trace import SpanContext

from execgate.executor.core import ranges
from execgate.executor.core.outcomes import ErrorClass, Evidence, Mark, StopMode
from execgate.executor.core.paths import Workspace
from execgate.executor.locks.modes import Mode
from execgate.executor.sandbox import Confinement, Sandbox
from execgate.executor.sandbox.ladder import CancelScope

from .decl import SandboxDecl


class ResourceKind(enum.Enum):
    FILE = "file"  # the file named by an argument
    TREE = "tree"  # a directory and everything below it
    WORKSPACE = "workspace"  # everything


@dataclass(frozen=True, slots=True)
class ResourceTemplate:
    kind: ResourceKind
    argument: str
    mode: Mode


@dataclass(frozen=True, slots=True)
class Declared:
    """A path a command declared it writes: what the sandbox makes writable."""

    # Where it was declared (`arguments.writes[0]`, `effects.writes[1]`, or the
    # argument a template names): errors about it name this.
    field: str
    # As declared: resolved again when the call starts, under its locks.
    text: str
    # Canonical, inside the workspace.
    path: Path
    # Made as a directory (else as an empty file) when it does not exist yet.
    directory: bool = False


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    destructive: bool = False
    idempotent: bool = False
    resources: tuple[ResourceTemplate, ...] = ()
    # The tool makes nothing visible before it calls `ToolContext.before_effect`: the
    # dispatcher may start it while its durable intent is still being written, and
    # overlap the two (docs/architecture.md, "The durable write path").
    gated: bool = False

    @property
    def may_write(self) -> bool:
        return not self.read_only


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    # Bytes of result text that go back to the model; more is PARTIAL/truncated.
    output_cap_bytes: int = 64 * 1024
    # Bytes of raw result the journal keeps per call (stdout and stderr each).
    raw_cap_bytes: int = 1024 * 1024
    # Seconds a call may run when it does not ask for less.
    default_timeout: float = 60.0
    # Upper bound on any timeout a call asks for.
    max_timeout: float = 600.0
    # Seconds between the polite signal and force termination.
    grace: float = 2.0
    # Upper bound on a grace period a canceller asks for.
    max_grace: float = 60.0
    # Largest arguments_json accepted, in bytes.
    max_arguments_bytes: int = 4 * 1024 * 1024
    # Largest file the file tools read whole or produce (edit_file's input and result):
    # a small `replace_all` request must not build a multi-GiB file in memory.
    file_cap_bytes: int = 16 * 1024 * 1024


def check_limits(limits: Limits) -> None:
    """The daemon's call limits (`--grace`, `--default-timeout`, `--output-cap`, `--file-cap`),
    each against its range: a `SettingError` naming the setting."""
    ranges.GRACE.check("--grace", limits.grace)
    ranges.GRACE.check("max_grace", limits.max_grace)
    ranges.TIMEOUT.check("--default-timeout", limits.default_timeout)
    ranges.TIMEOUT.check("max_timeout", limits.max_timeout)
    ranges.OUTPUT_CAP.check("--output-cap", limits.output_cap_bytes)
    ranges.RAW_CAP.check("raw_cap_bytes", limits.raw_cap_bytes)
    ranges.FILE_CAP.check("--file-cap", limits.file_cap_bytes)
    ranges.ARGUMENTS.check("max_arguments_bytes", limits.max_arguments_bytes)


@dataclass(slots=True)
class ToolContext:
    workspace: Workspace
    limits: Limits
    timeout: float
    cancel: CancelScope = field(default_factory=CancelScope)
    # What the call was scheduled with, for tools that analyse their arguments
    # (resources.CallEffects.detail); None for the others.
    analysis: Any = None
    # Where process-based tools run (chosen per call by policy), with which limits.
    sandbox: Sandbox | None = None
    confinement: Confinement = field(default_factory=Confinement)
    # The call may write (its effects, not just its tool's): the sandbox binds the
    # workspace read-write only then.
    may_write: bool = True
    # A command's declared writes, when the sandbox enforces them (effects.CallEffects.
    # confined): the workspace read-only but for these. None: nothing declared.
    confined: tuple[Declared, ...] | None = None
    # Unique per call: tags every process the call starts (sandbox.MARKER_ENV).
    marker: str = ""
    # The run the call belongs to (a sandbox may keep warm state per run).
    run_id: str = ""
    # The calling agent (an MCP server pooled per agent runs one process for each).
    agent: str = ""
    # May this call read this (canonical, workspace) path? The policy's answer for the
    # one file, for tools that walk a tree (search, list_dir): a tree allowed as a
    # whole may still hold files a rule denies (`.env`), which they skip.
    readable: Callable[[Path], bool] = field(default=lambda _path: True)
    # May this call use a regular file with more than one hard link at this
    # (canonical) path? The policy's `hard_links:`; refused everywhere by default.
    hard_links: Callable[[Path], bool] = field(default=lambda _path: False)
    # Report progress of the running call (progress, total or None, message): a
    # PROGRESS event on the Execute stream. The dispatcher's callback throttles.
    progress: Callable[[float, float | None, str], None] = field(default=lambda *_: None)
    # time.monotonic() by which the call must end (its timeout, cut to the run's
    # deadline), counted from before the sandbox starts; 0: `timeout` from now.
    deadline: float = 0.0
    # The span context of the call's batch, and the call's index in it: a tool that
    # hands the trace on names the call's span (telemetry.callspan.parent_for; only
    # MCP tools do). None: not traced.
    trace: SpanContext | None = None
    call_index: int = 0
    # Blocks (in a worker thread) until the call's intent is durable, or raises
    # ToolError if it could not be recorded; a `gated` tool calls it before anything
    # it does becomes visible. A no-op when the intent was written before the start.
    before_effect: Callable[[], None] = field(default=lambda: None)

    def remaining(self) -> float:
        """Seconds left until the call's deadline."""
        if not self.deadline:
            return self.timeout
        return max(self.deadline - time.monotonic(), 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolOutput:
    """What a tool produced. `dispatch` turns it into an Outcome.

    `text` may exceed the output cap; `dispatch` bounds it. A tool that bounds
    its own output (read_file reads at most the cap) sets `truncated` and
    `total_bytes` itself.
    """

    text: str = ""
    structured: dict[str, Any] = field(default_factory=dict)
    evidence: Evidence = field(default_factory=Evidence)
    truncated: bool = False
    total_bytes: int | None = None
    # A completed call that failed (for example a non-zero exit): FAILURE.
    error_class: ErrorClass = ErrorClass.NONE
    message: str = ""
    # How the work stopped; anything but COMPLETED means it was interrupted
    # (timeout or cancel) and `error_class` says which.
    stopped_how: StopMode = StopMode.COMPLETED
    marks: tuple[Mark, ...] = ()
    # Interrupted, but the tool proves nothing was committed (a rolled-back
    # transaction): FAILURE even for a call that may write.
    rolled_back: bool = False

    def raw(self) -> str:
        return json.dumps({"text": self.text, "structured": self.structured}, ensure_ascii=False)


class Tool(Protocol):
    spec: ToolSpec

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput: ...


def schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A strict object schema: unknown arguments are errors, not silently ignored."""
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


@runtime_checkable
class CheckedTool(Protocol):
    """A tool with checks of its arguments beyond its JSON Schema (a regex's cost, say),
    run by validation: a refusal is REJECTED before anything is journaled as started."""

    def check(self, args: dict[str, Any]) -> None:
        """Raise a REJECTED ToolError (`errors.invalid`) naming the field."""
        ...


@runtime_checkable
class PlacedTool(Protocol):
    """A tool whose declaration says where it runs (a declared command, an MCP
    server's tool): its backend and limits apply where no policy rule says otherwise,
    and its timeout is the call's default and ceiling."""

    placement: SandboxDecl
