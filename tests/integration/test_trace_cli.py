"""`execgate trace RUN` (terminal and --json), `execgate kills` and `calls list --status`
against a real daemon and a run the client Loop recorded (tests/trace_support.py)."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from rich.cells import cell_len

from execgate.client import Status
from execgate.client.loop.states import State
from execgate.executor.cli.kills import age, kills
from execgate.executor.cli.trace.command import render
from execgate.executor.cli.trace.rows import StopCause, stop_cause
from execgate.executor.cli.trace.timeline import trace
from tests.trace_support import (
    T0,
    Traced,
    execgate,
    hand_made_call,
    hand_made_run,
    ok,
    traced_run,
)

CALLS = ["s1c1", "s1c2", "s1c3", "s2c1", "s2c2", "s3c1", "s4c1", "s5c1"]
ROW = re.compile(r"^(s\d+c\d+) +(\S+) +bot +│(.*)│ (.*)$")
DUR = r"\d+(?:ms|\.\d{3}s)"  # 316ms, 1.500s


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    with traced_run(tmp_path_factory.mktemp("trace-cli")) as t:
        assert t.result.state is State.COMPLETED, t.result
        yield t


@pytest.fixture(scope="module")
def screen(traced: Traced) -> str:
    return ok(execgate(traced, "trace", traced.run_id))


@pytest.fixture(scope="module")
def rows(traced: Traced) -> dict[str, Any]:
    data = json.loads(ok(execgate(traced, "trace", traced.run_id, "--json")))
    return {r["call_id"]: r for r in data["rows"]}


def bar(row: str) -> str:
    m = ROW.match(row)
    assert m is not None, row
    return m.group(3)


def blocks(screen: str) -> dict[str, tuple[str, str]]:
    """call id -> (its row line, its phase lines joined)."""
    found: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in screen.splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in found, f"two rows for {m.group(1)}"
            current = m.group(1)
            found[current] = (line, [])
        elif current and line.startswith("    "):
            found[current][1].append(line.strip())
        else:
            current = ""
    return {k: (row, " ".join(rest)) for k, (row, rest) in found.items()}


# ---------------------------------------------------------------- the terminal view


def test_one_row_per_call_and_nothing_wider_than_100_columns(screen: str) -> None:
    assert list(blocks(screen)) == CALLS
    too_wide = [line for line in screen.splitlines() if len(line) > 100]
    assert not too_wide, too_wide


def test_the_second_write_waited_behind_the_first(screen: str) -> None:
    row, phases = blocks(screen)["s2c2"]
    assert re.search(rf"lock wait {DUR} behind s2c1", phases), phases
    assert "░" in bar(row)
    for read in ("s1c1", "s1c2", "s1c3"):
        assert "lock wait" not in blocks(screen)[read][1]


def test_the_parked_call_shows_its_approval_wait(traced: Traced, screen: str) -> None:
    row, phases = blocks(screen)["s3c1"]
    assert re.search(rf"approval wait {DUR} \(" + traced.approval_id, phases), phases
    assert "rule publish: publishing needs a human" in phases
    # From the approval record (Approvals.List): the decision and who made it.
    assert "approved by alice" in phases
    assert "▒" in bar(row)


def test_the_killed_call_has_its_cancel_and_force_marks(screen: str) -> None:
    row, phases = blocks(screen)["s4c1"]
    cells = bar(row)
    assert "▲" in cells
    assert "✖" in cells
    assert cells.index("▲") < cells.index("✖")
    assert "unknown_outcome/timeout" in row
    assert "timeout requested" in phases
    assert re.search(rf"✖ force kill after {DUR} grace", phases), phases
    assert "force_terminated" in phases
    assert "survivors 0" in phases
    # The cooperative stop was asked to stop, and was never killed.
    coop_row, coop = blocks(screen)["s5c1"]
    assert "✖" not in coop_row
    assert "✖" not in coop
    assert "cooperative" in coop


def test_transitions_and_the_stop_reason_close_the_view(screen: str) -> None:
    lines = screen.splitlines()
    assert lines[-1].startswith("stop: completed at +")
    assert lines[-1].endswith("final answer accepted")
    assert "awaiting_approval" in screen[screen.index("transitions:") :]


def test_a_failed_call_shows_its_error_class(screen: str) -> None:
    row, phases = blocks(screen)["s1c3"]
    assert "failure/not_found" in row
    assert phases.endswith("failure/not_found")


# ---------------------------------------------------------------- --json


def test_json_rows_have_ordered_times(rows: dict[str, Any]) -> None:
    assert list(rows) == CALLS
    for call_id, r in rows.items():
        assert 0 <= r["queued"] <= r["started"] <= r["finished"], call_id
        spans = r["spans"]
        assert spans[0]["start"] == r["queued"], call_id
        for before, after in itertools.pairwise(spans):
            assert before["end"] == after["start"], (call_id, spans)
            assert before["kind"] != after["kind"], (call_id, spans)
        assert spans[-1]["end"] == r["finished"], call_id


def test_json_lock_wait_ends_when_the_first_write_finished(rows: dict[str, Any]) -> None:
    first, second = rows["s2c1"], rows["s2c2"]
    assert second["waited_behind"] == ["traced-run/s2c1"]
    assert second["lock_wait"] > 0.2  # s2c1 runs 0.3 s
    assert second["started"] >= first["finished"]
    kinds = [s["kind"] for s in second["spans"] if s["kind"] != "queued"]
    assert kinds == ["lock_wait", "running"]
    assert first["lock_wait"] is None


def test_json_approval_wait_is_between_queued_and_started(
    traced: Traced, rows: dict[str, Any]
) -> None:
    a = rows["s3c1"]["approval"]
    assert a["approval_id"] == traced.approval_id
    assert (a["state"], a["decided_by"]) == ("approved", "alice")
    assert rows["s3c1"]["queued"] <= a["start"] < a["end"] <= rows["s3c1"]["started"]
    assert "approval_wait" in [s["kind"] for s in rows["s3c1"]["spans"]]


def test_json_force_minus_signal_is_the_grace(rows: dict[str, Any]) -> None:
    lad = rows["s4c1"]["ladder"]
    assert lad["cause"] == "timeout"
    assert lad["requested"] <= lad["signal"] <= lad["grace_expired"] <= lad["forced"]
    assert lad["forced"] <= lad["stopped"] <= rows["s4c1"]["finished"]
    assert lad["grace_used"] == pytest.approx(lad["forced"] - lad["signal"], abs=1e-5)
    assert 0.45 <= lad["grace_used"] <= 1.0  # the policy's grace_s: 0.5
    assert rows["s4c1"]["survivors"] == 0
    coop = rows["s5c1"]["ladder"]
    assert coop["forced"] is None
    assert coop["grace_used"] is None


def test_json_run_summary(traced: Traced) -> None:
    data = json.loads(ok(execgate(traced, "trace", traced.run_id, "--json")))
    assert data["run_id"] == traced.run_id
    assert data["stop"]["state"] == "completed"
    assert data["stop"]["reason"] == "final answer accepted"
    states = {s["state"]: s for s in data["states"]}
    assert states["awaiting_approval"]["entered"] == 1
    assert data["end"] >= max(r["finished"] for r in data["rows"])


def test_trace_of_an_unknown_run_fails_cleanly(traced: Traced) -> None:
    result = execgate(traced, "trace", "no-such-run")
    assert result.returncode == 1
    assert "no-such-run" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- kills


def test_kills_lists_the_forced_termination_only(traced: Traced) -> None:
    kills = json.loads(ok(execgate(traced, "kills", "--run", traced.run_id, "--json")))
    assert [k["call_id"] for k in kills] == ["s4c1"]  # s5c1 stopped cooperatively
    [k] = kills
    assert (k["tool"], k["agent"], k["cause"]) == ("run_command", "bot", "timeout")
    assert k["detail"] == "timeout after 1.5s"
    assert k["requested"] <= k["signal_sent"] <= k["forced"] <= k["stopped"]
    assert 0.45 <= k["grace_used"] <= 1.0
    assert k["survivors"] == 0
    assert k["signal"] == 9
    assert k["oom_killed"] in (None, False)


def test_kills_since(traced: Traced) -> None:
    recent = json.loads(ok(execgate(traced, "kills", "--since", "1h", "--json")))
    assert [k["call_id"] for k in recent] == ["s4c1"]
    # s4c1 was killed more than 1.5 s before the run ended (s5c1 ran 1.5 s after it).
    assert json.loads(ok(execgate(traced, "kills", "--since", "1s", "--json"))) == []
    bad = execgate(traced, "kills", "--since", "soon")
    assert bad.returncode == 2
    assert "30s, 15m, 1h or 2d" in bad.stderr


@pytest.mark.parametrize("columns", [160, 80])
def test_kills_table(traced: Traced, columns: int) -> None:
    table = ok(execgate(traced, "kills", "--run", traced.run_id, columns=columns))
    assert max(len(line) for line in table.splitlines()) <= columns
    assert "forced terminations: 1" in table
    # Kept whole at any width: the call, its run, its status and its survivors.
    for kept in ("s4c1", "traced-run", "unknown_outcome"):
        assert kept in table
    assert re.search(r"survivors\W+0\b|│ +0 │", table), table
    assert "timeout after 1.5s" in table.replace("\n", " ") or columns < 100
    assert re.search(rf"SIGKILL \+{DUR}", table), table
    assert "s5c1" not in table


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("15m", 900), ("1h", 3600), ("2d", 172800), ("1.5h", 5400)]
)
def test_ages(text: str, seconds: float) -> None:
    assert age(text) == seconds


# ---------------------------------------------------------------- calls list --status


def test_calls_list_by_status_unknown_outcome(traced: Traced) -> None:
    args = ("calls", "list", "--run", traced.run_id, "--status", "unknown_outcome")
    listed = json.loads(ok(execgate(traced, *args, "--json")))
    assert sorted(r["call_id"] for r in listed) == ["s4c1", "s5c1"]
    assert {r["outcome"]["status"] for r in listed} == {"unknown_outcome"}
    table = ok(execgate(traced, *args, columns=200))
    assert "s4c1" in table
    assert "s5c1" in table
    assert "s1c1" not in table


# ---------------------------------------------------------------- hand-made records

LADDER = (
    ("queued", 0.1, ""),
    ("lock_granted", 0.1, ""),
    ("started", 0.2, ""),
    ("cancel_requested", 0.4, "daemon shutting down (forced)"),
    ("signal_sent", 0.41, "SIGTERM to process group 7"),
    ("grace_expired", 0.41, "forced: no grace"),
    ("force_terminated", 0.42, "SIGKILL to process group 7"),
    ("stopped", 0.43, "no process of the call is left"),
    ("finished", 0.44, ""),
)


@pytest.mark.parametrize(
    ("detail", "error_class", "cause"),
    [
        ("timeout after 1.5s", "timeout", StopCause.TIMEOUT),
        ("daemon shutting down", "cancelled", StopCause.SHUTDOWN),
        ("daemon shutting down (forced)", "cancelled", StopCause.SHUTDOWN),
        ("enough (requested by olga)", "cancelled", StopCause.CANCEL),
    ],
)
def test_stop_causes(detail: str, error_class: str, cause: StopCause) -> None:
    assert stop_cause(detail, error_class) is cause


def test_kills_from_hand_made_records() -> None:
    forced = hand_made_call(
        "forced", LADDER, status=Status.UNKNOWN_OUTCOME, error_class="cancelled"
    )
    plain = hand_made_call("plain")
    [k] = kills([forced, plain])
    assert (k.call_id, k.cause) == ("forced", StopCause.SHUTDOWN)
    assert k.grace_used == pytest.approx(0.01)
    assert k.requested == T0 + 0.4
    assert kills([forced], since=T0 + 0.43) == []
    assert kills([forced], since=T0 + 0.42) == [k]


def test_long_names_control_characters_and_a_running_call_fit_100_columns() -> None:
    long_id = "toolu_01A09q90qw90lq917835lq9" * 2
    calls = [
        hand_made_call(long_id, LADDER, agent="\x1b[31mred\x1b[0m-agent-with-a-long-name"),
        hand_made_call("still", agent="bot", finished=False),
    ]
    lines = [line.plain for line in render(trace(hand_made_run(calls, ended=False)), 100)]
    assert all(cell_len(line) <= 100 for line in lines), [cell_len(x) for x in lines]
    assert not [line for line in lines if "\x1b" in line]
    # The id is never cut: too long to leave the bar room, the call takes two lines.
    at = next(i for i, line in enumerate(lines) if line.startswith(long_id + "  "))
    bar = lines[at + 1]
    assert bar.startswith("    │")
    assert bar.endswith("│ failure/not_found")
    # requested and killed 20 ms apart: one cell, both marks kept, in time order
    assert bar.index("▲") < bar.index("✖")
    assert any("still running" in line for line in lines)
    assert lines[-1] == "not ended: state requesting_model"


def test_the_stop_rule_and_its_evidence_are_named() -> None:
    lines = [line.plain for line in render(trace(hand_made_run([hand_made_call("c1")])), 100)]
    assert lines[-1] == "stop: failed at +1.000s — stopped (rule max_consecutive_errors: count 3)"


def test_a_kill_in_the_last_cell_keeps_the_cancel_mark_first() -> None:
    """At 80 columns the bar is narrow: a kill 20 ms after its request, at the run's
    end, falls in the request's (last) cell; the marks stay in time order."""
    from execgate.executor.cli.trace.command import cells
    from execgate.executor.cli.trace.rows import call_row

    row = call_row(hand_made_call("k", LADDER), T0)
    for width in (10, 17, 33):
        bar = "".join(glyph for glyph, _ in cells(row, 0.42, width))
        assert len(bar) == width
        assert bar.index("▲") < bar.index("✖") == width - 1, bar
