from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client
from execgate.executor.sandbox import cgroup
from execgate.executor.sandbox.registry import daemon_id
from tests import daemon as daemon_module
from tests.daemon import Daemon
from tests.pg_support import PgServer, bin_dir

JOURNAL_STORES = ("sqlite", "postgresql")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--journal-stores",
        default=",".join(JOURNAL_STORES),
        help="the journal stores the modules marked `journals` run against (comma-separated)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module marked `journals` runs once on each journal store (its daemons get
    `--journal postgresql://...` on the second)."""
    if "journal_store" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("journals") is None:
        return
    stores = [s for s in metafunc.config.getoption("--journal-stores").split(",") if s]
    unknown = set(stores) - set(JOURNAL_STORES)
    if unknown:
        raise pytest.UsageError(f"--journal-stores: unknown {sorted(unknown)}")
    metafunc.parametrize("journal_store", stores, indirect=True, scope="module")


@pytest.fixture(scope="module")
def journal_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """The journal store this module's daemons use: "sqlite" unless parametrised."""
    kind: str = getattr(request, "param", "sqlite")
    if kind == "postgresql":
        server: PgServer = request.getfixturevalue("pg_server")
        daemon_module.journal_for = lambda root: server.database(pg_database_name(root))
    try:
        yield kind
    finally:
        daemon_module.journal_for = None


def pg_database_name(root: Path) -> str:
    """One database per daemon root (a restarted daemon finds its journal again)."""
    return "d" + hashlib.sha256(str(root).encode()).hexdigest()[:20]


@pytest.fixture
def daemon(tmp_path: Path, journal_store: str) -> Iterator[Daemon]:
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
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, journal_store: str
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
    """The `execgate-*` cgroup directories daemons of this session made under our cgroup
    (`tests/daemon.py` notes their state dirs; the name is `execgate-<daemon id>`)."""
    ours = {f"execgate-{daemon_id(d)}" for d in daemon_module.started_state_dirs}
    found: set[Path] = set()
    own = cgroup._own_paths()
    for kind, mount in cgroup._mounts().items():
        if kind in own:
            base = mount / own[kind].lstrip("/")
            found.update(base / name for name in ours if (base / name).is_dir())
    return found


@pytest.fixture(scope="session", autouse=True)
def tidy_cgroups() -> Iterator[None]:
    """Daemons the tests SIGKILL never remove their (empty) cgroup directories: do it --
    only this session's daemons': another session on the machine (a second pytest, CI)
    has daemons whose empty leaves made ahead are about to be used."""
    yield
    for base in _cgroup_dirs():
        for leaf in base.iterdir():
            if leaf.is_dir():
                with contextlib.suppress(OSError):
                    leaf.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A throwaway PostgreSQL server for the whole session (tests/pg_support.py). Without
    the server's binaries its tests skip, unless EXECGATE_REQUIRE_POSTGRESQL is set
    (.ci/run sets it: there they must run)."""
    if bin_dir() is None:
        why = "no PostgreSQL server installed (apt-get install postgresql)"
        if os.environ.get("EXECGATE_REQUIRE_POSTGRESQL"):
            pytest.fail(why)
        pytest.skip(why)
    server = PgServer().start()
    yield server
    server.stop()
