"""The operator's commands through the real daemon and CLI, rendered at 80 columns.

One daemon (tests/trace_support.py) holds a run the client Loop recorded (reads, a lock
wait, an approval, a forced kill, a cooperative stop) and, beside it, calls an agent made
with Execute alone: in the implicit default run and in a run of its own that the Runs
service never heard of, with long call ids. Every table must show every id, status and
survivor count whole at 80 columns; every run must be traceable; prefixes must resolve.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execgate.client import Call, Status
from execgate.client.loop.states import State
from tests.loop_support import TOKENS, as_
from tests.support import Streamer, wait_until
from tests.trace_support import Traced, traced_run

WIDTH = 80
DIRECT_RUN = "direct-run-6f1c0e7a-93b2-4d8e-a1f5-0c2d7e9b4a13"
LONG_IDS = [f"toolu_01A09q90qw90lq917835lq9{i:03d}" for i in range(3)]
GROUPS = ("calls", "runs", "approvals", "policy", "token")
# Every command these tests render at 80 columns (the report counts them).
CHECKED_AT_80: set[str] = set()


@dataclass(frozen=True)
class World:
    traced: Traced
    default_ids: list[str]
    direct_ids: list[str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with traced_run(tmp_path_factory.mktemp("operators")) as t:
        assert t.result.state is State.COMPLETED, t.result
        with as_(t.daemon, "bot") as bot:
            default = bot.execute([Call(tool="read_file", arguments={"path": "a.txt"})])
            direct = bot.execute(
                [Call(tool="read_file", arguments={"path": "a.txt"}, call_id=i) for i in LONG_IDS],
                run_id=DIRECT_RUN,
            )
        assert all(o.status is Status.SUCCESS for o in [*default, *direct])
        yield World(t, [o.call_id for o in default], [o.call_id for o in direct])


def cli(
    world: World, *args: str, who: str = "olga", columns: int = WIDTH
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EXECGATE_ADDR", "EXECGATE_TOKEN")}
    env.update({"COLUMNS": str(columns), "NO_COLOR": "1"})
    cmd = [sys.executable, "-m", "execgate.executor.cli", *args]
    cmd += ["--addr", world.traced.daemon.address, "--token", TOKENS[who]]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    if columns == WIDTH and "--json" not in args:
        CHECKED_AT_80.add(" ".join(args[:2] if args[0] in GROUPS else args[:1]))
        wide = [line for line in result.stdout.splitlines() if len(line) > WIDTH]
        assert not wide, wide
    assert "Traceback" not in result.stderr, result.stderr
    return result


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


# ---------------------------------------------------------------- every run can be traced


@pytest.mark.parametrize("run", ["default", DIRECT_RUN])
def test_a_run_only_calls_used_can_be_traced(world: World, run: str) -> None:
    ids = world.default_ids if run == "default" else world.direct_ids
    screen = ok(cli(world, "trace", run))
    for call_id in ids:
        assert re.search(rf"^{re.escape(call_id)} +read_file +bot +│.*│ success$", screen, re.M)
    assert "no run record" in screen
    data = json.loads(ok(cli(world, "trace", run, "--json")))
    assert data["run_id"] == run
    assert [r["call_id"] for r in data["rows"]][-len(ids) :] == ids


@pytest.mark.parametrize("run", ["default", DIRECT_RUN])
def test_a_run_only_calls_used_can_be_shown_listed_and_searched_for_kills(
    world: World, run: str
) -> None:
    ids = world.default_ids if run == "default" else world.direct_ids
    shown = ok(cli(world, "runs", "show", run))
    assert f"run {run}" in shown
    assert "no run record" in shown
    listed = ok(cli(world, "calls", "list", "--run", run))
    for text in (shown, listed):
        for call_id in ids:
            assert call_id in text
    assert "forced terminations: 0" in ok(cli(world, "kills", "--run", run))
    detail = json.loads(ok(cli(world, "runs", "show", run, "--json")))
    assert [c["call_id"] for c in detail["calls"]][-len(ids) :] == ids


def test_every_outcome_the_cli_prints_names_its_run(world: World) -> None:
    out = ok(cli(world, "call", "read_file", "--arg", "path=a.txt", "--run", DIRECT_RUN, who="bot"))
    assert re.match(rf"SUCCESS +run {re.escape(DIRECT_RUN)}\s+call\s+\S+", out), out
    data = json.loads(
        ok(cli(world, "call", "read_file", "--arg", "path=a.txt", "--json", who="bot"))
    )
    assert data["run_id"] == "default"
    shown = ok(cli(world, "calls", "show", "s4c1"))
    assert re.search(r"UNKNOWN_OUTCOME timeout +run traced-run +call s4c1", shown), shown


# ---------------------------------------------------------------- no id is ever cut


def test_calls_list_at_80_columns_keeps_every_id_and_status(world: World) -> None:
    out = ok(cli(world, "calls", "list", "--limit", "100"))
    with as_(world.traced.daemon, "olga") as olga:
        records = olga.list_calls(limit=100)
    assert len(records) >= 12
    for r in records:
        assert r.call_id in out
        assert r.run_id in out
    assert "unknown_outcome" in out
    assert "failure" in out


def test_kills_at_80_columns_keeps_the_id_status_and_survivors(world: World) -> None:
    out = ok(cli(world, "kills"))
    assert "forced terminations: 1" in out
    assert re.search(r"s4c1\s.*traced-run\s.*unknown_outcome\s.*0\b", out.replace("\n", " "))
    assert re.search(r"survivors\W+0\b|│ +0 │", out), out


def test_runs_list_at_80_columns(world: World) -> None:
    out = ok(cli(world, "runs", "list"))
    assert "traced-run" in out
    assert "completed" in out


def test_a_unique_prefix_is_accepted_and_an_ambiguous_one_named(world: World) -> None:
    shown = ok(cli(world, "calls", "show", "s4"))
    assert "call: s4c1" in shown
    long_prefix = LONG_IDS[1][:-1]  # ...001 -> ...00: three calls start with it
    bad = cli(world, "calls", "show", long_prefix)
    assert bad.returncode == 1
    assert "ambiguous prefix" in bad.stderr
    for call_id in LONG_IDS:
        assert call_id in bad.stderr
    assert f"call: {LONG_IDS[2]}" in ok(cli(world, "calls", "show", LONG_IDS[2][:-1] + "2"))
    assert "run traced-run" in ok(cli(world, "trace", "traced"))
    assert "run traced-run" in ok(cli(world, "runs", "show", "traced-r"))
    cancelled = ok(cli(world, "cancel", "--call", "s5"))
    assert cancelled.strip() == "cancel reached 0 call(s) of run traced-run"
    missing = cli(world, "calls", "show", "nosuchcall")
    assert missing.returncode == 1
    assert "no call 'nosuchcall'" in missing.stderr


def test_approvals_list_at_80_columns_and_approve_by_prefix(world: World) -> None:
    daemon = world.traced.daemon
    parked = Streamer(
        daemon.address,
        [Call(tool="run_command", arguments={"argv": ["touch", "published.txt"]})],
        token=TOKENS["bot"],
        run_id="approval-run-0a1b2c3d",
    )
    with as_(daemon, "alice") as alice:
        wait_until(lambda: alice.approvals_pending(), "a pending approval")
        [pending] = alice.approvals_pending()
    out = ok(cli(world, "approvals", "list", who="alice"))
    assert pending.approval_id in out
    assert "approval-run-0a1b2c3d" in out
    assert pending.call_id in out
    decided = ok(cli(world, "approvals", "approve", pending.approval_id[:9], who="alice"))
    assert decided.startswith(f"APPROVED {pending.approval_id} by alice")
    parked.join()
    assert parked.outcome(pending.call_id).status is Status.SUCCESS


# ---------------------------------------------------------------- calls show


def test_calls_show_names_the_decision_the_evidence_and_the_timeline(world: World) -> None:
    out = ok(cli(world, "calls", "show", "s4c1"))
    assert re.search(r"^policy: allow by scripts \(revision [0-9a-f]{12}\)$", out, re.M), out
    # The evidence field may wrap at 80 columns (a long workspace path): read it whole.
    evidence = re.search(r"^evidence: (.*?)\n(?=stopped:)", out, re.M | re.S)
    assert evidence is not None
    for fact in ("signal 9", "survivors 0", "sandbox "):
        assert fact in evidence.group(1)
    marks = re.findall(r"^  \+ *(\d+\.\d{3})s  (\w+)", out, re.M)
    phases = [p for _, p in marks]
    assert phases[:3] == ["queued", "lock_granted", "started"]
    assert "force_terminated" in phases
    assert [float(t) for t, _ in marks] == sorted(float(t) for t, _ in marks)
    read = ok(cli(world, "calls", "show", "s1c1"))
    assert re.search(r"^evidence: .*?read 6 B.*?\nstopped:", read, re.M | re.S), read


# ---------------------------------------------------------------- trace at 80 columns


def test_trace_at_80_columns_never_cuts_an_id_or_outcome(world: World) -> None:
    screen = ok(cli(world, "trace", "traced-run"))
    head = screen.split("\ngoal:")[0].replace("\n  ", " ")
    assert re.search(r"from \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC[+-]\d\d:\d\d$", head), head
    [row] = [line for line in screen.splitlines() if line.startswith("s4c1 ")]
    assert row.endswith("│ unknown_outcome/timeout")
    bar = row[row.index("│") : row.rindex("│")]
    assert bar.index("▲") < bar.index("✖")
    assert "✖ force kill" in screen  # the legend, whole


# ---------------------------------------------------------------- kills --since


def test_kills_since_is_filtered_by_the_daemon(world: World) -> None:
    with as_(world.traced.daemon, "olga") as olga:
        stopped = olga.list_calls(
            run_id="traced-run", statuses=(Status.UNKNOWN_OUTCOME, Status.FAILURE)
        )
        by_id = {r.call_id: r for r in stopped}
        s4_end = by_id["s4c1"].outcome.timeline[-1].at  # type: ignore[union-attr]
        s5_end = by_id["s5c1"].outcome.timeline[-1].at  # type: ignore[union-attr]
        assert s4_end < s5_end
        after_s4 = olga.list_calls(run_id="traced-run", finished_since=(s4_end + s5_end) / 2)
        assert {r.call_id for r in after_s4} == {"s5c1"}
        assert olga.list_calls(run_id="traced-run", finished_since=time.time() + 60) == []
    recent = json.loads(ok(cli(world, "kills", "--since", "1h", "--json")))
    assert [k["call_id"] for k in recent] == ["s4c1"]
    assert json.loads(ok(cli(world, "kills", "--since", "1s", "--json"))) == []


# ---------------------------------------------------------------- pipes


def test_a_closed_pipe_ends_quietly(world: World) -> None:
    with as_(world.traced.daemon, "bot") as bot:
        bot.execute(
            [Call(tool="read_file", arguments={"path": "a.txt"}) for _ in range(120)],
            run_id="many-calls",
        )
    cmd = [sys.executable, "-m", "execgate.executor.cli", "calls", "list", "--json"]
    cmd += ["--limit", "200", "--addr", world.traced.daemon.address, "--token", TOKENS["olga"]]
    shell = " ".join(f"'{a}'" for a in cmd) + " | head -n 1"
    result = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=60)
    assert result.stdout == "[\n"
    assert result.stderr == ""


def test_tools_explain_and_health_at_80_columns(world: World, tmp_path: Path) -> None:
    tools = ok(cli(world, "tools", who="bot"))
    for name in ("read_file", "write_file", "edit_file", "list_dir", "search", "run_command"):
        assert re.search(rf"^ {name} +│", tools, re.M), tools
    batch = tmp_path / "batch.json"
    long_path = "a-rather-long-directory-name/and-a-long-file-name-inside-it.txt"
    batch.write_text(
        json.dumps(
            [
                {"tool": "read_file", "arguments": {"path": long_path}, "call_id": LONG_IDS[0]},
                {"tool": "read_file", "arguments": {"path": "a.txt"}, "call_id": "second"},
            ]
        )
    )
    plan = ok(cli(world, "explain", str(batch), who="bot"))
    assert LONG_IDS[0] in plan
    assert "…" not in plan  # long cells fold onto more lines; nothing is cut
    assert ok(cli(world, "health")).strip() == "SERVING"
    assert json.loads(ok(cli(world, "health", "--json")))["serving"] is True


def test_zz_count_of_commands_checked_at_80_columns() -> None:
    """Printed for the report (-s): which commands rendered at 80 columns above."""
    print(f"\ncommands checked at 80 columns: {len(CHECKED_AT_80)}: {sorted(CHECKED_AT_80)}")
    assert len(CHECKED_AT_80) >= 8
