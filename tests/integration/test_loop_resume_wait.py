"""A resumed loop waits for its calls on the Execute stream, never by polling GetCall.

The call is parked for an approval at a daemon that restarted (no stream follows it);
the resumed loop re-sends it with its id and idempotency key and the daemon joins it to
the parked call. GetCall is counted on the client the loop uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from execgate.client import Call, ExecgateClientError, Loop
from execgate.client.loop.states import State
from execgate.client.models.scripted import ScriptedModel
from tests.loop_support import (
    ASK_POLICY,
    Background,
    as_,
    lines,
    start_auth_daemon,
    state_of,
    stop,
)
from tests.support import wait_until


def test_a_resumed_loop_waits_for_its_parked_call_on_the_stream_not_by_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call is parked at a restarted daemon (no stream follows it); the resumed loop
    reads its record once, then re-sends it and waits on the Execute stream: however
    long the approval takes, GetCall is not asked again."""
    daemon = start_auth_daemon(tmp_path, ASK_POLICY)
    run_id = "parked-no-polling"
    tee = ("run_command", {"argv": ["tee", "-a", "approved.txt"], "stdin": "ran\n"})
    try:
        with as_(daemon, "bot") as bot:
            first = Background(
                lambda: Loop(bot, ScriptedModel([ScriptedModel.calls(tee)])).run(
                    "tee", run_id=run_id
                )
            )
            wait_until(lambda: state_of(bot, run_id) is State.AWAITING_APPROVAL, "parked")
            daemon.stop()
            with pytest.raises(ExecgateClientError):  # the stream ends with the daemon
                first.result(timeout=15)
        daemon.restart()

        with as_(daemon, "bot") as bot:
            asked: list[str] = []
            streams: list[list[str]] = []
            get_call, stream = bot.get_call, bot.stream

            def counted_get_call(call_id: str, **kwargs: Any) -> Any:
                asked.append(call_id)
                return get_call(call_id, **kwargs)

            def counted_stream(calls: Sequence[Call], **kwargs: Any) -> Any:
                streams.append([c.call_id for c in calls])
                return stream(calls, **kwargs)

            monkeypatch.setattr(bot, "get_call", counted_get_call)
            monkeypatch.setattr(bot, "stream", counted_stream)
            model = ScriptedModel([ScriptedModel.answer("appended once")])
            resumed = Background(lambda: Loop(bot, model).resume(run_id))
            # Approve only once the loop waits: on its stream, or (polling) asking again.
            wait_until(lambda: streams or len(asked) > 1, "the resumed loop to wait")
            with as_(daemon, "alice") as alice:
                (pending,) = [a for a in alice.approvals_pending() if a.run_id == run_id]
                alice.approve(pending.approval_id, "go")
            result = resumed.result(timeout=30)
            with as_(daemon, "alice") as alice:
                approvals = [a for a in alice.approvals_of_run(run_id)]
        assert result.state is State.COMPLETED, result
        assert asked == ["s1c1"], "GetCall polled while the call awaited its approval"
        assert streams == [["s1c1"]]
        assert [a.approval_id for a in approvals] == [pending.approval_id]
        assert lines(daemon.workspace / "approved.txt") == ["ran"]
    finally:
        stop(daemon)
