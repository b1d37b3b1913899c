"""A local stand-in for a model provider's HTTP API, for the adapter tests.

Test modules import `model_server_fixture` and `closed_port_fixture`, which pytest then
offers as the fixtures `model_server` and `closed_port`.

The server answers each POST with the next queued `Reply` (often a recorded-shape fixture
from tests/fixtures/models/) and records every request, so tests assert what went over the
wire. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import collections
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "models"


def fixture(name: str) -> dict[str, Any]:
    """A recorded-shape response body, by file stem."""
    doc: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return doc


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b"{}"
    headers: dict[str, str] = field(default_factory=dict)
    # Answer only when the test ends: the client's timeout fires first.
    hang: bool = False


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    # Header names lower-cased.
    headers: dict[str, str]
    body: Any


class ModelServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies: collections.deque[Reply] = collections.deque()
        self.requests: list[Recorded] = []
        # Set at teardown: hanging handlers may finish.
        self.released = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def reply(
        self,
        status: int = 200,
        *,
        fixture_name: str = "",
        body: Any = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        hang: bool = False,
    ) -> None:
        """Queue the next answer: a fixture file, a JSON-able `body`, or `raw` bytes."""
        if raw is None:
            raw = json.dumps(fixture(fixture_name) if fixture_name else body).encode()
        self.replies.append(Reply(status, raw, dict(headers or {}), hang))

    @property
    def last(self) -> Recorded:
        assert self.requests, "the server saw no request"
        return self.requests[-1]


class _Handler(BaseHTTPRequestHandler):
    server: ModelServer

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length", "0")))
        self.server.requests.append(
            Recorded(
                method="POST",
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=json.loads(raw),
            )
        )
        reply = self.server.replies.popleft() if self.server.replies else _NO_REPLY
        if reply.hang:
            self.server.released.wait(30)
        with contextlib.suppress(OSError):  # the client may have given up (timeouts)
            self._send(reply)

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply.body)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(reply.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


_NO_REPLY = Reply(599, b'{"error": {"message": "the test queued no reply"}}')


@pytest.fixture(name="model_server")
def model_server_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelServer]:
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    server = ModelServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield server
    server.released.set()
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(name="closed_port")
def closed_port_fixture() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections: bound (so nobody else takes it), not
    listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def assert_secret_hidden(exc: BaseException, secret: str) -> None:
    """`secret` is in no text of the exception nor of its causes."""
    seen: BaseException | None = exc
    while seen is not None:
        for text in (str(seen), repr(seen), *map(str, seen.args)):
            assert secret not in text, f"the api key leaked into {type(seen).__name__}: {text}"
        seen = seen.__cause__ or seen.__context__
