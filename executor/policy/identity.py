"""Who may call the daemon: identities, their roles and their credentials.

An identities file (`execgate serve --identities FILE`) lists them:

    version: 1
    identities:
      - name: build-agent            # recorded as the call's `agent`; policies match it
        roles: [agent]               # any of: agent, approver, operator, admin
        token_sha256: 9f86d081...    # sha256 (hex) of its bearer token: `execgate token new`
        groups: [builders]           # optional; policy `agents` entries `group:builders`
      - name: ci
        roles: [agent, operator]
        cert_subject: ci.example.internal   # the CN of its mTLS client certificate

Tokens are never stored, only their sha256. A token is 32 random bytes, so a plain
hash needs no salt or stretching: there is nothing to guess. Revoking an identity is
removing it (or its credential) from the file: the daemon reloads the file within a
second (a file that does not load is refused and the last good one stays in force).

Without an identities file the daemon listens on its Unix socket only, and every
caller there is the built-in identity `local` with every role (`make run`).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from execgate.executor.core.errors import IdentityError
from execgate.executor.core.yamldoc import YamlDoc as _Doc

from .model import memberships

FILE_KEYS = {"version", "identities"}
IDENTITY_KEYS = {"name", "roles", "groups", "token_sha256", "cert_subject"}
# Names go into the journal, policy `agents` lists and log lines: no spaces, no quotes.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class Role(enum.StrEnum):
    AGENT = "agent"  # runs tool calls (Execute, Explain, ListTools) and reads its journal
    APPROVER = "approver"  # decides `ask` approvals
    OPERATOR = "operator"  # reads the journal, cancels calls
    ADMIN = "admin"  # everything, including RPCs no other role is given


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    # What the journal records as the caller (`agent`, cancel `requester`).
    name: str
    # Never empty in a loaded file.
    roles: frozenset[Role]
    # Hex sha256 of the bearer token; "" when the identity has no token.
    token_sha256: str = ""
    # Subject CN of the identity's mTLS client certificate; "" when it has none.
    cert_subject: str = ""
    # Names policy rules can match as `group:NAME` in their `agents` lists.
    groups: frozenset[str] = frozenset()

    def holds_any(self, roles: frozenset[Role]) -> bool:
        return not self.roles.isdisjoint(roles)

    def memberships(self) -> frozenset[str]:
        """What a policy `agents` entry other than a name can match: `group:G`, `role:R`."""
        return memberships(self.groups, self.roles)


# The Unix-socket caller when no identities file is configured: today's single user.
LOCAL = Identity(name="local", roles=frozenset(Role))


@dataclass(frozen=True, slots=True)
class Identities:
    """The identities of one file. Lookups return None for strangers."""

    source: str
    entries: tuple[Identity, ...]
    # sha256 of the file's text (what hot reload compares).
    revision: str = ""

    def by_token(self, token: str) -> Identity | None:
        """The identity whose token this is; compares every entry in constant time."""
        digest = hash_token(token)
        found = None
        for identity in self.entries:
            # No early exit: the time taken does not say which entry matched.
            if identity.token_sha256 and hmac.compare_digest(identity.token_sha256, digest):
                found = identity
        return found

    def by_cert_subject(self, common_name: str) -> Identity | None:
        return next((i for i in self.entries if i.cert_subject == common_name), None)

    def memberships(self, name: str) -> frozenset[str]:
        """The groups and roles of the identity called `name` (none for a stranger)."""
        found = next((i for i in self.entries if i.name == name), None)
        return found.memberships() if found is not None else frozenset()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


def load_identities(path: Path) -> Identities:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise IdentityError(f"cannot read identities file: {exc}", path=str(path)) from exc
    return parse_identities(text, str(path))


def parse_identities(text: str, source: str) -> Identities:
    doc = _Doc(text, source, IdentityError)
    root = doc.root()
    if root is None:
        raise IdentityError(
            "empty file: an identities file has version and identities", path=source
        )
    top = doc.mapping(root, "file", FILE_KEYS)
    if "version" not in top or doc.value(top["version"]) != 1:
        raise doc.error(top.get("version", root), "version: must be 1")
    if "identities" not in top:
        raise doc.error(root, "identities: missing (a list of name, roles, credentials)")
    nodes = doc.sequence(top["identities"], "identities")
    if not nodes:
        raise doc.error(top["identities"], "identities: lists nobody, so nobody could call")
    entries = tuple(_identity(doc, n, f"identities[{i}]") for i, n in enumerate(nodes))
    _check_unique(doc, nodes, entries)
    return Identities(source, entries, hashlib.sha256(text.encode()).hexdigest())


def _identity(doc: _Doc, node: yaml.Node, where: str) -> Identity:
    keys = doc.mapping(node, where, IDENTITY_KEYS)
    if "name" not in keys:
        raise doc.error(node, f"{where}.name: missing")
    name = doc.string(keys["name"], f"{where}.name")
    if not NAME_PATTERN.fullmatch(name):
        raise doc.error(
            keys["name"],
            f"{where}.name: {name!r} is not a name (letters, digits, '.', '_', '@', '-'; "
            "at most 64, starting with a letter or digit)",
        )
    if "roles" not in keys:
        raise doc.error(node, f"{where}.roles: missing (any of {', '.join(Role)})")
    roles = _roles(doc, keys["roles"], f"{where}.roles")
    token = ""
    if "token_sha256" in keys:
        # Never echo the value: it may be a token pasted by mistake.
        token = doc.string(keys["token_sha256"], f"{where}.token_sha256").lower()
        if not _SHA256_HEX.fullmatch(token):
            raise doc.error(
                keys["token_sha256"],
                f"{where}.token_sha256: must be 64 hex digits, the sha256 of the token as "
                "`execgate token new` prints it (never the token itself)",
            )
    subject = (
        doc.string(keys["cert_subject"], f"{where}.cert_subject") if "cert_subject" in keys else ""
    )
    if not (token or subject):
        raise doc.error(node, f"{where}: needs a credential: token_sha256 or cert_subject")
    groups = _groups(doc, keys["groups"], f"{where}.groups") if "groups" in keys else ()
    return Identity(
        name=name, roles=roles, token_sha256=token, cert_subject=subject, groups=frozenset(groups)
    )


def _groups(doc: _Doc, node: yaml.Node, where: str) -> tuple[str, ...]:
    groups = doc.strings(node, where)
    for i, group in enumerate(groups):
        if not NAME_PATTERN.fullmatch(group):
            raise doc.error(doc.sequence(node, where)[i], f"{where}[{i}]: {group!r} is not a name")
    return groups


def _roles(doc: _Doc, node: yaml.Node, where: str) -> frozenset[Role]:
    items = doc.sequence(node, where)
    if not items:
        raise doc.error(node, f"{where}: must name at least one of {', '.join(Role)}")
    roles = set()
    for i, item in enumerate(items):
        value = doc.string(item, f"{where}[{i}]")
        try:
            roles.add(Role(value))
        except ValueError:
            raise doc.error(
                item, f"{where}[{i}]: unknown role {value!r}; roles are {', '.join(Role)}"
            ) from None
    return frozenset(roles)


def _check_unique(doc: _Doc, nodes: list[yaml.Node], entries: tuple[Identity, ...]) -> None:
    """Names, tokens and certificate subjects each name one identity."""
    seen: dict[tuple[str, str], int] = {}
    for i, (node, entry) in enumerate(zip(nodes, entries, strict=True)):
        for field, value in (
            ("name", entry.name),
            ("token_sha256", entry.token_sha256),
            ("cert_subject", entry.cert_subject),
        ):
            if not value:
                continue
            first = seen.setdefault((field, value), i)
            if first != i:
                where = f"identities[{i}].{field}"
                raise doc.error(
                    _key_value(node, field), f"{where}: the same as identities[{first}]'s"
                )


def _key_value(node: yaml.Node, key: str) -> yaml.Node:
    assert isinstance(node, yaml.MappingNode)
    value: yaml.Node = next(v for k, v in node.value if k.value == key)
    return value
