"""A corpus of bad input, through a real daemon.

Every bad call must come back as an Outcome (never a gRPC error) with the right
status, error class and field, must not touch anything it may not touch, and
the daemon must keep serving afterwards: after every test here a noop call has
to succeed and the daemon process has to be alive (see `still_serving`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execgate.client import Call, Client, Outcome, RequestError, Status, StopMode
from tests.daemon import Daemon

# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture(autouse=True)
def still_serving(shared: Daemon, eg: Client) -> Iterator[None]:
    """After each test: the daemon is alive and answers a noop."""
    yield
    echo = "alive-" + uuid.uuid4().hex
    outcome = eg.execute_one("noop", echo=echo)
    assert (outcome.status, outcome.text) == (Status.SUCCESS, echo), shared.log()[-3000:]
    assert shared.proc is not None
    assert shared.proc.poll() is None


@pytest.fixture
def outside(shared: Daemon) -> Path:
    """A directory next to the workspace, with a file a tool must never read or write."""
    path = shared.root / ("outside_" + uuid.uuid4().hex[:8])
    path.mkdir()
    (path / "secret.txt").write_text("TOP SECRET\n")
    return path


@pytest.fixture
def area(shared: Daemon) -> tuple[Path, str]:
    rel = "t_" + uuid.uuid4().hex[:12]
    (shared.workspace / rel).mkdir()
    return shared.workspace / rel, rel


def expect(
    client: Client,
    outcome: Outcome,
    status: Status,
    error_class: str,
    field: str,
    *,
    journaled: bool = True,
) -> Outcome:
    assert (outcome.status, outcome.error_class, outcome.field) == (status, error_class, field), (
        outcome
    )
    if status is not Status.SUCCESS:
        assert outcome.message
    if status is Status.REJECTED:
        assert outcome.stopped_how is StopMode.NOT_STARTED
        assert outcome.text == ""
    if journaled:
        record = client.get_call(outcome.call_id)
        assert record.outcome is not None
        assert (record.outcome.status, record.outcome.error_class, record.outcome.field) == (
            status,
            error_class,
            field,
        )
    return outcome


def snapshot(path: Path) -> tuple[bytes, int, int, int]:
    st = path.stat()
    return path.read_bytes(), st.st_ino, st.st_mtime_ns, st.st_mode


# ---------------------------------------------------------------- the corpus

DEEP = '{"path":' + "[" * 100_000 + "]" * 100_000 + "}"
HUGE_INT = '{"path":"a.txt","offset":' + "9" * 5000 + "}"

# (id, tool, arguments: dict or raw JSON text, status, error class, field)
CORPUS: list[tuple[str, str, Any, Status, str, str]] = [
    (
        "invalid-json",
        "read_file",
        "{not json",
        Status.REJECTED,
        "invalid_argument",
        "arguments_json",
    ),
    (
        "truncated-json",
        "read_file",
        '{"path": "a.txt"',
        Status.REJECTED,
        "invalid_argument",
        "arguments_json",
    ),
    ("array", "read_file", "[1,2]", Status.REJECTED, "invalid_argument", "arguments_json"),
    ("string", "read_file", '"a.txt"', Status.REJECTED, "invalid_argument", "arguments_json"),
    ("null", "read_file", "null", Status.REJECTED, "invalid_argument", "arguments_json"),
    ("number", "read_file", "42", Status.REJECTED, "invalid_argument", "arguments_json"),
    (
        "duplicate-keys",
        "read_file",
        '{"path": "a.txt", "path": "b.txt"}',
        Status.REJECTED,
        "invalid_argument",
        "arguments_json",
    ),
    (
        "nested-duplicate-keys",
        "run_command",
        '{"argv": ["env"], "env": {"A": "1", "A": "2"}}',
        Status.REJECTED,
        "invalid_argument",
        "arguments_json",
    ),
    (
        "nan",
        "read_file",
        '{"path": "a.txt", "offset": NaN}',
        Status.REJECTED,
        "invalid_argument",
        "arguments_json",
    ),
    (
        "infinity",
        "read_file",
        '{"path": "a.txt", "limit": -Infinity}',
        Status.REJECTED,
        "invalid_argument",
        "arguments_json",
    ),
    ("huge-int", "read_file", HUGE_INT, Status.REJECTED, "invalid_argument", "arguments_json"),
    ("deep-nesting", "read_file", DEEP, Status.REJECTED, "invalid_argument", "arguments_json"),
    (
        "lone-surrogate-path",
        "read_file",
        '{"path": "\\ud800.txt"}',
        Status.REJECTED,
        "invalid_argument",
        "arguments_json",
    ),
    (
        "lone-surrogate-content",
        "write_file",
        '{"path": "s.txt", "content": "\\udfff"}',
        Status.REJECTED,
        "invalid_argument",
        "arguments_json",
    ),
    (
        "lone-surrogate-argv",
        "run_command",
        '{"argv": ["echo", "\\ud83d"]}',
        Status.REJECTED,
        "invalid_argument",
        "arguments_json",
    ),
    (
        "wrong-type-string",
        "read_file",
        {"path": "a.txt", "offset": "x"},
        Status.REJECTED,
        "invalid_argument",
        "arguments.offset",
    ),
    (
        "wrong-type-bool",
        "read_file",
        {"path": "a.txt", "offset": True},
        Status.REJECTED,
        "invalid_argument",
        "arguments.offset",
    ),
    (
        "wrong-type-float",
        "list_dir",
        {"max_entries": 2.0},
        Status.REJECTED,
        "invalid_argument",
        "arguments.max_entries",
    ),
    (
        "float-overflow",
        "read_file",
        '{"path": "a.txt", "offset": 1e400}',
        Status.REJECTED,
        "invalid_argument",
        "arguments.offset",
    ),
    (
        "wrong-type-path",
        "read_file",
        {"path": 5},
        Status.REJECTED,
        "invalid_argument",
        "arguments.path",
    ),
    (
        "below-minimum",
        "read_file",
        {"path": "a.txt", "offset": 0},
        Status.REJECTED,
        "invalid_argument",
        "arguments.offset",
    ),
    (
        "above-maximum",
        "search",
        {"pattern": "x", "max_results": 10_001},
        Status.REJECTED,
        "invalid_argument",
        "arguments.max_results",
    ),
    (
        "wrong-type-bool-arg",
        "write_file",
        {"path": "a.txt", "content": "x", "create_dirs": "no"},
        Status.REJECTED,
        "invalid_argument",
        "arguments.create_dirs",
    ),
    (
        "argv-item-type",
        "run_command",
        {"argv": ["echo", 1]},
        Status.REJECTED,
        "invalid_argument",
        "arguments.argv[1]",
    ),
    (
        "argv-empty",
        "run_command",
        {"argv": []},
        Status.REJECTED,
        "invalid_argument",
        "arguments.argv",
    ),
    (
        "env-value-type",
        "run_command",
        {"argv": ["env"], "env": {"A": 1}},
        Status.REJECTED,
        "invalid_argument",
        "arguments.env.A",
    ),
    (
        "env-bad-name",
        "run_command",
        {"argv": ["env"], "env": {"1BAD": "x"}},
        Status.REJECTED,
        "invalid_argument",
        "arguments.env",
    ),
    ("missing-required", "read_file", {}, Status.REJECTED, "invalid_argument", "arguments.path"),
    (
        "missing-required-empty-text",
        "read_file",
        "",
        Status.REJECTED,
        "invalid_argument",
        "arguments.path",
    ),
    (
        "missing-new-string",
        "edit_file",
        {"path": "a.txt", "old_string": "a"},
        Status.REJECTED,
        "invalid_argument",
        "arguments.new_string",
    ),
    (
        "empty-path",
        "read_file",
        {"path": ""},
        Status.REJECTED,
        "invalid_argument",
        "arguments.path",
    ),
    (
        "empty-old-string",
        "edit_file",
        {"path": "a.txt", "old_string": "", "new_string": "x"},
        Status.REJECTED,
        "invalid_argument",
        "arguments.old_string",
    ),
    (
        "unknown-argument",
        "read_file",
        {"path": "a.txt", "bogus": 1},
        Status.REJECTED,
        "invalid_argument",
        "arguments.bogus",
    ),
    ("unknown-tool", "rm_rf", {"path": "/"}, Status.REJECTED, "unknown_tool", "tool"),
    ("empty-tool", "", {}, Status.REJECTED, "unknown_tool", "tool"),
    ("tool-case", "READ_FILE", {"path": "a.txt"}, Status.REJECTED, "unknown_tool", "tool"),
    (
        "nul-in-path",
        "read_file",
        {"path": "a\x00b.txt"},
        Status.REJECTED,
        "invalid_argument",
        "arguments.path",
    ),
    (
        "nul-in-write-path",
        "write_file",
        {"path": "nul\x00.txt", "content": "x"},
        Status.REJECTED,
        "invalid_argument",
        "arguments.path",
    ),
    (
        "nul-in-cwd",
        "run_command",
        {"argv": ["pwd"], "cwd": "a\x00"},
        Status.REJECTED,
        "invalid_argument",
        "arguments.cwd",
    ),
    (
        "nul-in-argv",
        "run_command",
        {"argv": ["echo", "a\x00b"]},
        Status.FAILURE,
        "invalid_argument",
        "arguments.argv[1]",
    ),
    (
        "nul-in-env",
        "run_command",
        {"argv": ["env"], "env": {"A": "x\x00y"}},
        Status.FAILURE,
        "invalid_argument",
        "arguments.env.A",
    ),
    (
        "dotdot-read",
        "read_file",
        {"path": "../daemon.log"},
        Status.REJECTED,
        "permission_denied",
        "arguments.path",
    ),
    (
        "dotdot-inner",
        "read_file",
        {"path": "a/../../daemon.log"},
        Status.REJECTED,
        "permission_denied",
        "arguments.path",
    ),
    (
        "dotdot-list",
        "list_dir",
        {"path": ".."},
        Status.REJECTED,
        "permission_denied",
        "arguments.path",
    ),
    (
        "dotdot-search",
        "search",
        {"pattern": "INFO", "path": ".."},
        Status.REJECTED,
        "permission_denied",
        "arguments.path",
    ),
    (
        "dotdot-cwd",
        "run_command",
        {"argv": ["cat", "daemon.log"], "cwd": ".."},
        Status.REJECTED,
        "permission_denied",
        "arguments.cwd",
    ),
    (
        "absolute-outside",
        "read_file",
        {"path": "/etc/passwd"},
        Status.REJECTED,
        "permission_denied",
        "arguments.path",
    ),
    (
        "absolute-root",
        "list_dir",
        {"path": "/"},
        Status.REJECTED,
        "permission_denied",
        "arguments.path",
    ),
    (
        "absolute-outside-edit",
        "edit_file",
        {"path": "/etc/hostname", "old_string": "a", "new_string": "b"},
        Status.REJECTED,
        "permission_denied",
        "arguments.path",
    ),
]


@pytest.mark.parametrize(
    ("tool", "arguments", "status", "error_class", "field"),
    [pytest.param(*case[1:], id=case[0]) for case in CORPUS],
)
def test_corpus(
    eg: Client, tool: str, arguments: Any, status: Status, error_class: str, field: str
) -> None:
    outcome = eg.run(Call(tool=tool, arguments=arguments))
    expect(eg, outcome, status, error_class, field)
    if status is Status.REJECTED:
        # Never started: no STARTED mark, nothing reached a tool.
        assert outcome.mark("started") is None
        assert outcome.mark("queued") is not None
        assert outcome.mark("finished") is not None


def test_corpus_as_one_batch(eg: Client) -> None:
    """The same bad calls together: each gets its own outcome, in order."""
    calls = [Call(tool=c[1], arguments=c[2]) for c in CORPUS]
    outcomes = eg.execute(calls)
    assert [(o.status, o.error_class, o.field) for o in outcomes] == [
        (c[3], c[4], c[5]) for c in CORPUS
    ]


def test_five_mib_arguments_are_resource_exhausted(eg: Client) -> None:
    big = "x" * (5 * 1024 * 1024)
    outcome = eg.run(Call(tool="write_file", arguments={"path": "big.txt", "content": big}))
    expect(eg, outcome, Status.REJECTED, "resource_exhausted", "arguments_json")
    assert "limit" in outcome.message


def test_deep_nesting_at_the_recursion_limit(eg: Client) -> None:
    """Every depth around Python's recursion limit is a clean REJECTED, never a crash."""
    calls = [
        Call(tool="noop", arguments='{"echo":' + "[" * n + "]" * n + "}") for n in range(900, 1101)
    ]
    outcomes = eg.execute(calls)
    for n, outcome in zip(range(900, 1101), outcomes, strict=True):
        assert (outcome.status, outcome.error_class) == (Status.REJECTED, "invalid_argument"), (
            n,
            outcome,
        )
        assert outcome.field in ("arguments.echo", "arguments_json"), (n, outcome)


def test_nul_in_write_path_writes_nothing(eg: Client, shared: Daemon) -> None:
    before = sorted(os.listdir(shared.workspace))
    expect(
        eg,
        eg.execute_one("write_file", path="zz\x00.txt", content="x"),
        Status.REJECTED,
        "invalid_argument",
        "arguments.path",
    )
    assert sorted(os.listdir(shared.workspace)) == before


# ---------------------------------------------------------------- paths that leave the workspace


def test_dotdot_write_creates_nothing_outside(eg: Client, shared: Daemon) -> None:
    name = "escape_" + uuid.uuid4().hex[:8] + ".txt"
    for path in (f"../{name}", f"sub/../../{name}", f"{shared.workspace}/../{name}"):
        outcome = eg.execute_one("write_file", path=path, content="escaped")
        expect(eg, outcome, Status.REJECTED, "permission_denied", "arguments.path")
    assert not (shared.root / name).exists()
    assert not (shared.workspace / "sub").exists()


def test_absolute_outside_reads_nothing(eg: Client) -> None:
    outcome = eg.execute_one("read_file", path="/etc/passwd")
    expect(eg, outcome, Status.REJECTED, "permission_denied", "arguments.path")
    assert outcome.text == ""
    assert outcome.evidence.bytes_read is None
    assert "root:" not in eg.get_call(outcome.call_id, include_raw=True).raw_result


def test_symlink_to_outside_file_is_refused(
    eg: Client, shared: Daemon, area: tuple[Path, str], outside: Path
) -> None:
    path, rel = area
    secret = outside / "secret.txt"
    (path / "link.txt").symlink_to(secret)
    before = snapshot(secret)

    calls = [
        Call(tool="read_file", arguments={"path": f"{rel}/link.txt"}),
        Call(tool="write_file", arguments={"path": f"{rel}/link.txt", "content": "pwned"}),
        Call(
            tool="edit_file",
            arguments={"path": f"{rel}/link.txt", "old_string": "TOP", "new_string": "NO"},
        ),
        Call(tool="search", arguments={"pattern": "SECRET", "path": f"{rel}/link.txt"}),
    ]
    for outcome in eg.execute(calls):
        expect(eg, outcome, Status.REJECTED, "permission_denied", "arguments.path")
        assert "SECRET" not in outcome.text
    assert snapshot(secret) == before
    assert (path / "link.txt").is_symlink()
    assert os.readlink(path / "link.txt") == str(secret)
    assert sorted(os.listdir(outside)) == ["secret.txt"]

    # Searching the directory that holds the link skips it rather than following it.
    found = eg.execute_one("search", pattern="SECRET", path=rel)
    expect(eg, found, Status.SUCCESS, "none", "")
    assert found.text == ""
    # Listing shows the link as a link and does not follow it.
    listed = eg.execute_one("list_dir", path=rel)
    assert listed.status is Status.SUCCESS
    assert listed.structured["entries"] == [
        {"name": "link.txt", "type": "symlink", "size": len(str(secret))}
    ]


def test_symlink_to_outside_dir_is_refused(
    eg: Client, area: tuple[Path, str], outside: Path
) -> None:
    path, rel = area
    (path / "out").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside / "secret.txt")
    calls = [
        Call(tool="list_dir", arguments={"path": f"{rel}/out"}),
        Call(tool="read_file", arguments={"path": f"{rel}/out/secret.txt"}),
        Call(tool="write_file", arguments={"path": f"{rel}/out/new.txt", "content": "x"}),
        Call(tool="write_file", arguments={"path": f"{rel}/out/secret.txt", "content": "x"}),
        Call(tool="search", arguments={"pattern": "SECRET", "path": f"{rel}/out"}),
    ]
    for outcome in eg.execute(calls):
        expect(eg, outcome, Status.REJECTED, "permission_denied", "arguments.path")
    run = eg.execute_one("run_command", argv=["cat", "secret.txt"], cwd=f"{rel}/out")
    expect(eg, run, Status.REJECTED, "permission_denied", "arguments.cwd")
    assert "SECRET" not in run.text
    assert snapshot(outside / "secret.txt") == before
    assert sorted(os.listdir(outside)) == ["secret.txt"]


def test_dangling_symlink_to_outside_is_refused(
    eg: Client, area: tuple[Path, str], outside: Path
) -> None:
    path, rel = area
    target = outside / "not-yet.txt"
    (path / "dangling").symlink_to(target)
    outcome = eg.execute_one("write_file", path=f"{rel}/dangling", content="created?")
    expect(eg, outcome, Status.REJECTED, "permission_denied", "arguments.path")
    assert not target.exists()
    assert (path / "dangling").is_symlink()


def test_symlink_inside_is_allowed(eg: Client, area: tuple[Path, str]) -> None:
    path, rel = area
    (path / "real.txt").write_text("real content\n")
    (path / "alias.txt").symlink_to("real.txt")
    (path / "dir").mkdir()
    (path / "dir" / "f").write_text("f\n")
    (path / "dirlink").symlink_to("dir", target_is_directory=True)

    read = expect(
        eg, eg.execute_one("read_file", path=f"{rel}/alias.txt"), Status.SUCCESS, "none", ""
    )
    assert read.text == "real content\n"
    assert read.evidence.path == str((path / "real.txt").resolve())

    # A write through the link replaces the file it points to; the link stays a link.
    wrote = expect(
        eg,
        eg.execute_one("write_file", path=f"{rel}/alias.txt", content="new\n"),
        Status.SUCCESS,
        "none",
        "",
    )
    assert wrote.evidence.path == str((path / "real.txt").resolve())
    assert (path / "alias.txt").is_symlink()
    assert (path / "real.txt").read_text() == "new\n"

    listed = expect(
        eg, eg.execute_one("list_dir", path=f"{rel}/dirlink"), Status.SUCCESS, "none", ""
    )
    assert listed.text == "f"


def test_absolute_path_inside_is_allowed(
    eg: Client, shared: Daemon, area: tuple[Path, str]
) -> None:
    path, _ = area
    target = path / "abs.txt"
    wrote = eg.execute_one("write_file", path=str(target), content="absolute\n")
    expect(eg, wrote, Status.SUCCESS, "none", "")
    assert target.read_text() == "absolute\n"
    read = eg.execute_one("read_file", path=str(target))
    expect(eg, read, Status.SUCCESS, "none", "")
    assert read.text == "absolute\n"
    root = eg.execute_one("list_dir", path=str(shared.workspace))
    expect(eg, root, Status.SUCCESS, "none", "")


# ---------------------------------------------------------------- special files


def test_fifo_is_refused_without_blocking(eg: Client, area: tuple[Path, str]) -> None:
    path, rel = area
    os.mkfifo(path / "pipe")
    (path / "plain.txt").write_text("needle\n")
    for call in (
        Call(tool="read_file", arguments={"path": f"{rel}/pipe"}),
        Call(tool="write_file", arguments={"path": f"{rel}/pipe", "content": "x"}),
        Call(
            tool="edit_file",
            arguments={"path": f"{rel}/pipe", "old_string": "a", "new_string": "b"},
        ),
    ):
        outcome = eg.run(call)
        expect(eg, outcome, Status.FAILURE, "invalid_argument", "arguments.path")
        assert "not a regular file" in outcome.message
    # A search over a directory holding a FIFO skips it instead of blocking on it.
    found = eg.execute_one("search", pattern="needle", path=rel)
    expect(eg, found, Status.SUCCESS, "none", "")
    assert found.text == f"{rel}/plain.txt:1: needle"
    assert (path / "pipe").exists()
    assert not (path / "pipe").is_file()


# ---------------------------------------------------------------- call ids and batches


def test_duplicate_call_id_across_batches(eg: Client, area: tuple[Path, str]) -> None:
    path, rel = area
    call_id = "dup-" + uuid.uuid4().hex
    first = eg.run(
        Call(
            tool="write_file", arguments={"path": f"{rel}/one.txt", "content": "1"}, call_id=call_id
        )
    )
    assert first.status is Status.SUCCESS
    second = eg.run(
        Call(
            tool="write_file", arguments={"path": f"{rel}/two.txt", "content": "2"}, call_id=call_id
        )
    )
    expect(eg, second, Status.REJECTED, "duplicate_call_id", "call_id", journaled=False)
    assert second.call_id == call_id
    assert not (path / "two.txt").exists()
    assert (path / "one.txt").read_text() == "1"

    record = eg.get_call(call_id)
    assert record.tool == "write_file"
    assert f"{rel}/one.txt" in record.arguments_json
    assert record.outcome is not None
    assert record.outcome.status is Status.SUCCESS

    # The same id in another run is a different call.
    other = eg.run(
        Call(tool="noop", arguments={"echo": "other run"}, call_id=call_id),
        run_id="other-" + uuid.uuid4().hex[:8],
    )
    assert other.status is Status.SUCCESS


def test_duplicate_call_id_in_one_batch(eg: Client, area: tuple[Path, str]) -> None:
    path, rel = area
    call_id = "dup-" + uuid.uuid4().hex
    calls = [
        Call(
            tool="write_file", arguments={"path": f"{rel}/a.txt", "content": "a"}, call_id=call_id
        ),
        Call(
            tool="write_file", arguments={"path": f"{rel}/b.txt", "content": "b"}, call_id=call_id
        ),
    ]
    outcomes = eg.execute(calls)
    assert sorted(o.status.value for o in outcomes) == ["rejected", "success"]
    rejected = next(o for o in outcomes if o.status is Status.REJECTED)
    assert (rejected.error_class, rejected.field) == ("duplicate_call_id", "call_id")
    # Exactly one of the two writes happened, and it is the one the journal holds.
    written = sorted(os.listdir(path))
    assert len(written) == 1
    record = eg.get_call(call_id)
    assert record.outcome is not None
    assert record.outcome.status is Status.SUCCESS
    assert f"{rel}/{written[0]}" in record.arguments_json


@pytest.mark.parametrize(
    ("call_id", "ok"),
    [
        pytest.param("x" * 256, True, id="256-chars"),
        pytest.param("x" * 257, False, id="257-chars"),
        pytest.param("y" * 100_000, False, id="100k-chars"),
        pytest.param("a\nb", False, id="newline"),
        pytest.param("a\x00b", False, id="nul"),
        pytest.param("tab\there", False, id="tab"),
        pytest.param("del\x7f", False, id="del"),
        pytest.param("esc\x1b[31m", False, id="ansi-escape"),
        pytest.param("ünï-cødé ✓", True, id="unicode"),
    ],
)
def test_call_id_checks(eg: Client, call_id: str, ok: bool) -> None:
    outcome = eg.run(Call(tool="noop", arguments={"echo": "id"}, call_id=call_id))
    assert outcome.call_id == call_id
    if ok:
        expect(eg, outcome, Status.SUCCESS, "none", "")
    else:
        expect(eg, outcome, Status.REJECTED, "invalid_argument", "call_id", journaled=False)
        assert outcome.text == ""


def test_bad_run_id_and_idempotency_key(eg: Client) -> None:
    outcome = eg.run(Call(tool="noop", arguments={"echo": "x"}), run_id="run\nid")
    expect(eg, outcome, Status.REJECTED, "invalid_argument", "run_id", journaled=False)
    outcome = eg.run(Call(tool="noop", arguments={"echo": "x"}, idempotency_key="k" * 257))
    expect(eg, outcome, Status.REJECTED, "invalid_argument", "idempotency_key", journaled=False)


def test_batch_over_1000_calls_is_a_request_error(eg: Client) -> None:
    calls = [Call(tool="noop", arguments={"echo": str(i)}) for i in range(1001)]
    with pytest.raises(RequestError) as info:
        eg.execute(calls)
    assert info.value.code == "INVALID_ARGUMENT"
    assert "1000" in info.value.details
    assert (info.value.error_class, info.value.field) == ("too_large", "calls")
    # Nothing of the refused batch ran.
    assert not any(
        r.arguments_json == '{"echo": "1000"}' for r in eg.list_calls(tool="noop", limit=1000)
    )


def test_batch_of_1000_calls_is_accepted(eg: Client) -> None:
    outcomes = eg.execute([Call(tool="noop", arguments={"echo": str(i)}) for i in range(1000)])
    assert [o.text for o in outcomes] == [str(i) for i in range(1000)]
    assert {o.status for o in outcomes} == {Status.SUCCESS}


def test_empty_batch(eg: Client) -> None:
    assert eg.execute([]) == []
