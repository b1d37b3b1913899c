"""Helpers for the Runs and Loop tests: daemons with and without identities, reading a
run's record, running a loop in a thread, and finding a call's process on this host.

Every daemon here runs its commands in the `process` sandbox, so the tests see the
commands' processes (and their working directory) in /proc.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from execgate.client import Call, Client, Outcome, RunDetail, RunNotFound
from execgate.client.loop.record import turn_json
from execgate.client.loop.states import Machine, State, Transition
from execgate.client.models.base import ToolCall, Turn, Usage
from execgate.client.runs import StepResult
from tests.auth_support import Who, write_identities
from tests.daemon import Daemon

T = TypeVar("T")

TOKENS = {name: f"{name}-" + name[0] * 40 for name in ("bot", "bob", "alice", "olga", "root")}
# bot and bob run loops; alice approves; olga operates; root administers.
PEOPLE = [
    Who("bot", ("agent",), token=TOKENS["bot"]),
    Who("bob", ("agent",), token=TOKENS["bob"]),
    Who("alice", ("approver",), token=TOKENS["alice"]),
    Who("olga", ("operator",), token=TOKENS["olga"]),
    Who("root", ("admin",), token=TOKENS["root"]),
]

# Files are free; `sleep` and `sh -c` scripts run; `touch` and `tee` wait for an approver;
# any other command is denied (the default).
ASK_POLICY = """\
version: 1
default: deny
rules:
  - id: files
    effect: allow
    tools: [read_file, write_file, list_dir]
    reason: files are fine
  - id: commands
    effect: allow
    tools: [run_command]
    argv_prefix: [[sleep], [sh, -c]]
    reason: sleeping and small scripts are harmless
  - id: touches
    effect: ask
    tools: [run_command]
    argv_prefix: [[touch], [tee]]
    approvers: [approver]
    ttl: 60
    reason: touching needs a human
"""


def start_daemon(root: Path, *extra: str) -> Daemon:
    """A daemon without identities (every caller is `local`), commands in `process`."""
    root.mkdir(parents=True, exist_ok=True)
    return Daemon(root, "--sandbox", "process", *extra).start()


def start_auth_daemon(root: Path, policy: str | None = None) -> Daemon:
    """A daemon that knows PEOPLE by their TOKENS; `policy` (YAML text) if given."""
    root.mkdir(parents=True, exist_ok=True)
    args = ["--identities", str(write_identities(root / "identities.yaml", PEOPLE))]
    if policy is not None:
        (root / "policy.yaml").write_text(policy)
        args += ["--policy", str(root / "policy.yaml")]
    home = root / "daemon"
    home.mkdir(exist_ok=True)
    return start_daemon(home, *args)


def stop(daemon: Daemon) -> None:
    if daemon.proc is not None and daemon.proc.poll() is None:
        daemon.stop()


def as_(daemon: Daemon, who: str) -> Client:
    return Client(daemon.address, token=TOKENS[who])


# ---------------------------------------------------------------- a loop step by hand


def sh(script: str) -> dict[str, Any]:
    return {"argv": ["sh", "-c", script]}


def counting(run_id: str, counter: str, call_id: str = "s1c1", then: str = "") -> Call:
    """A command that appends a line to `counter`: the call as a loop sends it."""
    return Call(
        tool="run_command",
        arguments=sh(f"echo {call_id} >> {counter}{'; ' + then if then else ''}"),
        call_id=call_id,
        idempotency_key=f"{run_id}:{call_id}",
    )


def opening(
    client: Client, run_id: str, calls: list[Call], workspace: str = ""
) -> tuple[Machine, list[Transition]]:
    """A started run at requesting_model, and a step's opening as a loop makes it."""
    client.runs.start("a goal", run_id=run_id, workspace=workspace)
    m = Machine(run_id)
    client.runs.append(run_id, [m.advance(State.REQUESTING_MODEL, "run started")])
    return m, step_opening(m, calls)


def step_opening(m: Machine, calls: list[Call]) -> list[Transition]:
    """The opening of a step of `calls`, the run's machine at requesting_model."""
    proposed = tuple(ToolCall(f"m{i}", c.tool, c.arguments) for i, c in enumerate(calls))
    turn = Turn("", proposed, Usage(), "tool_calls")
    planned = [
        {"call_id": c.call_id, "index": i, "model_id": f"m{i}", "tool": c.tool,
         "arguments": c.arguments}
        for i, c in enumerate(calls)
    ]  # fmt: skip
    return [
        m.advance(State.VALIDATING, "model replied", turn_json(turn)),
        m.advance(State.RUNNING_TOOLS, f"{len(calls)} call(s) sent", {"calls": planned}),
    ]


def the_end(result: StepResult) -> Transition:
    *_, last = result.events
    assert (last.from_state, last.to_state, last.reason) == (
        State.RUNNING_TOOLS,
        State.REQUESTING_MODEL,
        "batch finished",
    )
    return last


# ---------------------------------------------------------------- a run's record


def edges(events: Sequence[Transition]) -> list[tuple[str, str]]:
    return [(e.from_state.value, e.to_state.value) for e in events]


def assert_continuous(run_id: str, events: Sequence[Transition]) -> Machine:
    """seq 1..n without a gap or a repeat, and every move legal from the one before."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), [e.seq for e in events]
    return Machine.replay(run_id, events)


def terminal(detail: RunDetail) -> Transition:
    """The run's last event, which must be its (only) terminal one."""
    last = detail.events[-1]
    assert detail.run.terminal, detail.run
    assert last.to_state is detail.run.state
    assert sum(1 for e in detail.events if e.to_state in _TERMINAL) == 1
    return last


_TERMINAL = frozenset(
    {
        State.COMPLETED,
        State.FAILED,
        State.CANCELLED,
        State.BUDGET_EXHAUSTED,
        State.EXPIRED,
        State.ESCALATED,
    }
)


def state_of(client: Client, run_id: str) -> State | None:
    """The run's state, or None while it does not exist yet (its loop is starting)."""
    try:
        return client.runs.get(run_id).run.state
    except RunNotFound:
        return None


def outcome_of(detail: RunDetail, call_id: str) -> Outcome:
    [record] = [c for c in detail.calls if c.call_id == call_id]
    assert record.outcome is not None, f"{call_id} has no outcome yet"
    return record.outcome


def interval(outcome: Outcome) -> tuple[float, float]:
    """When the call ran: its `started` to its `finished` mark."""
    started, finished = outcome.mark("started"), outcome.mark("finished")
    assert started is not None, outcome.timeline
    assert finished is not None, outcome.timeline
    return started.at, finished.at


# ---------------------------------------------------------------- threads and processes


class Background(Generic[T]):
    """`fn()` in a daemon thread; `result()` joins it and returns (or re-raises) its end."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # handed to the test thread by result()
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 15.0) -> T:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still running after {timeout}s"
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


def processes(argv: Sequence[str], cwd: Path) -> list[int]:
    """Pids of live processes on this host running exactly `argv` in directory `cwd`."""
    want = b"\x00".join(a.encode() for a in argv) + b"\x00"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes() != want:
                continue
            if Path(entry / "cwd").resolve() != cwd.resolve():
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
