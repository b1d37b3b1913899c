from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client
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
