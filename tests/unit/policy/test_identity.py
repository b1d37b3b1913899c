"""Identities files, the authentication decision and the listener rules, without a daemon."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from execgate.executor.core.errors import ConfigError, IdentityError
from execgate.executor.policy.identity import (
    LOCAL,
    Identities,
    Identity,
    Role,
    hash_token,
    load_identities,
    parse_identities,
)
from execgate.executor.server.auth import Refusal, authenticate, authorize
from execgate.executor.server.config import ServeConfig, TlsFiles, parse_listener

HASH = hash_token("the-token")
GOOD = f"""\
version: 1
identities:
  - name: alice
    roles: [agent]
    token_sha256: {HASH}
  - name: ci
    roles: [agent, operator]
    cert_subject: ci.example
"""


def test_a_good_file_loads() -> None:
    ids = parse_identities(GOOD, "ids.yaml")
    assert [i.name for i in ids.entries] == ["alice", "ci"]
    assert ids.entries[1].roles == {Role.AGENT, Role.OPERATOR}
    assert ids.by_token("the-token") == ids.entries[0]
    assert ids.by_token("another") is None
    assert ids.by_cert_subject("ci.example") == ids.entries[1]
    assert ids.by_cert_subject("CI.example") is None


def test_the_hash_may_be_written_in_upper_case() -> None:
    ids = parse_identities(GOOD.replace(HASH, HASH.upper()), "ids.yaml")
    assert ids.by_token("the-token") is not None


@pytest.mark.parametrize(
    ("old", "new", "where", "says"),
    [
        ("roles: [agent]\n", "roles: [agent]\n    teams: [x]\n", "ids.yaml:5:5",
         "unknown key 'teams'"),
        ("roles: [agent, operator]", "roles: [agent, operatr]", "ids.yaml:7:20",
         "unknown role 'operatr'"),
        ("roles: [agent]", "roles: []", "ids.yaml:4:12", "at least one of"),
        ("roles: [agent]", "roles: agent", "ids.yaml:4:12", "must be a list"),
        ("    roles: [agent]\n", "", "ids.yaml:3:5", "identities[0].roles: missing"),
        (f"token_sha256: {HASH}", "token_sha256: the-token", "ids.yaml:5:19", "64 hex digits"),
        (f"token_sha256: {HASH}", "token: abc", "ids.yaml:5:5", "unknown key 'token'"),
        (f"    token_sha256: {HASH}\n", "", "ids.yaml:3:5", "needs a credential"),
        ("name: ci", "name: alice", "ids.yaml:6:11",
         "identities[1].name: the same as identities[0]'s"),
        ("cert_subject: ci.example", f"token_sha256: {HASH}", "ids.yaml:8:19", "the same as"),
        ("name: ci", "name: c i", "ids.yaml:6:11", "is not a name"),
        ("version: 1", "version: 2", "ids.yaml:1:10", "version: must be 1"),
        ("version: 1\n", "", "ids.yaml:1:1", "version: must be 1"),
        ("  - name: alice", "  - name: [alice]", "ids.yaml:3:11", "must be a non-empty string"),
    ],
)  # fmt: skip
def test_mistakes_are_errors_at_file_line_column(old: str, new: str, where: str, says: str) -> None:
    assert old in GOOD
    with pytest.raises(IdentityError) as caught:
        parse_identities(GOOD.replace(old, new, 1), "ids.yaml")
    assert str(caught.value).startswith(f"{where}: "), str(caught.value)
    assert says in str(caught.value)


def test_a_token_pasted_as_its_hash_is_not_echoed() -> None:
    with pytest.raises(IdentityError) as caught:
        parse_identities(GOOD.replace(HASH, "secret-token-value"), "ids.yaml")
    assert "secret-token-value" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty file"),
        ("version: 1\n", "identities: missing"),
        ("version: 1\nidentities: []\n", "lists nobody"),
        ("version: 1\nidentities: [\n", "not valid YAML"),
        ("- 1\n", "file: must be a mapping"),
    ],
)
def test_files_that_say_nothing_usable_are_errors(text: str, says: str) -> None:
    with pytest.raises(IdentityError, match=says):
        parse_identities(text, "ids.yaml")


def test_an_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="cannot read identities file"):
        load_identities(tmp_path / "missing.yaml")


# ------------------------------------------------------------------ the decision

IDS = Identities(
    "ids.yaml",
    (
        Identity(name="alice", roles=frozenset({Role.AGENT}), token_sha256=HASH),
        Identity(name="ci", roles=frozenset({Role.OPERATOR}), cert_subject="ci.example"),
    ),
)
BEARER = (("authorization", "Bearer the-token"),)
CERT = {"x509_common_name": [b"ci.example"], "transport_security_type": [b"ssl"]}


def test_without_identities_everyone_is_local() -> None:
    assert authenticate(None, (), {}) is LOCAL
    assert LOCAL.roles == set(Role)


@pytest.mark.parametrize(
    ("metadata", "auth_context", "expected"),
    [
        (BEARER, {}, "alice"),
        ((("authorization", "bearer the-token"),), {}, "alice"),
        ((), CERT, "ci"),
        (BEARER, CERT, "alice"),  # the token, when sent, decides
        ((), {}, "no credentials"),
        ((("authorization", "Bearer nope"),), CERT, "wrong or revoked"),
        ((("authorization", "the-token"),), {}, "not 'Bearer <token>'"),
        ((*BEARER, *BEARER), {}, "more than one"),
        ((), {"x509_common_name": [b"who.example"]}, "no identity has cert_subject 'who.example'"),
        ((), {"x509_common_name": [b"ci.example", b"x"]}, "more than one subject CN"),
    ],
)
def test_authenticate(
    metadata: tuple[tuple[str, str], ...], auth_context: dict[str, list[bytes]], expected: str
) -> None:
    found = authenticate(IDS, metadata, auth_context)
    if isinstance(found, Refusal):
        assert found.code is grpc.StatusCode.UNAUTHENTICATED
        assert expected in found.message
        assert "the-token" not in found.message
    else:
        assert found.name == expected


def test_authorize_by_role() -> None:
    alice, ci = IDS.entries
    assert authorize(alice, "/execgate.v1.Executor/ExecuteBatch") is None
    assert authorize(ci, "/execgate.v1.Executor/ListCalls") is None
    refusal = authorize(ci, "/execgate.v1.Executor/ExecuteBatch")
    assert refusal is not None
    assert refusal.code is grpc.StatusCode.PERMISSION_DENIED
    assert (
        refusal.message
        == "ci (roles: operator) may not call ExecuteBatch; it needs one of: admin, agent"
    )
    assert authorize(alice, "/grpc.health.v1.Health/Check") is None
    # Not in the table (reflection, a service added later): admin only.
    assert (
        authorize(alice, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        is not None
    )
    assert authorize(LOCAL, "/execgate.v1.Approvals/Decide") is None


# ------------------------------------------------------------------ which listeners need what

TLS = TlsFiles(cert=Path("s.pem"), key=Path("s.key"), client_ca=Path("ca.pem"))


@pytest.mark.parametrize(
    ("listen", "kwargs", "refusal"),
    [
        ("unix:/tmp/x.sock", {}, None),
        ("127.0.0.1:0", {}, "needs an identities file"),
        ("127.0.0.1:0", {"identities": Path("ids.yaml")}, None),
        ("0.0.0.0:0", {"identities": Path("ids.yaml")}, "not loopback and not TLS"),
        ("0.0.0.0:0", {"identities": Path("ids.yaml"), "tls": TLS}, None),
        ("0.0.0.0:0", {"identities": Path("ids.yaml"), "allow_remote": True}, None),
        ("0.0.0.0:0", {"allow_remote": True}, "needs an identities file"),
        ("unix:/tmp/x.sock", {"tls": TLS}, "there is no TCP --listen"),
    ],
)
def test_listener_rules(listen: str, kwargs: dict[str, object], refusal: str | None) -> None:
    config = ServeConfig(listen=(parse_listener(listen),), **kwargs)  # type: ignore[arg-type]
    if refusal is None:
        config.check()
    else:
        with pytest.raises(ConfigError, match=refusal):
            config.check()
