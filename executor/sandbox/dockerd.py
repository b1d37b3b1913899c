"""The edge to dockerd for the `docker` backend: every docker SDK call is made here.

`Dockerd` holds one SDK client, made on first use, and translates the SDK's
errors into SandboxError once; it knows what a hardened container looks like
(see docker.py), and labels each with this daemon's id and this daemon process's
instance, by which its guard (dockerguard.py) finds them if the process dies. What goes
over the hijacked attach and exec connections is docker_io.py's.

Every SDK call blocks. Short ones run in the default executor (`asyncio.to_thread`);
those that last as long as a call (its exit status, its output stream) get threads
of their own (`in_thread`), so that long calls can never make a kill queue behind
them in a shared pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import docker  # type: ignore[import-untyped]
from docker.errors import APIError, DockerException, ImageNotFound  # type: ignore[import-untyped]
from docker.types import LogConfig, Mount, Ulimit  # type: ignore[import-untyped]

from .base import MARKER_ENV, Exit, Launch, SandboxError

T = TypeVar("T")

NOBODY = "65534:65534"
TMPFS = {"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"}
LABEL_DAEMON, LABEL_RUN, LABEL_CALL = "execgate.daemon", "execgate.run", "execgate.call"
# Per daemon process (the daemon id is per state dir, so it outlives a process).
LABEL_INSTANCE = "execgate.instance"
IMAGE_NEEDED = "give --docker-image, or the server's sandbox.image in the tools file"


class ContainerGone(SandboxError):
    """The container (or exec) is no longer known to dockerd; `explanation` is dockerd's."""

    def __init__(self, explanation: str) -> None:
        super().__init__(f"gone from dockerd: {explanation}")
        self.explanation = explanation


class Dockerd:
    """This daemon's connection to dockerd, and the containers it makes. Blocking."""

    def __init__(
        self,
        image: str,
        daemon_id: str,
        *,
        instance: str = "",
        on_create: Callable[[], None] | None = None,
    ) -> None:
        # The default image ("": none; only a launch that names its own can run).
        self.image = image
        self.daemon_id = daemon_id
        self.instance = instance or secrets.token_hex(8)
        # Called after a container is created, before it starts (the guard's start).
        self._on_create = on_create
        # Made on first use (it asks dockerd for its API version): building the
        # backend, as `execgate doctor` does for every backend, never touches dockerd.
        self._client: Any = None
        self._lock = threading.Lock()

    def api(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    self._client = docker.from_env()
                except DockerException as exc:
                    raise SandboxError(f"dockerd not reachable: {exc}") from exc
            return self._client.api

    @contextlib.contextmanager
    def errors(self, image: str = "") -> Iterator[None]:
        """The SDK's and dockerd's errors as SandboxError, naming the image (`image`, else
        the default) or the daemon."""
        image = image or self.image
        try:
            yield
        except ImageNotFound as exc:
            raise SandboxError(f"image {image} not found: build or pull it first") from exc
        except APIError as exc:
            if exc.status_code == 404:
                raise ContainerGone(str(exc.explanation)) from exc
            raise SandboxError(f"dockerd refused ({image}): {exc.explanation}") from exc
        except OSError as exc:  # requests' connection errors are OSErrors
            raise SandboxError(f"dockerd not reachable: {exc}") from exc
        except DockerException as exc:  # the SDK's own checks (an empty image name, ...)
            raise SandboxError(f"docker ({image}): {exc}") from exc

    def check(self) -> str:
        """What `execgate doctor` says when dockerd (and the default image) are there."""
        with self.errors():
            version = self.api().version()["Version"]
        if not self.image:
            return f"dockerd {version}, no default image (--docker-image): {IMAGE_NEEDED}"
        try:
            with self.errors():
                self.api().inspect_image(self.image)
        except SandboxError as exc:
            raise SandboxError(f"dockerd {version}, but {exc}") from exc
        return f"dockerd {version}, image {self.image} present"

    def start_attached(self, launch: Launch) -> tuple[str, Any]:
        """Create a call's own container, attach to its stdio before it starts, start it."""
        params = {"stdout": 1, "stderr": 1, "stream": 1}
        if launch.stdin is not None:
            params["stdin"] = 1
        cid, (sio,) = self._start_attached(launch, [params])
        return cid, sio

    def start_serving(self, launch: Launch) -> tuple[str, Any, Any]:
        """A server's container (`Launch.serve`), started; its id, then its stdin and its
        output on two connections (see docker_io.ServerStdio)."""
        stdin = {"stdin": 1, "stream": 1}
        output = {"stdout": 1, "stderr": 1, "stream": 1}
        cid, (sin, sout) = self._start_attached(launch, [stdin, output])
        return cid, sin, sout

    def _start_attached(
        self, launch: Launch, attaches: list[dict[str, int]]
    ) -> tuple[str, list[Any]]:
        with self.errors(launch.image):
            cid = self.create(launch, list(launch.argv), call=True)
            sios: list[Any] = []
            try:
                for params in attaches:
                    sios.append(self.api().attach_socket(cid, params=params))
                self.api().start(cid)
            except BaseException:
                for sio in sios:
                    close_socket(sio)
                self.remove(cid)
                raise
            return cid, sios

    def start_waiting(self, launch: Launch, command: list[str]) -> tuple[str, int]:
        """Create and start a warm container for `launch`'s run; its id and init's host pid."""
        with self.errors():
            cid = self.create(launch, command, call=False)
            try:
                self.api().start(cid)
                return cid, int(self.api().inspect_container(cid)["State"]["Pid"])
            except BaseException:
                self.remove(cid)
                raise

    def start_exec(self, cid: str, launch: Launch) -> tuple[str, Any]:
        """Start `launch` as an exec in container `cid`; its id and stdio connection."""
        with self.errors():
            exec_id = self.api().exec_create(
                cid,
                list(launch.argv),
                stdin=launch.stdin is not None,
                environment={**launch.env, MARKER_ENV: launch.marker},
                workdir=str(launch.cwd),
                user=container_user(launch.workspace),
            )["Id"]
            return str(exec_id), self.api().exec_start(exec_id, socket=True)

    def create(self, launch: Launch, command: list[str], *, call: bool) -> str:
        """A hardened container for `launch`; `call`: the call's own, not a warm one."""
        image = launch.image or self.image
        if not image:
            raise SandboxError(f"docker: no image for this call: {IMAGE_NEEDED}")
        conf = launch.confinement
        ws = str(launch.workspace)
        host = self.api().create_host_config(
            binds={ws: {"bind": ws, "mode": "rw" if launch.writable else "ro"}},
            # A command's declared writes, read-write over the read-only workspace (the
            # Mounts API: no parsing of `src:dst:mode`, whatever the path holds; dockerd
            # mounts parents before what lies inside them).
            mounts=[Mount(str(p), str(p), type="bind", read_only=False) for p in launch.write_paths]
            or None,
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
            # Output reaches us through the attach stream only: nothing piles up on disk.
            log_config=LogConfig(type="none"),
        )
        labels = {
            LABEL_DAEMON: self.daemon_id,
            LABEL_INSTANCE: self.instance,
            LABEL_RUN: launch.run_id,
        }
        if call:
            labels[LABEL_CALL] = launch.marker
        created = self.api().create_container(
            image,
            command=command,
            working_dir=str(launch.cwd) if call else None,
            environment={**launch.env, MARKER_ENV: launch.marker} if call else None,
            user=container_user(launch.workspace),
            # With stdin open the SDK also sets StdinOnce: dockerd closes the command's
            # stdin when our connection to it ends (we close it, or this daemon died).
            stdin_open=call and (launch.stdin is not None or launch.serve),
            labels=labels,
            host_config=host,
        )
        cid = str(created["Id"])
        if self._on_create is not None:
            try:
                self._on_create()
            except BaseException:
                self.remove(cid)
                raise
        return cid

    def wait(self, cid: str) -> tuple[int, bool]:
        """Until the container stops: its status, and whether the OOM killer struck in it."""
        with self.errors():
            code = self.api().wait(cid)["StatusCode"]
            oom = self.api().inspect_container(cid)["State"]["OOMKilled"]
        return int(code), bool(oom)

    def init_pid(self, cid: str) -> int:
        """The host pid of the container's init (0 once it has stopped)."""
        with self.errors():
            return int(self.api().inspect_container(cid)["State"]["Pid"])

    def exec_status(self, exec_id: str) -> int | None:
        """An exec's exit status, None while it runs (or has yet to start)."""
        with self.errors():
            info = self.api().exec_inspect(exec_id)
        return None if info["Running"] or info["ExitCode"] is None else int(info["ExitCode"])

    def running(self, cid: str) -> bool:
        try:
            with self.errors():
                return bool(self.api().inspect_container(cid)["State"]["Running"])
        except ContainerGone:
            return False

    def signal(self, cid: str, name: str) -> None:
        """`docker kill --signal`; a container that is gone or stopped is fine."""
        with self.errors(), _unless(404, 409):
            self.api().kill(cid, signal=name)

    def top(self, cid: str) -> list[int]:
        """Host pids of the container's processes; [] once it has stopped or is gone."""
        with self.errors(), _unless(404, 409):
            top = self.api().top(cid)
            column = top["Titles"].index("PID")
            return sorted(int(row[column]) for row in top["Processes"] or [])
        return []

    def remove(self, cid: str) -> None:
        """Kill and remove; a container that is gone, or being removed, is fine."""
        with self.errors(), _unless(404, 409):
            self.api().remove_container(cid, force=True)

    def remove_labelled(self, *, instance_only: bool = False) -> int:
        """Remove every container, running or not, that carries this daemon's id (and
        `instance_only`: this daemon process's instance label)."""
        labels = [f"{LABEL_DAEMON}={self.daemon_id}"]
        if instance_only:
            labels.append(f"{LABEL_INSTANCE}={self.instance}")
        with self.errors():
            found = self.api().containers(all=True, filters={"label": labels})
        for container in found:
            self.remove(container["Id"])
        return len(found)

    @property
    def connected(self) -> bool:
        return self._client is not None

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


@contextlib.contextmanager
def _unless(*codes: int) -> Iterator[None]:
    """Ignore dockerd's answers with these HTTP statuses."""
    try:
        yield
    except APIError as exc:
        if exc.status_code not in codes:
            raise


def container_user(workspace: Path) -> str:
    """The workspace's owner, never root: root in the container is root on the bind mount."""
    try:
        st = os.stat(workspace)
    except OSError as exc:
        raise SandboxError(f"workspace {workspace}: {exc.strerror}") from exc
    return f"{st.st_uid}:{st.st_gid}" if st.st_uid != 0 else NOBODY


def workspace_note(workspace: Path) -> str | None:
    """Why commands in containers cannot write the workspace, if they cannot.

    Containers never run as root (root in the container is root on the bind mount), so a
    root-owned workspace is read-only to them unless its mode lets `nobody` write.
    """
    try:
        st = os.stat(workspace)
    except OSError:
        return None  # the workspace check at startup names this
    if st.st_uid != 0 or st.st_mode & 0o002:
        return None
    return (
        f"the workspace {workspace} is owned by root, and commands in containers run as "
        f"{NOBODY} (never as root), so they cannot write it; chown it to the user that "
        "should own what commands write (containers then run as that user)"
    )


def exit_of(code: int, oom: bool, signalled: bool) -> Exit:
    """docker-init reports a command killed by signal N as status 128+N. That can only be
    told apart from `exit 128+N` when we signalled the call or the OOM killer struck."""
    if code > 128 and (signalled or oom):
        return Exit(None, code - 128, oom)
    return Exit(code, None, oom)


def close_socket(sio: Any) -> None:
    """Close a hijacked connection: the HTTP response, the SocketIO and its socket."""
    raw = getattr(sio, "_sock", None)
    response = getattr(sio, "_response", None)
    if response is not None:
        response.close()
    sio.close()
    if raw is not None:
        raw.close()


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
