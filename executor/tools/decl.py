"""What a tools file declares, as values: command tools and MCP servers.

The loader (`toolfile`) builds these from YAML and refuses anything it cannot
build; the providers (`declared` for commands, `mcp` for servers) turn them into
tools. Nothing here runs or reads a file.

Templates are strings in which `{name}` stands for the call's argument `name`
(`{{` and `}}` are literal braces). In an argv template each element stays one
element whatever the argument holds: a template never becomes a shell string and
never splits into several elements. `{name...}` as a whole element spreads an
array argument into one element per item.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

# The default bound of one JSON-RPC message from an MCP server (`max_message_kb`).
MAX_MESSAGE_BYTES = 32 << 20


class OutputMode(enum.Enum):
    TEXT = "text"  # stdout is the result's text
    JSON = "json"  # stdout is one JSON value: the structured result (and its text)


class Pool(enum.Enum):
    """Who shares one process of an MCP server."""

    DAEMON = "daemon"  # one process for every call (stateless servers)
    RUN = "run"  # one per run: state a server keeps never crosses runs
    AGENT = "agent"  # one per agent


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvDecl:
    """The environment a command or server gets, and nothing else.

    `set`: fixed values written in the file. `passthrough`: names copied from the
    daemon's environment when present. `secrets`: variable in the child -> variable
    in the daemon's environment; the value is never shown to the agent, never
    journaled and never logged (the journal keeps the names).
    """

    set: tuple[tuple[str, str], ...] = ()
    passthrough: tuple[str, ...] = ()
    secrets: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectsDecl:
    """What a call touches, as templates over its arguments.

    `declared` False: the file says nothing, so the call may touch the whole
    workspace (a write on it: every other call waits). Paths are confined to the
    workspace and canonicalised like the built-ins' path arguments.
    """

    declared: bool = False
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    read_tables: tuple[str, ...] = ()
    write_tables: tuple[str, ...] = ()
    net: tuple[str, ...] = ()  # hosts; the policy's sandbox rule must also allow network

    @property
    def may_write(self) -> bool:
        return not self.declared or bool(self.writes or self.write_tables)


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxDecl:
    """Where a declared command or server runs. `backend` "default": the policy's
    sandbox rule for the tool decides (the daemon's --sandbox when none matches).
    `limits`: Confinement field -> value; the policy's rule may lower them. `image`: a
    server's docker image ("": the daemon's --docker-image); only with `backend: docker`."""

    backend: str = "default"
    limits: tuple[tuple[str, int], ...] = ()
    timeout: float | None = None
    image: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Located:
    """Where a declaration was written: errors found later (a reload, a server's
    schema) name the file and line."""

    source: str = ""
    line: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandDecl:
    name: str
    description: str
    input_schema: dict[str, Any]
    argv: tuple[str, ...]
    cwd: str = "."
    stdin: str | None = None  # an argument whose text is the command's stdin
    env: EnvDecl = field(default_factory=EnvDecl)
    effects: EffectsDecl = field(default_factory=EffectsDecl)
    idempotent: bool = False
    destructive: bool = False
    sandbox: SandboxDecl = field(default_factory=SandboxDecl)
    output: OutputMode = OutputMode.TEXT
    success_codes: tuple[int, ...] = (0,)
    # Arguments that may begin an argv element with `-` (read as options by the program).
    option_args: tuple[str, ...] = ()
    at: Located = field(default_factory=Located)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolOverride:
    """The operator's word on one tool of an MCP server, above what the server says."""

    effects: EffectsDecl | None = None
    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    hidden: bool = False  # not served at all
    # Where the override was written: a template that does not fit the tool's schema
    # (known once the server lists it) is named there. Not compared (see ServerDecl.at).
    at: Located = field(default_factory=Located, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerDecl:
    """An MCP server over stdio. Its tools are served as `NAME.TOOL`."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    cwd: str = "."
    env: EnvDecl = field(default_factory=EnvDecl)
    # Trusted: its tools' annotations (readOnlyHint, destructiveHint, idempotentHint,
    # openWorldHint) become effects. Untrusted: every tool writes, serialized per server.
    trusted: bool = False
    sandbox: SandboxDecl = field(default_factory=SandboxDecl)
    prestart: bool = False
    pool: Pool = Pool.DAEMON
    startup_timeout: float = 10.0
    # A message from the server longer than this ends its process (treated as a crash).
    max_message_bytes: int = MAX_MESSAGE_BYTES
    tools: tuple[tuple[str, ToolOverride], ...] = ()
    # Not compared: a reload that only moves a server's lines declares the same server.
    at: Located = field(default_factory=Located, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolFile:
    """Everything the tools file (or every file of a tools.d/ directory) declares."""

    commands: tuple[CommandDecl, ...] = ()
    servers: tuple[ServerDecl, ...] = ()
    revision: str = ""  # sha256 of the text(s) it was built from
