"""Identities and authentication through the real daemon: the auth matrix, revocation, mTLS,
identity claims, and the Unix socket without an identities file (the `make run` experience).

Every refused call is also checked for having had no effect: not journaled (GetCall as
an admin says not found), no file written, no cancel recorded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from execgate.client import (
    AsyncClient,
    Call,
    CallNotFound,
    Client,
    DaemonUnavailable,
    PermissionDenied,
    Status,
    Unauthenticated,
)
from execgate.executor.server.auth import ACCESS
from execgate.v1 import executor_pb2 as pb
from execgate.v1 import executor_pb2_grpc as pb_grpc
from tests.auth_support import Pki, Who, tcp_address, write_identities
from tests.daemon import Daemon

TOKENS = {
    "alice": "alice-" + "a" * 40,
    "olga": "olga-" + "o" * 40,
    "abby": "abby-" + "p" * 40,
    "root": "root-" + "r" * 40,
}
PEOPLE = [
    Who("alice", ("agent",), token=TOKENS["alice"]),
    Who("olga", ("operator",), token=TOKENS["olga"]),
    Who("abby", ("approver",), token=TOKENS["abby"]),
    Who("root", ("admin",), token=TOKENS["root"]),
    Who("bot", ("agent",), cert_subject="bot.example"),
]
BAD_TOKEN = "not-a-token-" + "x" * 30


class Served:
    """A daemon with identities, on its Unix socket and on an mTLS TCP port."""

    def __init__(self, root: Path) -> None:
        self.pki = Pki(root)
        identities = write_identities(root / "identities.yaml", PEOPLE)
        home = root / "daemon"
        home.mkdir()
        self.daemon = Daemon(
            home,
            "--identities", str(identities),
            "--listen", f"unix:{home / 'state' / 'execgate.sock'}",
            "--listen", "127.0.0.1:0",
            "--reflection",
            *self.pki.serve_args(),
        ).start()  # fmt: skip
        self.unix = self.daemon.address
        self.tcp = tcp_address(self.daemon)

    def client(self, who: str, **kwargs: Any) -> Client:
        return Client(self.unix, token=TOKENS[who], **kwargs)

    def journaled(self, call_id: str, run_id: str = "") -> bool:
        with self.client("root") as admin:
            try:
                admin.get_call(call_id, run_id=run_id)
            except CallNotFound:
                return False
        return True

    def cancels(self, run_id: str) -> list[str]:
        """The requesters the journal recorded for cancels of `run_id`."""
        conn = sqlite3.connect(f"file:{self.daemon.state_dir / 'journal.db'}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT requester FROM cancels WHERE run_id=?", (run_id,))
            return [r[0] for r in rows]
        finally:
            conn.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("auth"))
    yield s
    s.daemon.stop()


# ------------------------------------------------------------------ the auth matrix

# The documented role table (docs/identities.md), written out rather than read from ACCESS.
RUNS = {"alice", "root"}
READS = {"alice", "olga", "root"}
EXPECTED = {
    "ListTools": RUNS,
    "Execute": RUNS,
    "ExecuteBatch": RUNS,
    "Explain": RUNS,
    "GetCall": READS,
    "ListCalls": READS,
    "ListProviders": {"olga", "root"},
    "Cancel": READS,
    # Agents for their own calls, operators and approvers for anyone's (the described
    # call below is the caller's own, so every known identity gets an answer).
    "ExplainPolicy": {"alice", "olga", "abby", "root"},
}
# (label, metadata, who succeeds as): strangers first, then each known identity.
CREDENTIALS: list[tuple[str, tuple[tuple[str, str], ...], str]] = [
    ("no token", (), ""),
    ("bad token", (("authorization", f"Bearer {BAD_TOKEN}"),), ""),
    ("not bearer", (("authorization", f"Basic {TOKENS['root']}"),), ""),
    ("empty bearer", (("authorization", "Bearer "),), ""),
    (
        "two tokens",
        (("authorization", f"Bearer {TOKENS['root']}"), ("authorization", "Bearer x")),
        "",
    ),
    *[(name, (("authorization", f"Bearer {TOKENS[name]}"),), name) for name in TOKENS],
]


def test_every_executor_rpc_has_a_row_in_the_role_table() -> None:
    methods = pb.DESCRIPTOR.services_by_name["Executor"].methods_by_name
    assert set(methods) == set(EXPECTED)
    assert {m for m in ACCESS if m.startswith("/execgate.v1.Executor/")} == {
        f"/execgate.v1.Executor/{m}" for m in methods
    }


def _rpc(stub: pb_grpc.ExecutorStub, rpc: str, tag: str, md: Any) -> Callable[[], object]:
    """A call of `rpc` whose only possible effect is keyed by `tag` (a call id, a run id)."""
    write = pb.ExecuteRequest(
        run_id="matrix",
        calls=[
            pb.ToolCall(
                call_id=tag,
                tool="write_file",
                arguments_json=json.dumps({"path": f"matrix/{tag}.txt", "content": "x"}),
            )
        ],
    )
    calls: dict[str, Callable[[], object]] = {
        "ListTools": lambda: stub.ListTools(pb.ListToolsRequest(), metadata=md),
        "Execute": lambda: list(stub.Execute(write, metadata=md)),
        "ExecuteBatch": lambda: stub.ExecuteBatch(write, metadata=md),
        "Explain": lambda: stub.Explain(write, metadata=md),
        "GetCall": lambda: stub.GetCall(
            pb.GetCallRequest(run_id="setup", call_id="seen"), metadata=md
        ),
        "ListCalls": lambda: stub.ListCalls(pb.ListCallsRequest(limit=5), metadata=md),
        "ListProviders": lambda: stub.ListProviders(pb.ListProvidersRequest(), metadata=md),
        # A call of the run, not the run: barring a whole run also needs its ownership
        # (tests/integration/test_cancel_ownership.py), which is not what this matrix is about.
        "Cancel": lambda: stub.Cancel(pb.CancelRequest(run_id=tag, call_id="c"), metadata=md),
        "ExplainPolicy": lambda: stub.ExplainPolicy(
            pb.ExplainPolicyRequest(tool="write_file", paths=[f"matrix/{tag}.txt"]), metadata=md
        ),
    }
    return calls[rpc]


@pytest.fixture(scope="module")
def seen_call(served: Served) -> None:
    """A journaled call for GetCall to find."""
    with served.client("root", run_id="setup") as admin:
        assert admin.run(Call(tool="noop", call_id="seen")).status is Status.SUCCESS


@pytest.mark.parametrize("rpc", sorted(EXPECTED))
@pytest.mark.usefixtures("seen_call")
def test_auth_matrix_allows_only_the_listed_roles(served: Served, rpc: str) -> None:
    """Every credential against every RPC: zero unauthorized successes, zero side effects."""
    with grpc.insecure_channel(served.unix) as channel:
        stub = pb_grpc.ExecutorStub(channel)
        for label, md, who in CREDENTIALS:
            tag = f"{rpc}-{label.replace(' ', '-')}".lower()
            call = _rpc(stub, rpc, tag, md)
            if who in EXPECTED[rpc]:
                if rpc == "GetCall" and who == "alice":
                    # Admitted, but root's call is outside an agent's scope: answered as
                    # missing (tests/security/test_result_scoping.py).
                    with pytest.raises(grpc.RpcError) as scoped:
                        call()
                    assert scoped.value.code() is grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
                    continue
                call()
                if rpc in ("Execute", "ExecuteBatch"):
                    assert served.journaled(tag, "matrix")
                continue
            with pytest.raises(grpc.RpcError) as caught:
                call()
            err: Any = caught.value
            want = grpc.StatusCode.PERMISSION_DENIED if who else grpc.StatusCode.UNAUTHENTICATED
            assert err.code() is want, (label, err.details())
            assert all(t not in err.details() for t in (*TOKENS.values(), BAD_TOKEN))
            assert not served.journaled(tag, "matrix"), f"{label} got {rpc} journaled"
            assert not (served.daemon.workspace / "matrix" / f"{tag}.txt").exists()
            assert served.cancels(tag) == []


def test_refusals_say_what_is_missing_and_never_the_token(served: Served) -> None:
    with Client(served.unix, token="") as nobody, pytest.raises(Unauthenticated) as none:
        nobody.list_tools()
    assert "no credentials" in str(none.value)
    with Client(served.unix, token=BAD_TOKEN) as stranger, pytest.raises(Unauthenticated) as bad:
        stranger.list_tools()
    assert "wrong or revoked" in str(bad.value)
    with served.client("olga") as operator, pytest.raises(PermissionDenied) as denied:
        operator.execute_one("noop")
    assert "olga (roles: operator) may not call ExecuteBatch" in str(denied.value)
    assert "agent" in denied.value.details
    for exc in (none.value, bad.value, denied.value):
        assert all(t not in str(exc) for t in (*TOKENS.values(), BAD_TOKEN))
    log = served.daemon.log()
    assert "refused /execgate.v1.Executor/ListTools" in log
    assert all(t not in log for t in (*TOKENS.values(), BAD_TOKEN))


def test_health_needs_no_credentials(served: Served) -> None:
    with grpc.insecure_channel(served.unix) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_rpcs_outside_the_role_table_are_admin_only(served: Served) -> None:
    """Server reflection is in no row of the table: only an admin may list the services."""
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    with grpc.insecure_channel(served.unix) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        for who in ("alice", "olga", "root"):
            md = (("authorization", f"Bearer {TOKENS[who]}"),)
            if who != "root":
                with pytest.raises(grpc.RpcError) as caught:
                    list(stub.ServerReflectionInfo(iter([ask]), metadata=md, timeout=10))
                assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
                continue
            [reply] = stub.ServerReflectionInfo(iter([ask]), metadata=md, timeout=10)
            names = {s.name for s in reply.list_services_response.service}
            assert "execgate.v1.Executor" in names


def test_async_client_authenticates_too(served: Served) -> None:
    async def main() -> None:
        async with AsyncClient(served.unix, token=TOKENS["alice"]) as alice:
            outcome = await alice.execute_one("noop", echo="hi")
            assert (await alice.get_call(outcome.call_id)).agent == "alice"
        async with AsyncClient(served.unix, token=BAD_TOKEN) as stranger:
            with pytest.raises(Unauthenticated):
                await stranger.list_tools()
        async with AsyncClient(served.unix, token=TOKENS["abby"]) as approver:
            with pytest.raises(PermissionDenied):
                await approver.list_calls()

    asyncio.run(main())


# ------------------------------------------------------------------ who the journal says it was


def test_the_journal_records_the_authenticated_identity_not_a_claim(served: Served) -> None:
    claims = (("agent", "root"), ("x-execgate-agent", "root"), ("x-identity", "root"))
    with grpc.insecure_channel(served.unix) as channel:
        stub = pb_grpc.ExecutorStub(channel)
        md = (("authorization", f"Bearer {TOKENS['alice']}"), *claims)
        request = pb.ExecuteRequest(
            run_id="claims", calls=[pb.ToolCall(call_id="claimed", tool="noop")]
        )
        stub.ExecuteBatch(request, metadata=md)
        claimed = pb.CancelRequest(run_id="claims-cancel", call_id="c", requester="root")
        stub.Cancel(claimed, metadata=md)
        stub.Cancel(pb.CancelRequest(run_id="plain-cancel", call_id="c"), metadata=md)
    with served.client("root") as admin:
        assert admin.get_call("claimed", run_id="claims").agent == "alice"
    assert served.cancels("claims-cancel") == ["alice (says: root)"]
    assert served.cancels("plain-cancel") == ["alice"]


def test_concurrent_callers_each_get_their_own_identity(served: Served) -> None:
    """The identity travels per RPC (a context variable): interleaved calls never mix."""
    clients = {
        "alice": served.client("alice", run_id="mix"),
        "root": served.client("root", run_id="mix"),
        "bot": Client(served.tcp, run_id="mix", tls=served.pki.client("bot.example")),
    }
    errors: list[BaseException] = []

    def run(who: str, k: int) -> None:
        try:
            for i in range(15):
                clients[who].run(Call(tool="noop", call_id=f"mix-{who}-{k}-{i}"))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(who, k)) for who in clients for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with served.client("root") as admin:
        records = admin.list_calls(run_id="mix", limit=100)
    assert len(records) == 90
    assert all(r.call_id.split("-")[1] == r.agent for r in records)
    for c in clients.values():
        c.close()


# ------------------------------------------------------------------ mTLS


def test_a_known_client_certificate_is_its_identity(served: Served) -> None:
    with Client(served.tcp, tls=served.pki.client("bot.example")) as bot:
        outcome = bot.run(Call(tool="noop", call_id="by-cert"))
        assert outcome.status is Status.SUCCESS
        assert bot.get_call("by-cert").agent == "bot"


def test_a_certificate_with_an_unknown_subject_is_unauthenticated(served: Served) -> None:
    with (
        Client(served.tcp, tls=served.pki.client("stranger.example")) as stranger,
        pytest.raises(Unauthenticated, match=r"stranger\.example"),
    ):
        stranger.run(Call(tool="noop", call_id="by-stranger"))
    assert not served.journaled("by-stranger")


def test_a_certificate_from_another_ca_is_refused_at_the_handshake(
    served: Served, tmp_path: Path
) -> None:
    rogue = Pki(tmp_path, "rogue")
    forged = rogue.client("bot.example", ca=served.pki)  # the right CN, the wrong CA
    with Client(served.tcp, tls=forged) as impostor, pytest.raises(DaemonUnavailable):
        impostor.run(Call(tool="noop", call_id="by-rogue"))
    assert not served.journaled("by-rogue")
    assert "CERTIFICATE_VERIFY_FAILED" in served.daemon.log()


def test_tls_without_a_client_certificate_or_plaintext_is_refused(served: Served) -> None:
    ca_only = grpc.ssl_channel_credentials(root_certificates=served.pki.ca.read_bytes())
    for channel in (
        grpc.secure_channel(served.tcp, ca_only),
        grpc.insecure_channel(served.tcp),  # a token over plaintext to the TLS port
    ):
        md = (("authorization", f"Bearer {TOKENS['root']}"),)
        stub = pb_grpc.ExecutorStub(channel)
        with channel, pytest.raises(grpc.RpcError) as caught:
            stub.ListTools(pb.ListToolsRequest(), metadata=md, timeout=10)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_a_token_over_tls_names_the_caller_whatever_the_certificate(served: Served) -> None:
    """A token, when sent, decides; the certificate only gets the caller through TLS."""
    tls = served.pki.client("stranger-with-token.example")
    with Client(served.tcp, token=TOKENS["alice"], tls=tls) as alice:
        alice.run(Call(tool="noop", call_id="tls-and-token"))
        assert alice.get_call("tls-and-token").agent == "alice"
    bot_tls = served.pki.client("bot.example")
    with (
        Client(served.tcp, token=BAD_TOKEN, tls=bot_tls) as bot,
        pytest.raises(Unauthenticated),  # a bad token is not rescued by a good certificate
    ):
        bot.list_tools()


# ------------------------------------------------------------------ revocation


def test_a_revoked_identity_is_refused_after_the_restart(tmp_path: Path) -> None:
    ids = tmp_path / "identities.yaml"
    write_identities(ids, [PEOPLE[0], PEOPLE[3]])  # alice, root
    d = Daemon(tmp_path, "--identities", str(ids)).start()
    try:
        with Client(d.address, token=TOKENS["alice"]) as alice:
            assert alice.run(Call(tool="noop", call_id="before")).status is Status.SUCCESS
        d.stop()
        write_identities(ids, [PEOPLE[3]])  # alice removed
        d.restart()
        with (
            Client(d.address, token=TOKENS["alice"]) as alice,
            pytest.raises(Unauthenticated, match="wrong or revoked"),
        ):
            alice.run(Call(tool="noop", call_id="after"))
        with Client(d.address, token=TOKENS["root"]) as admin:
            assert admin.get_call("before").agent == "alice"  # history stays
            with pytest.raises(CallNotFound):
                admin.get_call("after")
    finally:
        d.stop()


# ------------------------------------------------------------------ no identities file


def test_the_unix_socket_without_identities_is_local_with_no_token(client: Client) -> None:
    outcome = client.run(Call(tool="noop", call_id="plain"))
    assert outcome.status is Status.SUCCESS
    assert client.get_call("plain").agent == "local"
    assert client.cancel(run_id="local-cancel") == []


def test_without_identities_a_token_is_ignored(daemon: Daemon) -> None:
    with Client(daemon.address, token="anything") as c:
        c.run(Call(tool="noop", call_id="with-token"))
        assert c.get_call("with-token").agent == "local"


# ------------------------------------------------------------------ CLI


def _execgate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "execgate.executor.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_token_new_prints_a_token_and_the_entry_holding_its_hash(tmp_path: Path) -> None:
    out = _execgate("token", "new", "ci-bot", "--role", "agent", "--role", "operator")
    assert out.returncode == 0, out.stderr
    first, *rest = out.stdout.splitlines()
    token = first.removeprefix("EXECGATE_TOKEN=")
    assert first.startswith("EXECGATE_TOKEN=")
    assert len(token) >= 40
    entry = "\n".join(line for line in rest if not line.startswith("#"))
    assert f"token_sha256: {hashlib.sha256(token.encode()).hexdigest()}" in entry
    assert token not in entry
    path = tmp_path / "ids.yaml"
    path.write_text("version: 1\nidentities:\n" + entry + "\n")
    from execgate.executor.policy.identity import Role, load_identities

    found = load_identities(path).by_token(token)
    assert found is not None
    assert found.name == "ci-bot"
    assert found.roles == {Role.AGENT, Role.OPERATOR}
    assert _execgate("token", "new", "bad name").returncode == 2


def test_cli_client_commands_take_the_token_from_the_environment(served: Served) -> None:
    addr = ["--addr", served.unix]
    ok = _execgate("calls", "list", *addr, "--json", env={"EXECGATE_TOKEN": TOKENS["olga"]})
    assert ok.returncode == 0, ok.stderr
    flag = _execgate("calls", "list", *addr, "--token", TOKENS["olga"], env={"EXECGATE_TOKEN": ""})
    assert flag.returncode == 0, flag.stderr
    refused = _execgate("tools", *addr, env={"EXECGATE_TOKEN": BAD_TOKEN})
    assert refused.returncode == 1
    assert "does not know who we are" in refused.stderr
    assert BAD_TOKEN not in refused.stderr + refused.stdout
    health = _execgate("health", *addr, env={"EXECGATE_TOKEN": ""})
    assert health.returncode == 0, health.stderr


def test_cli_client_speaks_mtls(served: Served) -> None:
    tls = served.pki.client("bot.example")
    out = _execgate(
        "call", "noop", "--arg", "echo=hi", "--addr", served.tcp, "--json",
        "--tls-ca", str(tls.ca), "--tls-cert", str(tls.cert), "--tls-key", str(tls.key),
        env={"EXECGATE_TOKEN": ""},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["text"] == "hi"
