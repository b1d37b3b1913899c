"""execgate.client.integrations without a daemon: the names models see, the public
surface of each adapter, and that neither framework loads unless its adapter is imported."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from execgate.client import Event, EventKind, Outcome, Status, ToolSpec
from execgate.client.integrations._gate import Gate, model_names

SURFACES = {
    "execgate.client.integrations.openai_agents": ["ExecgateTools"],
    "execgate.client.integrations.langgraph": ["ExecgateToolNode"],
}
FRAMEWORKS = ("agents", "langgraph", "langchain_core", "openai")


def spec(name: str) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=f"{name} tool",
        input_schema={"type": "object"},
        read_only=True,
        destructive=False,
        idempotent=True,
    )


def test_names_are_what_a_model_accepts_and_stay_unique() -> None:
    tools = model_names(
        [spec("read_file"), spec("git.git_status"), spec("git_git_status"), spec("x" * 70)]
    )
    assert [(t.name, t.spec.name) for t in tools] == [
        ("read_file", "read_file"),
        ("git_git_status", "git.git_status"),
        ("git_git_status_2", "git_git_status"),
        ("x" * 64, "x" * 70),
    ]


def test_only_picks_tools_by_their_execgate_names_and_names_an_unknown_one() -> None:
    specs = [spec("read_file"), spec("git.log"), spec("peek")]
    assert [t.name for t in model_names(specs, only=["peek", "git.log"])] == ["git_log", "peek"]
    with pytest.raises(ValueError, match=r"\['nope'\]"):
        model_names(specs, only=["peek", "nope"])


def test_a_call_carries_the_frameworks_id_and_a_key_scoped_to_the_run() -> None:
    gate = Gate(object(), run_id="r1")  # type: ignore[arg-type]  # no RPC is made
    call = gate.call("peek", {"path": "a"}, "call_7")
    assert (call.tool, call.arguments, call.call_id, call.idempotency_key) == (
        "peek",
        {"path": "a"},
        "call_7",
        "r1:call_7",
    )
    fresh = gate.call("peek", '{"path": "a"}', None)  # a framework that gave no id
    assert fresh.call_id.startswith("call-")
    assert fresh.idempotency_key == f"r1:{fresh.call_id}"
    assert Gate(object()).run_id != Gate(object()).run_id  # type: ignore[arg-type]


@pytest.mark.parametrize("module", sorted(SURFACES))
def test_each_adapters_surface_is_frozen(module: str) -> None:
    assert importlib.import_module(module).__all__ == SURFACES[module]


def _imported_after(code: str) -> list[str]:
    probe = (
        f"import json, sys; {code}; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_the_client_alone_loads_no_framework() -> None:
    assert _imported_after("import execgate.client, execgate.client.integrations") == []


def test_an_adapter_loads_its_own_framework_only() -> None:
    loaded = _imported_after("import execgate.client.integrations.langgraph")
    assert "langgraph" in loaded
    assert "agents" not in loaded


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [("openai_agents", "agents", "openai-agents"), ("langgraph", "langgraph", "langgraph")],
)
def test_a_missing_framework_says_which_extra_to_install(
    module: str, missing: str, extra: str
) -> None:
    # sys.modules[name] = None makes `import name` fail as if it were not installed.
    code = (
        f"import sys; sys.modules[{missing!r}] = None\nimport execgate.client.integrations.{module}"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"pip install 'execgate[{extra}]'" in out.stderr


class FakeClient:
    """Stands in for AsyncClient in Gate.run: a scripted event stream, cancels recorded.
    `hold` makes the stream wait after its events (a call still running)."""

    def __init__(self, events: list[Event], hold: bool = False) -> None:
        self.events, self.hold = events, hold
        self.cancels: list[dict[str, object]] = []
        self.holding = asyncio.Event()

    async def stream(self, calls: object, **kw: object) -> AsyncIterator[Event]:
        for e in self.events:
            yield e
        if self.hold:
            self.holding.set()
            await asyncio.Event().wait()

    async def cancel(self, **kw: object) -> list[str]:
        self.cancels.append(kw)
        return ["c1"]


def finished(call_id: str, index: int) -> Event:
    outcome = Outcome(call_id=call_id, status=Status.SUCCESS, error_class="none", text="ok")
    return Event(
        kind=EventKind.FINISHED, call_id=call_id, batch_id="b", at=0.0, index=index, outcome=outcome
    )


def test_a_hook_that_raises_is_logged_and_the_outcomes_still_come_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("the app's bug")

    gate = Gate(FakeClient([finished("c1", 0)]), on_event=broken)  # type: ignore[arg-type]
    [outcome] = asyncio.run(gate.run([gate.call("noop", {}, "c1")]))
    assert outcome.status is Status.SUCCESS
    assert "a hook raised on a finished event of c1" in caplog.text


def test_a_call_the_stream_never_finished_is_an_unknown_outcome() -> None:
    gate = Gate(FakeClient([finished("c2", 1)]))  # type: ignore[arg-type]
    first, second = asyncio.run(
        gate.run([gate.call("noop", {}, "c1"), gate.call("noop", {}, "c2")])
    )
    assert (first.call_id, first.status, first.error_class) == (
        "c1",
        Status.UNKNOWN_OUTCOME,
        "internal",
    )
    assert second.status is Status.SUCCESS


def test_a_cancelled_turn_cancels_its_batch_then_stays_cancelled() -> None:
    client = FakeClient([], hold=True)
    gate = Gate(client, run_id="r1")  # type: ignore[arg-type]

    async def main() -> None:
        turn = asyncio.create_task(gate.run([gate.call("slow", {}, "c1")]))
        await client.holding.wait()
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn

    asyncio.run(main())
    [cancel] = client.cancels
    assert cancel["run_id"] == "r1"
    assert str(cancel["batch_id"]).startswith("batch-")
