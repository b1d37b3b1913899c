"""`execgate mcp` under MCP clients nobody here wrote, each launching it over stdio against
a real daemon: the TypeScript SDK's `Client` (@modelcontextprotocol/sdk, driven line by
line through tests/fixtures/mcp/bridge_client.cjs, which only relays) and the MCP
Inspector's CLI mode (@modelcontextprotocol/inspector `--cli`). Both come from
`make test-deps` (tests/fixtures/mcp/npm's lockfile)."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execgate.client import CallRecord, Client, Status, StopMode
from tests import bridge_support as bs
from tests import mcp_support as ms
from tests.daemon import Daemon, scaled
from tests.support import wait_until

pytestmark = pytest.mark.timeout(240)

KEY = "execgate/idempotencyKey"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    if not bs.TS_SDK.exists() or not bs.INSPECTOR_CLI.exists():
        pytest.fail(f"the npm MCP clients are missing under {ms.NPM}: make test-deps")
    tag = ms.new_tag()
    d = bs.bridge_daemon(tmp_path_factory.mktemp("bridge-clients"), tag).start(timeout=60)
    yield d
    d.stop()
    ms.wait_for(lambda: ms.tagged(tag) == [], 10, "every MCP server gone with the daemon")


@pytest.fixture
def operator(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.address, token=bs.token(daemon, "operator")) as c:
        yield c


# ---------------------------------------------------------------- the TypeScript SDK


class TsClient:
    """The relay around the TypeScript SDK's client: commands in, its events out."""

    def __init__(self, daemon: Daemon, log: Path, *bridge_args: str) -> None:
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                ["node", str(bs.TS_CLIENT), bs.EXECGATE, "mcp", *bridge_args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env={**os.environ, "EXECGATE_MCP_NPM": str(ms.NPM), **bs.bridge_env(daemon)},
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        connected = self.next()
        assert connected.get("op") == "connected", connected
        self.server = connected["server"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._events.put(json.loads(line))

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def next(self, seconds: float = 30) -> dict[str, Any]:
        try:
            return self._events.get(timeout=scaled(seconds))
        except queue.Empty:
            raise AssertionError(f"no event within {scaled(seconds):.0f}s: {self.log()}") from None

    def call(self, tag: str, name: str, **fields: Any) -> dict[str, Any]:
        """Send a call and return its ending event (result or error)."""
        self.send(op="call", tag=tag, name=name, **fields)
        while "result" not in (event := self.next()) and "error" not in event:
            pass
        assert event["tag"] == tag, event
        return event

    def log(self) -> str:
        return self._log.read_text()

    def close(self) -> None:
        """Close the client (it waits for its calls, closes the bridge) and wait for it."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.send(op="close")
        self.proc.stdin.close()
        self.proc.wait(scaled(30))
        self._reader.join(scaled(10))
        self.proc.stdout.close()
        assert self.proc.returncode == 0, self.log()


@pytest.fixture
def ts(daemon: Daemon, tmp_path: Path) -> Iterator[TsClient]:
    client = TsClient(daemon, tmp_path / "ts.log", "--run-id", f"ts-{tmp_path.name}")
    yield client
    client.close()


def _text(result: dict[str, Any]) -> str:
    return "\n".join(c["text"] for c in result["content"] if c["type"] == "text")


def test_ts_tools_list_and_annotations(ts: TsClient) -> None:
    assert ts.server["name"] == "execgate"
    ts.send(op="list")
    tools = {t["name"]: t for t in ts.next()["tools"]}
    assert tools["read_file"]["annotations"] == {"readOnlyHint": True}
    assert tools["write_file"]["annotations"] == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": True,
    }
    assert tools["faulty.echo"]["annotations"] == {"readOnlyHint": False}
    assert tools["echo_hi"]["annotations"] == {"readOnlyHint": True}
    assert "path" in tools["read_file"]["inputSchema"]["properties"]


def test_ts_success_failure_and_deny(ts: TsClient) -> None:
    ok = ts.call("ok", "read_file", arguments={"path": "hello.txt"})["result"]
    assert (ok.get("isError", False), _text(ok)) == (False, "hello from the workspace\n")
    assert ok["structuredContent"]["status"] == "SUCCESS"
    failed = ts.call("failed", "read_file", arguments={"path": "missing.txt"})["result"]
    assert failed["isError"] is True
    assert _text(failed).startswith("execgate: FAILURE (not_found)")
    denied = ts.call("denied", "read_file", arguments={"path": "secret.txt"})["result"]
    assert denied["isError"] is True
    assert "REJECTED (policy_denied): denied by policy (no-secrets)" in _text(denied)


def test_ts_approval_wait_is_progress(ts: TsClient, operator: Client, daemon: Daemon) -> None:
    ts.send(
        op="call",
        tag="ask",
        name="run_command",
        arguments={"argv": ["touch", "ts-approved.txt"]},
        progress=True,
    )
    first = ts.next()
    assert first["tag"] == "ask", first
    message = first["progress"]["message"]
    m = re.match(r"waiting for approval (\S+) by an operator", message)
    assert m, first
    assert first["progress"]["progress"] == 1
    operator.approve(m.group(1), "yes")
    while "result" not in (event := ts.next()):
        assert "progress" in event, event
    assert event["result"].get("isError", False) is False, event
    assert (daemon.workspace / "ts-approved.txt").exists()


def _running(operator: Client, run_id: str) -> CallRecord | None:
    return next((c for c in operator.list_calls(run_id=run_id) if c.running), None)


def test_ts_abort_cancels_the_call_and_its_key_replays(
    daemon: Daemon, operator: Client, tmp_path: Path
) -> None:
    run_id = "ts-cancel"
    client = TsClient(daemon, tmp_path / "ts.log", "--run-id", run_id)
    argv = ["sh", "-c", "echo ran >> ts-cancelled.txt; sleep 60"]
    try:
        client.send(
            op="call",
            tag="long",
            name="run_command",
            arguments={"argv": argv},
            meta={KEY: "ts-cancel-1"},
        )
        wait_until(lambda: _running(operator, run_id), "the call running", scaled(30))
        # "running" in the journal is the intent; the command's first line is the proof
        # that it started (else a busy machine aborts it before it writes).
        marker = daemon.workspace / "ts-cancelled.txt"
        wait_until(marker.exists, "the command started", scaled(30))
        client.send(op="abort", tag="long")
        aborted = client.next()
        assert aborted["tag"] == "long", aborted
        assert "error" in aborted, aborted

        def ended() -> CallRecord | None:
            [call] = operator.list_calls(run_id=run_id)
            return call if call.outcome is not None else None

        wait_until(ended, "the aborted call's outcome", scaled(30))
        record = ended()
        assert record is not None
        assert record.outcome is not None
        outcome = record.outcome
        assert (outcome.status, outcome.error_class) == (Status.UNKNOWN_OUTCOME, "cancelled")
        assert outcome.stopped_how is StopMode.COOPERATIVE
        asked = outcome.mark("cancel_requested")
        assert asked is not None
        assert "cancelled by the MCP client" in asked.detail
        again = client.call(
            "again", "run_command", arguments={"argv": argv}, meta={KEY: "ts-cancel-1"}
        )["result"]
    finally:
        client.close()
    assert again["isError"] is True
    assert _text(again).startswith("execgate: UNKNOWN_OUTCOME (cancelled)")
    assert "reconcile before retrying" in _text(again)
    assert again["structuredContent"]["replay_of"] == record.call_id
    assert (daemon.workspace / "ts-cancelled.txt").read_text() == "ran\n"


# ---------------------------------------------------------------- the Inspector's CLI


def inspector(daemon: Daemon, tmp_path: Path, *method: str) -> tuple[int, Any, str]:
    """`mcp-inspector --cli -e EXECGATE_ADDR=… execgate mcp METHOD…`: exit status, the
    JSON it printed, its stderr."""
    ran = subprocess.run(
        [
            str(bs.INSPECTOR_CLI),
            "--cli",
            "-e",
            f"EXECGATE_ADDR={daemon.address}",
            bs.EXECGATE,
            "mcp",
            *method,
        ],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        # Its catalog of servers is kept out of $HOME.
        env={**os.environ, "MCP_CATALOG_PATH": str(tmp_path / "catalog.json")},
    )
    try:
        printed = json.loads(ran.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON ({ran.returncode}): {ran.stdout}\n{ran.stderr}") from None
    return ran.returncode, printed, ran.stderr


def test_inspector_tools_list(daemon: Daemon, tmp_path: Path) -> None:
    code, printed, err = inspector(daemon, tmp_path, "--method", "tools/list")
    assert code == 0, err
    tools = {t["name"]: t for t in printed["tools"]}
    assert tools["read_file"]["annotations"] == {"readOnlyHint": True}
    assert tools["run_command"]["annotations"] == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
    }
    assert tools["faulty.echo"]["_meta"]["execgate/provider"] == "mcp:faulty"


def test_inspector_tools_call_success_and_deny(daemon: Daemon, tmp_path: Path) -> None:
    call = ("--method", "tools/call", "--tool-name", "read_file", "--tool-arg")
    code, printed, err = inspector(daemon, tmp_path, *call, "path=hello.txt")
    assert code == 0, err
    assert printed["content"] == [{"type": "text", "text": "hello from the workspace\n"}]
    assert printed["structuredContent"]["status"] == "SUCCESS"
    code, printed, err = inspector(daemon, tmp_path, *call, "path=secret.txt")
    assert code != 0  # the Inspector's own exit status for isError
    assert printed["isError"] is True
    assert "denied by policy (no-secrets)" in printed["content"][0]["text"]


def test_inspector_retries_with_a_key_run_once(daemon: Daemon, tmp_path: Path) -> None:
    """Two Inspector processes (two sessions, request ids both starting over) with one
    `_meta` key: the command runs once."""
    call = (
        "--method",
        "tools/call",
        "--tool-name",
        "run_command",
        "--tool-arg",
        'argv=["sh","-c","echo once >> inspector-once.txt"]',
        "--tool-metadata",
        f"{KEY}=inspector-1",
    )
    first = inspector(daemon, tmp_path, *call)
    second = inspector(daemon, tmp_path, *call)
    assert (first[0], second[0]) == (0, 0), (first[2], second[2])
    call_id = first[1]["structuredContent"]["call_id"]
    assert second[1]["structuredContent"]["replay_of"] == call_id
    assert second[1]["structuredContent"]["call_id"] != call_id
    assert (daemon.workspace / "inspector-once.txt").read_text() == "once\n"
