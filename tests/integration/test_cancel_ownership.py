"""Who may cancel what, through a real daemon: an agent stops only its own calls and
runs; an operator (or admin) stops anyone's.

Identities: `bot` and `carol` are agents, `olga` is an operator. A refused cancel must
leave no trace: no row in the journal's `cancels` table, no bar on the run, and the
call it aimed at still running (its process is looked for on the host). Long calls
are `work` calls (a real process reading a file, then sleeping), so that several can
run at once on different files.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from execgate.client import Call, Client, EventKind, PermissionDenied, Status
from execgate.executor.policy.identity import hash_token
from tests.cancel_support import new_tag, work
from tests.daemon import Daemon
from tests.support import Streamer, wait_until, work_pids, work_sleeping

TOKENS = {name: f"{name}-" + name[0] * 40 for name in ("bot", "carol", "olga")}
IDENTITIES = f"""\
version: 1
identities:
  - name: bot
    roles: [agent]
    token_sha256: {hash_token(TOKENS["bot"])}
  - name: carol
    roles: [agent]
    token_sha256: {hash_token(TOKENS["carol"])}
  - name: olga
    roles: [operator]
    token_sha256: {hash_token(TOKENS["olga"])}
"""
POLICY = "version: 1\ndefault: deny\nrules:\n  - {id: all, effect: allow, tools: ['*']}\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("ownership")
    (root / "identities.yaml").write_text(IDENTITIES)
    (root / "policy.yaml").write_text(POLICY)
    home = root / "daemon"
    home.mkdir()
    d = Daemon(
        home,
        "--identities", str(root / "identities.yaml"),
        "--policy", str(root / "policy.yaml"),
        "--sandbox", "process",
    ).start()  # fmt: skip
    yield d
    if d.proc is not None and d.proc.poll() is None:
        assert d.stop() == 0


def as_(d: Daemon, who: str) -> Client:
    return Client(d.address, token=TOKENS[who])


def cancels(d: Daemon) -> list[tuple[str, str, str, str]]:
    """(requester, run_id, batch_id, call_id) of every cancel request the journal holds."""
    with sqlite3.connect(f"file:{d.state_dir / 'journal.db'}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT requester, run_id, batch_id, call_id FROM cancels ORDER BY seq")
        return rows.fetchall()


class Long:
    """A `work` call of `who` sleeping 30 s on its own file, streamed in the background."""

    def __init__(self, d: Daemon, who: str, run: str, batch: str = "") -> None:
        tag = new_tag()[:8]
        self.call_id = f"long-{who}-{tag}"
        self.run = run
        self.path = d.workspace / f"{self.call_id}.txt"
        d.workspace.mkdir(exist_ok=True)
        self.path.write_text("1\n")
        call = work(self.call_id, self.path.name, seconds=30)
        self.stream = Streamer(d.address, [call], token=TOKENS[who], run_id=run, batch_id=batch)
        wait_until(
            lambda: work_sleeping(self.path) or self.stream.error, f"{self.call_id} to sleep"
        )
        assert self.stream.error is None, self.stream.error

    def running(self) -> bool:
        return not self.stream.seen(EventKind.FINISHED, self.call_id) and bool(work_pids(self.path))

    def cancelled(self) -> None:
        """It ends as a cancelled read, and its process is gone."""
        self.stream.join()
        o = self.stream.outcome(self.call_id)
        assert (o.status, o.error_class) == (Status.FAILURE, "cancelled"), o
        wait_until(lambda: not work_pids(self.path), f"{self.call_id}'s process to be gone", 5)


def refused(c: Client, **target: Any) -> str:
    with pytest.raises(PermissionDenied) as info:
        c.cancel(**target)
    return info.value.details


def quick(c: Client, run: str, name: str) -> Status:
    call = Call(tool="read_file", arguments={"path": "quick.txt"}, call_id=name)
    return c.run(call, run_id=run).status


def test_an_agent_may_not_cancel_another_agents_call_batch_or_run(daemon: Daemon) -> None:
    run, batch = f"bots-{new_tag()[:8]}", f"batch-{new_tag()[:8]}"
    long = Long(daemon, "bot", run, batch)
    before = cancels(daemon)
    with as_(daemon, "carol") as carol:
        for target in (
            {"call_id": long.call_id, "run_id": run},
            {"batch_id": batch},
            {"run_id": run},
        ):
            says = refused(carol, **target)
            assert "carol may cancel only its own calls" in says, says
            assert "by bot" in says, says
    assert cancels(daemon) == before, "a refused cancel was recorded"
    assert long.running()
    with as_(daemon, "bot") as bot:
        assert bot.get_call(long.call_id, run_id=run).running
        # Its owner may: the call stops as any cancelled call does.
        assert bot.cancel(call_id=long.call_id, run_id=run) == [long.call_id]
        long.cancelled()
        assert cancels(daemon)[len(before) :] == [("bot", run, "", long.call_id)]
        # The refused run cancel barred nothing.
        (daemon.workspace / "quick.txt").write_text("q")
        assert quick(bot, run, "after") is Status.SUCCESS


def test_an_operator_may_cancel_any_agents_call(daemon: Daemon) -> None:
    run = f"olgas-{new_tag()[:8]}"
    long = Long(daemon, "bot", run)
    before = len(cancels(daemon))
    with as_(daemon, "olga") as olga:
        assert olga.cancel(call_id=long.call_id, run_id=run, reason="ops") == [long.call_id]
    long.cancelled()
    o = long.stream.outcome(long.call_id)
    asked = o.mark("cancel_requested")
    assert asked is not None
    assert "requested by olga" in asked.detail, asked.detail
    assert cancels(daemon)[before:] == [("olga", run, "", long.call_id)]


def test_a_run_with_another_agents_recorded_calls_may_not_be_cancelled(daemon: Daemon) -> None:
    run = f"shared-{new_tag()[:8]}"
    (daemon.workspace / "quick.txt").write_text("q")
    with as_(daemon, "bot") as bot:
        assert quick(bot, run, "bots-earlier") is Status.SUCCESS
    # Nothing of bot's is in flight; only carol's own call is. The run is still not hers.
    mine = Long(daemon, "carol", run)
    before = cancels(daemon)
    with as_(daemon, "carol") as carol:
        says = refused(carol, run_id=run)
        assert "by bot" in says, says
        assert cancels(daemon) == before
        assert mine.running()
        # Her own call in that run she may stop.
        assert carol.cancel(call_id=mine.call_id, run_id=run) == [mine.call_id]
        mine.cancelled()
        # Idle now: still refused, and nothing barred the run.
        before = cancels(daemon)
        assert "by bot" in refused(carol, run_id=run)
        assert cancels(daemon) == before
        assert quick(carol, run, "carols-later") is Status.SUCCESS
    with as_(daemon, "bot") as bot:
        # And the other way round: carol has calls there now too.
        assert "by carol" in refused(bot, run_id=run)
    with as_(daemon, "olga") as olga:
        assert olga.cancel(run_id=run) == []
    assert cancels(daemon)[-1] == ("olga", run, "", "")


def test_an_agent_may_cancel_and_bar_its_own_fresh_run(daemon: Daemon) -> None:
    (daemon.workspace / "quick.txt").write_text("q")
    with as_(daemon, "carol") as carol:
        run = carol.runs.start("nothing yet").run_id  # started by carol: hers
        assert carol.cancel(run_id=run, reason="never mind") == []
        assert cancels(daemon)[-1] == ("carol", run, "", "")
        late = carol.run(Call(tool="read_file", arguments={"path": "quick.txt"}), run_id=run)
    assert (late.status, late.error_class, late.field) == (Status.REJECTED, "cancelled", "run_id")
    assert "never mind" in late.message


@pytest.mark.parametrize("run", ["default", "nobody-used-this-yet"])
def test_an_agent_may_not_bar_a_run_that_is_not_its_own(daemon: Daemon, run: str) -> None:
    """The shared implicit run, and a run id nobody has used, belong to no agent: an
    agent barring them would stop everyone else's later calls there."""
    before = cancels(daemon)
    with as_(daemon, "carol") as carol, pytest.raises(PermissionDenied) as refused:
        carol.cancel(run_id=run)
    assert run in str(refused.value)
    assert cancels(daemon) == before
    (daemon.workspace / "quick.txt").write_text("q")
    with as_(daemon, "bot") as bot:
        ok = bot.run(Call(tool="read_file", arguments={"path": "quick.txt"}), run_id=run)
    assert ok.status is Status.SUCCESS


def test_an_agent_may_cancel_its_own_run_with_its_calls_in_flight(daemon: Daemon) -> None:
    run = f"carols-{new_tag()[:8]}"
    (daemon.workspace / "quick.txt").write_text("q")
    with as_(daemon, "carol") as carol:
        assert quick(carol, run, "earlier") is Status.SUCCESS
        mine = Long(daemon, "carol", run)
        assert carol.cancel(run_id=run) == [mine.call_id]
    mine.cancelled()
    with as_(daemon, "carol") as carol:
        assert quick(carol, run, "later") is Status.REJECTED
