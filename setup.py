"""Build hook: generate `execgate.v1` from proto/ before setuptools looks at packages.

Generated code lives in gen/ (git-ignored). It is produced whenever setuptools
loads this file -- `pip install .`, `pip install -e .`, building a wheel -- so it
can never drift from proto/ or be edited by hand. It runs before `setup()`
because setuptools checks that every package directory exists while it reads
the configuration, before any build command runs.

Two generators: protoc for the .proto files, and `generate_runstates` for the
run-state machine (proto/execgate/v1/runstates.json -> execgate.v1.runstates, a
plain typed module of constants the client loop and the daemon both import; the
TypeScript client generates its copy from the same file, scripts/gen-runstates.mjs).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from setuptools import setup

ROOT = pathlib.Path(__file__).parent.resolve()
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "gen"
PACKAGE_DIR = OUT_ROOT / "execgate" / "v1"
RUNSTATES = PROTO_ROOT / "execgate" / "v1" / "runstates.json"


def generate_protos() -> None:
    from grpc_tools import protoc  # build-time dependency (pyproject build-system)

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    PACKAGE_DIR.mkdir(parents=True, exist_ok=True)
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={OUT_ROOT}",
        f"--pyi_out={OUT_ROOT}",
        f"--grpc_python_out={OUT_ROOT}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed for " + " ".join(protos))
    init = '"""Generated from proto/execgate/v1. Do not edit."""\n'
    (PACKAGE_DIR / "__init__.py").write_text(init)


# -- the run-state machine ------------------------------------------------------------


def _strip(node: Any) -> Any:
    """`node` without its "$..." comment keys."""
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if not k.startswith("$")}
    return node


def _expand(doc: dict[str, Any]) -> dict[str, list[str]]:
    """Every state's successors, in the states' order: the edges plus the two rules."""
    names = [s["name"] for s in doc["states"]]
    kinds = {s["name"]: s["kind"] for s in doc["states"]}
    edges = _strip(doc["edges"])
    resume = _strip(doc["resume_into"])

    def refs(items: list[str]) -> set[str]:
        out: set[str] = set()
        for item in items:
            if item == "@resume":
                out |= set(resume.values())
            elif item.startswith("@"):
                out |= {n for n in names if kinds[n] == item[1:]}
            else:
                out.add(item)
        return out

    table: dict[str, list[str]] = {}
    for name in names:
        match kinds[name]:
            case "live":
                to = refs(edges[name]) | refs(doc["from_every_live_state"])
            case "suspended":
                to = refs(doc["from_suspended"])
            case _:
                to = set()
        table[name] = [n for n in names if n in to]
    return table


def _check(doc: dict[str, Any], table: dict[str, list[str]]) -> None:
    names = [s["name"] for s in doc["states"]]
    kinds = {s["name"]: s["kind"] for s in doc["states"]}
    live = {n for n in names if kinds[n] == "live"}
    problems = []
    if len(set(names)) != len(names):
        problems.append("a state is named twice")
    if bad := set(kinds.values()) - {"live", "suspended", "success", "stop"}:
        problems.append(f"unknown kinds {sorted(bad)}")
    if set(_strip(doc["edges"])) != live:
        problems.append("edges must list exactly the live states")
    resume = _strip(doc["resume_into"])
    if set(resume) != live:
        problems.append("resume_into's keys must be exactly the live states")
    refused = set(_strip(doc["refusals"]))
    targets = {t for ts in table.values() for t in ts} | set(resume.values())
    if unknown := targets - set(names):
        problems.append(f"edges to unknown states {sorted(unknown)}")
    if refused & set(_strip(doc["daemon_hints"])):
        problems.append("a refusal shares its name with a daemon error class")
    if problems:
        raise SystemExit(f"{RUNSTATES}: " + "; ".join(problems))


def _member(name: str) -> str:
    return name.upper()


def _comment(node: dict[str, Any], indent: str) -> list[str]:
    text = node.get("$comment")
    return [f"{indent}# {text}"] if isinstance(text, str) else []


def _states(names: list[str]) -> str:
    if not names:
        return "frozenset()"
    return "frozenset({" + ", ".join(f"State.{_member(n)}" for n in names) + "})"


def _strs(mapping: dict[str, str], key: str = "{!r}") -> list[str]:
    return [f"        {key.format(k)}: {v!r}," for k, v in mapping.items()]


_EXPORTS = [
    *("DAEMON_HINTS", "FALLBACK_HINTS", "LIMIT_KEYS", "LIVE", "REFUSAL_HINTS", "RESUME_INTO"),
    *("STATUS_HINTS", "STOPS", "STOP_PRIORITY", "SUSPENDED", "TERMINAL", "TRANSITIONS"),
    *("Refusal", "State"),
]


def render_runstates(doc: dict[str, Any]) -> str:
    """The Python module of `doc`: enums, frozensets and read-only mappings, typed."""
    table = _expand(doc)
    _check(doc, table)
    names = [s["name"] for s in doc["states"]]
    kind = {s["name"]: s["kind"] for s in doc["states"]}
    refusals = _strip(doc["refusals"])
    out = [
        f'"""Generated from proto/execgate/v1/{RUNSTATES.name} by setup.py. Do not edit.',
        "",
        "The run-state machine's data, shared by the client loop (execgate.client.loop)",
        "and the daemon's Runs service (execgate.executor.core.runstate).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import enum",
        "from collections.abc import Mapping",
        "from types import MappingProxyType",
        "from typing import Final",
        "",
        "__all__ = [",
        *(f'    "{n}",' for n in _EXPORTS),
        "]",
        "",
        "",
        "class State(enum.StrEnum):",
        '    """A run\'s state."""',
        "",
    ]
    for state in doc["states"]:
        out += _comment(state, "    ")
        out.append(f"    {_member(state['name'])} = {state['name']!r}")
    out += [
        "",
        "",
        "class Refusal(enum.StrEnum):",
        '    """Why the loop refused a call itself; the call never reached the daemon."""',
        "",
    ]
    for name in refusals:
        out += _comment(doc["refusals"][name], "    ")
        out.append(f"    {_member(name)} = {name!r}")

    def of_kind(*kinds: str) -> str:
        return _states([n for n in names if kind[n] in kinds])

    resume = _strip(doc["resume_into"])
    out += [
        "",
        "",
        "# The states in which the run executes: those it can be suspended from.",
        f"LIVE: Final[frozenset[State]] = {of_kind('live')}",
        "# Suspended, resumable.",
        f"SUSPENDED: Final[frozenset[State]] = {of_kind('suspended')}",
        "# The terminals a run is stopped into; everything terminal except success.",
        f"STOPS: Final[frozenset[State]] = {of_kind('stop')}",
        f"TERMINAL: Final[frozenset[State]] = {of_kind('stop', 'success')}",
        "# Suspended from -> resumed into.",
        "RESUME_INTO: Final[Mapping[State, State]] = MappingProxyType(",
        "    {",
        *(f"        State.{_member(k)}: State.{_member(v)}," for k, v in resume.items()),
        "    }",
        ")",
        "# Every legal move: state -> the states it may move to.",
        "TRANSITIONS: Final[Mapping[State, frozenset[State]]] = MappingProxyType(",
        "    {",
        *(f"        State.{_member(k)}: {_states(v)}," for k, v in table.items()),
        "    }",
        ")",
        f"STOP_PRIORITY: Final[tuple[str, ...]] = {tuple(doc['stop_priority']['rules'])!r}",
        f"LIMIT_KEYS: Final[tuple[str, ...]] = {tuple(doc['limit_keys']['keys'])!r}",
        "DAEMON_HINTS: Final[Mapping[str, str]] = MappingProxyType(",
        "    {",
        *_strs(_strip(doc["daemon_hints"])),
        "    }",
        ")",
        "REFUSAL_HINTS: Final[Mapping[Refusal, str]] = MappingProxyType(",
        "    {",
        *(f"        Refusal.{_member(k)}: {v['hint']!r}," for k, v in refusals.items()),
        "    }",
        ")",
        "STATUS_HINTS: Final[Mapping[str, str]] = MappingProxyType(",
        "    {",
        *_strs(_strip(doc["status_hints"])),
        "    }",
        ")",
        "FALLBACK_HINTS: Final[Mapping[str, str]] = MappingProxyType(",
        "    {",
        *_strs(_strip(doc["fallback_hints"])),
        "    }",
        ")",
    ]
    return "\n".join(out) + "\n"


def generate_runstates() -> None:
    doc = json.loads(RUNSTATES.read_text(encoding="utf-8"))
    PACKAGE_DIR.mkdir(parents=True, exist_ok=True)
    (PACKAGE_DIR / "runstates.py").write_text(render_runstates(doc), encoding="utf-8")


generate_protos()
generate_runstates()
setup()
