"""A recorded run worth tracing, for the `execgate trace` / `kills` tests.

`traced_run(root)` starts a daemon with identities and a policy (reads allowed, `sh -c`
scripts allowed, `touch published.txt` asks an approver, commands limited to 1.5 s with a
0.5 s grace) and drives one run through the client `Loop`, as `execgate demo` does:

    s1c1, s1c2, s1c3  three reads together (s1c3's path is markup: it must be escaped)
    s2c1, s2c2        two commands: the second waits for the first's workspace lock
    s3c1              parked by the ask rule until alice approves it
    s4c1              ignores SIGTERM: timeout, grace, force kill
    s5c1              exits on SIGTERM: timeout, cooperative stop
    then a final answer: the run completes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from execgate.client import (
    CallRecord,
    Evidence,
    Loop,
    LoopResult,
    Mark,
    Outcome,
    RunDetail,
    RunInfo,
    Status,
    StopMode,
)
from execgate.client.loop.states import State, Transition
from execgate.client.models import ScriptedModel
from tests.daemon import Daemon
from tests.loop_support import TOKENS, Background, as_, start_auth_daemon, stop
from tests.support import wait_until

RUN_ID = "traced-run"
MARKUP_PATH = "<b>x</b>&'\".txt"
POLICY = """\
version: 1
default: deny
rules:
  - id: reads
    effect: allow
    tools: [read_file]
    reason: reads are fine
  - id: scripts
    effect: allow
    tools: [run_command]
    argv_prefix: [[sh, -c]]
    reason: small scripts
  - id: publish
    effect: ask
    tools: [run_command]
    argv_prefix: [[touch, published.txt]]
    approvers: [approver]
    ttl: 60
    reason: publishing needs a human
limits:
  - tools: [run_command]
    timeout_s: 1.5
    grace_s: 0.5
"""
APPEND = "echo {0} >> notes.txt; sleep 0.3"


@dataclass(frozen=True)
class Traced:
    daemon: Daemon
    run_id: str
    approval_id: str
    result: LoopResult


def script() -> ScriptedModel:
    S = ScriptedModel
    return S(
        [
            S.calls(
                ("read_file", {"path": "a.txt"}),
                ("read_file", {"path": "b.txt"}),
                ("read_file", {"path": MARKUP_PATH}),
            ),
            S.calls(
                ("run_command", {"argv": ["sh", "-c", APPEND.format("first")]}),
                ("run_command", {"argv": ["sh", "-c", APPEND.format("second")]}),
            ),
            S.calls(("run_command", {"argv": ["touch", "published.txt"]})),
            S.calls(("run_command", {"argv": ["sh", "-c", "trap '' TERM; sleep 30"]})),
            S.calls(("run_command", {"argv": ["sh", "-c", "sleep 30"]})),
            S.answer("read, wrote twice, published, and was stopped twice"),
        ]
    )


@contextlib.contextmanager
def traced_run(root: Path) -> Iterator[Traced]:
    daemon = start_auth_daemon(root, POLICY)
    try:
        (daemon.workspace / "a.txt").write_text("alpha\n")
        (daemon.workspace / "b.txt").write_text("beta\n")

        def run() -> LoopResult:
            with as_(daemon, "bot") as bot:
                return Loop(bot, script(), limits={"max_steps": 10}).run("trace me", run_id=RUN_ID)

        loop = Background(run)
        with as_(daemon, "alice") as alice:
            pending: list[str] = []

            def parked() -> bool:
                pending[:] = [a.approval_id for a in alice.approvals_pending()]
                return bool(pending)

            wait_until(parked, "the publish call awaiting approval")
            alice.approve(pending[0], "ship it")
        yield Traced(daemon, RUN_ID, pending[0], loop.result(timeout=30))
    finally:
        stop(daemon)


def execgate(traced: Traced, *args: str, columns: int = 100) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator (olga) runs it against the traced daemon."""
    env = {k: v for k, v in os.environ.items() if k not in ("EXECGATE_ADDR", "EXECGATE_TOKEN")}
    env.update({"COLUMNS": str(columns), "NO_COLOR": "1"})
    cmd = [sys.executable, "-m", "execgate.executor.cli", *args]
    cmd += ["--addr", traced.daemon.address, "--token", TOKENS["olga"]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout


# ---------------------------------------------------------------- hand-made records

T0 = 1_700_000_000.0
PLAIN = (
    ("queued", 0.1, ""),
    ("lock_granted", 0.2, ""),
    ("started", 0.2, ""),
    ("finished", 0.5, ""),
)


def hand_made_call(
    call_id: str,
    marks: tuple[tuple[str, float, str], ...] = PLAIN,
    *,
    agent: str = "bot",
    arguments: str = "{}",
    message: str = "",
    detail: str = "",
    status: Status = Status.FAILURE,
    error_class: str = "not_found",
    stopped_how: StopMode = StopMode.COMPLETED,
    evidence: Evidence | None = None,
    finished: bool = True,
) -> CallRecord:
    """A journal record whose marks are (phase, seconds after T0, detail); `detail` is
    added to the last mark."""
    timeline = tuple(Mark(p, T0 + at, d) for p, at, d in marks)
    if detail:
        timeline = (*timeline[:-1], Mark(timeline[-1].phase, timeline[-1].at, detail))
    outcome = Outcome(
        call_id=call_id,
        status=status,
        error_class=error_class,
        message=message,
        timeline=timeline,
        stopped_how=stopped_how,
        evidence=evidence or Evidence(),
    )
    return CallRecord(
        run_id="hand-made",
        call_id=call_id,
        batch_id="b1",
        tool="run_command",
        arguments_json=arguments,
        idempotency_key="",
        agent=agent,
        may_write=True,
        created_at=T0 + marks[0][1],
        running=not finished,
        outcome=outcome if finished else None,
    )


def hand_made_run(
    calls: list[CallRecord], *, goal: str = "by hand", reason: str = "stopped", ended: bool = True
) -> RunDetail:
    """A run of `calls`; ended: failed at T0 + 1 by rule max_consecutive_errors."""
    start = Transition("hand-made", 1, T0, State.CREATED, State.REQUESTING_MODEL, "run started")
    end = Transition(
        "hand-made",
        2,
        T0 + 1,
        State.REQUESTING_MODEL,
        State.FAILED,
        reason,
        {"rule": "max_consecutive_errors", "evidence": {"count": 3}},
    )
    events = (start, end) if ended else (start,)
    state = State.FAILED if ended else State.REQUESTING_MODEL
    run = RunInfo(run_id="hand-made", goal=goal, owner="bot", created_at=T0, state=state)
    return RunDetail(run, events, tuple(calls))
