from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client
from execgate.executor.sandbox import cgroup
from tests.daemon import Daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A real daemon on a temporary socket, with its own workspace and journal."""
    d = Daemon(tmp_path).start()
    yield d
    if d.proc is not None and d.proc.poll() is None:
        d.stop()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with Client(daemon.address) as c:
        yield c


@pytest.fixture(scope="module")
def shared(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    """One daemon for a whole test module (starting one costs about a second)."""
    d = Daemon(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])).start()
    yield d
    if d.proc is not None and d.proc.poll() is None:
        d.stop()


@pytest.fixture(scope="module")
def eg(shared: Daemon) -> Iterator[Client]:
    """A client of the module's shared daemon."""
    with Client(shared.address) as c:
        yield c


def _cgroup_dirs() -> set[Path]:
    """The `execgate-*` cgroup directories daemons of this host made under our cgroup."""
    found: set[Path] = set()
    own = cgroup._own_paths()
    for kind, mount in cgroup._mounts().items():
        if kind in own:
            found.update((mount / own[kind].lstrip("/")).glob("execgate-*"))
    return found


@pytest.fixture(scope="session", autouse=True)
def tidy_cgroups() -> Iterator[None]:
    """Daemons the tests SIGKILL never remove their (empty) cgroup directories: do it."""
    before = _cgroup_dirs()
    yield
    for base in _cgroup_dirs() - before:
        for leaf in base.iterdir():
            if leaf.is_dir():
                with contextlib.suppress(OSError):
                    leaf.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()
