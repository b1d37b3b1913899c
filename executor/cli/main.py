"""`execgate`: the daemon (`serve`) and the operator/developer commands that talk to it.

`execgate --help` and `--version` import no command: each command's module (and with it
grpc, rich, the client or the daemon) is imported only when that command is the one run.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Callable, Sequence

from .options import Parser

EX_UNAVAILABLE = 69

# command -> (module that registers it, its one-line help). The module's registrar adds
# every command it owns; the others appear as help-only entries.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("serve", "run the daemon in the foreground"),
    "tools": ("tools", "the daemon's tools (list) and tools files (check)"),
    "call": ("calls", "run one tool call"),
    "calls": ("calls", "read the journal: list, show"),
    "cancel": ("calls", "stop a call, a batch or a run"),
    "explain": ("calls", "show how a batch would be scheduled, run nothing"),
    "health": ("calls", "exit 0 if the daemon is serving"),
    "approvals": ("approvals", "calls a policy `ask` rule parked: list, watch, approve, deny"),
    "runs": ("runs", "runs recorded by the daemon: list, show, cancel"),
    "trace": ("trace.command", "a run's calls on a timeline (terminal, JSON or HTML)"),
    "kills": ("kills", "calls the daemon force-terminated, and how"),
    "doctor": ("sandbox", "which sandbox backends work here; the daemon's MCP servers"),
    "policy": ("policy", "check, explain and test policy files (no daemon needed)"),
    "token": ("identity", "bearer tokens for the identities file"),
    "demo": ("demo", "run a scripted agent against a daemon, narrated"),
    "mcp": ("mcp", "serve the daemon's tools to MCP clients (stdio, or HTTP on loopback)"),
}
REGISTRAR = {
    "serve": "add_command",
    "calls": "add_commands",
    "tools": "add_commands",
    "approvals": "add_commands",
    "runs": "add_commands",
    "trace.command": "add_commands",
    "kills": "add_commands",
    "sandbox": "add_doctor",
    "policy": "add_commands",
    "identity": "add_commands",
    "demo": "add_command",
    "mcp": "add_command",
}


def main(argv: Sequence[str] | None = None, *, own_process: bool = False) -> int:
    """Run one command. `own_process`: this is the `execgate` process itself (the console
    script, `python -m`), so it may set process-wide signal dispositions; a caller that
    runs commands in-process (tests, embedding) keeps its own."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if own_process and args.command != "serve":
        # `execgate … | head`: the reader went away; end as a Unix tool does, no traceback.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return _report(exc)


def _report(exc: Exception) -> int:
    """The exit status for an error meant for the user; anything else propagates."""
    from execgate.client import DaemonUnavailable, ExecgateClientError
    from execgate.executor.core.errors import ConfigError, PolicyError, ToolFileError

    if isinstance(exc, (ConfigError, PolicyError, ToolFileError)):
        print(f"execgate: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, ExecgateClientError):
        print(f"execgate: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE if isinstance(exc, DaemonUnavailable) else 1
    raise exc


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, just that command's module is imported (all when None
    is not a command: help-only entries for each)."""
    parser = Parser(prog="execgate", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"execgate {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    loaded: set[str] = set()
    modules = [COMMANDS[only][0]] if only in COMMANDS else []
    for name in modules:
        before = set(sub.choices)
        _registrar(name)(sub)
        loaded |= set(sub.choices) - before
    for name, (_, text) in COMMANDS.items():
        if name not in loaded:
            sub.add_parser(name, help=text, add_help=False)
    # Keep `--help`'s list in COMMANDS's order whatever was loaded first.
    sub._choices_actions.sort(key=lambda a: list(COMMANDS).index(a.dest))
    return parser


def full_parser() -> argparse.ArgumentParser:
    """Every command's real parser (tests walk it)."""
    parser = Parser(prog="execgate")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in dict.fromkeys(module for module, _ in COMMANDS.values()):
        _registrar(name)(sub)
    return parser


def _registrar(module: str) -> Callable[[argparse._SubParsersAction[Parser]], None]:
    mod = importlib.import_module(f"{__package__}.{module}")
    fn: Callable[[argparse._SubParsersAction[Parser]], None] = getattr(mod, REGISTRAR[module])
    return fn


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("execgate")
    except PackageNotFoundError:
        return "unknown"
