"""Unit tests of the daemon's logic that need no daemon: lock, group commit, bounding,
argument parsing, policy loading, and the client's public surface."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import execgate.client
from execgate.executor.core.errors import PolicyError, ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.journal.writer import SqliteWriter
from execgate.executor.pipeline import results
from execgate.executor.pipeline.validate import parse_arguments
from execgate.executor.policy import Effect, PolicyInput, default_policy_path, load_policy


def run_async(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(fn(), timeout=10))  # type: ignore[arg-type]


# ---------------------------------------------------------------- SqliteWriter


def _writer(path: Path) -> tuple[SqliteWriter, list[str]]:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    return SqliteWriter(conn), statements


def _count(path: Path) -> list[int]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT k FROM t ORDER BY k").fetchall()
    conn.close()
    return [r[0] for r in rows]


def _insert(k: int) -> Callable[[sqlite3.Connection], int]:
    def job(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t (k, v) VALUES (?, 'x')", (k,))
        return k

    return job


def test_writer_many_concurrent_submits_all_land(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    writer, _ = _writer(db)

    async def body() -> None:
        got = await asyncio.gather(
            *(writer.submit(_insert(k), durable=k % 7 == 0) for k in range(300))
        )
        assert got == list(range(300))

    try:
        run_async(body)
    finally:
        writer.close()
    assert _count(db) == list(range(300))


def test_writer_groups_queued_jobs_into_one_commit(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    writer, statements = _writer(db)
    started, go = threading.Event(), threading.Event()

    def blocker(conn: sqlite3.Connection) -> str:
        started.set()
        assert go.wait(10)
        return "blocker"

    async def body() -> None:
        first = asyncio.ensure_future(writer.submit(blocker, durable=True))
        assert await asyncio.to_thread(started.wait, 10)
        rest = [asyncio.ensure_future(writer.submit(_insert(k), durable=False)) for k in range(50)]
        await asyncio.sleep(0)  # every submit has queued its job
        go.set()
        assert await first == "blocker"
        assert await asyncio.gather(*rest) == list(range(50))
        # The blocker's transaction, then the 50 jobs that queued up while it was open:
        # one commit for them all, not 50.
        assert statements.count("COMMIT") == 2

    try:
        run_async(body)
    finally:
        writer.close()
    assert _count(db) == list(range(50))


def test_writer_fast_path_never_overtakes_a_pending_job(tmp_path: Path) -> None:
    """A non-durable write runs inline only when nothing is pending, so order holds."""
    db = tmp_path / "w.db"
    writer, _ = _writer(db)
    started, go = threading.Event(), threading.Event()
    seen: list[int] = []

    def blocker(conn: sqlite3.Connection) -> None:
        started.set()
        assert go.wait(10)

    def count(conn: sqlite3.Connection) -> int:
        return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])

    async def body() -> None:
        # Idle writer: the fast path commits on this thread, with no writer-thread hop.
        assert await writer.submit(_insert(1), durable=False) == 1
        ran_on = await writer.submit(lambda conn: threading.get_ident(), durable=False)
        assert ran_on == threading.get_ident()
        durable_on = await writer.submit(lambda conn: threading.get_ident(), durable=True)
        assert durable_on != threading.get_ident()  # fsyncing writes go to the writer
        first = asyncio.ensure_future(writer.submit(blocker, durable=True))
        assert await asyncio.to_thread(started.wait, 10)
        writer.submit_nowait(_insert(2), durable=False)  # queued behind the blocker
        later = asyncio.ensure_future(writer.submit(count, durable=False))
        await asyncio.sleep(0)
        assert not later.done()  # it waits: the fast path would have overtaken row 2
        go.set()
        await first
        seen.append(await later)

    try:
        run_async(body)
    finally:
        writer.close()
    assert seen == [2]
    assert _count(db) == [1, 2]


def test_writer_failing_job_rolls_back_alone(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    writer, statements = _writer(db)
    started, go = threading.Event(), threading.Event()

    def blocker(conn: sqlite3.Connection) -> None:
        started.set()
        assert go.wait(10)

    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t (k, v) VALUES (1000, 'partial')")
        raise ValueError("job failed")

    async def body() -> None:
        first = asyncio.ensure_future(writer.submit(blocker, durable=True))
        assert await asyncio.to_thread(started.wait, 10)
        jobs = [
            writer.submit(_insert(1), durable=True),
            writer.submit(half_then_fail, durable=True),
            writer.submit(_insert(1), durable=False),  # duplicate key: IntegrityError
            writer.submit(_insert(2), durable=False),
        ]
        futures = [asyncio.ensure_future(j) for j in jobs]
        await asyncio.sleep(0)
        go.set()
        await first
        got = await asyncio.gather(*futures, return_exceptions=True)
        assert got[0] == 1
        assert got[3] == 2
        assert isinstance(got[1], ValueError)
        assert isinstance(got[2], sqlite3.IntegrityError)
        assert statements.count("COMMIT") == 2  # the blocker's, then one for the group
        assert "PRAGMA synchronous=FULL" in statements  # a durable job was in it

    try:
        run_async(body)
    finally:
        writer.close()
    assert _count(db) == [1, 2]


def test_writer_submit_sync(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    writer, _ = _writer(db)
    try:
        assert writer.submit_sync(_insert(5), durable=True) == 5
        with pytest.raises(sqlite3.IntegrityError):
            writer.submit_sync(_insert(5), durable=True)
    finally:
        writer.close()
    assert _count(db) == [5]


# ---------------------------------------------------------------- results.bound


def test_bound_examples() -> None:
    assert results.bound("hello", 10) == ("hello", False, 5)
    assert results.bound("hello", 5) == ("hello", False, 5)
    assert results.bound("hello", 4) == ("hell", True, 4)
    # "é" is 2 bytes, "€" 3, "😀" 4: never half a character.
    assert results.bound("éé", 3) == ("é", True, 2)
    assert results.bound("€€", 5) == ("€", True, 3)
    assert results.bound("a😀", 4) == ("a", True, 1)
    assert results.bound("😀", 3) == ("", True, 0)
    assert results.bound("", 0) == ("", False, 0)
    assert results.bound("x", 0) == ("", True, 0)


@given(st.text(alphabet=st.characters(exclude_categories=("Cs",))), st.integers(0, 200))
def test_bound_properties(text: str, cap: int) -> None:
    cut, truncated, returned = results.bound(text, cap)
    data = cut.encode("utf-8")
    assert len(data) <= cap
    assert returned == len(data)
    assert text.startswith(cut)
    assert truncated == (len(text.encode("utf-8")) > cap)
    if truncated:  # maximal: the next character would not have fit
        nxt = text[len(cut)]
        assert len(data) + len(nxt.encode("utf-8")) > cap
    else:
        assert cut == text


# ---------------------------------------------------------------- parse_arguments


def _rejected(text: str, max_bytes: int = 1000) -> ToolError:
    with pytest.raises(ToolError) as info:
        parse_arguments(text, max_bytes)
    assert info.value.status is Status.REJECTED
    return info.value


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_parse_arguments_empty_is_empty_object(text: str) -> None:
    assert parse_arguments(text, 100) == {}


def test_parse_arguments_object() -> None:
    assert parse_arguments('{"a": [1, {"b": null}], "c": "é"}', 100) == {
        "a": [1, {"b": None}],
        "c": "é",
    }


@pytest.mark.parametrize("text", ["[]", "1", '"x"', "null", "true", "[{}]"])
def test_parse_arguments_not_an_object(text: str) -> None:
    err = _rejected(text)
    assert err.error_class is ErrorClass.INVALID_ARGUMENT
    assert err.field == "arguments_json"
    assert "object" in err.message


@pytest.mark.parametrize("text", ["{", '{"a": 1,}', "{'a': 1}", '{"a": 1} x', "nope"])
def test_parse_arguments_not_json(text: str) -> None:
    err = _rejected(text)
    assert err.error_class is ErrorClass.INVALID_ARGUMENT
    assert err.field == "arguments_json"


def test_parse_arguments_duplicate_keys_refused() -> None:
    err = _rejected('{"path": "a", "path": "b"}')
    assert err.field == "arguments_json"
    assert "duplicate key 'path'" in err.message


def test_parse_arguments_nested_duplicate_keys_refused() -> None:
    err = _rejected('{"env": {"A": "1", "A": "2"}}')
    assert "duplicate key 'A'" in err.message


@pytest.mark.parametrize("const", ["NaN", "Infinity", "-Infinity"])
def test_parse_arguments_non_json_constants_refused(const: str) -> None:
    err = _rejected(f'{{"x": {const}}}')
    assert err.error_class is ErrorClass.INVALID_ARGUMENT
    assert const.lstrip("-") in err.message


def test_parse_arguments_deep_nesting_is_rejected_not_a_crash() -> None:
    depth = 100_000
    err = _rejected('{"a": ' + "[" * depth + "]" * depth + "}", max_bytes=10 * depth)
    assert err.error_class is ErrorClass.INVALID_ARGUMENT


def test_parse_arguments_size_counts_utf8_bytes() -> None:
    text = '{"a": "' + "é" * 10 + '"}'  # 19 characters, 29 bytes
    assert len(text) == 19
    assert len(text.encode()) == 29
    assert parse_arguments(text, 29) == {"a": "é" * 10}
    err = _rejected(text, max_bytes=28)
    assert err.error_class is ErrorClass.RESOURCE_EXHAUSTED
    assert err.field == "arguments_json"
    assert "29 bytes" in err.message
    assert "28" in err.message


# ---------------------------------------------------------------- policy


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


ALLOW_THEN_DENY = """
version: 1
default: allow
rules:
  - {id: allow-run, effect: allow, tools: [run_command], reason: ok}
  - {id: deny-run, effect: deny, tools: ["run_*"], reason: no commands}
"""
DENY_THEN_ALLOW = """
version: 1
default: allow
rules:
  - {id: deny-run, effect: deny, tools: ["run_*"], reason: no commands}
  - {id: allow-run, effect: allow, tools: [run_command], reason: ok}
"""


@pytest.mark.parametrize("text", [ALLOW_THEN_DENY, DENY_THEN_ALLOW])
def test_policy_deny_beats_allow_in_any_order(tmp_path: Path, text: str) -> None:
    policy = load_policy(_policy(tmp_path, text))
    decision = policy.decide(PolicyInput(tool="run_command"))
    assert decision.effect is Effect.DENY
    assert decision.rule_ids == ("deny-run",)
    assert decision.reason == "no commands"
    assert policy.decide(PolicyInput(tool="read_file")).effect is Effect.ALLOW  # the file's default


def test_policy_default_is_deny(tmp_path: Path) -> None:
    policy = load_policy(
        _policy(
            tmp_path,
            """
version: 1
rules:
  - {id: reads, effect: allow, tools: [read_file]}
""",
        )
    )
    assert policy.decide(PolicyInput(tool="read_file")).effect is Effect.ALLOW
    decision = policy.decide(PolicyInput(tool="write_file"))
    assert decision.effect is Effect.DENY
    assert decision.rule_ids == ()


def test_shipped_policy_allows_builtins_and_denies_the_rest() -> None:
    policy = load_policy(default_policy_path())
    for tool in (
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "search",
        "run_command",
        "noop",
    ):
        assert policy.decide(PolicyInput(tool=tool)).effect is Effect.ALLOW, tool
    assert policy.decide(PolicyInput(tool="delete_everything")).effect is Effect.DENY


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("version: 1\ndefualt: allow\n", "defualt"),
        ("version: 1\nrules:\n  - {id: a, effect: allow, tools: [x], tool: y}\n", "tool"),
        ("version: 1\nrules:\n  - {id: a, effect: allow, tools: [x], unless: always}\n", "unless"),
    ],
)
def test_policy_unknown_key_refused_by_name(tmp_path: Path, text: str, key: str) -> None:
    path = _policy(tmp_path, text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert repr(key) in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "version: 2\n",
        "- a\n- b\n",
        "version: 1\ndefault: maybe\n",
        "version: 1\nrules: {a: 1}\n",
        "version: 1\nrules:\n  - {id: a, effect: allow}\n",
        "version: 1\nrules:\n  - {id: a, effect: allow, tools: [x]}\n"
        "  - {id: a, effect: deny, tools: [y]}\n",
        "version: 1\nrules: [\n",
    ],
)
def test_policy_malformed_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(PolicyError):
        load_policy(_policy(tmp_path, text))


def test_policy_missing_file_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(tmp_path / "absent.yaml")


# ---------------------------------------------------------------- the client's surface


def test_client_public_names_are_frozen() -> None:
    """Changing the public surface of `execgate.client` must be a deliberate act."""
    assert execgate.client.__all__ == [
        "Approval",
        "ApprovalNotPending",
        "ApprovalState",
        "AsyncClient",
        "Call",
        "CallNotFound",
        "CallPlan",
        "CallRecord",
        "CancelNotice",
        "Client",
        "DaemonUnavailable",
        "Event",
        "EventKind",
        "Evidence",
        "ExecgateClientError",
        "Loop",
        "LoopResult",
        "Mark",
        "Outcome",
        "PermissionDenied",
        "PolicyDecision",
        "RequestError",
        "RunDetail",
        "RunInfo",
        "RunNotFound",
        "RunRefused",
        "Runs",
        "SoFar",
        "Status",
        "StopMode",
        "TlsConfig",
        "ToolSpec",
        "Unauthenticated",
        "Verdict",
    ]
    for name in execgate.client.__all__:
        assert getattr(execgate.client, name) is not None
    namespace: dict[str, Any] = {}
    exec("from execgate.client import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(execgate.client.__all__)


def test_client_does_not_import_the_daemon() -> None:
    import subprocess
    import sys

    code = (
        "import sys, execgate.client; "
        "print(sorted(m for m in sys.modules if m.startswith('execgate.executor')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == "[]"


def test_writer_survives_a_cancelled_submit(tmp_path: Path) -> None:
    """A caller that stops waiting (its task is cancelled) must not break the writer."""
    db = tmp_path / "w.db"
    writer, _ = _writer(db)
    started, go = threading.Event(), threading.Event()

    def blocker(conn: sqlite3.Connection) -> None:
        started.set()
        assert go.wait(10)

    async def body() -> None:
        first = asyncio.ensure_future(writer.submit(blocker, durable=True))
        assert await asyncio.to_thread(started.wait, 10)
        victim = asyncio.ensure_future(writer.submit(_insert(7), durable=False))
        bystander = asyncio.ensure_future(writer.submit(_insert(6), durable=False))
        await asyncio.sleep(0)  # both jobs are queued behind the blocker
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
        go.set()
        await first
        assert await asyncio.wait_for(bystander, 10) == 6
        assert await asyncio.wait_for(writer.submit(_insert(8), durable=False), 10) == 8

    try:
        run_async(body)
    finally:
        writer.close()
    assert _count(db) == [6, 8]  # the cancelled job was not written behind its caller's back


def test_writer_checkpoints_on_its_own_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Autocheckpoint is off; the writer thread checkpoints every CHECKPOINT_EVERY commits."""
    import execgate.executor.journal.writer as sw

    monkeypatch.setattr(sw, "CHECKPOINT_EVERY", 10)
    db = tmp_path / "w.db"
    writer, statements = _writer(db)

    async def body() -> None:
        for k in range(35):
            await writer.submit(_insert(k), durable=False)

    try:
        run_async(body)
    finally:
        writer.close()
    checkpoints = [s for s in statements if "wal_checkpoint(PASSIVE)" in s]
    assert len(checkpoints) == 3  # after commits 10, 20 and 30 (1-in-10 via the thread)
    assert "PRAGMA wal_autocheckpoint=0" in statements
    assert _count(db) == list(range(35))
