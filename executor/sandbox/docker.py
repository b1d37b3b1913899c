"""The `docker` backend: each call in a hardened container of its own, or an exec in a warm one.

What a call's container gets: the image's file system read-only, a private 64 MiB
/tmp, the workspace bind-mounted at its host path (so cwd and paths mean the same
inside; read-write for a tool that may write, read-only otherwise) and nothing
else of the host; no network unless policy opens it (docker's bridge then); every
capability dropped and no-new-privileges; memory (= memory+swap: no swap), pids
and rlimits (cpu, fsize, nofile) from the Confinement; docker-init as PID 1. It
never runs as root: the user is the workspace's owner, or nobody (65534) when
root owns the workspace -- which then is, in practice, read-only for docker calls.

Stopping a per-call container: SIGTERM to the container (docker-init forwards it
to the command); force is SIGKILL to its init, upon which the kernel kills every
process in the container's PID namespace, setsid-escaped grandchildren included.
Containers are created, not run with auto-remove (that races the exit status and
the output): `release` removes them. Each carries the daemon's id as a label, so
`cleanup_stale` removes what a crashed predecessor left.

Warm mode: one long-lived container per run (and workspace, write mode, limits)
that only waits; each call is an exec in it, which saves the container start
(see docs/sandbox-docker.md for figures). An exec has no namespace of its own, so
the call's processes are found by their marker (MARKER_ENV) in /proc: the daemon
must run as root in dockerd's PID namespace (`probe` checks the first). SIGTERM
goes to every marked process; force SIGKILLs them and discards the container (the
run's next call gets a new one), which also ends what cleared its environment.

Every SDK call blocks. Short ones run in the default executor; those that last as
long as the call (the exit status, the output stream) get threads of their own,
so that long calls can never make a kill queue behind them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import signal
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import docker  # type: ignore[import-untyped]
from docker.errors import APIError, DockerException, ImageNotFound  # type: ignore[import-untyped]
from docker.types import LogConfig, Ulimit  # type: ignore[import-untyped]

from . import procscan
from .base import MARKER_ENV, Captured, Exit, Launch, Probe, SandboxError

T = TypeVar("T")

MODES = ("per-call", "warm")
NOBODY = "65534:65534"
TMPFS = {"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"}
# The warm container's command: wait, and exit at once on SIGTERM. Needs sh in the image.
WAITER = ("sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done")
LABEL_DAEMON, LABEL_RUN, LABEL_CALL = "execgate.daemon", "execgate.run", "execgate.call"
# After the call stops, read what output is there, then stop waiting (see process.py).
OUTPUT_SETTLE_SECONDS = 1.0
# The API has no blocking wait for an exec: poll it, less often as the call goes on.
EXEC_POLL_FIRST, EXEC_POLL_MAX = 0.005, 0.1


class DockerSandbox:
    name = "docker"

    def __init__(self, image: str, *, daemon_id: str, mode: str = "per-call") -> None:
        if mode not in MODES:
            raise ValueError(f"docker mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.image = image
        self.daemon_id = daemon_id
        self.mode = mode
        # Created on first use (it asks dockerd for its API version): building the
        # backend, as `execgate doctor` does for every backend, never touches dockerd.
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._warm = _WarmPool(self)

    def api(self) -> Any:
        """The low-level SDK client (blocking)."""
        with self._client_lock:
            if self._client is None:
                try:
                    self._client = docker.from_env()
                except DockerException as exc:
                    raise SandboxError(f"dockerd not reachable: {exc}") from exc
            return self._client.api

    async def start(self, launch: Launch) -> ContainerRunning | ExecRunning:
        if self.mode == "warm":
            return await self._warm.start(launch)
        cid, sio = await asyncio.to_thread(self._start_container, launch)
        stdio = _Stdio(sio, launch.stdin, launch.output_cap)
        where = f"container {cid[:12]} ({self.image}, per call)"
        return ContainerRunning(self, cid, stdio, where)

    def _start_container(self, launch: Launch) -> tuple[str, Any]:
        """Create the call's container, attach to its stdio before it starts, start it."""
        with self.errors():
            api = self.api()
            cid = self.create(launch, list(launch.argv), call=True)
            try:
                params = {"stdout": 1, "stderr": 1, "stream": 1}
                if launch.stdin is not None:
                    params["stdin"] = 1
                sio = api.attach_socket(cid, params=params)
                try:
                    api.start(cid)
                except BaseException:
                    close_socket(sio)
                    raise
            except BaseException:
                self.remove(cid)
                raise
            return cid, sio

    def create(self, launch: Launch, command: list[str], *, call: bool) -> str:
        """A hardened container for `launch` (blocking); `call`: one call's, not a warm one."""
        conf = launch.confinement
        ws = str(launch.workspace)
        api = self.api()
        host = api.create_host_config(
            binds={ws: {"bind": ws, "mode": "rw" if launch.writable else "ro"}},
            network_mode="bridge" if conf.network else "none",
            read_only=True,
            tmpfs=dict(TMPFS),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            init=True,
            mem_limit=conf.memory_bytes,
            memswap_limit=conf.memory_bytes,
            pids_limit=conf.processes,
            ulimits=[
                Ulimit(name="nofile", soft=conf.open_files, hard=conf.open_files),
                Ulimit(name="fsize", soft=conf.file_size_bytes, hard=conf.file_size_bytes),
                Ulimit(name="cpu", soft=conf.cpu_seconds, hard=conf.cpu_seconds),
            ],
            # Output reaches us only through the attach stream: nothing piles up on disk.
            log_config=LogConfig(type="none"),
        )
        labels = {LABEL_DAEMON: self.daemon_id, LABEL_RUN: launch.run_id}
        if call:
            labels[LABEL_CALL] = launch.marker
        created = api.create_container(
            self.image,
            command=command,
            working_dir=str(launch.cwd) if call else None,
            environment={**launch.env, MARKER_ENV: launch.marker} if call else None,
            user=container_user(launch.workspace),
            stdin_open=call and launch.stdin is not None,
            labels=labels,
            host_config=host,
        )
        return str(created["Id"])

    def remove(self, cid: str) -> None:
        """Kill and remove a container (blocking); one already gone is fine."""
        try:
            self.api().remove_container(cid, force=True)
        except APIError as exc:
            if exc.status_code not in (404, 409):  # gone, or its removal is under way
                raise

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """dockerd's and the SDK's errors, translated once, here at the edge."""
        try:
            yield
        except ImageNotFound as exc:
            raise SandboxError(f"image {self.image} not found: build or pull it first") from exc
        except APIError as exc:
            raise SandboxError(f"dockerd refused ({self.image}): {exc.explanation}") from exc
        except (DockerException, OSError) as exc:  # requests' connection errors are OSErrors
            raise SandboxError(f"dockerd not reachable: {exc}") from exc

    def probe(self) -> Probe:
        try:
            api = self.api()
            version = api.version()["Version"]
        except (SandboxError, DockerException, OSError) as exc:
            return Probe(self.name, False, f"dockerd not reachable: {exc}")
        try:
            api.inspect_image(self.image)
        except ImageNotFound:
            why = f"image {self.image} not found: build it (docker build -t {self.image} ...)"
            return Probe(self.name, False, f"dockerd {version}, but {why}")
        except (DockerException, OSError) as exc:
            return Probe(self.name, False, f"dockerd {version}, image {self.image!r}: {exc}")
        if self.mode == "warm" and os.geteuid() != 0:
            why = "warm mode finds a call's processes in /proc: run the daemon as root"
            return Probe(self.name, False, f"dockerd {version}, but {why} (or use per-call)")
        return Probe(self.name, True, f"dockerd {version}, image {self.image} present, {self.mode}")

    async def cleanup_stale(self) -> int:
        return await asyncio.to_thread(self._remove_labelled)

    def _remove_labelled(self) -> int:
        """Remove every container, running or not, that carries this daemon's id."""
        with self.errors():
            found = self.api().containers(
                all=True, filters={"label": f"{LABEL_DAEMON}={self.daemon_id}"}
            )
            for container in found:
                self.remove(container["Id"])
        return len(found)

    async def close(self) -> None:
        """Remove the warm containers, and any call's that a cancelled start left behind."""
        if self._client is None:
            return
        self._warm.forget()
        await asyncio.to_thread(self._remove_labelled)
        with self._client_lock:
            self._client.close()
            self._client = None


class ContainerRunning:
    """A call in a container of its own."""

    def __init__(self, sandbox: DockerSandbox, cid: str, stdio: _Stdio, description: str) -> None:
        self.sandbox = sandbox
        self.cid = cid
        self.stdio = stdio
        self.description = description
        # Set before we signal: a status above 128 then means "killed by signal".
        self._signalled = False
        self._released = False
        self._signals: list[asyncio.Future[None]] = []
        self._exited = in_thread(self._wait_exit, f"docker-wait-{cid[:12]}")

    def _wait_exit(self) -> Exit:
        api = self.sandbox.api()
        with self.sandbox.errors():
            code = api.wait(self.cid)["StatusCode"]
            oom = bool(api.inspect_container(self.cid)["State"]["OOMKilled"])
        return exit_of(code, oom, self._signalled)

    async def wait(self) -> Exit:
        return await asyncio.shield(self._exited)

    async def finish(self) -> None:
        """Nothing is left: docker-init exits with the command, and the kernel empties
        the container's PID namespace when its init is gone."""

    def terminate(self) -> str:
        # `docker kill` takes 2-70 ms: too long to block the event loop, so it runs in a
        # thread, which `release` joins.
        self._signalled = True
        self._signals.append(in_thread(functools.partial(self._signal, "SIGTERM"), "docker-term"))
        return f"SIGTERM to container {self.cid[:12]} (docker-init forwards it to the command)"

    async def kill(self) -> str:
        self._signalled = True
        await asyncio.to_thread(self._signal, "SIGKILL")
        return f"SIGKILL to container {self.cid[:12]} (its whole PID namespace dies with it)"

    def _signal(self, name: str) -> None:
        try:
            self.sandbox.api().kill(self.cid, signal=name)
        except APIError as exc:
            if exc.status_code not in (404, 409):  # gone, or already stopped
                raise

    async def survivors(self) -> list[int]:
        if self._exited.done() and self._exited.exception() is None:
            return []  # its init is gone, and so is everything else in it
        return await asyncio.to_thread(self._top)

    def _top(self) -> list[int]:
        try:
            top = self.sandbox.api().top(self.cid)
        except APIError as exc:
            if exc.status_code in (404, 409):  # removed, or not running any more
                return []
            raise
        column = top["Titles"].index("PID")
        return sorted(int(row[column]) for row in top["Processes"] or [])

    async def output(self) -> tuple[Captured, Captured]:
        return await self.stdio.result()

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        # A SIGTERM that failed changes nothing now: the ladder has moved on without it.
        await asyncio.gather(*self._signals, return_exceptions=True)
        try:
            await asyncio.to_thread(self.sandbox.remove, self.cid)
        finally:
            self.stdio.close()


class ExecRunning:
    """A call running as an exec in its run's warm container."""

    def __init__(self, pool: _WarmPool, warm: _Warm, exec_id: str, stdio: _Stdio, marker: str):
        self.pool = pool
        self.warm = warm
        self.exec_id = exec_id
        self.stdio = stdio
        self.marker = marker
        self.description = f"exec {exec_id[:12]} in warm container {warm.cid[:12]}"
        self._ooms = oom_kills(warm.pid)
        self._signalled = False
        self._released = False

    async def wait(self) -> Exit:
        api, delay = self.pool.sandbox.api(), EXEC_POLL_FIRST
        while True:
            try:
                info = await asyncio.to_thread(api.exec_inspect, self.exec_id)
            except APIError as exc:
                if exc.status_code != 404:
                    raise
                return Exit(None, signal.SIGKILL)  # its container was discarded
            if not info["Running"] and info["ExitCode"] is not None:
                break  # (not running and no exit code: not started yet)
            await asyncio.sleep(delay)
            delay = min(delay * 2, EXEC_POLL_MAX)
        oom = oom_kills(self.warm.pid) > self._ooms
        return exit_of(info["ExitCode"], oom, self._signalled)

    async def finish(self) -> None:
        """The command exited, but the container lives on: end what it left running."""
        await asyncio.to_thread(signal_marked, self.marker, signal.SIGKILL)

    def terminate(self) -> str:
        self._signalled = True
        count = signal_marked(self.marker, signal.SIGTERM)
        return f"SIGTERM to the {count} process(es) of exec {self.exec_id[:12]}"

    async def kill(self) -> str:
        self._signalled = True
        count = await asyncio.to_thread(signal_marked, self.marker, signal.SIGKILL)
        return f"SIGKILL to {count} marked process(es); " + await self.pool.discard(self.warm)

    async def survivors(self) -> list[int]:
        return await asyncio.to_thread(procscan.with_marker, MARKER_ENV, self.marker)

    async def output(self) -> tuple[Captured, Captured]:
        return await self.stdio.result()

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.stdio.close()
        await self.pool.leave(self.warm)


@dataclass(eq=False)
class _Warm:
    cid: str
    # The container's init, as a host pid: where its memory cgroup is found.
    pid: int
    # Calls started in it and not yet released.
    users: int = 0
    # Never given to a new call; removed when its last call is released.
    doomed: bool = False
    removed: bool = False


class _WarmPool:
    """The warm containers, one per (run, workspace, user, write mode, limits).

    Invariant: a container in `_by_key` is not doomed; a doomed one is removed
    once its `users` drop to 0.
    """

    def __init__(self, sandbox: DockerSandbox) -> None:
        self.sandbox = sandbox
        self._by_key: dict[tuple[object, ...], _Warm] = {}
        self._lock = asyncio.Lock()

    async def start(self, launch: Launch) -> ExecRunning:
        warm = await self._enter(launch)
        try:
            exec_id, sio = await asyncio.to_thread(self._start_exec, warm, launch)
        except BaseException:
            await self.leave(warm)
            raise
        return ExecRunning(
            self, warm, exec_id, _Stdio(sio, launch.stdin, launch.output_cap), launch.marker
        )

    async def _enter(self, launch: Launch) -> _Warm:
        key = (
            launch.run_id,
            launch.workspace,
            container_user(launch.workspace),
            launch.writable,
            launch.confinement,
        )
        async with self._lock:
            warm = self._by_key.get(key)
            if warm is not None and not await self.running(warm):  # OOM may have hit its init
                await self._retire(warm, warm.users)
                warm = None
            if warm is None:
                warm = await asyncio.to_thread(self._create, launch)
                self._by_key[key] = warm
            warm.users += 1
            return warm

    def _create(self, launch: Launch) -> _Warm:
        with self.sandbox.errors():
            cid = self.sandbox.create(launch, list(WAITER), call=False)
            try:
                api = self.sandbox.api()
                api.start(cid)
                return _Warm(cid, int(api.inspect_container(cid)["State"]["Pid"]))
            except BaseException:
                self.sandbox.remove(cid)
                raise

    def _start_exec(self, warm: _Warm, launch: Launch) -> tuple[str, Any]:
        with self.sandbox.errors():
            api = self.sandbox.api()
            exec_id = api.exec_create(
                warm.cid,
                list(launch.argv),
                stdin=launch.stdin is not None,
                environment={**launch.env, MARKER_ENV: launch.marker},
                workdir=str(launch.cwd),
                user=container_user(launch.workspace),
            )["Id"]
            return str(exec_id), api.exec_start(exec_id, socket=True)

    async def running(self, warm: _Warm) -> bool:
        def running() -> bool:
            try:
                return bool(self.sandbox.api().inspect_container(warm.cid)["State"]["Running"])
            except APIError as exc:
                if exc.status_code == 404:
                    return False
                raise

        return not warm.removed and await asyncio.to_thread(running)

    async def discard(self, warm: _Warm) -> str:
        """Retire `warm` (force termination of one of its calls): removed now if that call
        is its only one, else once its other calls end, so they are not killed with it."""
        others = warm.users - 1
        if await self._retire(warm, others):
            return f"warm container {warm.cid[:12]} removed (the run's next call gets a new one)"
        return f"warm container {warm.cid[:12]} retired ({others} other call(s) still in it)"

    async def _retire(self, warm: _Warm, users: int) -> bool:
        """Never hand `warm` to a new call; remove it now if `users` is 0. True if removed."""
        warm.doomed = True
        self._by_key = {k: w for k, w in self._by_key.items() if w is not warm}
        if users > 0:
            return False
        await self._remove(warm)
        return True

    async def leave(self, warm: _Warm) -> None:
        warm.users -= 1
        if warm.doomed and warm.users == 0:
            await self._remove(warm)

    async def _remove(self, warm: _Warm) -> None:
        if not warm.removed:
            warm.removed = True
            await asyncio.to_thread(self.sandbox.remove, warm.cid)

    def forget(self) -> None:
        """Daemon shutdown: the caller removes every labelled container, these included."""
        self._by_key.clear()


class _Stdio:
    """One hijacked attach or exec connection: feeds stdin, keeps `cap` bytes of
    stdout and of stderr (counting the rest). Each direction has its own thread, so
    a command that writes before it reads cannot deadlock against us."""

    def __init__(self, sio: Any, stdin: bytes | None, cap: int) -> None:
        self._sio = sio
        # The SDK hands out a SocketIO over the socket: shutdown needs the socket itself.
        self._sock: socket.socket = getattr(sio, "_sock", sio)
        # The client's request timeout must not end a quiet call's stream.
        self._sock.settimeout(None)
        self._cap = cap
        self._kept = (bytearray(), bytearray())
        self._totals = [0, 0]
        self._done = in_thread(self._pump, "docker-output")
        if stdin is not None:
            threading.Thread(
                target=self._feed, args=(stdin,), name="docker-stdin", daemon=True
            ).start()

    def _feed(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self._sock.sendall(data)
            self._sock.shutdown(socket.SHUT_WR)  # EOF for the command's stdin

    def _pump(self) -> None:
        """Demultiplex docker's frames (8-byte header: stream, 3 zero bytes, size)."""
        while (header := self._exactly(8)) is not None:
            stream, size = struct.unpack(">BxxxL", header)
            while size > 0:
                chunk = self._recv(min(size, 65536))
                if not chunk:
                    return
                size -= len(chunk)
                if stream in (1, 2):
                    self._keep(stream - 1, chunk)

    def _exactly(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = self._recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def _recv(self, n: int) -> bytes:
        try:
            return self._sock.recv(n)
        except OSError:  # closed under us by `close`
            return b""

    def _keep(self, index: int, chunk: bytes) -> None:
        kept = self._kept[index]
        self._totals[index] += len(chunk)
        if len(kept) < self._cap:
            kept += chunk[: self._cap - len(kept)]

    async def result(self) -> tuple[Captured, Captured]:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._done), OUTPUT_SETTLE_SECONDS)
        out, err = self._kept
        return Captured(bytes(out), self._totals[0]), Captured(bytes(err), self._totals[1])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked on it
        close_socket(self._sio)


def close_socket(sio: Any) -> None:
    """Close a hijacked connection: the SocketIO, its socket and the HTTP response."""
    raw = getattr(sio, "_sock", None)
    response = getattr(sio, "_response", None)
    if response is not None:
        response.close()
    sio.close()
    if raw is not None:
        raw.close()


def container_user(workspace: Path) -> str:
    """The workspace's owner, never root: root in the container is root on the bind mount."""
    st = os.stat(workspace)
    return f"{st.st_uid}:{st.st_gid}" if st.st_uid != 0 else NOBODY


def exit_of(code: int, oom: bool, signalled: bool) -> Exit:
    """docker-init reports a command killed by signal N as status 128+N. That is only
    told apart from `exit 128+N` when we signalled the call or the OOM killer struck."""
    if code > 128 and (signalled or oom):
        return Exit(None, code - 128, oom)
    return Exit(code, None, oom)


def signal_marked(marker: str, sig: int) -> int:
    """Send `sig` to every live process carrying the call's marker; returns how many."""
    pids = procscan.with_marker(MARKER_ENV, marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return len(pids)


def oom_kills(pid: int) -> int:
    """OOM kills so far in the memory cgroup of host process `pid` (0 if unreadable).

    dockerd reports OOMKilled only once a container has stopped; a warm one does not.
    """
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return 0
    files: list[Path] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1 (and the v1 half of a hybrid host)
            files.insert(0, Path(f"/sys/fs/cgroup/memory{path}/memory.oom_control"))
        elif controllers == "":
            files.append(Path(f"/sys/fs/cgroup{path}/memory.events"))
    for file in files:
        with contextlib.suppress(OSError, ValueError):
            for entry in file.read_text().splitlines():
                key, _, value = entry.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def in_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """Run `fn`, a blocking call that lasts as long as a container, in a thread of its own.

    The future's exception counts as retrieved even if nobody awaits it (a wait that
    fails because `release` removed the container): awaiting it still raises.
    """
    done: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if done.set_running_or_notify_cancel():
            try:
                done.set_result(fn())
            except Exception as exc:
                done.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    future = asyncio.wrap_future(done)
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future
