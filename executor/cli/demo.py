"""`execgate demo`: a scripted agent against a real daemon, narrated.

It starts a private daemon (temporary workspace and journal, a demo policy and two
identities: an agent and an approver) unless --addr names one, then runs a
scripted model through the client `Loop`. The transcript shows, from the
daemon's own events: two reads running together, two writes to one file taking
turns, a call parked for a human's approval (approved by the second identity),
a command that ignores SIGTERM force-terminated after its grace period, and the
run's terminal state with its reason.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from execgate.client import Client, Event, EventKind, Loop
from execgate.client.loop.states import Transition
from execgate.client.models import ScriptedModel, Turn
from execgate.executor.policy.identity import hash_token, new_token

from . import demo_checks

POLICY = """\
version: 1
default: deny
rules:
  - id: demo-files
    effect: allow
    tools: [read_file, list_dir]
    reason: the demo reads its workspace
  - id: demo-commands
    effect: allow
    tools: [run_command]
    argv_prefix: [[sh, -c]]
    reason: the demo's shell commands
  - id: publish-needs-a-human
    effect: ask
    tools: [run_command]
    argv_prefix: [[touch, published.txt]]
    approvers: [approver]
    ttl: 120
    reason: publishing needs a human's yes
limits:
  - tools: [run_command]
    timeout_s: 1.5
    grace_s: 0.5
"""
APPEND = "echo {0} >> notes.txt; sleep 0.3"
STUBBORN = "trap '' TERM; echo ignoring SIGTERM; sleep 30"


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run a scripted agent against a daemon, narrated")
    p.add_argument("--addr", default=None, help="use this daemon (default: start a private one)")
    p.add_argument("--token", default=None, help="the agent's token for --addr")
    p.add_argument(
        "--approver-token", default=None, help="an approver's token for --addr (default: none)"
    )
    p.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="the private daemon's journal, workspace, policy and identities go in DIR and "
        "stay there, so the run can be traced afterwards (default: a temporary directory)",
    )
    p.add_argument(
        "--print-policy",
        action="store_true",
        help="print the demo's policy (for a daemon that --addr names) and stop",
    )
    p.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    if args.print_policy:
        print(POLICY, end="")
        return 0
    if args.keep is not None and args.addr is not None:
        raise SystemExit("execgate demo: --keep is for the private daemon; not with --addr")
    with _daemon(args) as (address, agent_token, approver_token):
        story = Story()
        with Client(address, token=agent_token) as client:
            if args.addr is not None and (gaps := demo_checks.missing_rules(client, _steps())):
                print(demo_checks.explain_gaps(address, gaps), file=sys.stderr)
                return 1
            approver = _approver(address, approver_token, story)
            loop = Loop(
                client,
                _script(),
                on_transition=story.transition,
                on_event=story.event,
                limits={"max_steps": 10},
            )
            result = loop.run("show what execgate does with an agent's calls")
            story.say(f"run {result.run_id} ended {result.state.value}: {result.reason}")
            if approver is not None:
                approver.join(timeout=1)
    if args.keep is not None:
        print(demo_checks.how_to_trace(args.keep.resolve(), result.run_id))
    return 0 if result.completed else 1


def _script() -> ScriptedModel:
    return ScriptedModel(_steps())


def _steps() -> list[Turn]:
    return [
        ScriptedModel.calls(("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"})),
        ScriptedModel.calls(
            ("run_command", {"argv": ["sh", "-c", APPEND.format("first")]}),
            ("run_command", {"argv": ["sh", "-c", APPEND.format("second")]}),
        ),
        ScriptedModel.calls(("run_command", {"argv": ["touch", "published.txt"]})),
        ScriptedModel.calls(("run_command", {"argv": ["sh", "-c", STUBBORN]})),
        ScriptedModel.answer("read both files, wrote notes twice, published, and learned"),
    ]


class Story:
    """The transcript: one line per transition and per call event, seconds since start."""

    def __init__(self) -> None:
        self.start = time.time()
        self._lock = threading.Lock()

    def say(self, text: str, at: float | None = None) -> None:
        with self._lock:
            print(f"{(at or time.time()) - self.start:7.3f}  {text}", flush=True)

    def transition(self, t: Transition) -> None:
        self.say(f"[run] {t.from_state.value} -> {t.to_state.value}: {t.reason}", t.at)

    def event(self, e: Event) -> None:
        what = {
            EventKind.QUEUED: "queued",
            EventKind.STARTED: "started",
            EventKind.WAITING: f"waits its turn behind {', '.join(e.blocked_by)}",
            EventKind.AWAITING_APPROVAL: f"awaiting approval {e.approval_id} ({e.reason})",
        }.get(e.kind)
        if e.kind is EventKind.FINISHED and e.outcome is not None:
            o = e.outcome
            what = f"finished {o.status.value}/{o.error_class}"
            if o.stopped_how.value not in ("completed", "unspecified", "not_started"):
                what += f", {o.stopped_how.value}" + _ladder(o.timeline)
        self.say(f"      call {e.call_id} {what}", e.at)


def _ladder(timeline: tuple[object, ...]) -> str:
    """signal -> force -> stopped, as offsets from the signal."""
    marks = {getattr(m, "phase", ""): getattr(m, "at", 0.0) for m in timeline}
    sent = marks.get("signal_sent")
    if sent is None:
        return ""
    steps = [
        f"{p} +{marks[p] - sent:.3f}s"
        for p in ("grace_expired", "force_terminated", "stopped")
        if p in marks
    ]
    return " (signal sent; " + ", ".join(steps) + ")"


def _approver(address: str, token: str | None, story: Story) -> threading.Thread | None:
    """A second identity that approves the first approval it sees."""
    if token is None:
        return None

    def decide() -> None:
        with Client(address, token=token) as human:
            for approval in human.watch_approvals():
                if approval.state.value == "pending":
                    story.say(f"      approver sees {approval.approval_id}: {approval.reason}")
                    human.approve(approval.approval_id, "looks fine")
                    story.say(f"      approver approved {approval.approval_id}")
                    return

    thread = threading.Thread(target=decide, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def _daemon(args: argparse.Namespace) -> Iterator[tuple[str, str | None, str | None]]:
    if args.addr is not None:
        yield args.addr, args.token, args.approver_token
        return
    with _root(args.keep) as root:
        agent, approver, operator = new_token(), new_token(), new_token()
        (root / "identities.yaml").write_text(_identities(agent, approver, operator))
        token = root / "operator.token"
        token.touch(mode=0o600)
        token.write_text(operator + "\n")
        (root / "policy.yaml").write_text(POLICY)
        workspace = root / "workspace"
        workspace.mkdir(exist_ok=True)
        (workspace / "a.txt").write_text("alpha\n")
        (workspace / "b.txt").write_text("beta\n")
        proc = _serve(root, workspace)
        try:
            yield f"unix:{root / 'state' / 'execgate.sock'}", agent, approver
        finally:
            proc.terminate()
            proc.wait(30)


@contextlib.contextmanager
def _root(keep: Path | None) -> Iterator[Path]:
    """`keep` (made if missing), or a temporary directory removed afterwards."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="execgate-demo-") as tmp:
        yield Path(tmp)


def _identities(agent: str, approver: str, operator: str) -> str:
    return (
        "version: 1\nidentities:\n"
        f"  - {{name: demo-agent, roles: [agent], token_sha256: {hash_token(agent)}}}\n"
        f"  - {{name: demo-approver, roles: [approver], token_sha256: {hash_token(approver)}}}\n"
        f"  - {{name: demo-operator, roles: [operator], token_sha256: {hash_token(operator)}}}\n"
    )


def _serve(root: Path, workspace: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "execgate.executor.cli", "serve",
        "--workspace", str(workspace), "--state-dir", str(root / "state"),
        "--policy", str(root / "policy.yaml"), "--identities", str(root / "identities.yaml"),
    ]  # fmt: skip
    log = (root / "daemon.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    socket = root / "state" / "execgate.sock"
    deadline = time.monotonic() + 30
    while not socket.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("execgate demo: the daemon did not start:\n" + _tail(root))
        time.sleep(0.05)
    return proc


def _tail(root: Path) -> str:
    return (root / "daemon.log").read_text(errors="replace")[-2000:]
