"""The MCP provider with real servers in the real bwrap sandbox (no daemon: the
provider, its tools and the cancel ladder; tests/integration/test_mcp_daemon.py
has the daemon's side). Every test ends with no process of its servers left."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Phase, StopMode
from execgate.executor.core.paths import Workspace
from execgate.executor.locks import Mode
from execgate.executor.sandbox import Confinement
from execgate.executor.sandbox.bwrap import BwrapSandbox
from execgate.executor.sandbox.registry import Sandboxes
from execgate.executor.tools import CancelScope, Limits, ToolContext, ToolOutput
from execgate.executor.tools.decl import EffectsDecl, EnvDecl, Pool, ServerDecl, ToolOverride
from execgate.executor.tools.mcp import McpProvider, McpTool
from execgate.executor.tools.mcp.calling import ANSWERED, PINGED
from execgate.executor.tools.mcp.server import MAX_PROCESSES
from tests import mcp_support as ms
from tests.daemon import scaled
from tests.support import sandbox_serve_args

pytestmark = pytest.mark.timeout(120)


def _sandboxes() -> Sandboxes:
    sandbox_serve_args("bwrap", Path())  # skips (or fails, in CI) without bwrap
    bwrap = BwrapSandbox(None, ms.RO_PATHS)
    return Sandboxes({"bwrap": bwrap}, "bwrap", lambda *_: None, Confinement())


def _decl(name: str, server: tuple[str, tuple[str, ...]], tag: str, **kw: Any) -> ServerDecl:
    command, args = server
    env = EnvDecl(set=((ms.TAG_ENV, tag),))
    return ServerDecl(name=name, command=command, args=args, env=env, **kw)


def _ctx(
    ws: Path, *, timeout: float = 30.0, grace: float = 1.0, writes: bool = True
) -> ToolContext:
    limits = Limits(grace=grace)
    return ToolContext(Workspace(ws), limits, scaled(timeout), CancelScope(), may_write=writes)


def run(ws: Path, decls: list[ServerDecl], body: Callable[[McpProvider], Awaitable[None]]) -> None:
    """Start the provider on `decls`, run `body`, close it (in one event loop)."""

    async def main() -> None:
        provider = McpProvider(_sandboxes(), Workspace(ws))
        try:
            await provider.start(tuple(decls))
            await body(provider)
        finally:
            await provider.close()

    asyncio.run(main())


def tool(provider: McpProvider, name: str) -> McpTool:
    found = provider.tools()[name]
    assert isinstance(found, McpTool)
    return found


def test_git_reads_in_bwrap(tmp_path: Path) -> None:
    repo = ms.git_repo(tmp_path / "ws")
    tag = ms.new_tag()

    async def body(provider: McpProvider) -> None:
        names = set(provider.tools())
        assert {"git.git_status", "git.git_log"} <= names, names
        status = await tool(provider, "git.git_status").run({"repo_path": str(repo)}, _ctx(repo))
        assert status.error_class is ErrorClass.NONE, status
        assert "working tree clean" in status.text
        logged = await tool(provider, "git.git_log").run({"repo_path": str(repo)}, _ctx(repo))
        assert "first commit" in logged.text, logged
        assert "bwrap" in logged.evidence.sandbox
        assert ms.tagged(tag), "the server runs (prestart), tagged"
        [state] = provider.status()
        assert (state.name, state.running, state.restarts) == ("git", 1, 0)

    run(repo, [_decl("git", ms.git_server(repo), tag, prestart=True)], body)
    assert ms.tagged(tag) == []


def test_untrusted_tools_write_the_server_key_whatever_they_claim(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()

    async def body(provider: McpProvider) -> None:
        lie = tool(provider, "faulty.lie_append")
        assert not lie.spec.read_only  # it says readOnlyHint; nobody believes it
        effects = lie.call_effects({"path": "x", "line": "y"}, {}, Workspace(ws))
        assert effects.may_write
        modes = {c.key.render(): c.mode for c in effects.claims}
        assert modes == {"mcp:faulty": Mode.WRITE, "workspace": Mode.WRITE}

    run(ws, [_decl("faulty", ms.fixture_server(), tag)], body)
    assert ms.tagged(tag) == []


def test_trusted_annotations_and_overrides(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()
    append = ToolOverride(effects=EffectsDecl(declared=True, writes=("{path}",)))
    decl = _decl(
        "faulty",
        ms.fixture_server(),
        tag,
        trusted=True,
        tools=(
            ("lie_append", append),
            ("flood", ToolOverride(hidden=True)),
        ),
    )

    async def body(provider: McpProvider) -> None:
        assert "faulty.flood" not in provider.tools()
        echo = tool(provider, "faulty.echo")
        assert echo.spec.read_only  # trusted: readOnlyHint believed
        read = echo.call_effects({"text": "a"}, {}, Workspace(ws))
        assert not read.may_write
        assert [(c.key.render(), c.mode) for c in read.claims] == [("mcp:faulty", Mode.READ)]
        lie = tool(provider, "faulty.lie_append")
        wrote = lie.call_effects({"path": "notes/a.txt", "line": "x"}, {}, Workspace(ws))
        assert wrote.may_write
        keys = {c.key.render(): c.mode for c in wrote.claims}
        assert keys[f"file:{ws.resolve()}/notes/a.txt"] is Mode.WRITE
        with pytest.raises(Exception, match="outside the workspace"):
            lie.call_effects({"path": "../../etc/passwd", "line": "x"}, {}, Workspace(ws))

    run(ws, [decl], body)
    assert ms.tagged(tag) == []


def test_faults_are_typed_outcomes_and_leave_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()

    async def call(provider: McpProvider, name: str, args: dict[str, Any], **kw: Any) -> ToolOutput:
        return await tool(provider, f"faulty.{name}").run(args, _ctx(ws, **kw))

    async def body(provider: McpProvider) -> None:
        failed = await call(provider, "fails", {"why": "on purpose"})
        assert failed.error_class is ErrorClass.TOOL_ERROR, failed
        assert "Error executing tool fails" in failed.text  # the SDK hides the exception
        flood = await call(provider, "flood", {"megabytes": 3})
        assert len(flood.text) == 3 << 20  # the pipeline bounds it (PARTIAL)
        crashed = await call(provider, "crash", {"code": 7})
        assert (crashed.error_class, crashed.stopped_how) == (
            ErrorClass.INTERRUPTED,
            StopMode.INTERRUPTED,
        ), crashed
        assert "exited" in crashed.message
        again = await call(provider, "echo", {"text": "back"})  # restarted for later calls
        assert again.text == "back", again
        [state] = provider.status()
        assert state.restarts == 1, state
        assert "exited" in state.last_error, state

    run(ws, [_decl("faulty", ms.fixture_server(), tag)], body)
    assert ms.tagged(tag) == []


def test_a_cancelled_reader_stops_cooperatively_on_a_ping(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()

    async def body(provider: McpProvider) -> None:
        ctx = _ctx(ws, grace=scaled(5.0), writes=False)
        task = asyncio.ensure_future(tool(provider, "faulty.hang").run({}, ctx))
        await asyncio.sleep(0.3)  # let the request reach the server; the cancel ends it
        ctx.cancel.cancel("test", requester="tester")
        out = await asyncio.wait_for(task, scaled(10))
        assert (out.error_class, out.stopped_how) == (ErrorClass.CANCELLED, StopMode.COOPERATIVE)
        phases = [m.phase for m in out.marks]
        assert phases == [Phase.CANCEL_REQUESTED, Phase.SIGNAL_SENT, Phase.STOPPED], out.marks
        assert "notifications/cancelled" in out.marks[1].detail
        assert out.marks[2].detail == PINGED
        [state] = provider.status()
        assert (state.running, state.restarts) == (1, 0)  # the same server goes on

    run(ws, [_decl("faulty", ms.fixture_server(), tag, prestart=True)], body)
    assert ms.tagged(tag) == []


def test_a_cancelled_writer_without_an_answer_is_forced(tmp_path: Path) -> None:
    """The SDK cancels `hang`'s handler and, as the spec says, never answers it: a ping
    would be answered, but for a writer only its answer counts."""
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()

    async def body(provider: McpProvider) -> None:
        before = ms.tagged(tag)
        ctx = _ctx(ws, grace=0.5)
        task = asyncio.ensure_future(tool(provider, "faulty.hang").run({}, ctx))
        await asyncio.sleep(0.3)
        ctx.cancel.cancel("test")
        out = await asyncio.wait_for(task, scaled(20))
        assert (out.error_class, out.stopped_how) == (
            ErrorClass.CANCELLED,
            StopMode.FORCE_TERMINATED,
        )
        expired = out.marks[2]
        assert (expired.phase, expired.detail) == (
            Phase.GRACE_EXPIRED,
            "after 0.5s without an answer",
        )
        assert not set(before) & set(ms.tagged(tag)), "the old tree is gone"
        again = await tool(provider, "faulty.echo").run({"text": "new"}, _ctx(ws))
        assert again.text == "new"

    run(ws, [_decl("faulty", ms.fixture_server(), tag, prestart=True)], body)
    assert ms.tagged(tag) == []


def test_a_writer_answered_within_the_grace_stops_cooperatively(tmp_path: Path) -> None:
    """`ignore_cancel` blocks the server's loop, then answers: the cancel is read only
    after the answer is on its way, so the answer comes (after the SDK stopped waiting
    for it) and proves the work ended."""
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()

    async def body(provider: McpProvider) -> None:
        block = scaled(2.0)  # long enough for the cancel to come in it, under load
        ctx = _ctx(ws, grace=block + scaled(10.0))
        started = ws / "blocking"
        args = {"seconds": block, "started": str(started)}
        task = asyncio.ensure_future(tool(provider, "faulty.ignore_cancel").run(args, ctx))
        await ms.await_for(started.exists, 10, "the block")  # the cancel comes in it
        ctx.cancel.cancel("test")
        out = await asyncio.wait_for(task, scaled(20))
        assert (out.error_class, out.stopped_how) == (ErrorClass.CANCELLED, StopMode.COOPERATIVE)
        assert [m.phase for m in out.marks][-1] is Phase.STOPPED
        assert out.marks[-1].detail == ANSWERED
        [state] = provider.status()
        assert (state.running, state.restarts) == (1, 0)

    run(ws, [_decl("faulty", ms.fixture_server(), tag, prestart=True)], body)
    assert ms.tagged(tag) == []


def test_ignored_cancel_is_forced_and_the_server_restarted(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()

    async def body(provider: McpProvider) -> None:
        child = await tool(provider, "faulty.spawn_child").run({}, _ctx(ws))
        assert child.error_class is ErrorClass.NONE, child
        before = ms.tagged(tag)
        assert len(before) >= 2, before  # the server and its setsid'd child (and bwrap's)
        ctx = _ctx(ws, timeout=1.0, grace=0.5)
        out = await asyncio.wait_for(
            tool(provider, "faulty.ignore_cancel").run({}, ctx), scaled(20)
        )
        assert (out.error_class, out.stopped_how) == (ErrorClass.TIMEOUT, StopMode.FORCE_TERMINATED)
        phases = [m.phase for m in out.marks]
        assert phases[-3:] == [Phase.GRACE_EXPIRED, Phase.FORCE_TERMINATED, Phase.STOPPED]
        assert out.evidence.survivors == 0
        assert not set(before) & set(ms.tagged(tag)), "the old tree is gone"
        again = await tool(provider, "faulty.echo").run({"text": "new"}, _ctx(ws))
        assert again.text == "new"
        [state] = provider.status()
        assert state.restarts == 1

    run(ws, [_decl("faulty", ms.fixture_server(), tag, prestart=True)], body)
    assert ms.tagged(tag) == []


def test_everything_echo_and_long_running_cancel(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()

    async def body(provider: McpProvider) -> None:
        echo = await tool(provider, "everything.echo").run({"message": "hi"}, _ctx(ws))
        assert "hi" in echo.text, echo
        long = tool(provider, "everything.trigger-long-running-operation")
        ctx = _ctx(ws, grace=scaled(5.0), writes=False)
        task = asyncio.ensure_future(long.run({"duration": 60, "steps": 60}, ctx))
        await asyncio.sleep(0.5)
        ctx.cancel.cancel("enough")
        out = await asyncio.wait_for(task, scaled(10))
        assert (out.error_class, out.stopped_how) == (ErrorClass.CANCELLED, StopMode.COOPERATIVE)
        assert out.marks[-1].detail == PINGED
        # The TypeScript SDK answers no cancelled request either (its handler, which
        # ignores the abort signal, runs on): as a writer, the call is forced.
        ctx = _ctx(ws, grace=1.0)
        task = asyncio.ensure_future(long.run({"duration": 60, "steps": 60}, ctx))
        await asyncio.sleep(0.5)
        ctx.cancel.cancel("enough")
        out = await asyncio.wait_for(task, scaled(20))
        assert (out.error_class, out.stopped_how) == (
            ErrorClass.CANCELLED,
            StopMode.FORCE_TERMINATED,
        )
        assert (out.marks[2].phase, out.marks[2].detail) == (
            Phase.GRACE_EXPIRED,
            "after 1s without an answer",
        )

    run(ws, [_decl("everything", ms.npm_server("server-everything"), tag, prestart=True)], body)
    assert ms.tagged(tag) == []


def test_a_server_that_never_initializes_is_left_out(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()
    mute = ("sleep", ("300",))  # reads nothing, answers nothing

    async def body(provider: McpProvider) -> None:
        assert provider.tools() == {}
        [state] = provider.status()
        assert state.running == 0
        assert "not ready within 1s" in state.last_error, state

    run(ws, [_decl("mute", mute, tag, startup_timeout=1.0)], body)
    assert ms.tagged(tag) == []


def test_pool_per_run_gives_each_run_its_process(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()

    async def body(provider: McpProvider) -> None:
        echo = tool(provider, "faulty.echo")
        for run_id in ("r1", "r2", "r1"):
            ctx = _ctx(ws)
            ctx.run_id = run_id
            out = await echo.run({"text": run_id}, ctx)
            assert out.text == run_id, out
        [state] = provider.status()
        assert (state.running, state.restarts) == (2, 0), state

    run(ws, [_decl("faulty", ms.fixture_server(), tag, pool=Pool.RUN)], body)
    assert ms.tagged(tag) == []


def _gated(name: str, ws: Path, tag: str, **kw: Any) -> tuple[ServerDecl, Path]:
    """The fixture server, held before its start while `ws/NAME.gate` exists."""
    gate = ws / f"{name}.gate"
    decl = _decl(name, ms.fixture_server(), tag, startup_timeout=scaled(60), **kw)
    env = EnvDecl(set=(*decl.env.set, ("FAULTY_START_GATE", str(gate))))
    return replace(decl, env=env), gate


def test_a_caller_cancelled_during_the_start_leaves_no_orphan(tmp_path: Path) -> None:
    """The caller's task cancelled while the server starts (the start is the server's):
    the process comes up, is kept for the next call, and is killed at close -- none is
    left behind."""
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()
    decl, gate = _gated("faulty", ws, tag)

    async def body(provider: McpProvider) -> None:
        echo = tool(provider, "faulty.echo")
        await ms.await_for(lambda: ms.tagged(tag) == [], 10, "discovery's process closed")
        gate.touch()
        caller = asyncio.ensure_future(echo.run({"text": "lost"}, _ctx(ws)))
        await ms.await_for(lambda: ms.tagged(tag) != [], 20, "the start begun")
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        starting = set(ms.tagged(tag))
        gate.unlink()
        await ms.await_for(lambda: provider.status()[0].running == 1, 30, "the start done")
        assert set(ms.tagged(tag)) == starting
        again = await echo.run({"text": "kept"}, _ctx(ws))
        assert again.text == "kept", again
        [state] = provider.status()
        assert (state.running, state.restarts, state.last_error) == (1, 0, ""), state

    run(ws, [decl], body)
    assert ms.tagged(tag) == []


def test_close_during_a_start_kills_it(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()
    decl, gate = _gated("faulty", ws, tag)

    async def body(provider: McpProvider) -> None:
        await ms.await_for(lambda: ms.tagged(tag) == [], 10, "discovery's process closed")
        gate.touch()
        caller = asyncio.ensure_future(tool(provider, "faulty.echo").run({"text": "x"}, _ctx(ws)))
        await ms.await_for(lambda: ms.tagged(tag) != [], 20, "the start begun")
        await provider.close()
        assert ms.tagged(tag) == []
        with pytest.raises(ToolError, match="closing"):
            await caller

    run(ws, [decl], body)
    assert ms.tagged(tag) == []


def test_the_process_cap_holds_under_concurrent_starts(tmp_path: Path) -> None:
    """`pool: run`, MAX_PROCESSES + 1 runs starting at once: the cap's worth start, the
    one over it is refused (every process is in use); later, a new run's process
    takes the place of the least recently used idle one."""
    ws = tmp_path / "ws"
    ws.mkdir()
    tag = ms.new_tag()
    decl, gate = _gated("faulty", ws, tag, pool=Pool.RUN, trusted=True)

    def in_run(run_id: str) -> ToolContext:
        ctx = _ctx(ws, timeout=120)
        ctx.run_id = run_id
        return ctx

    async def body(provider: McpProvider) -> None:
        echo = tool(provider, "faulty.echo")
        gate.touch()
        calls = [
            asyncio.ensure_future(echo.run({"text": f"r{i}"}, in_run(f"r{i}")))
            for i in range(MAX_PROCESSES + 1)
        ]
        await asyncio.wait(calls, timeout=scaled(5), return_when=asyncio.FIRST_COMPLETED)
        refused = [c for c in calls if c.done()]
        assert len(refused) == 1, refused
        with pytest.raises(ToolError, match="in use"):
            await refused[0]
        gate.unlink()
        done = await asyncio.gather(*[c for c in calls if c not in refused])
        assert all(o.error_class is ErrorClass.NONE for o in done), done
        assert len({o.text for o in done}) == MAX_PROCESSES, done  # each its run's
        assert provider.status()[0].running == MAX_PROCESSES
        late = await echo.run({"text": "late"}, in_run("late"))
        assert late.text == "late", late
        assert provider.status()[0].running == MAX_PROCESSES

    run(ws, [decl], body)
    assert ms.tagged(tag) == []
