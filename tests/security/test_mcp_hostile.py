"""A malicious MCP server against the daemon (review of issue 16): what it lists and
what it sends must never crash, wedge, or bloat the daemon, nor reach past the policy.

Each test is the proof of one finding, through the real daemon on a real socket with
the raw JSON-RPC fixture server `tests/fixtures/mcp/hostile_server.py` in real bwrap:

- a tool name outside MCP's rule (a `/` escapes a policy glob, control characters reach
  logs and terminals, 10,000 characters);
- an inputSchema nested too deeply for the schema check (the daemon did not start);
- an inputSchema `$ref` to a URL (the daemon fetched it, from the host's network, on the
  event loop, with no timeout);
- an inputSchema `pattern` that backtracks exponentially (the event loop was blocked);
- an outputSchema `pattern` that backtracks on the server's own structuredContent (the
  SDK's check of the result blocked the event loop: no argument of the agent needed);
- a tools/list that never ends (memory grew until the start timed out);
- requests to the daemon from a server that never reads the answers (each one's
  handler, and its params, were kept: memory without bound).
"""

from __future__ import annotations

import http.server
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from execgate.client import Call, Client, Status
from tests import mcp_support as ms
from tests.daemon import Daemon, scaled

pytestmark = pytest.mark.timeout(240)

HOSTILE = ms.FIXTURE.parent / "hostile_server.py"
POLICY = """\
version: 1
default: allow
rules:
  - {id: no-names, effect: deny, tools: ["names.*"]}
"""


def _server(name: str, mode: str, tag: str, **kw: Any) -> dict[str, Any]:
    env = [("HOSTILE_MODE", mode), *kw.pop("env", [])]
    return ms.entry(name, (sys.executable, (str(HOSTILE),)), tag, env=env, **kw)


def _hwm_kib(d: Daemon) -> int:
    """The daemon's peak resident memory so far (VmHWM), KiB."""
    assert d.proc is not None
    for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


class _Hits(http.server.BaseHTTPRequestHandler):
    """Counts GETs; answers a schema."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        body = b'{"type": "string"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def web() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Hits", (_Hits,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/schema.json", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory, web: tuple[str, list[str]]
) -> Iterator[tuple[Daemon, Client]]:
    root = tmp_path_factory.mktemp("mcp-hostile")
    tag = ms.new_tag()
    url, _ = web
    servers = [
        _server("names", "names", tag),
        _server("ref", "ref", tag, env=[("HOSTILE_REF_URL", url)]),
        _server("redos", "redos", tag),
        _server("requests", "requests", tag),
        _server("output", "output", tag),
    ]
    d = ms.mcp_daemon(root, servers, POLICY).start(timeout=60)
    try:
        with Client(d.address) as c:
            yield d, c
    finally:
        d.stop()
        ms.wait_for(lambda: ms.tagged(tag) == [], 10, "every server gone with the daemon")


def _served(c: Client) -> set[str]:
    return {t.name for t in c.list_tools()}


def _healthy(c: Client, server: str) -> None:
    """The daemon still serves, and so does the server's well-behaved tool."""
    o = c.run(Call(tool=f"{server}.ok", arguments={"text": "hi"}, timeout=60))
    assert (o.status, o.text) == (Status.SUCCESS, "ok"), o


# -- tool names ---------------------------------------------------------------------------


def test_a_tool_name_outside_mcps_rule_is_left_out(live: tuple[Daemon, Client]) -> None:
    """FINDING (high): `names.a/b` was served, and a policy glob's `*` stays within one
    `/` segment: `deny names.*` did not cover it, so under `default: allow` the agent
    called it. Control characters and 10,000-character names were served (and logged,
    and printed by `execgate tools`) too."""
    d, c = live
    served = {n for n in _served(c) if n.startswith("names.")}
    assert served == {"names.ok", "names.dot.ted"}, sorted(s[:40] for s in served)
    slash = c.run(Call(tool="names.a/b", arguments={"text": "x"}))
    assert (slash.status, slash.error_class) == (Status.REJECTED, "unknown_tool"), slash
    # A name with dots keeps to the rule, and the server's glob covers it.
    dotted = c.run(Call(tool="names.dot.ted", arguments={"text": "x"}))
    assert (dotted.status, dotted.error_class) == (Status.REJECTED, "policy_denied"), dotted
    why = ms.provider(c, "names").last_error
    assert "left out: its name is not [A-Za-z0-9._-]{1,128}" in why, why
    log = d.log()
    for raw in ("\x1b", "new\nline", "x" * 200):
        assert raw not in log, raw
        assert raw not in why, raw


# -- schemas ------------------------------------------------------------------------------


def test_a_schema_too_deep_to_check_leaves_its_tool_out(tmp_path: Path) -> None:
    """FINDING (high): the schema check's RecursionError escaped the provider's start:
    one server listing such a tool kept the whole daemon from starting."""
    tag = ms.new_tag()
    d = ms.mcp_daemon(tmp_path, [_server("deep", "deep", tag)], POLICY)
    try:
        d.start(timeout=60)
        with Client(d.address) as c:
            assert "deep.deep" not in _served(c)
            _healthy(c, "deep")
            why = ms.provider(c, "deep").last_error
            assert "tool deep left out: its inputSchema is nested too deeply" in why, why
    finally:
        d.stop()
        ms.wait_for(lambda: ms.tagged(tag) == [], 10, "every server gone with the daemon")


def test_a_schema_referring_to_a_url_is_not_fetched(
    live: tuple[Daemon, Client], web: tuple[str, list[str]]
) -> None:
    """FINDING (high): validating a call's arguments fetched the server's `$ref` URL --
    from the daemon's own network (no sandbox), blocking the event loop with no timeout
    (a URL that never answers stopped every call of the daemon)."""
    _, c = live
    url, seen = web
    assert "ref.ref" not in _served(c)
    o = c.run(Call(tool="ref.ref", arguments={"text": "x"}))
    assert o.status is Status.REJECTED, o
    assert seen == [], seen
    why = ms.provider(c, "ref").last_error
    assert f"tool ref left out: its inputSchema refers to {url!r}" in why, why
    _healthy(c, "ref")


def test_a_pattern_that_backtracks_is_bounded(live: tuple[Daemon, Client]) -> None:
    """FINDING (high): a server's `pattern` ran with Python's `re` on the event loop: 38
    characters blocked the whole daemon for 27 s (each one more: x1.6)."""
    _, c = live
    began = time.monotonic()
    o = c.run(Call(tool="redos.redos", arguments={"text": "a" * 38 + "b"}))
    took = time.monotonic() - began
    assert (o.status, o.error_class, o.field) == (
        Status.REJECTED,
        "invalid_argument",
        "arguments.text",
    ), o
    assert "took too long" in o.message, o.message
    assert took < scaled(3.0), took
    assert c.run(Call(tool="noop")).status is Status.SUCCESS
    # A match that is quick still works.
    fine = c.run(Call(tool="redos.redos", arguments={"text": "aaaa"}))
    assert fine.status is Status.SUCCESS, fine


def test_an_output_pattern_that_backtracks_on_the_servers_result_is_bounded(
    live: tuple[Daemon, Client],
) -> None:
    """FINDING (high): the SDK's call_tool checks structuredContent against the tool's
    outputSchema with jsonschema (`re`) on the event loop: a server that answers with
    the text its own pattern backtracks on blocked the whole daemon for 27 s (and
    longer at will), whatever the agent sent."""
    _, c = live
    began = time.monotonic()
    o = c.run(Call(tool="output.out", arguments={"text": "x"}))
    took = time.monotonic() - began
    assert (o.status, o.error_class) == (Status.FAILURE, "tool_error"), o
    assert "took too long" in o.message, o.message
    assert took < scaled(3.0), took
    assert c.run(Call(tool="noop")).status is Status.SUCCESS
    _healthy(c, "output")


# -- floods -------------------------------------------------------------------------------


def test_a_tools_list_that_never_ends_fails_the_start_at_once(tmp_path: Path) -> None:
    """FINDING (medium): tools/list was followed page after page until the start timed
    out, every page kept: memory grew with what the server wrote meanwhile."""
    tag = ms.new_tag()
    server = _server("pages", "pages", tag, startup_timeout_s=60)
    d = ms.mcp_daemon(tmp_path, [server], POLICY)
    began = time.monotonic()
    try:
        d.start(timeout=60)
        took = time.monotonic() - began
        with Client(d.address) as c:
            why = ms.provider(c, "pages").last_error
            assert "more than 1024 tools" in why, why
            assert not any(n.startswith("pages.") for n in _served(c))
        assert took < scaled(30), took
    finally:
        d.stop()
        ms.wait_for(lambda: ms.tagged(tag) == [], 10, "every server gone with the daemon")


def test_a_server_flooding_requests_it_never_reads_answers_to_is_ended(
    live: tuple[Daemon, Client],
) -> None:
    """FINDING (medium): each request a server sends the daemon got a handler task that
    waited to write its answer to a server that reads nothing: the tasks, and each one's
    params (1 MiB here), piled up for as long as the server kept writing."""
    d, c = live
    before = _hwm_kib(d)
    o = c.run(Call(tool="requests.flood", timeout=60))
    took_mib = (_hwm_kib(d) - before) / 1024
    assert (o.status, o.error_class) == (Status.UNKNOWN_OUTCOME, "interrupted"), o
    assert "requests" in o.message, o.message
    assert took_mib < 100, f"the daemon's peak memory grew {took_mib:.0f} MiB"
    assert "requests" in ms.provider(c, "requests").last_error
    _healthy(c, "requests")
