"""`execgate tools [list] | check PATH`: the tools a daemon serves, and tools files.

`list` (also plain `execgate tools`) asks the running daemon; `check` reads a tools
file or tools.d/ directory as the daemon would and prints every error at
file:line:column (exit 1), or a summary of what it declares.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rich.console import Console

from execgate.executor.core.errors import ToolFileError
from execgate.executor.tools import builtin_tools
from execgate.executor.tools.toolfile import load_tools

from . import common
from . import options as cli_options
from .table import Col, print_table


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = cli_options.common()
    p = sub.add_parser("tools", parents=[parent], help="the daemon's tools; check tools files")
    p.set_defaults(handler=_list)
    cmds = p.add_subparsers(dest="tools_command", metavar="COMMAND")
    ls = cmds.add_parser("list", parents=[parent], help="the running daemon's tools")
    ls.set_defaults(handler=_list)
    c = cmds.add_parser("check", help="validate a tools file or tools.d/ directory")
    c.add_argument("path", type=Path)
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(handler=_check)


def _list(args: argparse.Namespace) -> int:
    with common.client(args) as client:
        tools = client.list_tools()
    if args.json:
        common.print_json([dataclasses.asdict(t) for t in tools])
        return 0
    columns = [Col("tool", keep=True, style="bold"), Col("provider"), Col("effects")]
    columns += [Col("trusted")]
    columns += [Col("arguments"), Col("description")]
    rows = []
    for t in tools:
        effects = "read-only" if t.read_only else "writes" + (", destructive" * t.destructive)
        effects += ", idempotent" * t.idempotent
        props = t.input_schema.get("properties", {})
        required = set(t.input_schema.get("required", []))
        names = ", ".join(n + ("" if n in required else "?") for n in props)
        # no: an untrusted server's hints are ignored and the tool is taken for a writer.
        trusted = "yes" if t.annotations_trusted else "no"
        rows.append([t.name, t.provider, effects, trusted, names, t.description.split(". ")[0]])
    print_table(Console(highlight=False), columns, rows, title="execgate tools")
    return 0


def _check(args: argparse.Namespace) -> int:
    reserved = frozenset(builtin_tools(test_tools=True))
    try:
        file = load_tools(args.path, reserved)
    except ToolFileError as exc:
        errors = getattr(exc, "errors", (exc,))
        if args.json:
            print(
                json.dumps(
                    {"path": str(args.path), "ok": False, "errors": [str(e) for e in errors]}
                )
            )
        else:
            for err in errors:
                print(f"FAIL {err}")
            print(f"     {args.path}: {len(errors)} error(s)")
        return 1
    summary = {
        "path": str(args.path),
        "ok": True,
        "errors": [],
        "tools": [c.name for c in file.commands],
        "servers": [s.name for s in file.servers],
        "revision": file.revision,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"ok   {args.path}: {len(file.commands)} command tool(s), {len(file.servers)} "
            f"MCP server(s), revision {file.revision[:12]}"
        )
        for c in file.commands:
            effects = "writes" if c.effects.may_write else "read-only"
            print(f"     {c.name:<24} command  {effects}  ({c.at.source}:{c.at.line})")
        for s in file.servers:
            trust = "trusted" if s.trusted else "untrusted"
            print(f"     {s.name + '.*':<24} mcp      {trust}  ({s.at.source}:{s.at.line})")
    return 0
