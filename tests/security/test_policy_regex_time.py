"""A `when: matches` regex that backtracks badly cannot hold the daemon.

The pattern is the policy author's, the argument the model's. Through a real
daemon: an argument that makes `(a|aa)+` backtrack for hours is refused within
the match time limit (fail closed: REJECTED, naming the argument), and the
daemon keeps answering; an argument the regex decides at once is allowed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client, Status
from execgate.executor.policy.model import MATCH_SECONDS
from tests.daemon import Daemon

POLICY = """\
version: 1
default: deny
rules:
  - id: a-runs-only
    effect: allow
    tools: [write_file]
    when:
      - {arg: content, matches: "(a|aa)+"}
  - id: reads
    effect: allow
    tools: [list_dir]
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("regex-time")
    (root / "policy.yaml").write_text(POLICY)
    d = Daemon(root, "--policy", str(root / "policy.yaml")).start()
    yield d
    d.stop()


@pytest.mark.parametrize("length", [40, 60, 200])
def test_a_backtracking_match_is_refused_in_time(daemon: Daemon, length: int) -> None:
    with Client(daemon.address) as c:
        began = time.monotonic()
        o = c.execute_one("write_file", path="x.txt", content="a" * length + "!")
        took = time.monotonic() - began
        assert (o.status, o.error_class, o.field) == (
            Status.REJECTED,
            "policy_denied",
            "arguments.content",
        ), o
        assert "could not decide" in o.message
        assert took < 30 * MATCH_SECONDS + 5  # the limit, plus a loaded machine's RPC
        assert c.execute_one("list_dir", path=".").status is Status.SUCCESS
    assert not (daemon.workspace / "x.txt").exists()


def test_a_match_decided_at_once_still_allows(daemon: Daemon) -> None:
    with Client(daemon.address) as c:
        o = c.execute_one("write_file", path="y.txt", content="aaaa")
    assert o.status is Status.SUCCESS, o
    assert (Path(daemon.workspace) / "y.txt").read_text() == "aaaa"
