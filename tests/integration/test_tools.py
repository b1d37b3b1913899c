"""Every built-in tool through a real daemon: success paths, failure classes, effects on disk.

Most tests share one daemon per module (starting one costs about a second) and
work in a fresh directory of its workspace; the tests that need a daemon of
their own (an output cap, an environment, an empty journal) start one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from execgate.client import Call, Client, Outcome, Status, StopMode
from execgate.executor.sandbox import procscan
from tests.daemon import Daemon

# ---------------------------------------------------------------- fixtures and helpers


@dataclass(frozen=True)
class Area:
    """A fresh directory inside the workspace: `path` on disk, `rel` as a tool argument."""

    path: Path
    rel: str

    def arg(self, *parts: str) -> str:
        return "/".join([self.rel, *parts])


@pytest.fixture
def area(shared: Daemon) -> Area:
    rel = "t_" + uuid.uuid4().hex[:12]
    path = shared.workspace / rel
    path.mkdir()
    return Area(path, rel)


def own_daemon(root: Path, *args: str) -> Daemon:
    """A daemon of the test's own (Daemon.start does not create its root)."""
    root.mkdir(parents=True, exist_ok=True)
    return Daemon(root, *args).start()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check(
    client: Client,
    outcome: Outcome,
    status: Status,
    error_class: str = "none",
    field: str | None = None,
) -> Outcome:
    """Assert the outcome, and that the journal holds the same one for its call id."""
    assert (outcome.status, outcome.error_class) == (status, error_class), outcome
    if field is not None:
        assert outcome.field == field, outcome
    if status is Status.REJECTED:
        assert outcome.stopped_how is StopMode.NOT_STARTED, outcome
    elif status is not Status.UNKNOWN_OUTCOME:
        assert outcome.stopped_how is StopMode.COMPLETED, outcome
    record = client.get_call(outcome.call_id)
    assert not record.running
    assert record.outcome is not None
    assert record.outcome.status is outcome.status
    assert record.outcome.error_class == outcome.error_class
    assert record.outcome.field == outcome.field
    assert record.outcome.stopped_how is outcome.stopped_how
    return outcome


def run(client: Client, tool: str, timeout: float | None = None, **arguments: object) -> Outcome:
    return client.run(Call(tool=tool, arguments=arguments, timeout=timeout))


def phases(outcome: Outcome) -> list[str]:
    return [m.phase for m in outcome.timeline]


def tagged(name: str, value: str) -> list[int]:
    """Live pids on this host whose environment has name=value."""
    return procscan.with_marker(name, value)


# ---------------------------------------------------------------- read_file


def test_read_file_whole(eg: Client, area: Area) -> None:
    content = "alpha\nbeta\nünïcødé ✓\n"
    (area.path / "a.txt").write_text(content, encoding="utf-8")
    out = check(eg, run(eg, "read_file", path=area.arg("a.txt")), Status.SUCCESS)
    size = len(content.encode())
    assert out.text == content
    assert not out.truncated
    assert out.total_bytes == size
    assert out.returned_bytes == size
    assert out.evidence.bytes_read == size
    assert out.evidence.path == str((area.path / "a.txt").resolve())
    assert out.structured == {
        "path": area.arg("a.txt"),
        "start_line": 1,
        "end_line": 3,
        "file_bytes": size,
        "binary": False,
    }


def test_read_file_offset_and_limit(eg: Client, area: Area) -> None:
    (area.path / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = check(eg, run(eg, "read_file", path=area.arg("n.txt"), offset=3, limit=2), Status.SUCCESS)
    assert out.text == "line 3\nline 4\n"
    assert (out.structured["start_line"], out.structured["end_line"]) == (3, 4)
    assert out.evidence.bytes_read == len("line 3\nline 4\n")

    tail = check(
        eg, run(eg, "read_file", path=area.arg("n.txt"), offset=9, limit=5), Status.SUCCESS
    )
    assert tail.text == "line 9\nline 10\n"
    assert tail.structured["end_line"] == 10

    last = check(eg, run(eg, "read_file", path=area.arg("n.txt"), offset=10), Status.SUCCESS)
    assert last.text == "line 10\n"

    first = check(eg, run(eg, "read_file", path=area.arg("n.txt"), limit=1), Status.SUCCESS)
    assert first.text == "line 1\n"


def test_read_file_missing_is_not_found(eg: Client, area: Area) -> None:
    out = check(
        eg,
        run(eg, "read_file", path=area.arg("nope.txt")),
        Status.FAILURE,
        "not_found",
        "arguments.path",
    )
    assert out.text == ""
    assert not (area.path / "nope.txt").exists()


def test_read_file_of_a_directory_is_invalid(eg: Client, area: Area) -> None:
    (area.path / "d").mkdir()
    out = check(
        eg,
        run(eg, "read_file", path=area.arg("d")),
        Status.FAILURE,
        "invalid_argument",
        "arguments.path",
    )
    assert "directory" in out.message


def test_output_cap_partial_results(tmp_path: Path) -> None:
    d = own_daemon(tmp_path / "x", "--output-cap", "1024")
    try:
        with Client(d.address) as c:
            # 100 lines of 20 bytes: byte 1024 falls inside line 52 (bytes 1020..1039).
            lines = [f"line {i:03d} ".ljust(19, "-") + "\n" for i in range(1, 101)]
            content = "".join(lines)
            (d.workspace / "big.txt").write_text(content)

            out = check(c, run(c, "read_file", path="big.txt"), Status.PARTIAL)
            assert out.truncated
            assert out.returned_bytes == 1024
            assert out.total_bytes == 2000
            assert out.text == content[:1024]
            assert out.structured["next_offset"] == 52
            assert out.message == "result truncated at the output cap"

            # Following next_offset pages through the file; a page's cut line comes again.
            pages, offset, seen = [], 1, 0
            while True:
                page = run(c, "read_file", path="big.txt", offset=offset)
                assert page.returned_bytes <= 1024
                if page.status is Status.SUCCESS:
                    pages.append(page.text)
                    break
                check(c, page, Status.PARTIAL)
                pages.append(page.text[: page.text.rindex("\n") + 1])
                offset = page.structured["next_offset"]
                seen += 1
                assert seen < 10
            assert "".join(pages) == content

            # A limit that keeps the read under the cap is a complete result.
            check(c, run(c, "read_file", path="big.txt", offset=52, limit=10), Status.SUCCESS)

            # Any tool's text is bounded the same way, on a character boundary.
            echo = check(c, run(c, "noop", echo="é" * 1000), Status.PARTIAL)
            assert echo.text == "é" * 512
            assert (echo.returned_bytes, echo.total_bytes) == (1024, 2000)

            # A command's output too; the journal keeps all of it.
            cmd = check(
                c, run(c, "run_command", argv=["sh", "-c", "yes x | head -c 5000"]), Status.PARTIAL
            )
            assert cmd.evidence.exit_code == 0
            assert cmd.truncated
            assert (cmd.returned_bytes, cmd.total_bytes) == (1024, 5000)
            assert cmd.text == "x\n" * 512
            raw = json.loads(c.get_call(cmd.call_id, include_raw=True).raw_result)
            assert raw["text"] == "x\n" * 2500
    finally:
        d.stop()
    assert d.proc is not None
    assert d.proc.returncode == 0


# ---------------------------------------------------------------- write_file


def test_write_file_creates(eg: Client, area: Area) -> None:
    content = "hello\nwörld\n"
    out = check(
        eg, run(eg, "write_file", path=area.arg("new.txt"), content=content), Status.SUCCESS
    )
    target = area.path / "new.txt"
    data = target.read_bytes()
    assert data == content.encode()
    assert out.evidence.bytes_written == len(data) == 13
    assert out.evidence.sha256_before == ""
    assert out.evidence.sha256_after == sha(data)
    assert out.evidence.path == str(target.resolve())
    assert out.structured == {"path": area.arg("new.txt"), "bytes_written": 13, "created": True}
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_write_file_overwrites(eg: Client, area: Area) -> None:
    target = area.path / "f.txt"
    target.write_bytes(b"old contents\n")
    out = check(eg, run(eg, "write_file", path=area.arg("f.txt"), content="new\n"), Status.SUCCESS)
    assert target.read_bytes() == b"new\n"
    assert out.evidence.sha256_before == sha(b"old contents\n")
    assert out.evidence.sha256_after == sha(target.read_bytes())
    assert out.evidence.bytes_written == 4
    assert out.structured["created"] is False

    empty = check(eg, run(eg, "write_file", path=area.arg("f.txt"), content=""), Status.SUCCESS)
    assert target.read_bytes() == b""
    assert empty.evidence.sha256_before == sha(b"new\n")
    assert empty.evidence.sha256_after == sha(b"")
    assert empty.evidence.bytes_written == 0


def test_write_file_create_dirs(eg: Client, area: Area) -> None:
    check(
        eg, run(eg, "write_file", path=area.arg("a", "b", "c.txt"), content="deep"), Status.SUCCESS
    )
    assert (area.path / "a" / "b" / "c.txt").read_text() == "deep"

    out = check(
        eg,
        run(eg, "write_file", path=area.arg("x", "y.txt"), content="z", create_dirs=False),
        Status.FAILURE,
        "not_found",
        "arguments.path",
    )
    assert out.evidence.sha256_after is None
    assert not (area.path / "x").exists()


def test_write_file_leaves_no_temp_files(eg: Client, area: Area) -> None:
    for i in range(5):
        check(eg, run(eg, "write_file", path=area.arg("f.txt"), content=f"v{i}"), Status.SUCCESS)
        check(eg, run(eg, "write_file", path=area.arg(f"g{i}.txt"), content="g"), Status.SUCCESS)
    check(
        eg,
        run(eg, "edit_file", path=area.arg("f.txt"), old_string="v4", new_string="v5"),
        Status.SUCCESS,
    )
    assert sorted(os.listdir(area.path)) == ["f.txt"] + [f"g{i}.txt" for i in range(5)]
    assert (area.path / "f.txt").read_text() == "v5"


def test_write_file_preserves_mode(eg: Client, area: Area) -> None:
    for name, mode in [("private.txt", 0o600), ("group.txt", 0o640), ("script.sh", 0o755)]:
        target = area.path / name
        target.write_text("before\n")
        target.chmod(mode)
        inode = target.stat().st_ino
        check(eg, run(eg, "write_file", path=area.arg(name), content="after\n"), Status.SUCCESS)
        assert target.read_text() == "after\n"
        assert stat.S_IMODE(target.stat().st_mode) == mode, name
        assert target.stat().st_ino != inode  # replaced by a rename, not written in place
    # edit_file goes through the same atomic replace.
    check(
        eg,
        run(eg, "edit_file", path=area.arg("script.sh"), old_string="after", new_string="edited"),
        Status.SUCCESS,
    )
    assert stat.S_IMODE((area.path / "script.sh").stat().st_mode) == 0o755


def test_write_file_onto_directory_fails(eg: Client, area: Area) -> None:
    (area.path / "d").mkdir()
    (area.path / "d" / "inside.txt").write_text("keep")
    out = check(
        eg,
        run(eg, "write_file", path=area.arg("d"), content="x"),
        Status.FAILURE,
        "invalid_argument",
        "arguments.path",
    )
    assert "directory" in out.message
    assert (area.path / "d").is_dir()
    assert os.listdir(area.path / "d") == ["inside.txt"]
    assert (area.path / "d" / "inside.txt").read_text() == "keep"
    assert sorted(os.listdir(area.path)) == ["d"]


def test_write_file_under_a_file_fails(eg: Client, area: Area) -> None:
    (area.path / "f.txt").write_text("plain")
    check(
        eg,
        run(eg, "write_file", path=area.arg("f.txt", "x.txt"), content="x"),
        Status.FAILURE,
        "invalid_argument",
        "arguments.path",
    )
    check(
        eg,
        run(eg, "write_file", path=area.arg("f.txt", "a", "x.txt"), content="x"),
        Status.FAILURE,
        "invalid_argument",
        "arguments.path",
    )
    assert (area.path / "f.txt").read_text() == "plain"
    assert sorted(os.listdir(area.path)) == ["f.txt"]


# ---------------------------------------------------------------- edit_file


def test_edit_file_replaces_exactly_once(eg: Client, area: Area) -> None:
    target = area.path / "m.py"
    before = b"def f():\n    return 1\n\ndef g():\n    return 2\n"
    target.write_bytes(before)
    out = check(
        eg,
        run(eg, "edit_file", path=area.arg("m.py"), old_string="return 1", new_string="return 10"),
        Status.SUCCESS,
    )
    after = target.read_bytes()
    assert after == b"def f():\n    return 10\n\ndef g():\n    return 2\n"
    assert out.structured["replacements"] == 1
    assert out.evidence.sha256_before == sha(before)
    assert out.evidence.sha256_after == sha(after)
    assert out.evidence.bytes_written == len(after)


def test_edit_file_no_match_changes_nothing(eg: Client, area: Area) -> None:
    target = area.path / "m.txt"
    target.write_bytes(b"one two three\n")
    st = target.stat()
    check(
        eg,
        run(eg, "edit_file", path=area.arg("m.txt"), old_string="four", new_string="4"),
        Status.FAILURE,
        "no_match",
        "arguments.old_string",
    )
    assert target.read_bytes() == b"one two three\n"
    assert (target.stat().st_ino, target.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns)


def test_edit_file_ambiguous_match_changes_nothing(eg: Client, area: Area) -> None:
    target = area.path / "m.txt"
    target.write_bytes(b"x = 1\ny = 2\nx = 1\n")
    st = target.stat()
    out = check(
        eg,
        run(eg, "edit_file", path=area.arg("m.txt"), old_string="x = 1", new_string="x = 3"),
        Status.FAILURE,
        "ambiguous_match",
        "arguments.old_string",
    )
    assert "2 times" in out.message
    assert target.read_bytes() == b"x = 1\ny = 2\nx = 1\n"
    assert (target.stat().st_ino, target.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns)


def test_edit_file_replace_all(eg: Client, area: Area) -> None:
    target = area.path / "m.txt"
    target.write_bytes(b"x = 1\ny = 2\nx = 1\n")
    out = check(
        eg,
        run(
            eg,
            "edit_file",
            path=area.arg("m.txt"),
            old_string="x = 1",
            new_string="x = 3",
            replace_all=True,
        ),
        Status.SUCCESS,
    )
    assert target.read_bytes() == b"x = 3\ny = 2\nx = 3\n"
    assert out.structured["replacements"] == 2
    assert out.evidence.sha256_after == sha(target.read_bytes())


def test_edit_file_missing_is_not_found(eg: Client, area: Area) -> None:
    check(
        eg,
        run(eg, "edit_file", path=area.arg("nope.txt"), old_string="a", new_string="b"),
        Status.FAILURE,
        "not_found",
        "arguments.path",
    )
    assert not (area.path / "nope.txt").exists()


# ---------------------------------------------------------------- list_dir


def test_list_dir(eg: Client, area: Area) -> None:
    (area.path / "b.txt").write_text("bb")
    (area.path / "a.txt").write_text("a")
    (area.path / "sub").mkdir()
    (area.path / "link").symlink_to("a.txt")
    out = check(eg, run(eg, "list_dir", path=area.rel), Status.SUCCESS)
    assert out.text.splitlines() == ["a.txt", "b.txt", "link", "sub/"]
    entries = {e["name"]: e for e in out.structured["entries"]}
    assert {n: e["type"] for n, e in entries.items()} == {
        "a.txt": "file",
        "b.txt": "file",
        "link": "symlink",
        "sub": "dir",
    }
    assert entries["b.txt"]["size"] == 2
    assert out.structured["total_entries"] == 4
    assert not out.truncated

    # Exactly as many entries as allowed: complete.
    check(eg, run(eg, "list_dir", path=area.rel, max_entries=4), Status.SUCCESS)


def test_list_dir_max_entries_is_partial(eg: Client, area: Area) -> None:
    for name in ("c", "a", "b"):
        (area.path / name).write_text(name)
    out = check(eg, run(eg, "list_dir", path=area.rel, max_entries=2), Status.PARTIAL)
    assert out.truncated
    assert out.text.splitlines() == ["a", "b"]
    assert out.structured["total_entries"] == 3
    assert len(out.structured["entries"]) == 2


def test_list_dir_failures(eg: Client, area: Area) -> None:
    (area.path / "f.txt").write_text("x")
    check(
        eg,
        run(eg, "list_dir", path=area.arg("f.txt")),
        Status.FAILURE,
        "invalid_argument",
        "arguments.path",
    )
    check(
        eg,
        run(eg, "list_dir", path=area.arg("nope")),
        Status.FAILURE,
        "not_found",
        "arguments.path",
    )


def test_list_dir_defaults_to_the_workspace(eg: Client, area: Area) -> None:
    out = check(eg, eg.execute_one("list_dir"), Status.SUCCESS)
    assert area.rel + "/" in out.text.splitlines()


# ---------------------------------------------------------------- search


@pytest.fixture
def tree(area: Area) -> Area:
    (area.path / "src").mkdir()
    (area.path / "src" / "a.py").write_text("def foo():\n    return FOO\n")
    (area.path / "src" / "b.txt").write_text("nothing\nfoo bar\n")
    (area.path / "src" / "c.py").write_text("nothing here\n")
    (area.path / "src" / "bin.dat").write_bytes(b"foo\x00\x01")
    (area.path / ".git").mkdir()
    (area.path / ".git" / "foo").write_text("foo in vcs\n")
    return area


def test_search_finds_file_and_line(eg: Client, tree: Area) -> None:
    out = check(eg, run(eg, "search", pattern="foo", path=tree.rel), Status.SUCCESS)
    assert out.text.splitlines() == [
        f"{tree.rel}/src/a.py:1: def foo():",
        f"{tree.rel}/src/b.txt:2: foo bar",
    ]
    assert out.structured["matches"] == 2
    assert out.structured["limited"] is False


def test_search_glob(eg: Client, tree: Area) -> None:
    out = check(eg, run(eg, "search", pattern="foo", path=tree.rel, glob="*.py"), Status.SUCCESS)
    assert out.text.splitlines() == [f"{tree.rel}/src/a.py:1: def foo():"]
    none = check(eg, run(eg, "search", pattern="foo", path=tree.rel, glob="*.md"), Status.SUCCESS)
    assert none.text == ""
    assert none.structured["matches"] == 0


def test_search_case_insensitive(eg: Client, tree: Area) -> None:
    out = check(
        eg,
        run(eg, "search", pattern="foo", path=tree.arg("src", "a.py"), case_insensitive=True),
        Status.SUCCESS,
    )
    assert out.text.splitlines() == [
        f"{tree.rel}/src/a.py:1: def foo():",
        f"{tree.rel}/src/a.py:2:     return FOO",
    ]
    exact = check(
        eg, run(eg, "search", pattern="FOO", path=tree.arg("src", "a.py")), Status.SUCCESS
    )
    assert exact.text.splitlines() == [f"{tree.rel}/src/a.py:2:     return FOO"]


def test_search_invalid_regex_is_rejected(eg: Client, tree: Area) -> None:
    # The pattern is compiled (after its cost is bounded) at validation: REJECTED.
    out = check(
        eg,
        run(eg, "search", pattern="(unclosed", path=tree.rel),
        Status.REJECTED,
        "invalid_argument",
        "arguments.pattern",
    )
    assert "not a valid regex" in out.message


def test_search_max_results_is_partial(eg: Client, area: Area) -> None:
    for i in range(5):
        (area.path / f"f{i}.txt").write_text(f"hit {i}\nmiss\nhit again {i}\n")
    out = check(eg, run(eg, "search", pattern="hit", path=area.rel, max_results=3), Status.PARTIAL)
    assert out.truncated
    assert out.text.splitlines() == [
        f"{area.rel}/f0.txt:1: hit 0",
        f"{area.rel}/f0.txt:3: hit again 0",
        f"{area.rel}/f1.txt:1: hit 1",
    ]
    assert out.structured["matches"] == 3
    assert out.structured["limited"] is True


def test_search_exactly_max_results_is_complete(eg: Client, area: Area) -> None:
    for i in range(3):
        (area.path / f"f{i}.txt").write_text(f"hit {i}\n")
    out = check(eg, run(eg, "search", pattern="hit", path=area.rel, max_results=3), Status.SUCCESS)
    assert len(out.text.splitlines()) == 3
    assert out.structured["limited"] is False


def test_search_missing_path_is_not_found(eg: Client, area: Area) -> None:
    check(
        eg,
        run(eg, "search", pattern="x", path=area.arg("nope")),
        Status.FAILURE,
        "not_found",
        "arguments.path",
    )


def test_search_catastrophic_pattern_times_out(eg: Client, area: Area) -> None:
    (area.path / "evil.txt").write_text("a" * 40 + "!\n")
    started = time.monotonic()
    out = check(
        eg,
        run(eg, "search", timeout=0.5, pattern="(a|aa)+$", path=area.rel),
        Status.FAILURE,
        "timeout",
        "arguments.pattern",
    )
    assert time.monotonic() - started < 10
    assert "evil.txt:1" in out.message


# ---------------------------------------------------------------- run_command


def test_run_command_success(eg: Client) -> None:
    out = check(eg, run(eg, "run_command", argv=["echo", "hello"]), Status.SUCCESS)
    assert out.text == "hello\n"
    assert out.evidence.exit_code == 0
    assert out.evidence.signal is None
    assert out.structured == {"exit_code": 0, "signal": None, "stdout_bytes": 6, "stderr_bytes": 0}
    assert eg.get_call(out.call_id).may_write


def test_run_command_nonzero_exit(eg: Client) -> None:
    out = check(
        eg,
        run(eg, "run_command", argv=["sh", "-c", "echo out; echo err >&2; exit 3"]),
        Status.FAILURE,
        "nonzero_exit",
    )
    assert out.evidence.exit_code == 3
    assert out.message == "exited with status 3"
    assert out.text == "out\n\n[stderr]\nerr\n"
    assert out.structured["stdout_bytes"] == 4
    assert out.structured["stderr_bytes"] == 4


def test_run_command_killed_by_signal(eg: Client) -> None:
    out = check(
        eg,
        run(eg, "run_command", argv=["sh", "-c", "kill -KILL $$"]),
        Status.FAILURE,
        "nonzero_exit",
    )
    assert out.evidence.exit_code is None
    assert out.evidence.signal == 9
    assert out.message == "killed by signal 9"


def test_run_command_program_not_found(eg: Client, area: Area) -> None:
    check(
        eg,
        run(eg, "run_command", argv=["no-such-program-execgate"]),
        Status.FAILURE,
        "not_found",
        "arguments.argv[0]",
    )
    (area.path / "not-executable").write_text("#!/bin/sh\necho hi > ran.txt\n")
    check(
        eg,
        run(eg, "run_command", argv=["./not-executable"], cwd=area.rel),
        Status.FAILURE,
        "permission_denied",
        "arguments.argv[0]",
    )
    assert not (area.path / "ran.txt").exists()


def test_run_command_stdin(eg: Client) -> None:
    out = check(
        eg, run(eg, "run_command", argv=["cat"], stdin="piped\ninput ünïcode"), Status.SUCCESS
    )
    assert out.text == "piped\ninput ünïcode"
    # Without stdin the command reads /dev/null and does not wait.
    empty = check(eg, run(eg, "run_command", argv=["cat"], timeout=10), Status.SUCCESS)
    assert empty.text == ""


def test_run_command_cwd(eg: Client, shared: Daemon, area: Area) -> None:
    (area.path / "sub").mkdir()
    out = check(eg, run(eg, "run_command", argv=["pwd"], cwd=area.arg("sub")), Status.SUCCESS)
    assert out.text == f"{(area.path / 'sub').resolve()}\n"
    default = check(eg, run(eg, "run_command", argv=["pwd"]), Status.SUCCESS)
    assert default.text == f"{shared.workspace.resolve()}\n"
    check(
        eg,
        run(eg, "run_command", argv=["sh", "-c", "echo made > made.txt"], cwd=area.rel),
        Status.SUCCESS,
    )
    assert (area.path / "made.txt").read_text() == "made\n"

    check(
        eg,
        run(eg, "run_command", argv=["pwd"], cwd=".."),
        Status.REJECTED,
        "permission_denied",
        "arguments.cwd",
    )
    check(
        eg,
        run(eg, "run_command", argv=["pwd"], cwd=area.arg("nope")),
        Status.FAILURE,
        "not_found",
        "arguments.cwd",
    )
    (area.path / "f.txt").write_text("x")
    check(
        eg,
        run(eg, "run_command", argv=["pwd"], cwd=area.arg("f.txt")),
        Status.FAILURE,
        "not_found",
        "arguments.cwd",
    )


def test_run_command_env_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s3cr3t-" + uuid.uuid4().hex
    monkeypatch.setenv("EXECGATE_TEST_SECRET", secret)
    d = own_daemon(tmp_path / "env")
    try:
        assert d.proc is not None
        # The daemon itself has the variable...
        assert secret.encode() in Path(f"/proc/{d.proc.pid}/environ").read_bytes()
        with Client(d.address) as c:
            out = check(c, run(c, "run_command", argv=["env"]), Status.SUCCESS)
            # ...the command does not.
            assert secret not in out.text
            assert "EXECGATE_TEST_SECRET" not in out.text
            env = dict(line.split("=", 1) for line in out.text.splitlines())
            # The call's marker (how its processes are found), and bwrap's PWD.
            assert re.fullmatch("[0-9a-f]{16}", env.pop("EXECGATE_CALL"))
            assert env.pop("PWD", str(d.workspace.resolve())) == str(d.workspace.resolve())
            assert env == {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8",
                "HOME": str(d.workspace.resolve()),
            }
            extra = check(
                c, run(c, "run_command", argv=["env"], env={"FOO": "bar baz"}), Status.SUCCESS
            )
            assert "FOO=bar baz" in extra.text.splitlines()
            assert secret not in extra.text
    finally:
        d.stop()


def test_run_command_no_shell_interpretation(eg: Client, area: Area) -> None:
    argv = ["echo", "a;b && c", "$(touch pwned)", "`touch pwned2`", "*", "> out.txt", "|", "x"]
    out = check(eg, run(eg, "run_command", argv=argv, cwd=area.rel), Status.SUCCESS)
    assert out.text == "a;b && c $(touch pwned) `touch pwned2` * > out.txt | x\n"
    assert os.listdir(area.path) == []


def test_run_command_timeout_cooperative(eg: Client) -> None:
    started = time.monotonic()
    out = check(
        eg,
        run(eg, "run_command", timeout=0.5, argv=["sleep", "30"]),
        Status.UNKNOWN_OUTCOME,
        "timeout",
    )
    elapsed = time.monotonic() - started
    assert out.stopped_how is StopMode.COOPERATIVE
    assert out.evidence.signal == 15
    assert out.evidence.exit_code is None
    p = phases(out)
    for phase in ("started", "cancel_requested", "signal_sent", "stopped", "finished"):
        assert phase in p, p
    assert (
        p.index("started")
        < p.index("cancel_requested")
        < p.index("signal_sent")
        < p.index("stopped")
        < p.index("finished")
    )
    assert "grace_expired" not in p
    assert "force_terminated" not in p
    assert out.mark("cancel_requested").detail == "timeout after 0.5s"
    waited = out.mark("cancel_requested").at - out.mark("started").at
    assert 0.4 <= waited < 5
    assert elapsed < 10
    assert eg.get_call(out.call_id).outcome.timeline == out.timeline


def test_run_command_timeout_force_terminated(eg: Client, area: Area) -> None:
    started = time.monotonic()
    tag = uuid.uuid4().hex
    script = "trap '' TERM; sleep 30 & echo started > pids; wait"
    out = check(
        eg,
        run(
            eg,
            "run_command",
            timeout=0.5,
            argv=["sh", "-c", script],
            cwd=area.rel,
            env={"EG_TEST_TAG": tag},
        ),
        Status.UNKNOWN_OUTCOME,
        "timeout",
    )
    elapsed = time.monotonic() - started
    assert out.stopped_how is StopMode.FORCE_TERMINATED
    assert out.evidence.signal == 9
    assert out.evidence.survivors == 0
    p = phases(out)
    order = ["cancel_requested", "signal_sent", "grace_expired", "force_terminated", "stopped"]
    assert [x for x in p if x in order] == order
    grace = out.mark("grace_expired").at - out.mark("signal_sent").at
    assert 1.8 <= grace < 5  # the daemon's default grace is 2 s
    assert elapsed < 15
    # Nothing the command started is left running: the shell and its sleep are gone
    # (found by their environment: pids inside a sandbox's namespace are not ours).
    assert (area.path / "pids").read_text() == "started\n"
    assert tagged("EG_TEST_TAG", tag) == []


# ---------------------------------------------------------------- all statuses, journaled


def test_every_status_is_reachable_and_journaled(daemon: Daemon, client: Client) -> None:
    (daemon.workspace / "d").mkdir()
    (daemon.workspace / "d" / "one").write_text("1")
    (daemon.workspace / "d" / "two").write_text("2")
    calls = {
        Status.SUCCESS: Call(tool="noop", arguments={"echo": "hi"}),
        Status.FAILURE: Call(tool="read_file", arguments={"path": "missing.txt"}),
        Status.REJECTED: Call(tool="no_such_tool", arguments={}),
        Status.PARTIAL: Call(tool="list_dir", arguments={"path": "d", "max_entries": 1}),
        Status.UNKNOWN_OUTCOME: Call(
            tool="run_command", arguments={"argv": ["sleep", "30"]}, timeout=0.3
        ),
    }
    outcomes = dict(zip(calls, client.execute(list(calls.values())), strict=True))
    expected = {
        Status.SUCCESS: "none",
        Status.FAILURE: "not_found",
        Status.REJECTED: "unknown_tool",
        Status.PARTIAL: "none",
        Status.UNKNOWN_OUTCOME: "timeout",
    }
    for status, outcome in outcomes.items():
        check(client, outcome, status, expected[status])
    assert outcomes[Status.SUCCESS].text == "hi"
    assert outcomes[Status.REJECTED].field == "tool"

    records = client.list_calls()
    assert sorted(r.call_id for r in records) == sorted(o.call_id for o in outcomes.values())
    for status, outcome in outcomes.items():
        only = client.list_calls(statuses=[status])
        assert [r.call_id for r in only] == [outcome.call_id]
        assert only[0].outcome is not None
        assert only[0].outcome.status is status
    by_id = {r.call_id: r for r in records}
    assert by_id[outcomes[Status.UNKNOWN_OUTCOME].call_id].may_write
    assert not by_id[outcomes[Status.FAILURE].call_id].may_write
