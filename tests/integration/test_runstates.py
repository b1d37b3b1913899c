"""The run-state machine is defined once: proto/execgate/v1/runstates.json.

setup.py generates `execgate.v1.runstates` from it and client/typescript's build
generates src/gen/runstates.ts. Here: both generated tables say what the data file
says (its edge rules expanded independently of either generator); the Python loop's
tables, the daemon's (`core.runstate`) and the TypeScript client's are the generated
ones, not copies; and the daemon refuses exactly the histories the loop's `Machine`
refuses, with the same kind and message.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execgate.client.loop import errors as loop_errors
from execgate.client.loop import results, states, stops
from execgate.executor.core import runstate
from execgate.v1 import runs_pb2 as rpb
from execgate.v1 import runstates

observe = importlib.import_module("execgate.client.loop.observe")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "proto" / "execgate" / "v1" / "runstates.json"
TS_TABLES = ROOT / "client" / "typescript" / "dist" / "src" / "gen" / "runstates.js"


def _plain(node: Any) -> Any:
    """`node` without its "$..." comment keys."""
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items() if not k.startswith("$")}
    return node


DOC: dict[str, Any] = json.loads(DATA.read_text(encoding="utf-8"))
NAMES = [s["name"] for s in DOC["states"]]
KIND = {s["name"]: s["kind"] for s in DOC["states"]}
RESUME = _plain(DOC["resume_into"])


def of_kind(*kinds: str) -> set[str]:
    return {n for n in NAMES if KIND[n] in kinds}


def _refs(items: list[str]) -> set[str]:
    out: set[str] = set()
    for item in items:
        if item == "@resume":
            out |= set(RESUME.values())
        elif item.startswith("@"):
            out |= of_kind(item[1:])
        else:
            out.add(item)
    return out


def expected_edges() -> dict[str, set[str]]:
    edges = _plain(DOC["edges"])
    table: dict[str, set[str]] = {}
    for name in NAMES:
        if KIND[name] == "live":
            table[name] = set(edges[name]) | _refs(DOC["from_every_live_state"])
        elif KIND[name] == "suspended":
            table[name] = _refs(DOC["from_suspended"])
        else:
            table[name] = set()
    return table


REFUSALS = _plain(DOC["refusals"])
EXPECTED: dict[str, Any] = {
    "states": NAMES,
    "transitions": {k: sorted(v) for k, v in expected_edges().items()},
    "live": sorted(of_kind("live")),
    "suspended": sorted(of_kind("suspended")),
    "stops": sorted(of_kind("stop")),
    "terminal": sorted(of_kind("stop", "success")),
    "resume": RESUME,
    "priority": DOC["stop_priority"]["rules"],
    "limit_keys": DOC["limit_keys"]["keys"],
    "daemon_hints": _plain(DOC["daemon_hints"]),
    "refusal_hints": {k: v["hint"] for k, v in REFUSALS.items()},
    "status_hints": _plain(DOC["status_hints"]),
    "fallback_hints": _plain(DOC["fallback_hints"]),
}


def _names(states_: Any) -> list[str]:
    return sorted(str(s) for s in states_)


def test_the_generated_python_tables_are_the_data_files() -> None:
    r = runstates
    got = {
        "states": [s.value for s in r.State],
        "transitions": {k.value: _names(v) for k, v in r.TRANSITIONS.items()},
        "live": _names(r.LIVE),
        "suspended": _names(r.SUSPENDED),
        "stops": _names(r.STOPS),
        "terminal": _names(r.TERMINAL),
        "resume": {k.value: v.value for k, v in r.RESUME_INTO.items()},
        "priority": list(r.STOP_PRIORITY),
        "limit_keys": list(r.LIMIT_KEYS),
        "daemon_hints": dict(r.DAEMON_HINTS),
        "refusal_hints": {k.value: v for k, v in r.REFUSAL_HINTS.items()},
        "status_hints": dict(r.STATUS_HINTS),
        "fallback_hints": dict(r.FALLBACK_HINTS),
    }
    assert got == EXPECTED
    assert [k.value for k in r.TRANSITIONS] == NAMES
    assert [x.value for x in r.Refusal] == list(REFUSALS)


def test_the_data_file_keeps_its_own_rules() -> None:
    # Completed is reachable from validating only; a stop from every non-terminal state.
    edges = expected_edges()
    assert [n for n, to in edges.items() if "completed" in to] == ["validating"]
    for name in of_kind("live", "suspended"):
        assert of_kind("stop") <= edges[name], name
    assert set(RESUME) == of_kind("live")
    # The limit keys are runs.proto's RunLimits, field for field.
    assert DOC["limit_keys"]["keys"] == [f.name for f in rpb.RunLimits.DESCRIPTOR.fields]
    assert not set(REFUSALS) & set(EXPECTED["daemon_hints"])


def test_the_python_loops_tables_are_the_generated_ones() -> None:
    assert states.State is runstates.State
    assert states.TRANSITIONS is runstates.TRANSITIONS
    assert states.RESUME_INTO is runstates.RESUME_INTO
    assert states.TERMINAL is runstates.TERMINAL
    assert states.STOPS is runstates.STOPS
    assert states.LIVE is runstates.LIVE
    assert stops.PRIORITY is runstates.STOP_PRIORITY
    assert observe.DAEMON_HINTS is runstates.DAEMON_HINTS
    assert observe.REFUSAL_HINTS is runstates.REFUSAL_HINTS
    assert observe.Refusal is runstates.Refusal
    assert results.LIMIT_KEYS is runstates.LIMIT_KEYS
    assert tuple(results.STOP_KWARGS) == runstates.LIMIT_KEYS


def test_the_daemons_tables_are_the_generated_ones() -> None:
    assert runstate.State is runstates.State
    assert runstate.TERMINAL is runstates.TERMINAL
    assert runstate.LIMIT_KEYS is runstates.LIMIT_KEYS
    # Its refusal kinds are the loop's breakages that a stored history can have.
    assert {k.value for k in runstate.Breakage} == {k.value for k in loop_errors.Breakage} - {
        "malformed"
    }


def test_the_typescript_tables_are_the_data_files() -> None:
    node = shutil.which("node")
    if node is None or not TS_TABLES.exists():
        pytest.fail(f"needs node and the built TypeScript client ({TS_TABLES}): run `make test-ts`")
    script = f"import * as t from {json.dumps(TS_TABLES.as_uri())}; console.log(JSON.stringify(t));"
    out = subprocess.run(
        [node, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    t = json.loads(out.stdout)
    got = {
        "states": t["STATES"],
        "transitions": {k: sorted(v) for k, v in t["TRANSITIONS"]},
        "live": sorted(t["LIVE"]),
        "suspended": sorted(t["SUSPENDED"]),
        "stops": sorted(t["STOPS"]),
        "terminal": sorted(t["TERMINAL"]),
        "resume": dict(t["RESUME_INTO"]),
        "priority": t["STOP_PRIORITY"],
        "limit_keys": t["LIMIT_KEYS"],
        "daemon_hints": t["DAEMON_HINTS"],
        "refusal_hints": t["REFUSAL_HINTS"],
        "status_hints": t["STATUS_HINTS"],
        "fallback_hints": t["FALLBACK_HINTS"],
    }
    camel = [
        "".join(w.title() if i else w for i, w in enumerate(k.split("_")))
        for k in EXPECTED["limit_keys"]
    ]
    assert got == {**EXPECTED, "limit_keys": camel}


# -- the daemon's checks are the loop's ------------------------------------------------

S = runstates.State
_moves = st.lists(
    st.tuples(
        # 0: continue the run; 1: a skipped seq; 2: a repeated seq; 3: a wrong from-state;
        # 4: another run's record.
        st.sampled_from([0, 0, 0, 0, 0, 0, 1, 2, 3, 4]),
        st.sampled_from(list(S)),
        st.sampled_from(list(S)),
    ),
    max_size=12,
)


@given(_moves)
def test_the_daemon_refuses_exactly_what_the_loop_refuses(moves: list[tuple[int, S, S]]) -> None:
    loop = states.Machine("r")
    daemon = runstate.History("r")
    for fault, to, other in moves:
        seq = loop.next_seq + {1: 1, 2: -1}.get(fault, 0)
        moved = states.Transition(
            "x" if fault == 4 else "r",
            seq,
            0.0,
            other if fault == 3 else loop.state,
            to,
            "",
        )
        said = _loop_says(loop, moved)
        assert _daemon_says(daemon, runstate.Transition(**_fields(moved))) == said
        if said is not None:
            return
        assert (daemon.state, daemon.next_seq) == (loop.state, loop.next_seq)
        assert daemon.suspended_from == loop.suspended_from


Refused = tuple[str, str, str, int | None] | None


def _loop_says(loop: states.Machine, moved: states.Transition) -> Refused:
    try:
        loop.record(moved)
    except loop_errors.BrokenHistory as exc:
        return (exc.kind.value, str(exc), exc.run_id, exc.seq)
    return None


def _daemon_says(daemon: runstate.History, moved: runstate.Transition) -> Refused:
    try:
        daemon.record(moved)
    except runstate.BrokenHistory as exc:
        return (exc.kind.value, str(exc), exc.run_id, exc.seq)
    return None


def _fields(moved: states.Transition) -> dict[str, Any]:
    return {f.name: getattr(moved, f.name) for f in dataclasses.fields(moved)}


def test_replay_rebuilds_the_same_run() -> None:
    m = states.Machine("r")
    moves = [
        m.advance(S.REQUESTING_MODEL, "go"),
        m.advance(S.WAITING, "suspend"),
        m.advance(S.REQUESTING_MODEL, "resume"),
        m.advance(S.VALIDATING, "answer"),
    ]
    history = runstate.History.replay("r", [runstate.Transition(**_fields(t)) for t in moves])
    assert (history.state, history.next_seq) == (S.VALIDATING, 5)
    waiting = runstate.Transition("r", 5, 0.0, S.VALIDATING, S.WAITING, "")
    history.record(waiting)
    with pytest.raises(runstate.BrokenHistory, match="resumes into validating") as refused:
        history.record(runstate.Transition("r", 6, 0.0, S.WAITING, S.RUNNING_TOOLS, ""))
    assert refused.value.kind is runstate.Breakage.ILLEGAL
    assert (history.state, history.next_seq) == (S.WAITING, 6)  # nothing changed
