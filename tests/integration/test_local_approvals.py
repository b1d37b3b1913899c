"""Approvals out of the box: the daemon `make run` starts, and the README's walkthrough.

The daemon is started with the Makefile's own RUN_ARGS (`--local-identities`: an `agent`
and an `operator` made once under the state directory), and the README's walkthrough
commands are read from the README and run as written, through the real CLI in
subprocesses: the agent's call waits, `calls show` says for which approval, the operator
lists and approves it, and the call runs. The agent can never approve its own call; an
undecided call expires REJECTED `approval_expired`, visibly to its caller.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import CallNotFound, Client, Status, Unauthenticated
from tests.daemon import Daemon
from tests.support import wait_until

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "execgate.executor.cli"]


def run_args(policy: Path | None = None) -> list[str]:
    """The Makefile's RUN_ARGS, the policy path made absolute (or replaced)."""
    [line] = [
        ln for ln in (REPO / "Makefile").read_text().splitlines() if ln.startswith("RUN_ARGS")
    ]
    args = shlex.split(line.split(":=", 1)[1])
    i = args.index("--policy")
    args[i + 1] = str(policy or REPO / args[i + 1])
    assert "--local-identities" in args
    return args


def walkthrough() -> list[str]:
    """The shell lines of the README's approval walkthrough, comments stripped."""
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- approval-walkthrough -->", 1)[1].split("<!-- /approval-", 1)[0]
    lines = []
    for fence in re.findall(r"```sh\n(.*?)```", block, re.S):
        for ln in filter(str.strip, fence.splitlines()):
            words = shlex.split(ln, comments=True)
            lines.append(shlex.join(words) if words[0] == "execgate" else ln.strip())
    return lines


def execgate(line: str, root: Path, sock: Path, **kw: object) -> subprocess.Popen[str]:
    """Run one README line (`execgate …` through this interpreter) from the root `make
    run` works in, as a user would: no token given, the CLI finds its own."""
    argv = shlex.split(line)
    assert argv[0] == "execgate", line
    env = {k: v for k, v in os.environ.items() if k != "EXECGATE_TOKEN"}
    env |= {"EXECGATE_ADDR": f"unix:{sock}", "COLUMNS": "80"}  # a terminal's width
    return subprocess.Popen(
        [*CLI, *argv[1:]], cwd=root, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw,  # type: ignore[call-overload]
    )  # fmt: skip


def done(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def shell(line: str, root: Path) -> None:
    subprocess.run(line, shell=True, cwd=root, check=True, timeout=30)


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Daemon]:
    daemon = Daemon(tmp_path, *run_args()).start()
    try:
        yield daemon
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()


def test_the_walkthrough_lines_are_found() -> None:
    lines = walkthrough()
    assert [ln.split()[:3] for ln in lines if ln.startswith("execgate")] == [
        ["execgate", "call", "run_command"],
        ["execgate", "calls", "show"],
        ["execgate", "approvals", "list"],
        ["execgate", "approvals", "approve"],
    ]


def test_local_identities_are_made_once_owner_only(made: Daemon) -> None:
    state = made.state_dir
    files = [
        state / "identities.yaml",
        state / "tokens/agent.token",
        state / "tokens/operator.token",
    ]
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert stat.S_IMODE((state / "tokens").stat().st_mode) == 0o700
    before = [f.read_text() for f in files]
    made.stop()
    made.restart()
    assert [f.read_text() for f in files] == before  # made once, kept


def test_a_client_with_no_token_is_the_agent(made: Daemon) -> None:
    # The README's Python example under `make run`: no token given, none in the
    # environment; the client uses the agent token beside the socket.
    env_token = os.environ.pop("EXECGATE_TOKEN", None)
    try:
        with Client(made.address) as eg:
            out = eg.execute_one("noop")
            assert out.status is Status.SUCCESS, out
            assert eg.get_call(out.call_id).agent == "agent"
        with Client(made.address, token="") as nobody, pytest.raises(Unauthenticated):
            nobody.list_tools()  # an explicit "" is no token: refused
    finally:
        if env_token is not None:
            os.environ["EXECGATE_TOKEN"] = env_token


def test_readme_walkthrough_ask_list_approve_runs(made: Daemon) -> None:
    root, sock = made.root, made.socket
    lines = walkthrough()
    shell(lines[0], root)
    target = made.workspace / "notes" / "a.txt"
    assert target.read_text() == "draft\n"
    call = execgate(lines[1], root, sock)
    with Client(made.address, token=(made.state_dir / "tokens/operator.token").read_text()) as op:
        wait_until(lambda: op.approvals_pending(), "the call parked for approval")
        [pending] = op.approvals_pending()
    assert (pending.requester, pending.tool, pending.rule_id) == (
        "agent",
        "run_command",
        "ask-before-rm",
    )

    code, out, err = done(execgate(lines[2], root, sock))  # calls show rm-1
    assert code == 0, err
    assert f"state: waiting for approval {pending.approval_id}" in out, out
    code, out, err = done(execgate(lines[3], root, sock))  # approvals list
    assert code == 0, err
    assert pending.approval_id in out, out
    assert "agent" in out, out

    # The agent may not approve its own call: its token is refused, the call still waits.
    agent = (made.state_dir / "tokens/agent.token").read_text().strip()
    approve = lines[4].replace("<approval-id>", pending.approval_id)
    code, out, err = done(execgate(f"{approve} --token {agent}", root, sock))
    assert code != 0
    assert "agent (roles: agent) may not call Decide" in err, out + err
    assert call.poll() is None
    assert target.exists()

    code, out, err = done(execgate(approve, root, sock))
    assert code == 0, err
    assert f"APPROVED {pending.approval_id} by operator" in out, out
    code, out, err = done(call)
    assert code == 0, (out, err)
    assert out.startswith("SUCCESS"), out
    assert not target.exists()
    code, out, _ = done(execgate("execgate calls show rm-1 --json", root, sock))
    record = json.loads(out)
    assert (record["agent"], record["outcome"]["status"]) == ("agent", "success"), record
    assert record["policy"]["rule_ids"] == ["ask-before-rm"]


def test_an_undecided_call_is_visible_then_expires_rejected(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    text = (REPO / "policies/default.yaml").read_text()
    assert "    ttl: 600\n" in text
    policy.write_text(text.replace("    ttl: 600\n", "    ttl: 2\n"))
    daemon = Daemon(tmp_path, *run_args(policy)).start()
    try:
        (daemon.workspace / "x").write_text("x\n")
        call = execgate(
            """execgate call run_command --arg 'argv=["rm","x"]' --call-id rm-2""",
            tmp_path, daemon.socket,
        )  # fmt: skip
        agent = (daemon.state_dir / "tokens/agent.token").read_text()
        with Client(daemon.address, token=agent) as client:

            def parked() -> bool:
                try:
                    return bool(client.get_call("rm-2").awaiting_approval)
                except CallNotFound:  # not yet arrived
                    return False

            wait_until(parked, "the caller sees the wait")
            record = client.get_call("rm-2")
            approval_id = record.awaiting_approval
            assert approval_id.startswith("appr_"), record
            assert record.outcome is None
            assert record.agent == "agent"
            assert record.may_write  # run_command may change the workspace
            assert record.approvers == ("approver",)
            assert record.approval_expires_at is not None
            assert record.approval_expires_at > record.created_at
            code, out, err = done(call)
            assert code == 1, (out, err)
            assert out.startswith("REJECTED approval_expired"), out
            record = client.get_call("rm-2")
        assert not record.awaiting_approval
        assert record.outcome is not None
        assert (record.outcome.status, record.outcome.error_class) == (
            Status.REJECTED, "approval_expired",
        )  # fmt: skip
        assert f"nobody decided within the rule's ttl (approval {approval_id}" in (
            record.outcome.message
        )
        assert (daemon.workspace / "x").exists()
    finally:
        daemon.stop()
