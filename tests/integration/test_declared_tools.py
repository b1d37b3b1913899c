"""Declared command tools through a real daemon and the real bwrap sandbox: listed with
their provider, scheduled by their declared effects, confined by them, secrets kept out
of the journal, the log and the result, hot reload that fails closed, policy on them."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from execgate.client import Call, Client, EventKind, Outcome, Status
from execgate.executor.policy import default_policy_path
from tests.auth_support import write_identities
from tests.daemon import Daemon, scaled
from tests.loop_support import PEOPLE, TOKENS
from tests.support import wait_until

REPO = Path(__file__).resolve().parents[2]
SECRET = "tok-" + uuid.uuid4().hex
PY = sys.executable if sys.executable.startswith("/usr/") else "python3"
SLEEP = "import time; time.sleep(1.0)"
APPEND = "import sys, time; time.sleep(0.3); open(sys.argv[1], 'a').write(sys.argv[2])"
WAIT_FOR_GO = (
    "import os, sys, time\nwhile not os.path.exists('go'): time.sleep(0.02)\nprint(sys.argv[1])"
)


def command(
    name: str, argv: list[str], props: dict[str, Any] | None = None, **more: Any
) -> dict[str, Any]:
    schema = {"type": "object", "properties": props or {}, "additionalProperties": False}
    return {
        "name": name,
        "description": f"{name} (test)",
        "input_schema": schema,
        "argv": argv,
        **more,
    }


STR = {"type": "string"}
TOOLS: list[dict[str, Any]] = [
    command("nap_read", [PY, "-c", SLEEP], effects={"reads": ["."]}),
    command("nap_write", [PY, "-c", SLEEP]),
    command(
        "append",
        [PY, "-c", APPEND, "{path}", "{tag}"],
        {"path": STR, "tag": STR},
        effects={"writes": ["{path}"]},
    ),
    command(
        "try_write", [PY, "-c", "open('forbidden.txt', 'w').write('x')"], effects={"reads": ["."]}
    ),
    command(
        "leak",
        [
            PY,
            "-c",
            "import os, sys; t = os.environ['TOKEN']; print('out', t); "
            "print('err', t, file=sys.stderr)",
        ],
        env={"secrets": {"TOKEN": "EG_TEST_SECRET"}},
        effects={},
    ),
    command("danger", [PY, "-c", "print(1)"], effects={}),
    command("careful", [PY, "-c", "print(1)"], effects={}),
    command("slow", [PY, "-c", WAIT_FOR_GO, "v1"]),
    command(
        "ifaces",
        [PY, "-c", "import socket; print([n for _, n in socket.if_nameindex()])"],
        effects={"net": ["example.com"]},
    ),
    command("too_slow", [PY, "-c", "import time; time.sleep(120)"], effects={}, timeout_s=0.5),
]


def tools_text(tools: list[dict[str, Any]]) -> str:
    return yaml.safe_dump({"version": 1, "tools": tools}, sort_keys=False)


def policy_text() -> str:
    doc = yaml.safe_load(default_policy_path().read_text())
    doc["rules"] += [
        {"id": "no-danger", "effect": "deny", "tools": ["danger"], "reason": "test deny"},
        {
            "id": "ask-careful",
            "effect": "ask",
            "tools": ["careful"],
            "approvers": ["approver"],
            "ttl": 1,
        },
        {"id": "declared", "effect": "allow", "tools": ["*"]},
    ]
    return yaml.safe_dump(doc)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Client, Path]]:
    root = tmp_path_factory.mktemp("declared")
    tools, policy = root / "tools.yaml", root / "policy.yaml"
    tools.write_text(tools_text(TOOLS))
    policy.write_text(policy_text())
    (root / "d").mkdir()
    d = Daemon(
        root / "d", "--policy", str(policy), "--tools", str(tools), env={"EG_TEST_SECRET": SECRET}
    ).start()
    try:
        with Client(d.address) as c:
            yield d, c, tools
    finally:
        d.stop()


def at(o: Outcome, phase: str) -> float:
    found = o.mark(phase)
    assert found is not None, (o.call_id, o.status, o.message, o.timeline)
    return found.at


def overlap(a: Outcome, b: Outcome) -> bool:
    return at(a, "started") < at(b, "finished") and at(b, "started") < at(a, "finished")


def run(c: Client, tool: str, **args: Any) -> Outcome:
    return c.run(Call(tool=tool, arguments=args))


def test_declared_tools_are_listed_with_their_provider_and_effects(live: Any) -> None:
    _, c, _ = live
    tools = {t.name: t for t in c.list_tools()}
    assert tools["read_file"].provider == "builtin"
    assert tools["nap_read"].provider == "command"
    assert tools["nap_read"].read_only
    assert not tools["nap_write"].read_only
    assert not tools["append"].read_only
    assert "EG_TEST_SECRET" not in str(tools["leak"])
    assert SECRET not in str(tools["leak"])


def test_a_declared_reader_runs_beside_another_and_an_undeclared_one_does_not(live: Any) -> None:
    _, c, _ = live
    r1, r2 = c.execute([Call(tool="nap_read"), Call(tool="nap_read")])
    assert (r1.status, r2.status) == (Status.SUCCESS, Status.SUCCESS), (r1.message, r2.message)
    assert overlap(r1, r2)
    w1, w2 = c.execute([Call(tool="nap_write"), Call(tool="nap_write")])
    assert not overlap(w1, w2)  # undeclared effects: the whole workspace, one at a time


def test_two_declared_writers_of_one_file_keep_proposal_order(live: Any) -> None:
    d, c, _ = live
    a, b = c.execute(
        [
            Call(tool="append", arguments={"path": "order.txt", "tag": t})
            for t in ("first,", "second")
        ]
    )
    assert (a.status, b.status) == (Status.SUCCESS, Status.SUCCESS), (a.message, b.message)
    assert at(b, "started") >= at(a, "finished")
    assert (d.workspace / "order.txt").read_text() == "first,second"


def test_a_tool_declaring_no_write_gets_a_read_only_workspace(live: Any) -> None:
    d, c, _ = live
    o = run(c, "try_write")
    assert o.status is Status.FAILURE
    # The refused write is told apart from a plain non-zero exit (tools/confine.py).
    assert o.error_class == "permission_denied"
    assert "a write outside the declared paths was refused" in o.message
    assert "may write only nothing (it declared no writes)" in o.message
    assert "Read-only file system" in o.text
    assert not (d.workspace / "forbidden.txt").exists()


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../x"])
def test_an_effect_outside_the_workspace_is_rejected(live: Any, path: str) -> None:
    d, c, _ = live
    o = run(c, "append", path=path, tag="x")
    assert (o.status, o.error_class, o.field) == (
        Status.REJECTED,
        "permission_denied",
        "arguments.path",
    )
    assert not (d.root / "escape.txt").exists()


def test_a_secret_is_in_no_result_journal_or_log_while_the_command_printed_it(live: Any) -> None:
    d, c, _ = live
    o = run(c, "leak")
    assert o.status is Status.SUCCESS, o.message
    assert "out [secret TOKEN]" in o.text
    assert "err [secret TOKEN]" in o.text
    assert SECRET not in o.text + str(o.structured) + o.message
    record = c.get_call(o.call_id, include_raw=True)
    assert "[secret TOKEN]" in record.raw_result
    assert SECRET not in str(record)
    for db in d.state_dir.glob("journal.db*"):
        assert SECRET.encode() not in db.read_bytes(), db
    assert SECRET not in d.log()


def test_policy_deny_and_ask_work_on_declared_tools(live: Any) -> None:
    _, c, _ = live
    denied = run(c, "danger")
    assert (denied.status, denied.error_class) == (Status.REJECTED, "policy_denied")
    events = list(c.stream([Call(tool="careful", call_id="careful-1")], timeout=scaled(30)))
    assert any(e.kind is EventKind.AWAITING_APPROVAL for e in events)
    final = events[-1].outcome
    assert final is not None
    assert (final.status, final.error_class) == (
        Status.REJECTED,
        "approval_expired",
    )


def test_declaring_net_opens_no_network_without_the_policys_sandbox_rule(live: Any) -> None:
    _, c, _ = live
    o = run(c, "ifaces")
    assert o.status is Status.SUCCESS, o.message
    assert o.text.strip() == "['lo']"  # bwrap's own network namespace: loopback only


def test_a_tools_directory_is_watched_file_by_file(tmp_path: Path) -> None:
    tools_d = tmp_path / "tools.d"
    tools_d.mkdir()
    (tools_d / "10-a.yaml").write_text(tools_text([command("from_a", [PY, "-c", "print('a')"])]))
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", "--policy", str(tmp_path / "p.yaml"), "--tools", str(tools_d))
    (tmp_path / "p.yaml").write_text(policy_text())
    d.start()
    try:
        with Client(d.address) as c:
            assert run(c, "from_a").text.strip() == "a"
            save(tools_d / "20-b.yaml", tools_text([command("from_b", [PY, "-c", "print('b')"])]))
            wait_until(lambda: "from_b" in {t.name for t in c.list_tools()}, "b", scaled(20))
            save(tools_d / "30-c.yaml", tools_text([command("from_a", ["ls"])]))
            wait_until(lambda: any(not ok for ok, _ in reloads(d)), "the refusal", scaled(20))
            [(_, message)] = [r for r in reloads(d) if not r[0]]
            assert f"{tools_d / '30-c.yaml'}:3: tool 'from_a': already declared at" in message
            assert run(c, "from_b").text.strip() == "b"  # the last good set stays
    finally:
        d.stop()


def test_a_declared_timeout_is_the_calls_default_and_ceiling(live: Any) -> None:
    _, c, _ = live
    o = c.run(Call(tool="too_slow", timeout=scaled(60)))
    assert (o.status, o.error_class) == (Status.FAILURE, "timeout")
    assert at(o, "finished") - at(o, "started") < scaled(10)


def reloads(d: Daemon) -> list[tuple[int, str]]:
    with sqlite3.connect(f"file:{d.state_dir / 'journal.db'}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT accepted, message FROM policy_events ORDER BY seq").fetchall()


def save(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def test_hot_reload_adds_refuses_and_keeps_calls_in_flight_on_their_definition(live: Any) -> None:
    d, c, tools = live
    (d.workspace / "go").unlink(missing_ok=True)
    stream = iter(
        c.stream([Call(tool="slow", call_id=f"slow-{uuid.uuid4().hex[:6]}")], timeout=scaled(60))
    )
    assert next(e for e in stream if e.kind is EventKind.STARTED)
    v2 = [t for t in TOOLS if t["name"] != "slow"]
    v2 += [command("slow", [PY, "-c", WAIT_FOR_GO, "v2"]), command("fresh", [PY, "-c", "print(2)"])]
    save(tools, tools_text(v2))
    wait_until(lambda: "fresh" in {t.name for t in c.list_tools()}, "the new tool", scaled(20))
    (d.workspace / "go").write_text("")
    [finished] = [e for e in stream if e.kind is EventKind.FINISHED]
    assert finished.outcome is not None
    assert finished.outcome.text.strip() == "v1"
    assert run(c, "slow").text.strip() == "v2"

    broken = tools_text(v2).replace("name: fresh", "name: fresh.x")
    save(tools, broken)
    wait_until(lambda: any(not ok for ok, _ in reloads(d)), "the refusal", scaled(20))
    [(_, message)] = [r for r in reloads(d) if not r[0]]
    assert f"{tools}:" in message
    assert "'fresh.x' is not a name" in message
    assert run(c, "fresh").status is Status.SUCCESS  # the last good set stays
    assert "tools reload refused" in d.log()
    save(tools, tools_text(TOOLS))
    wait_until(lambda: "fresh" not in {t.name for t in c.list_tools()}, "the revert", scaled(20))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", *args],
        capture_output=True, text=True, timeout=scaled(60), env=env,
    )  # fmt: skip


def test_tools_list_shows_the_provider_and_effects(live: Any) -> None:
    d, _, _ = live
    out = cli("tools", "list", "--addr", d.address)
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if " nap_read " in f" {ln} "]
    assert "command" in line
    assert "read-only" in line
    [line] = [ln for ln in out.stdout.splitlines() if " read_file " in f" {ln} "]
    assert "builtin" in line


def test_tools_check_names_every_error_and_summarises_a_good_file(tmp_path: Path) -> None:
    good = cli("tools", "check", str(REPO / "tools" / "examples.yaml"))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "command tool(s)" in good.stdout
    assert "git_log" in good.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(tools_text([command("x.y", ["ls"]), command("ok", ["ls", "{nope}"])]))
    out = cli("tools", "check", str(bad))
    assert out.returncode == 1
    fails = [ln for ln in out.stdout.splitlines() if ln.startswith("FAIL")]
    assert len(fails) == 2
    assert all(f"FAIL {bad}:" in ln for ln in fails)
    assert "{nope} is not a property" in fails[1]


def test_an_invalid_tools_file_refuses_to_start_with_the_located_error(tmp_path: Path) -> None:
    tools = tmp_path / "tools.yaml"
    tools.write_text(tools_text([command("read_file", ["ls"])]))
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", "--tools", str(tools))
    with pytest.raises(Exception, match="a built-in tool has this name"):
        d.start()
    assert f"{tools}:3: tool 'read_file'" in d.log()


def test_an_approved_call_of_a_declared_tool_runs_and_writes(tmp_path: Path) -> None:
    """`ask` on a declared tool that may write (its effects undeclared): the approver's
    word lets it run, exactly as for run_command."""
    stamp = command("stamp", [PY, "-c", "open('stamped.txt', 'w').write('yes')"])
    (tmp_path / "tools.yaml").write_text(tools_text([stamp]))
    policy = yaml.safe_load(default_policy_path().read_text())
    policy["rules"].insert(
        0,
        {"id": "ask-stamp", "effect": "ask", "tools": ["stamp"], "approvers": ["approver"]},
    )
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy, sort_keys=False))
    identities = write_identities(tmp_path / "identities.yaml", PEOPLE)
    (tmp_path / "d").mkdir()
    d = Daemon(
        tmp_path / "d",
        *("--policy", str(tmp_path / "policy.yaml"), "--identities", str(identities)),
        *("--tools", str(tmp_path / "tools.yaml")),
    ).start()
    try:
        bot = Client(d.address, token=TOKENS["bot"])
        alice = Client(d.address, token=TOKENS["alice"])
        stream = bot.stream([Call(tool="stamp", call_id="stamp-1")], timeout=scaled(60))
        parked = next(e for e in stream if e.kind is EventKind.AWAITING_APPROVAL)
        assert alice.approve(parked.approval_id, "fine").state.value == "approved"
        final = [e for e in stream if e.kind is EventKind.FINISHED][-1].outcome
        assert final is not None
        assert final.status is Status.SUCCESS, (final.error_class, final.message)
        assert (d.workspace / "stamped.txt").read_text() == "yes"
        bot.close()
        alice.close()
    finally:
        d.stop()
