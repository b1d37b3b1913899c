"""Trying to get round a policy through a real daemon: path spellings, symlinks, case,
trees, and command argv.

One daemon serves the whole module with the shipped policy plus two deny rules:
`no-secrets-dir` (anything under `secret/`, every tool) and `no-rm` (run_command
with argv starting `rm` or `git push`). The workspace holds:

    secret/token.txt        the secret (a unique marker, so a leak is unmistakable)
    ok/a.txt                an ordinary file
    ok/link -> ../secret/token.txt
    alias   -> secret       a directory symlink
    .env                    the same marker, under the shipped `secrets` rule

Every spelling that reaches the secret must come back REJECTED/policy_denied,
NOT_STARTED, with the secret nowhere in the outcome or the journal, and the file
unchanged. The policy sees canonical workspace-relative paths (validation resolves
`..`, `.`, `//`, absolute spellings and symlinks first), which is why they all land
on the same rule. Where the daemon's own confinement answers first (a path that
resolves outside the workspace), the answer is REJECTED/permission_denied and the
policy is never asked; those cases are marked as such.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execgate.client import Call, Client, Outcome, Status, StopMode
from execgate.executor.policy import default_policy_path, parse_policy
from tests.daemon import Daemon

SECRET = f"TOKEN-{uuid.uuid4().hex}"

EXTRA_RULES = """\
  - id: no-secrets-dir
    effect: deny
    paths: ["secret/"]
    reason: the secret directory is off limits
  - id: no-rm
    effect: deny
    tools: [run_command]
    argv_prefix: [[rm], [git, push]]
    reason: no deleting, no pushing
"""


def _policy_text() -> str:
    """The shipped policy with EXTRA_RULES first in its rule list."""
    text = default_policy_path().read_text()
    assert text.count("\nrules:\n") == 1, "policies/default.yaml changed shape"
    text = text.replace("\nrules:\n", "\nrules:\n" + EXTRA_RULES, 1)
    ids = {r.id for r in parse_policy(text, "bypass.yaml").rules}
    assert {"no-secrets-dir", "no-rm", "secrets", "workspace-reads"} <= ids
    return text


@dataclass(frozen=True)
class Gate:
    daemon: Daemon
    client: Client

    @property
    def ws(self) -> Path:
        return self.daemon.workspace

    @property
    def token(self) -> Path:
        return self.ws / "secret" / "token.txt"


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    root = tmp_path_factory.mktemp("bypass")
    policy = root / "policy.yaml"
    policy.write_text(_policy_text())
    ws = root / "workspace"
    (ws / "secret").mkdir(parents=True)
    (ws / "secret" / "token.txt").write_text(SECRET + "\n")
    (ws / "ok").mkdir()
    (ws / "ok" / "a.txt").write_text("ordinary\n")
    (ws / "ok" / "link").symlink_to("../secret/token.txt")
    (ws / "alias").symlink_to("secret", target_is_directory=True)
    (ws / ".env").write_text(f"API_KEY={SECRET}\n")
    (root / "outside.txt").write_text(SECRET + "\n")  # for the confinement cases
    (ws / "ok" / "escape").symlink_to(root / "outside.txt")
    daemon = Daemon(root, "--policy", str(policy)).start()
    try:
        with Client(daemon.address) as client:
            yield Gate(daemon, client)
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()


def run(gate: Gate, tool: str, **arguments: object) -> Outcome:
    return gate.client.run(Call(tool=tool, arguments=arguments))


def assert_no_leak(gate: Gate, out: Outcome) -> None:
    """The secret is in neither the outcome nor the journal's record of it."""
    record = gate.client.get_call(out.call_id)
    seen = [out.text, out.message, json.dumps(out.structured), record.raw_result]
    assert not any(SECRET in s for s in seen), out


def refused(gate: Gate, error_class: str, tool: str, **arguments: object) -> Outcome:
    """Run the call; assert it was REJECTED with `error_class`, never started, leaked nothing."""
    out = run(gate, tool, **arguments)
    assert (out.status, out.error_class) == (Status.REJECTED, error_class), out
    assert out.stopped_how is StopMode.NOT_STARTED, out
    assert out.mark("started") is None, out
    assert (out.evidence.bytes_read, out.evidence.bytes_written) == (None, None), out
    record = gate.client.get_call(out.call_id)
    assert record.outcome is not None
    assert (record.outcome.status, record.outcome.error_class) == (out.status, out.error_class)
    assert_no_leak(gate, out)
    return out


def policy_denied(gate: Gate, rule: str, tool: str, **arguments: object) -> Outcome:
    out = refused(gate, "policy_denied", tool, **arguments)
    assert f"denied by policy ({rule})" in out.message, out
    return out


@pytest.fixture
def untouched(gate: Gate) -> Iterator[None]:
    """The secret directory is exactly as the module made it when the test ends."""
    before = (gate.token.read_bytes(), gate.token.stat().st_mtime_ns)
    yield
    assert (gate.token.read_bytes(), gate.token.stat().st_mtime_ns) == before
    assert sorted(os.listdir(gate.ws / "secret")) == ["token.txt"]
    assert os.readlink(gate.ws / "ok" / "link") == "../secret/token.txt"


# ---------------------------------------------------------------- reading the secret

# Every one of these is canonicalised by validation to `secret/token.txt`.
SPELLINGS = [
    "secret/token.txt",
    "./secret/token.txt",
    "ok/../secret/token.txt",
    "secret//token.txt",
    "secret/./token.txt",
    "secret/token.txt/",
    "ok/../alias/../secret/token.txt",
    "ok/link",  # a file symlink into the denied directory
    "alias/token.txt",  # a directory symlink onto it
    "./alias//./token.txt",
    "{ws}/secret/token.txt",  # absolute, inside the workspace
    "{ws}/alias/token.txt",
    "../workspace/secret/token.txt",  # leaves the workspace and comes back in
    "/proc/self/cwd/workspace/secret/token.txt",  # the daemon's cwd is the test root
]


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_read_file_of_the_secret_is_policy_denied(gate: Gate, spelling: str) -> None:
    path = spelling.format(ws=gate.ws)
    policy_denied(gate, "no-secrets-dir", "read_file", path=path)
    # search on a single file searches that file: the same path, the same answer.
    policy_denied(gate, "no-secrets-dir", "search", pattern=".", path=path)


@pytest.mark.parametrize("path", [".env", "./.env", "ok/../.env", "{ws}/.env"])
def test_the_shipped_secrets_rule_still_holds(gate: Gate, path: str) -> None:
    policy_denied(gate, "secrets", "read_file", path=path.format(ws=gate.ws))
    policy_denied(gate, "secrets", "edit_file", path=".env", old_string="A", new_string="B")
    assert (gate.ws / ".env").read_text() == f"API_KEY={SECRET}\n"


def test_the_ordinary_file_next_door_is_readable(gate: Gate) -> None:
    """The control: the rule denies the secret, not everything."""
    out = run(gate, "read_file", path="ok/a.txt")
    assert (out.status, out.text) == (Status.SUCCESS, "ordinary\n"), out


def test_other_case_is_another_path_and_never_the_secret(gate: Gate) -> None:
    """Linux filesystems are case-sensitive: `SECRET/token.txt` is a different path the
    rule does not cover -- and one that does not exist, so nothing is read."""
    for path in ("SECRET/token.txt", "Secret/token.txt", "SECRET/../SECRET/token.txt"):
        out = run(gate, "read_file", path=path)
        assert (out.status, out.error_class) == (Status.FAILURE, "not_found"), out
        assert_no_leak(gate, out)
    # Under the real directory any name is covered, whatever its case.
    policy_denied(gate, "no-secrets-dir", "read_file", path="secret/TOKEN.txt")


@pytest.mark.parametrize(
    "path",
    [
        "../outside.txt",
        "ok/escape",  # a symlink out of the workspace
        "{ws}/../outside.txt",
        "/etc/hostname",
    ],
)
def test_paths_outside_the_workspace_are_confinement_not_policy(gate: Gate, path: str) -> None:
    """The daemon's confinement answers before the policy is asked: permission_denied."""
    out = refused(gate, "permission_denied", "read_file", path=path.format(ws=gate.ws))
    assert "resolves outside the workspace" in out.message


# ---------------------------------------------------------------- trees over the secret


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize("path", ["secret/", "secret", "./secret/", "alias", "alias/"])
def test_list_dir_of_the_denied_directory_is_policy_denied(gate: Gate, path: str) -> None:
    out = policy_denied(gate, "no-secrets-dir", "list_dir", path=path)
    assert "token.txt" not in out.text


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize("path", [".", "ok", "secret", "alias"])
def test_search_over_a_tree_never_returns_the_secret(gate: Gate, path: str) -> None:
    """Either outcome would be safe: the search refused, or run with the denied files
    left out. What must never happen is the secret in the result. (With path `.` the
    shipped policy's own `secrets` rule is bypassed the same way: `.env` is returned.)"""
    out = run(gate, "search", pattern="TOKEN", path=path)
    if out.status is Status.REJECTED:
        assert out.error_class == "policy_denied", out
    assert_no_leak(gate, out)


# ---------------------------------------------------------------- writing the secret


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize(
    "path",
    [
        "secret/token.txt",
        "secret/new.txt",  # does not exist yet: denied all the same, and not created
        "secret/sub/new.txt",
        "ok/../secret/token.txt",
        "ok/link",  # through the file symlink: resolves to secret/token.txt
        "alias/token.txt",
        "alias/new.txt",
        "{ws}/secret/token.txt",
    ],
)
def test_write_file_into_the_secret_directory_is_policy_denied(gate: Gate, path: str) -> None:
    policy_denied(
        gate, "no-secrets-dir", "write_file", path=path.format(ws=gate.ws), content="pwned\n"
    )


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize("path", ["secret/token.txt", "ok/link", "alias/token.txt"])
def test_edit_file_of_the_secret_is_policy_denied(gate: Gate, path: str) -> None:
    policy_denied(
        gate, "no-secrets-dir", "edit_file", path=path, old_string="TOKEN", new_string="x"
    )


# ---------------------------------------------------------------- commands


@pytest.fixture
def victim(gate: Gate) -> Path:
    """A fresh directory a command may try to delete (so `ok/` survives every test)."""
    path = gate.ws / f"victim_{uuid.uuid4().hex[:8]}"
    path.mkdir()
    (path / "f.txt").write_text("x")
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["rm", "-rf", "{victim}"],
        ["rm"],
        ["rm", "--", "{victim}/f.txt"],
        ["git", "push"],
        ["git", "push", "--force", "origin", "main"],
    ],
)
def test_denied_commands_are_policy_denied(gate: Gate, victim: Path, argv: list[str]) -> None:
    argv = [a.format(victim=victim.name) for a in argv]
    policy_denied(gate, "no-rm", "run_command", argv=argv)
    assert (victim / "f.txt").exists()


def test_the_policy_cannot_see_into_a_shell_string(gate: Gate, victim: Path) -> None:
    """CURRENT BEHAVIOUR, by design: `argv_prefix` compares tokens, and the tokens here
    are `sh`, `-c` and one string; `rm` is inside that string, where no rule looks. The
    same holds for any program that runs another (`env rm`, `find -delete`, `python
    -c`, `xargs rm`) and for a path to the program (`/bin/rm`). A deny-list of
    commands therefore cannot stop a determined agent: where shells or interpreters
    are allowed, security teams must allow-list the commands that may run (and deny
    the rest by default), not deny-list the dangerous ones."""
    out = run(gate, "run_command", argv=["sh", "-c", f"rm -rf {victim.name}"])
    assert out.status is Status.SUCCESS, out
    assert not victim.exists()


def test_the_policy_does_not_match_a_program_by_its_path(gate: Gate, victim: Path) -> None:
    """CURRENT BEHAVIOUR: `/bin/rm` is not the token `rm`, so `no-rm` does not match and
    rm runs (see the shell test above for why deny-lists cannot be made tight)."""
    out = run(gate, "run_command", argv=["/bin/rm", "-rf", victim.name])
    assert out.status is Status.SUCCESS, out
    assert not victim.exists()


def test_paths_rules_do_not_see_command_arguments(gate: Gate) -> None:
    """CURRENT BEHAVIOUR: a command's only paths, as the policy sees them, are its cwd;
    file names in argv are opaque strings. `no-secrets-dir` therefore does not stop
    `cat secret/token.txt` -- the sandbox shows the command the whole workspace. Paths
    rules bind the file tools; commands must be governed by argv rules (allow-listed)."""
    out = run(gate, "run_command", argv=["cat", "secret/token.txt"])
    assert (out.status, out.text) == (Status.SUCCESS, SECRET + "\n"), out


@pytest.mark.parametrize(
    "arg",
    [
        "ok && rm -rf ok",
        "ok; rm -rf ok",
        "ok | rm -rf ok",
        "$(rm -rf ok)",
        "`rm -rf ok`",
        "ok\nrm -rf ok",
        "ok > ok/a.txt",
    ],
)
def test_shell_syntax_in_argv_is_a_plain_argument(gate: Gate, arg: str) -> None:
    """No shell is involved: argv goes to execve as is, so `&&`, `;`, `|`, `$(…)`,
    backticks, newlines and redirections are characters in echo's one argument. echo
    prints it back, and `ok/` is untouched."""
    out = run(gate, "run_command", argv=["echo", arg])
    assert (out.status, out.text) == (Status.SUCCESS, arg + "\n"), out
    assert (gate.ws / "ok" / "a.txt").read_text() == "ordinary\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["rm\n", "-rf", "ok"],
        ["rm ", "-rf", "ok"],
        [" rm", "-rf", "ok"],
        ["rm;", "-rf", "ok"],
        ["rm -rf ok"],
    ],
)
def test_near_miss_rm_tokens_are_not_matched_but_cannot_run_rm(gate: Gate, argv: list[str]) -> None:
    """`rm\\n`, `rm ` and friends are other tokens, so `no-rm` does not match them (the
    call is not REJECTED) -- and, with no shell to trim or split them, they are also
    the names of programs that do not exist: the call fails not_found on argv[0]."""
    out = run(gate, "run_command", argv=argv)
    assert (out.status, out.error_class) == (Status.FAILURE, "not_found"), out
    assert out.field == "arguments.argv[0]", out
    assert (gate.ws / "ok" / "a.txt").read_text() == "ordinary\n"
