"""The MCP bridge's mappings, on values alone: call ids and keys, tool hints, outcomes as
results, progress messages, the loopback check. (Through real clients and a real daemon:
tests/integration/test_mcp_bridge*.py.)"""

from __future__ import annotations

import socket

import mcp_types as types
import pytest

from execgate.client import Event, EventKind, Evidence, Outcome, Status, StopMode, ToolSpec
from execgate.client.mcpbridge import IDEMPOTENCY_META, BadMeta, NotLoopback
from execgate.client.mcpbridge.keys import call_id, idempotency_key
from execgate.client.mcpbridge.progress import Teller
from execgate.client.mcpbridge.results import call_result
from execgate.client.mcpbridge.serve import loopback
from execgate.client.mcpbridge.tools import hints, mcp_tool

# ---------------------------------------------------------------- keys


def test_call_ids_tell_number_string_and_odd_request_ids_apart() -> None:
    assert call_id("s1", 7) == "mcp-s1-7"
    assert call_id("s1", "7") == "mcp-s1-s7"
    odd = call_id("s1", "a b/" + "x" * 300)
    assert odd.startswith("mcp-s1-h")
    assert len(odd) == len("mcp-s1-h") + 16
    assert odd == call_id("s1", "a b/" + "x" * 300)
    assert odd != call_id("s1", "a b/" + "x" * 299)


def test_the_key_is_the_clients_else_the_call_id() -> None:
    assert idempotency_key({IDEMPOTENCY_META: "k-1"}, "mcp-s-1") == "k-1"
    assert idempotency_key({"progress_token": 3}, "mcp-s-1") == "mcp-s-1"
    assert idempotency_key(None, "mcp-s-1") == "mcp-s-1"


@pytest.mark.parametrize("bad", [7, "", None, ["k"], "k" * 257])
def test_a_malformed_key_names_itself(bad: object) -> None:
    with pytest.raises(BadMeta) as caught:
        idempotency_key({IDEMPOTENCY_META: bad}, "mcp-s-1")
    assert caught.value.key == IDEMPOTENCY_META
    assert str(caught.value).startswith(f'_meta["{IDEMPOTENCY_META}"]: ')


# ---------------------------------------------------------------- tools


def _spec(**effects: bool) -> ToolSpec:
    fields = {"read_only": False, "destructive": False, "idempotent": False}
    trusted = effects.pop("trusted", True)
    return ToolSpec(
        name="t",
        description="d",
        input_schema={"properties": {"a": {"type": "string"}}},
        annotations_trusted=trusted,
        **{**fields, **effects},
    )


def test_hints_follow_the_effects_the_daemon_believes() -> None:
    reader = hints(_spec(read_only=True, idempotent=True))
    assert reader == types.ToolAnnotations(read_only_hint=True)
    writer = hints(_spec(destructive=False, idempotent=True))
    assert writer == types.ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=True
    )
    # Untrusted: a writer, and nothing else is claimed (MCP's cautious defaults apply).
    stranger = hints(_spec(destructive=False, idempotent=True, trusted=False))
    assert stranger == types.ToolAnnotations(read_only_hint=False)


def test_a_schema_without_a_type_is_an_object() -> None:
    tool = mcp_tool(_spec())
    assert tool.input_schema == {"type": "object", "properties": {"a": {"type": "string"}}}
    assert tool.meta == {"execgate/provider": "builtin", "execgate/annotationsTrusted": True}


# ---------------------------------------------------------------- results


def _outcome(status: Status, error_class: str = "none", **fields: object) -> Outcome:
    return Outcome(call_id="mcp-s-4", status=status, error_class=error_class, **fields)


def _texts(result: types.CallToolResult) -> list[str]:
    return [c.text for c in result.content if isinstance(c, types.TextContent)]


def test_success_is_the_text_and_the_envelope() -> None:
    outcome = _outcome(
        Status.SUCCESS,
        text="hi\n",
        structured={"exit_code": 0},
        evidence=Evidence(exit_code=0, sandbox="bwrap"),
        stopped_how=StopMode.COMPLETED,
    )
    result = call_result(outcome, "run-1")
    assert result.is_error is False
    assert _texts(result) == ["hi\n"]
    assert result.structured_content == {
        "status": "SUCCESS",
        "error_class": "none",
        "call_id": "mcp-s-4",
        "run_id": "run-1",
        "result": {"exit_code": 0},
        "stopped_how": "completed",
        "evidence": {"exit_code": 0, "sandbox": "bwrap"},
    }


def test_a_success_without_text_shows_its_structured_result() -> None:
    result = call_result(_outcome(Status.SUCCESS, structured={"rows": 2}), "r")
    assert _texts(result) == ['{"rows": 2}']


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (Status.FAILURE, "nonzero_exit"),
        (Status.REJECTED, "policy_denied"),
        (Status.PARTIAL, "none"),
        (Status.UNKNOWN_OUTCOME, "timeout"),
    ],
)
def test_anything_else_is_an_error_result_saying_why(status: Status, error_class: str) -> None:
    outcome = _outcome(status, error_class, message="because", field="arguments.path", text="out")
    result = call_result(outcome, "run-1")
    assert result.is_error is True
    first, rest = _texts(result)
    assert first.startswith(f"execgate: {status.name} ({error_class}): because\n")
    assert "field: arguments.path" in first
    assert "call mcp-s-4 in run run-1" in first
    assert rest == "out"
    assert ("reconcile before retrying" in first) is (status is Status.UNKNOWN_OUTCOME)
    assert result.structured_content["status"] == status.name


def test_a_cut_result_and_a_replay_are_said() -> None:
    outcome = _outcome(
        Status.UNKNOWN_OUTCOME,
        "cancelled",
        truncated=True,
        returned_bytes=10,
        total_bytes=99,
        replay_of="mcp-t-2",
    )
    [first] = _texts(call_result(outcome, "run-1"))
    assert "result cut at 10 of 99 bytes" in first
    assert "the recorded outcome of call mcp-t-2 (same idempotency key)" in first
    # Reconcile the call that ran, not the replay.
    assert "`execgate calls show mcp-t-2 --run run-1`" in first


# ---------------------------------------------------------------- progress


def _event(kind: EventKind, **fields: object) -> Event:
    return Event(kind=kind, call_id="c", batch_id="b", at=0.0, **fields)


def test_a_quick_call_tells_nothing() -> None:
    teller = Teller()
    for kind in (EventKind.QUEUED, EventKind.STARTED):
        assert teller.tell(_event(kind)) is None
    assert teller.still(30) is None


def test_an_approval_wait_is_told_then_repeated_then_running() -> None:
    teller = Teller()
    asked = _event(
        EventKind.AWAITING_APPROVAL,
        approval_id="appr_1",
        rule_id="ask-rm",
        reason="a human first",
        expires_at=0.0,
    )
    said = teller.tell(asked, ("approver", "alice"))
    assert said == (
        "waiting for approval appr_1 by an operator (rule ask-rm: a human first; "
        "approvers: approver, alice; expires 1970-01-01 00:00:00 UTC; "
        "`execgate approvals approve appr_1`)"
    )
    assert teller.still(12.4) == f"still {said} (12 s)"
    assert teller.tell(_event(EventKind.STARTED)) == "running"
    assert teller.still(20) is None
    assert [teller.step() for _ in range(3)] == [1.0, 2.0, 3.0]


def test_lock_waits_and_tool_progress() -> None:
    teller = Teller()
    waiting = _event(EventKind.WAITING, keys=("file:/w/a",), blocked_by=("r/c1",))
    assert teller.tell(waiting) == "waiting for r/c1 (on file:/w/a)"
    tool = _event(EventKind.PROGRESS, progress=3.0, total=10.0, progress_message="copying")
    assert teller.tell(tool) == "running: 3/10 copying"
    assert teller.tell(_event(EventKind.PROGRESS, progress=0.5)) == "running: 0.5"


# ---------------------------------------------------------------- loopback


@pytest.mark.parametrize(
    ("host", "family"),
    [
        ("127.0.0.1", socket.AF_INET),
        ("127.1.2.3", socket.AF_INET),
        ("::1", socket.AF_INET6),
        ("localhost", socket.AF_INET),
    ],
)
def test_loopback_hosts(host: str, family: socket.AddressFamily) -> None:
    assert loopback(host) == family


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1", "example.com", ""])
def test_other_hosts_are_refused(host: str) -> None:
    with pytest.raises(NotLoopback) as caught:
        loopback(host)
    assert caught.value.host == host
