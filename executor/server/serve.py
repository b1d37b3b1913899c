"""gRPC wiring: listeners, health, reflection, signals, startup and shutdown.

The servicers are in `services`; no call logic lives in either."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from execgate.executor.core.errors import ConfigError
from execgate.executor.core.paths import Workspace
from execgate.executor.journal.base import JournalStore
from execgate.executor.journal.opening import open_journal, redacted
from execgate.executor.locks import FileLockManager, LockBackend, LockManager, NoLocks
from execgate.executor.pipeline.dispatch import Dispatcher
from execgate.executor.policy import Policy, default_policy_path, load_policy
from execgate.executor.policy.identity import Identities, load_identities, parse_identities
from execgate.executor.policy.reload import policy_watcher
from execgate.executor.policy.watch import FileWatcher
from execgate.executor.runs.registry import RunStore
from execgate.executor.sandbox import dockerd
from execgate.executor.sandbox import registry as sandbox_registry
from execgate.executor.sandbox.privileges import make_non_dumpable
from execgate.executor.sandbox.registry import daemon_id
from execgate.executor.telemetry import metrics, tracing
from execgate.executor.tools import Tool, builtin_tools
from execgate.executor.tools.decl import ToolFile
from execgate.executor.tools.reload import (
    backends_wanted,
    default_image_needed,
    load_toolset,
    tools_watcher,
)
from execgate.executor.tools.toolset import ToolSet
from execgate.v1 import executor_pb2_grpc as pb_grpc
from execgate.v1 import runs_pb2
from execgate.v1 import runs_pb2_grpc as rpb_grpc

from . import heap, mcp_wiring, memdebug
from .auth import AuthInterceptor, server_credentials
from .cluster import Cluster
from .config import JOURNAL_NAME, Listener, ServeConfig
from .generic import GenericOnly
from .runs_service import RunsService
from .services import ApprovalsService, ExecutorService

log = logging.getLogger("execgate.server")

MAX_MESSAGE = 64 * 1024 * 1024
SERVICE_NAME = "execgate.v1.Executor"
APPROVALS_NAME = "execgate.v1.Approvals"
RUNS_NAME = runs_pb2.DESCRIPTOR.services_by_name["Runs"].full_name


def prepare_dirs(config: ServeConfig) -> int:
    """Create the directories and take the state-dir lock; returns the lock's descriptor.

    One daemon per state dir: a second one would "recover" the first one's running
    calls as interrupted. The flock dies with the process, so a crash leaves no
    stale lock behind.
    """
    config.state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(config.state_dir, 0o700)
    lock_fd = os.open(
        config.state_dir / "daemon.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        raise ConfigError(f"another daemon is running with state dir {config.state_dir}") from None
    config.workspace.mkdir(parents=True, exist_ok=True)
    for lst in config.listeners():
        if lst.unix_path is not None:
            _clear_stale_socket(lst.unix_path)
    return lock_fd


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket left by a dead daemon; refuse to steal a live one's."""
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
        return
    finally:
        probe.close()
    raise ConfigError(f"another daemon is already listening on {path}")


def journal_where(config: ServeConfig) -> str:
    """Where the journal is, as logs may say it (never a password)."""
    if config.journal:
        return redacted(config.journal)
    return str((config.state_dir / JOURNAL_NAME).resolve())


def build(config: ServeConfig) -> tuple[Dispatcher, JournalStore, ToolFile]:
    policy = load_policy(config.policy or default_policy_path())
    toolset, declared = load_toolset(config.tools, _builtins(config).values())
    journal = open_journal(
        config.journal,
        config.state_dir / JOURNAL_NAME,
        lease=config.lease,
        name=f"{socket.gethostname()}:{os.getpid()}:{config.state_dir.resolve()}",
    )
    try:
        return _build(config, policy, toolset, declared, journal)
    except BaseException:
        journal.close()
        raise


def _build(
    config: ServeConfig,
    policy: Policy,
    toolset: ToolSet,
    declared: ToolFile,
    journal: JournalStore,
) -> tuple[Dispatcher, JournalStore, ToolFile]:
    recovered = journal.recover()
    if recovered:
        log.warning("recovered %d call(s) left running by a previous daemon", recovered)
    wanted = {r.backend for r in policy.sandbox if r.backend != "default"}
    wanted |= backends_wanted(declared)
    _check_docker_image(config, declared, policy)
    sandbox = replace(config.sandbox, workspace=config.workspace)
    sandboxes = sandbox_registry.build(
        sandbox, daemon_id(config.state_dir), wanted, policy.sandbox_for
    )
    if "docker" in sandboxes.backends:
        note = dockerd.workspace_note(config.workspace)
        if note is not None:
            log.warning("sandbox docker: %s", note)
    dispatcher = Dispatcher(
        tools=toolset,
        journal=journal,
        policy=policy,
        workspace=Workspace(config.workspace),
        limits=config.limits,
        locks=_lock_backend(config, journal),
        sandboxes=sandboxes,
    )
    return dispatcher, journal, declared


def _on_run_ended(
    served: mcp_wiring.ServedServers, dispatcher: Dispatcher
) -> Callable[[str], None]:
    """What a run's end lets go: its MCP server processes, its warm sandboxes."""

    def ended(run_id: str) -> None:
        served.provider.run_ended(run_id)
        dispatcher.sandboxes.run_ended(run_id)

    return ended


def _check_docker_image(config: ServeConfig, declared: ToolFile, policy: Policy) -> None:
    """The docker backend runs without --docker-image only where every container names
    its image (MCP servers with `sandbox.image`); say so at startup, not at a call."""
    if config.sandbox.docker_image:
        return
    who = "the tools file" if default_image_needed(declared) else ""
    if any(r.backend == "docker" for r in policy.sandbox):
        who = "the policy's sandbox rules"
    if who:
        raise ConfigError(
            f"{who} run tools in the docker sandbox, which needs --docker-image "
            "(only MCP servers with sandbox.image run without one)"
        )


def _builtins(config: ServeConfig) -> dict[str, Tool]:
    return builtin_tools(test_tools=config.test_tools)


def _lock_backend(config: ServeConfig, journal: JournalStore) -> LockBackend:
    match config.locks:
        case "filelock":
            return FileLockManager(config.shared_lock_dir())
        case "postgresql":
            from execgate.executor.locks.pg_backend import PgLockManager

            return PgLockManager(journal, config.lock_space_name())
        case "none":
            log.warning("--locks none: calls are NOT scheduled; conflicting writes race")
            return NoLocks()
        case _:
            return LockManager()


# The exit status of a daemon that lost its lease in a shared journal (EX_TEMPFAIL: its
# supervisor starts it again, as a new member).
LEASE_LOST_EXIT = 75


async def serve(config: ServeConfig, *, on_ready: Callable[[list[str]], None] | None = None) -> int:
    """Serve until signalled (0), or until the daemon lost its lease in a shared journal
    (LEASE_LOST_EXIT)."""
    config.check()
    memdebug.install(asyncio.get_running_loop())
    # Always: a command of the daemon's own uid must not ptrace it or read its memory.
    if not make_non_dumpable():
        log.warning("cannot make the daemon non-dumpable (prctl PR_SET_DUMPABLE)")
    identities = None if config.identities is None else load_identities(config.identities)
    old_umask = os.umask(0o077)  # state dir, journal and sockets: owner only, from birth
    try:
        lock_fd = prepare_dirs(config)
        dispatcher, journal, declared = build(config)
        served = await _start_servers(config, dispatcher, declared, old_umask)
        interceptor = AuthInterceptor(identities)
        if identities is not None:
            dispatcher.authorizer.memberships = identities.memberships
        telemetry = dispatcher.telemetry
        telemetry.tracing = tracing.setup(journal.spans, daemon_id(config.state_dir))
        telemetry.metrics = metrics.setup(daemon_id(config.state_dir), tools=dispatcher.tools)
        telemetry.metrics.gauges(dispatcher.approvals.waiting, dispatcher.queue_depth)
        # A --journal URL is a database other daemons may share; none is our own SQLite.
        runs = RunStore(journal.runs, shared=bool(config.journal))
        runs.on_ended = _on_run_ended(served, dispatcher)
        dispatcher.ended_runs = runs.ended
        dispatcher.run_owners = runs.owners
        dispatcher.workspaces.runs = runs.workspaces
        server, health_servicer = _server(config, dispatcher, runs, interceptor, served)
        addresses = _bind(server, config)
    finally:
        os.umask(old_umask)
    stopping = _Stopping(dispatcher)
    cluster = Cluster(journal.notices, dispatcher, runs, stopping.lease_lost)
    _resume_parked(dispatcher, journal)
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    watchers = _watchers(config, dispatcher, journal, interceptor, served)
    watching = [asyncio.create_task(w.run()) for w in watchers]
    heap.settle()  # startup's heap out of the collector's walks (heap.py)
    if on_ready is not None:
        on_ready(addresses)
    await _until_signalled(stopping.event, on_second=dispatcher.force)
    for task in watching:
        task.cancel()
    log.info("shutting down: draining in-flight calls")
    await health_servicer.enter_graceful_shutdown()
    await _shut_down(server, config, runs, dispatcher, served)
    await cluster.close()
    journal.close()
    os.close(lock_fd)
    return LEASE_LOST_EXIT if stopping.lost else 0


def _resume_parked(dispatcher: Dispatcher, journal: JournalStore) -> None:
    parked = dispatcher.resume_parked(journal.approvals.left_pending())
    if parked:
        log.info("%d call(s) still await approval from before the restart", parked)


class _Stopping:
    """Why the daemon stops: a signal, or the lease it lost in a shared journal."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.event = asyncio.Event()
        self.lost = False
        self._dispatcher = dispatcher

    def lease_lost(self) -> None:
        """Another daemon settled this one's calls and freed its locks: stop at once
        (calls in flight are killed; their records are settled already)."""
        self.lost = True
        self.event.set()
        self._dispatcher.force()


async def _shut_down(
    server: grpc.aio.Server,
    config: ServeConfig,
    runs: RunStore,
    dispatcher: Dispatcher,
    served: mcp_wiring.ServedServers,
) -> None:
    """No new RPCs; every call in flight stopped (grace, then force) and recorded; then
    the MCP servers and the sandboxes go."""
    stopping = asyncio.create_task(server.stop(grace=config.limits.grace + 5))
    runs.close()
    await dispatcher.close()
    await stopping
    await runs.drain()  # the last steps' fsyncs
    await served.provider.close()
    await dispatcher.sandboxes.close()
    dispatcher.telemetry.shutdown()


async def _start_servers(
    config: ServeConfig, dispatcher: Dispatcher, declared: ToolFile, umask: int
) -> mcp_wiring.ServedServers:
    """Leftovers first (a crashed daemon's cgroup leaves), then the MCP servers, with
    the daemon's own umask (a server's files are not the state dir's)."""
    stale = await dispatcher.sandboxes.cleanup_stale()
    if stale:
        log.warning("removed %d sandbox leftover(s) of a previous daemon", stale)
    restore = os.umask(umask)
    try:
        return await mcp_wiring.start_servers(dispatcher, declared, _builtins(config).values())
    finally:
        os.umask(restore)


def _watchers(
    config: ServeConfig,
    dispatcher: Dispatcher,
    journal: JournalStore,
    interceptor: AuthInterceptor,
    served: mcp_wiring.ServedServers,
) -> list[FileWatcher[Any]]:
    """The files reloaded while the daemon runs: policy, identities, tools."""
    watchers: list[FileWatcher[Any]] = [_policy_watcher(config, dispatcher, journal)]
    if interceptor.identities is not None and config.identities is not None:
        watchers.append(
            _identities_watcher(config.identities, interceptor, dispatcher, journal, served)
        )
    if config.tools is not None:
        watchers.append(_tools_watcher(config, dispatcher, journal, served))
    return watchers


def _policy_watcher(
    config: ServeConfig, dispatcher: Dispatcher, journal: JournalStore
) -> FileWatcher[Policy]:
    """Hot reload of the policy file the daemon started with (see policy/reload.py)."""

    def apply(policy: Policy) -> None:
        dispatcher.policy = policy  # one assignment: each call sees the old or the new

    path = Path(config.policy or default_policy_path())
    return policy_watcher(path, dispatcher.policy, apply, journal.reloads, config.policy_reload)


def _tools_watcher(
    config: ServeConfig,
    dispatcher: Dispatcher,
    journal: JournalStore,
    served: mcp_wiring.ServedServers,
) -> FileWatcher[ToolSet]:
    """Hot reload of the tools file or directory (see tools/reload.py)."""
    assert config.tools is not None

    def apply(toolset: ToolSet) -> None:
        dispatcher.toolset = toolset  # one assignment: a call keeps the tool it validated

    return tools_watcher(
        config.tools,
        dispatcher.toolset,
        builtins=_builtins(config).values(),
        backends=dispatcher.sandboxes.backends,
        apply=apply,
        reloads=journal.reloads,
        contribute=served.contribute,
        interval=config.policy_reload,
    )


def _identities_watcher(
    path: Path,
    interceptor: AuthInterceptor,
    dispatcher: Dispatcher,
    journal: JournalStore,
    served: mcp_wiring.ServedServers,
) -> FileWatcher[Identities]:
    """Hot reload of the identities file: a removed identity or token is refused from
    the next RPC on; a file that does not load leaves the last good one in force. An
    agent whose groups changed may fall under another sandbox rule: MCP server
    processes that no longer fit their callers are closed."""

    def apply(identities: Identities) -> None:
        interceptor.identities = identities
        dispatcher.authorizer.memberships = identities.memberships
        served.provider.reconfine()

    return FileWatcher(
        path,
        what="identities",
        parse=parse_identities,
        apply=apply,
        reloads=journal.reloads,
        loaded=interceptor.identities.revision if interceptor.identities else "",
    )


def _server(
    config: ServeConfig,
    dispatcher: Dispatcher,
    runs: RunStore,
    interceptor: AuthInterceptor,
    served: mcp_wiring.ServedServers,
) -> tuple[grpc.aio.Server, Any]:  # Any: health.aio.HealthServicer, see below
    server = grpc.aio.server(
        # Authentication wraps each method with the request guard too (guard.guarded):
        # a stranger's garbage stays UNAUTHENTICATED.
        interceptors=[interceptor],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.so_reuseport", 0),
        ],
    )
    executor = ExecutorService(dispatcher, served.provider.status)
    generic: Any = GenericOnly(server)  # one pending request for all methods (generic.py)
    pb_grpc.add_ExecutorServicer_to_server(executor, generic)
    approvals = ApprovalsService(dispatcher.approvals, lambda: dispatcher.policy)
    pb_grpc.add_ApprovalsServicer_to_server(approvals, generic)
    rpb_grpc.add_RunsServicer_to_server(RunsService(runs, dispatcher), generic)
    # grpc-stubs type only the sync grpc_health.v1.health, not its `aio` module.
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, generic)
    if config.reflection:
        from grpc_reflection.v1alpha import reflection

        names = (
            SERVICE_NAME,
            APPROVALS_NAME,
            RUNS_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, server)
    return server, health_servicer


def _bind(server: grpc.aio.Server, config: ServeConfig) -> list[str]:
    """Unix sockets are plaintext (owner-only); TCP is mTLS when config.tls says so."""
    tls = None if config.tls is None else server_credentials(config.tls)
    addresses = []
    for lst in config.listeners():
        try:
            if tls is not None and lst.unix_path is None:
                port = server.add_secure_port(lst.grpc_address, tls)
            else:
                port = server.add_insecure_port(lst.grpc_address)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen on {lst.grpc_address}: {exc}") from exc
        if lst.unix_path is not None:
            os.chmod(lst.unix_path, 0o600)
            addresses.append(lst.grpc_address)
        else:
            addresses.append(Listener(host=lst.host, port=port).grpc_address)
    return addresses


async def _until_signalled(stop: asyncio.Event, on_second: Callable[[], None]) -> None:
    """Returns on SIGTERM/SIGINT (or once `stop` is set). A second signal forces:
    in-flight calls are killed now (and still recorded); a third exits at once."""
    loop = asyncio.get_running_loop()
    forced = False

    def on_signal(signum: int) -> None:
        nonlocal forced
        if forced:
            log.error("third signal: exiting without recording in-flight calls")
            os._exit(1)
        if stop.is_set():
            log.warning("second signal: force-terminating in-flight calls")
            forced = True
            on_second()
            return
        log.info("received %s", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    await stop.wait()
