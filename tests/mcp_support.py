"""Real MCP servers for the tests: where they are installed, and how to run them in bwrap.

Python servers (`mcp-server-git`, the fixture server) come from the test venv; the
npm ones (`@modelcontextprotocol/server-everything`, `server-filesystem`) from the
folder `.ci/run` installs them into (`EXECGATE_MCP_NPM`, default `.test-deps/npm`
at the repository's root). bwrap shows only system directories and the workspace,
so these folders are bound read-only into the sandbox (`RO_PATHS`, the daemon's
`--sandbox-ro`).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from execgate.client import Client, ProviderStatus
from execgate.executor.sandbox import procscan
from tests.daemon import Daemon, scaled
from tests.support import sandbox_serve_args

REPO = Path(__file__).resolve().parents[1]
NPM = Path(os.environ.get("EXECGATE_MCP_NPM", REPO / ".test-deps" / "npm"))
SCOPE = NPM / "node_modules" / "@modelcontextprotocol"
FIXTURE = REPO / "tests" / "fixtures" / "mcp" / "faulty_server.py"
RO_PATHS = tuple(
    dict.fromkeys(
        p.resolve() for p in (Path(sys.prefix), Path(sys.base_prefix), NPM, FIXTURE.parent)
    )
)
TAG_ENV = "EG_TAG"


def npm_server(package: str, *args: str) -> tuple[str, tuple[str, ...]]:
    """(command, args) of an npm server; the test fails if it is not installed."""
    entry = SCOPE / package / "dist" / "index.js"
    if not entry.exists():
        pytest.fail(f"{entry} missing: npm install --prefix {NPM} @modelcontextprotocol/{package}")
    return "node", (str(entry), *args)


def git_server(repo: Path) -> tuple[str, tuple[str, ...]]:
    exe = Path(sys.prefix) / "bin" / "mcp-server-git"
    return str(exe), ("--repository", str(repo))


def fixture_server() -> tuple[str, tuple[str, ...]]:
    return sys.executable, (str(FIXTURE),)


def new_tag() -> str:
    return "mcp-" + secrets.token_hex(6)


def tagged(tag: str) -> list[int]:
    """Live host pids with EG_TAG=tag in their environment (a server and its children)."""
    return procscan.with_marker(TAG_ENV, tag)


def wait_for(check: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll `check` until true, for `seconds` scaled for load; fail naming `what`."""
    deadline = time.monotonic() + scaled(seconds)
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {scaled(seconds):.1f}s: {what}")
        time.sleep(0.02)


async def await_for(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + scaled(seconds)
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {scaled(seconds):.1f}s: {what}")
        await asyncio.sleep(0.02)


def git_repo(path: Path) -> Path:
    """A real repository with one commit."""
    import subprocess

    path.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
    }
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    # A workspace handed to the run-as user is not root's: let git in anyway.
    env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="safe.directory", GIT_CONFIG_VALUE_0="*")
    (path / "README").write_text("hello\n")
    for argv in (
        ["init", "-q", "-b", "main"],
        ["add", "README"],
        ["commit", "-qm", "first commit"],
    ):
        subprocess.run(["git", "-C", str(path), *argv], check=True, env=env)
    return path


def tools_file(path: Path, servers: list[dict[str, Any]]) -> Path:
    """A tools file declaring `servers` (the file's keys; `env.set` as a mapping)."""
    path.write_text(yaml.safe_dump({"version": 1, "servers": servers}, sort_keys=False))
    return path


def entry(name: str, server: tuple[str, tuple[str, ...]], tag: str, **kw: Any) -> dict[str, Any]:
    """A `servers:` entry: `server` (command, args) tagged with EG_TAG=tag; `env` (pairs)
    added to what it is set; any other key as given."""
    command, args = server
    env = {"set": dict([(TAG_ENV, tag), *kw.pop("env", [])])}
    return {"name": name, "command": command, "args": list(args), "env": env, **kw}


def mcp_daemon(root: Path, servers: list[dict[str, Any]], policy: str, *extra: str) -> Daemon:
    """A daemon in bwrap (not started) serving `servers` under `policy`, grace 1 s."""
    daemon = Daemon(
        root,
        *sandbox_serve_args("bwrap", root),
        *[a for p in RO_PATHS for a in ("--sandbox-ro", str(p))],
        "--policy",
        str(root / "policy.yaml"),
        "--tools",
        str(root / "tools.yaml"),
        "--grace",
        "1",
        *extra,
    )
    (root / "policy.yaml").parent.mkdir(parents=True, exist_ok=True)
    (root / "policy.yaml").write_text(policy)
    tools_file(root / "tools.yaml", servers)
    return daemon


def provider(client: Client, name: str) -> ProviderStatus:
    """ListProviders' row of server `name`."""
    [found] = [p for p in client.list_providers() if p.provider == f"mcp:{name}"]
    return found
