"""The daemon reads the standard OTEL_* variables as the specification says.

Through a real daemon: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES reach an OTLP
receiver on every span's resource; OTEL_TRACES_EXPORTER picks the exporters
(`console` prints spans on the daemon's stdout, `none` exports nothing even with an
endpoint set, an unknown name stops the daemon at startup naming what is known).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from execgate.client import Client, Status
from execgate.executor.telemetry import otel_env as otelenv
from tests.daemon import Daemon
from tests.otlp_support import Receiver, start_receiver
from tests.support import wait_until

SERVE = [sys.executable, "-m", "execgate.executor.cli", "serve"]
FAST = {"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_EXPORTER_OTLP_INSECURE": "true"}


@pytest.fixture
def otlp() -> Iterator[tuple[Receiver, str]]:
    server, receiver, port = start_receiver()
    yield receiver, f"http://127.0.0.1:{port}"
    server.stop(0)


def _one_call(d: Daemon) -> None:
    (d.workspace / "a.txt").write_text("alpha\n")
    with Client(d.address) as c:
        assert c.execute_one("read_file", path="a.txt").status is Status.SUCCESS


def test_service_name_and_resource_attributes_reach_the_collector(
    tmp_path: Path, otlp: tuple[Receiver, str]
) -> None:
    receiver, endpoint = otlp
    env = {
        **FAST,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "gate-eu-1",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci,team=agents%20platform",
    }
    d = Daemon(tmp_path, env=env).start()
    try:
        _one_call(d)
        wait_until(lambda: receiver.named("execgate.call"), "the call's span at the collector")
    finally:
        d.stop()
    (span,) = receiver.named("execgate.call")
    assert span.service == "gate-eu-1"
    assert span.resource["deployment.environment"] == "ci"
    assert span.resource["team"] == "agents platform"
    assert span.resource["service.instance.id"]  # the daemon's own, still there


def test_without_overrides_the_service_is_execgate(
    tmp_path: Path, otlp: tuple[Receiver, str]
) -> None:
    receiver, endpoint = otlp
    d = Daemon(tmp_path, env={**FAST, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}).start()
    try:
        _one_call(d)
        wait_until(lambda: receiver.named("execgate.call"), "the call's span at the collector")
    finally:
        d.stop()
    assert {s.service for s in receiver.spans} == {"execgate"}


def test_the_console_exporter_prints_spans(tmp_path: Path) -> None:
    d = Daemon(tmp_path, env={**FAST, "OTEL_TRACES_EXPORTER": "console"}).start()
    try:
        _one_call(d)
        wait_until(lambda: '"name": "execgate.call"' in d.log(), "a span on the console")
    finally:
        d.stop()
    assert "traces: journal and console" in d.log()


def test_none_exports_nothing_even_with_an_endpoint(
    tmp_path: Path, otlp: tuple[Receiver, str]
) -> None:
    receiver, endpoint = otlp
    env = {**FAST, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_EXPORTER": "none"}
    d = Daemon(tmp_path, env=env).start()
    try:
        _one_call(d)
        with Client(d.address) as c:
            (rec,) = c.list_calls(limit=1)
        assert rec.outcome is not None
    finally:
        assert d.stop() == 0  # a clean stop flushes every exporter there is
    assert receiver.spans == []
    assert "traces: journal and" not in d.log()


def test_an_unknown_exporter_stops_the_daemon_at_startup(tmp_path: Path) -> None:
    ran = subprocess.run(
        [*SERVE, "--state-dir", str(tmp_path / "state"), "--workspace", str(tmp_path)],
        env={**_environ(), "OTEL_TRACES_EXPORTER": "zipkin-please"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 2, ran.stderr
    assert "OTEL_TRACES_EXPORTER: no exporter named 'zipkin-please'" in ran.stderr
    assert "console" in ran.stderr  # what it knows
    assert "Traceback" not in ran.stderr


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp, console,otlp"}, ["otlp", "console"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, []),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_exporter_names(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], names: list[str]
) -> None:
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert otelenv.exporter_names("traces") == names


def test_console_span_output_is_json_with_the_resource(tmp_path: Path) -> None:
    env = {**FAST, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "printed"}
    d = Daemon(tmp_path, env=env).start()
    try:
        _one_call(d)
        wait_until(lambda: '"name": "execgate.call"' in d.log(), "a span on the console")
    finally:
        d.stop()
    text = d.log()
    start = text.index('{\n    "name": "execgate.call"')  # the SDK's to_json(indent=4)
    span, _ = json.JSONDecoder().raw_decode(text[start:])
    assert span["resource"]["attributes"]["service.name"] == "printed"
