"""execgate.client.integrations.openai_agents with the real OpenAI Agents SDK, offline:
the SDK's own scripted model (`agents.testing.ScriptedModel`) proposes the calls, the
SDK's runner runs the turn, and every call goes through a real daemon (declared tools in
the real sandbox, identities, a policy that denies and asks)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunConfig, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from execgate.client import AsyncClient, Event, EventKind, Outcome, Status, StopMode
from execgate.client.integrations.openai_agents import ExecgateTools
from tests.daemon import Daemon, scaled
from tests.framework_support import (
    Span,
    all_overlap,
    counter,
    journaled,
    none_overlap,
    overlap,
    run_natively,
    span,
    start_framework_daemon,
)
from tests.loop_support import TOKENS, stop
from tests.mcp_support import await_for

N = 6  # increments of one file proposed in one turn
OFFLINE = RunConfig(tracing_disabled=True)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_framework_daemon(tmp_path_factory.mktemp("openai-agents"))
    yield d
    stop(d)


def bot(daemon: Daemon) -> AsyncClient:
    return AsyncClient(daemon.address, token=TOKENS["bot"])


def turn(*calls: tuple[str, dict[str, Any], str]) -> list[Any]:
    return [function_call(name, args, call_id=call_id) for name, args, call_id in calls]


def read_back(model: ScriptedModel, step: int) -> dict[str, str]:
    """What the model read in its `step`-th request: function outputs by call id."""
    return {
        item["call_id"]: item["output"]
        for item in model.calls[step].input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


async def run_agent(tools: list[FunctionTool], model: ScriptedModel) -> str:
    agent = Agent(name="tester", instructions="use the tools", tools=tools, model=model)
    result = await Runner.run(agent, "go", run_config=OFFLINE)
    model.assert_complete()
    return str(result.final_output)


def test_the_daemons_tools_are_the_agents_function_tools(daemon: Daemon) -> None:
    async def main() -> None:
        async with bot(daemon) as eg:
            specs = {s.name: s for s in await eg.list_tools()}
            tools = await ExecgateTools.load(eg)
            picked = await ExecgateTools.load(eg, only=["increment", "peek"])
            with pytest.raises(ValueError, match="no_such_tool"):
                await ExecgateTools.load(eg, only=["peek", "no_such_tool"])
        # The MCP server's `faulty.echo` is offered as `faulty_echo`: no dots in a name.
        assert "faulty.echo" in specs
        named = {name.replace(".", "_"): spec for name, spec in specs.items()}
        assert {t.name for t in tools.function_tools} == set(named)
        for t in tools.function_tools:
            assert t.params_json_schema == named[t.name].input_schema
            assert t.description == named[t.name].description
            assert not t.strict_json_schema
        assert [t.name for t in picked.function_tools] == ["increment", "peek"]
        assert tools.run_id != picked.run_id  # each load its own run unless told

    asyncio.run(main())


def test_a_turn_runs_through_execgate_under_the_sdks_call_ids(daemon: Daemon) -> None:
    model = ScriptedModel(
        [
            turn(
                ("write_file", {"path": "sdk.txt", "content": "from the sdk\n"}, "call_w"),
                ("peek", {"path": "sdk.txt"}, "call_p"),
            ),
            [assistant_message("wrote and read sdk.txt")],
        ]
    )

    async def main() -> None:
        async with bot(daemon) as eg:
            tools = await ExecgateTools.load(eg)
            assert await run_agent(tools.function_tools, model) == "wrote and read sdk.txt"
            w = await eg.get_call("call_w", run_id=tools.run_id)
            p = await eg.get_call("call_p", run_id=tools.run_id)
        assert (w.tool, w.idempotency_key) == ("write_file", f"{tools.run_id}:call_w")
        assert (p.tool, p.idempotency_key) == ("peek", f"{tools.run_id}:call_p")
        assert w.outcome is not None
        assert w.outcome.status is Status.SUCCESS
        assert p.outcome is not None
        assert p.outcome.status is Status.SUCCESS
        seen = read_back(model, 1)
        assert seen["call_w"].startswith("[success]")
        # The SDK ran the two as concurrent tasks, each its own batch: the daemon still
        # ordered the read of sdk.txt after its write.
        assert seen["call_p"] == "[success]\nfrom the sdk\n"
        assert w.batch_id != p.batch_id

    asyncio.run(main())


def test_an_mcp_servers_tool_is_called_by_the_name_the_model_was_given(daemon: Daemon) -> None:
    model = ScriptedModel(
        [turn(("faulty_echo", {"text": "through MCP"}, "call_m")), [assistant_message("ok")]]
    )

    async def main() -> None:
        async with bot(daemon) as eg:
            tools = await ExecgateTools.load(eg, only=["faulty.echo"])
            assert [t.name for t in tools.function_tools] == ["faulty_echo"]
            await run_agent(tools.function_tools, model)
            record = await eg.get_call("call_m", run_id=tools.run_id)
        assert record.tool == "faulty.echo"
        assert read_back(model, 1)["call_m"] == "[success]\nthrough MCP"

    asyncio.run(main())


def test_a_policy_denial_is_what_the_model_reads(daemon: Daemon) -> None:
    model = ScriptedModel([turn(("danger", {}, "call_d")), [assistant_message("ok")]])

    async def main() -> None:
        async with bot(daemon) as eg:
            tools = await ExecgateTools.load(eg)
            await run_agent(tools.function_tools, model)
            record = await eg.get_call("call_d", run_id=tools.run_id)
        assert record.outcome is not None
        assert (record.outcome.status, record.outcome.error_class) == (
            Status.REJECTED,
            "policy_denied",
        )
        seen = read_back(model, 1)["call_d"]
        assert seen.startswith("[rejected: policy_denied] do not retry")
        assert "never this one" in seen  # the rule's reason

    asyncio.run(main())


def test_an_approval_wait_is_reported_and_the_call_runs_once_approved(daemon: Daemon) -> None:
    model = ScriptedModel([turn(("careful", {}, "call_c")), [assistant_message("ok")]])
    events: list[Event] = []

    async def approve_the_first(human: AsyncClient) -> str:
        async for approval in human.watch_approvals():
            if approval.state.value == "pending" and approval.call_id == "call_c":
                await human.approve(approval.approval_id, "fine")
                return approval.approval_id
        raise AssertionError("the approvals stream ended")

    async def main() -> None:
        async with bot(daemon) as eg, AsyncClient(daemon.address, token=TOKENS["alice"]) as alice:
            tools = await ExecgateTools.load(eg, on_event=events.append)
            async with asyncio.timeout(scaled(30)), asyncio.TaskGroup() as tg:
                approver = tg.create_task(approve_the_first(alice))
                await run_agent(tools.function_tools, model)
            [decided] = await alice.approvals_of_run(tools.run_id)
        waits = [e for e in events if e.kind is EventKind.AWAITING_APPROVAL]
        assert [(e.call_id, e.approval_id, e.rule_id) for e in waits] == [
            ("call_c", approver.result(), "ask-careful")
        ]
        assert (decided.state.value, decided.decided_by) == ("approved", "alice")
        assert read_back(model, 1)["call_c"] == "[success]\ncarefully done\n"

    asyncio.run(main())


@pytest.mark.parametrize("how", ["task", "streamed", "tool_timeout"])
def test_cancelling_the_run_cancels_the_call_at_the_daemon(daemon: Daemon, how: str) -> None:
    model = ScriptedModel([turn(("slow", {}, "call_s")), [assistant_message("never")]])
    events: list[Event] = []

    def started() -> bool:
        return any(e.kind is EventKind.STARTED and e.call_id == "call_s" for e in events)

    async def main() -> Outcome:
        async with bot(daemon) as eg:
            tools = await ExecgateTools.load(eg, on_event=events.append)
            agent = Agent(name="tester", tools=tools.function_tools, model=model)
            if how == "tool_timeout":  # the SDK's own per-tool timeout cancels the call
                [slow] = [t for t in tools.function_tools if t.name == "slow"]
                agent.tools = [dataclasses.replace(slow, timeout_seconds=scaled(2))]
                await Runner.run(agent, "go", run_config=OFFLINE)
                assert started()
                assert read_back(model, 1)["call_s"].startswith("Tool 'slow' timed out")
            elif how == "task":
                run = asyncio.create_task(Runner.run(agent, "go", run_config=OFFLINE))
                await await_for(started, 20, "the slow call started")
                run.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await run
            else:
                streamed = Runner.run_streamed(agent, "go", run_config=OFFLINE)

                async def cancel_once_started() -> None:
                    await await_for(started, 20, "the slow call started")
                    streamed.cancel()

                async with asyncio.TaskGroup() as tg:
                    tg.create_task(cancel_once_started())
                    async for _ in streamed.stream_events():
                        pass
            return await journaled(eg, "call_s", tools.run_id)

    outcome = asyncio.run(main())
    assert (outcome.status, outcome.error_class) == (Status.FAILURE, "cancelled"), outcome
    assert outcome.stopped_how in (StopMode.COOPERATIVE, StopMode.FORCE_TERMINATED)
    assert outcome.mark("cancel_requested") is not None
    assert outcome.mark("finished").at - outcome.mark("started").at < 30  # not its 60 s


def test_a_resent_call_is_answered_from_the_journal_not_run_again(daemon: Daemon) -> None:
    path = counter(daemon, "resent.txt")
    script = [turn(("increment", {"path": "resent.txt"}, "call_i")), [assistant_message("ok")]]

    async def main() -> tuple[str, str]:
        async with bot(daemon) as eg:
            first = await ExecgateTools.load(eg)
            await run_agent(first.function_tools, once := ScriptedModel(script))
            # The same run resumed: the SDK proposes the same call id again.
            again = await ExecgateTools.load(eg, run_id=first.run_id)
            await run_agent(again.function_tools, twice := ScriptedModel(script))
        return read_back(once, 1)["call_i"], read_back(twice, 1)["call_i"]

    before, after = asyncio.run(main())
    assert path.read_text() == "1\n"
    assert before == "[success]\nread 0\n"
    assert after.startswith("[success]\nread 0\n")
    assert "[the result of an earlier call" in after


# ------------------------------------------------------------------ the demonstration


def the_turn(path: str) -> ScriptedModel:
    """One turn: N increments of `path` and three reads of notes.txt, then an answer."""
    calls = [("increment", {"path": path}, f"call_inc{i}") for i in range(N)]
    calls += [("peek", {"path": "notes.txt"}, f"call_peek{i}") for i in range(3)]
    return ScriptedModel([turn(*calls), [assistant_message("done")]])


def native_tools(workspace: Path, spans: dict[str, list[Span]]) -> list[FunctionTool]:
    """The same two tools, run by the SDK itself: the same programs, in the workspace."""

    @function_tool
    async def increment(path: str) -> str:
        """Add one to the integer in a file."""
        spans["increment"].append(s := await run_natively(workspace, "increment", path=path))
        return s.output

    @function_tool
    async def peek(path: str) -> str:
        """Print a file."""
        spans["peek"].append(s := await run_natively(workspace, "peek", path=path))
        return s.output

    return [increment, peek]


def test_concurrent_increments_lose_updates_natively_and_none_through_execgate(
    daemon: Daemon,
) -> None:
    (daemon.workspace / "notes.txt").write_text("some notes\n")
    native, gated = counter(daemon, "native.txt"), counter(daemon, "gated.txt")
    spans: dict[str, list[Span]] = {"increment": [], "peek": []}
    finished: list[Outcome] = []

    def keep(event: Event) -> None:
        if event.kind is EventKind.FINISHED and event.outcome is not None:
            finished.append(event.outcome)

    async def main() -> None:
        await run_agent(native_tools(daemon.workspace, spans), the_turn("native.txt"))
        async with bot(daemon) as eg:
            tools = await ExecgateTools.load(eg, on_event=keep)
            await run_agent(tools.function_tools, the_turn("gated.txt"))

    asyncio.run(main())
    # The SDK alone: the increments ran at once, read the same value, lost updates.
    lost_natively = N - int(native.read_text())
    assert lost_natively >= 1, native.read_text()
    assert any(overlap(a, b) for a in spans["increment"] for b in spans["increment"] if a != b)
    # Through execgate: every increment counted; they ran one at a time, the reads together.
    assert int(gated.read_text()) == N
    assert all(o.status is Status.SUCCESS for o in finished), finished
    incs = [span(o) for o in finished if o.call_id.startswith("call_inc")]
    peeks = [span(o) for o in finished if o.call_id.startswith("call_peek")]
    assert (len(incs), len(peeks)) == (N, 3)
    assert none_overlap(incs)
    assert all_overlap(peeks)
    assert any(overlap(p, i) for p in peeks for i in incs)  # other files' reads run beside
