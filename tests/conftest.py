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
