"""The identities `make run` gives one person at a terminal: an `agent` and an `operator`.

`execgate serve --local-identities` makes them once, in the state directory (./var),
and serves with them:

    var/identities.yaml        the identities file (sha256 of each token only), 0600
    var/tokens/agent.token     the agent's bearer token, 0600: what `execgate call` uses
    var/tokens/operator.token  the operator's, 0600: what `execgate approvals` uses

The operator holds the `operator` and `approver` roles, so it may decide the agent's
`ask` calls; the agent holds `agent` only, so it can never approve its own. The CLI
finds the tokens beside the socket it talks to (`tokens_dir`); a token given with
--token or $EXECGATE_TOKEN always wins. Nothing is overwritten: files that exist are
used as they are, and a half-made set (one file missing) is an error naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from execgate.executor.core.errors import ConfigError

from .identity import Role, hash_token, new_token

__all__ = ["LOCAL_ROLES", "LocalIdentities", "cli_token", "ensure", "token_file", "tokens_dir"]

# Identity name -> its roles. The names are what the journal records.
LOCAL_ROLES: dict[str, tuple[Role, ...]] = {
    "agent": (Role.AGENT,),
    "operator": (Role.OPERATOR, Role.APPROVER),
}


@dataclass(frozen=True, slots=True)
class LocalIdentities:
    # The identities file to serve with.
    file: Path
    # Identity name -> the file holding its token.
    tokens: dict[str, Path]


def tokens_dir(state_dir: Path) -> Path:
    return state_dir / "tokens"


def token_file(state_dir: Path, name: str) -> Path:
    return tokens_dir(state_dir) / f"{name}.token"


def ensure(state_dir: Path) -> LocalIdentities:
    """The local identities under `state_dir`, made if none of their files exist yet."""
    file = state_dir / "identities.yaml"
    tokens = {name: token_file(state_dir, name) for name in LOCAL_ROLES}
    paths = [file, *tokens.values()]
    present = [p for p in paths if p.exists()]
    if present and len(present) < len(paths):
        missing = ", ".join(str(p) for p in paths if not p.exists())
        raise ConfigError(
            f"local identities half made: {missing} missing; remove {file} and "
            f"{tokens_dir(state_dir)} to make a new pair"
        )
    if not present:
        _make(state_dir, file, tokens)
    return LocalIdentities(file, tokens)


def _make(state_dir: Path, file: Path, tokens: dict[str, Path]) -> None:
    for directory in (state_dir, tokens_dir(state_dir)):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
    lines = [
        "# Made once by `execgate serve --local-identities` (make run); tokens in tokens/.",
        "version: 1",
        "identities:",
    ]
    for name, path in tokens.items():
        token = new_token()
        _write_private(path, token + "\n")
        roles = ", ".join(LOCAL_ROLES[name])
        lines.append(f"  - {{name: {name}, roles: [{roles}], token_sha256: {hash_token(token)}}}")
    _write_private(file, "\n".join(lines) + "\n")


def _write_private(path: Path, text: str) -> None:
    """Create `path` owner-only (0600), never replacing a file that appeared meanwhile."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def cli_token(address: str, name: str) -> str | None:
    """The token of local identity `name` for a CLI talking to `address` (already
    resolved): from the tokens directory beside its Unix socket, if there is one there
    and $EXECGATE_TOKEN is unset. None: the client's own default applies."""
    if os.environ.get("EXECGATE_TOKEN") or not address.startswith("unix:"):
        return None
    path = token_file(Path(address.removeprefix("unix:")).parent, name)
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
