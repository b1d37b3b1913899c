"""What `pip install execgate` gives an agent, checked on the real wheel and a real daemon.

The wheel is built from this checkout (no build isolation: the venv already has
setuptools and grpcio-tools). Its metadata must make the client thin; a client
process that cannot import any of the daemon's dependencies still talks to a
real daemon; the console script on such an install says what to install.
"""

from __future__ import annotations

import email
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.executor.cli.entry import DAEMON_ONLY
from tests.daemon import Daemon

ROOT = Path(__file__).resolve().parents[2]
# What an agent gets: the wire (grpcio, protobuf) and the tracing API, nothing else.
THIN = {"grpcio", "protobuf", "opentelemetry-api"}
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [*PIP_WHEEL, "--wheel-dir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    # Neither setuptools' deprecations nor its package-data complaints.
    assert "Warning" not in built.stderr, built.stderr
    (path,) = out.glob("execgate-*.whl")
    return path


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(zf.read(name))


def _name(requirement: str) -> str:
    for stop in "<>=!~;[ ":
        requirement = requirement.split(stop)[0]
    return requirement.lower()


def test_the_client_install_is_thin(wheel: Path) -> None:
    requires = _metadata(wheel).get_all("Requires-Dist") or []
    base = {_name(r) for r in requires if "extra ==" not in r}
    daemon = {_name(r) for r in requires if 'extra == "daemon"' in r}
    assert base == THIN
    for heavy in ("sqlglot", "docker", "psutil", "opentelemetry-sdk", "pyyaml"):
        assert heavy in daemon, heavy
    assert not {n for n in base if "otlp" in n}


def test_the_wheel_ships_its_type_marks_and_policies(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert {"execgate/client/py.typed", "execgate/executor/py.typed"} <= names
    assert "execgate/policies/default.yaml" in names
    assert "execgate/policies/policy.schema.json" in names


# A process that behaves like a thin install: every daemon-only package is missing.
BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    TOPS = {tops!r}
    PREFIXES = ("opentelemetry.sdk", "opentelemetry.exporter")
    class Thin(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in TOPS or name.startswith(PREFIXES):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None
    sys.meta_path.insert(0, Thin())
    """
)


def _thin(
    script: str, *, tops: frozenset[str] = DAEMON_ONLY - {"opentelemetry"}, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    code = BLOCKER.format(tops=sorted(tops)) + textwrap.dedent(script)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        input=stdin,
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path).start()
    (d.workspace / "hello.txt").write_text("hello from the workspace\n")
    try:
        yield d
    finally:
        d.stop()


def test_a_thin_client_runs_a_call_on_a_real_daemon(served: Daemon) -> None:
    ran = _thin(
        f"""
        from execgate.client import Client, Status
        with Client({served.address!r}) as eg:
            o = eg.execute_one("read_file", path="hello.txt")
        assert o.status is Status.SUCCESS, o
        print(o.text.strip())
        import sys
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in
                       ("sqlglot", "docker", "psutil", "yaml", "jsonschema", "rich", "mcp"))
        assert not heavy, heavy
        """
    )
    assert ran.returncode == 0, ran.stderr
    assert "hello from the workspace" in ran.stdout


@pytest.mark.parametrize("command", [["doctor"], ["calls", "list"], ["serve"]])
def test_the_console_script_on_a_thin_install_says_what_to_install(command: list[str]) -> None:
    ran = _thin(
        f"""
        import sys
        from execgate.executor.cli.entry import main
        sys.exit(main({command!r}))
        """
    )
    assert ran.returncode == 2, ran.stderr
    assert "pip install 'execgate[daemon]'" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_the_mcp_extra_is_the_sdk_alone(wheel: Path) -> None:
    requires = _metadata(wheel).get_all("Requires-Dist") or []
    assert {_name(r) for r in requires if 'extra == "mcp"' in r} == {"mcp"}


def test_execgate_mcp_on_an_install_without_the_sdk_says_what_to_install() -> None:
    ran = _thin(
        """
        import sys
        from execgate.executor.cli.entry import main
        sys.exit(main(["mcp"]))
        """,
        tops=(DAEMON_ONLY - {"opentelemetry"}) | {"mcp"},
    )
    assert ran.returncode == 2, ran.stderr
    assert "pip install 'execgate[mcp]'" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_execgate_mcp_needs_no_daemon_extra() -> None:
    """The client and the mcp extra (which brings jsonschema and the OpenTelemetry API
    itself) are enough: the bridge starts, serves until its stdin ends, and exits 0."""
    ran = _thin(
        """
        import sys
        from execgate.executor.cli.entry import main
        code = main(["mcp"])
        daemon_side = sorted(m for m in sys.modules if m.startswith("execgate.executor.")
                             and not m.startswith("execgate.executor.cli"))
        assert not daemon_side, daemon_side
        sys.exit(code)
        """,
        tops=DAEMON_ONLY - {"opentelemetry", "jsonschema"},
    )
    assert ran.returncode == 0, ran.stderr


def test_help_answers_on_a_thin_install() -> None:
    ran = _thin(
        """
        import sys
        from execgate.executor.cli.entry import main
        sys.exit(main(["--help"]))
        """
    )
    assert ran.returncode == 0, ran.stderr
    assert "serve" in ran.stdout
