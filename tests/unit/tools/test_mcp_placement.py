"""Where an MCP server runs: the policy's sandbox rule for `NAME.*` over the tools
file's `sandbox:`, as for a declared command -- and its image only in docker.

Fakes for the backends (only their names matter here); the Launch is the one the
provider would start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from execgate.executor.core.paths import Workspace
from execgate.executor.policy import load_policy
from execgate.executor.sandbox import Confinement, Launch, SandboxError
from execgate.executor.sandbox.registry import Sandboxes
from execgate.executor.tools.decl import SandboxDecl, ServerDecl
from execgate.executor.tools.mcp import McpProvider


class Named:
    def __init__(self, name: str) -> None:
        self.name = name


def placed(tmp_path: Path, box: SandboxDecl, rules: str = "") -> tuple[str, Launch]:
    """(the backend's name, the Launch) of server `box` under a policy with `rules`."""
    policy_path = tmp_path / "p.yaml"
    policy_path.write_text(
        "version: 1\ndefault: deny\nrules:\n  - {id: all, effect: allow, tools: ['*']}\n"
        + (f"sandbox:\n{rules}" if rules else "")
    )
    policy = load_policy(policy_path)
    backends: dict[str, Any] = {n: Named(n) for n in ("bwrap", "process", "docker")}
    boxes = Sandboxes(backends, "bwrap", policy.sandbox_for, Confinement())
    workspace = Workspace(tmp_path)
    provider = McpProvider(boxes, workspace)
    decl = ServerDecl(name="box", command="/srv/mcp-server", sandbox=box)
    placement = provider._placer(decl)("box.tool", "a1")
    return placement.sandbox.name, provider._launcher(decl)(placement, workspace)


def test_a_process_works_in_the_workspace_of_its_pool_key(tmp_path: Path) -> None:
    """The launch binds and starts in the workspace it is given, not the daemon's."""
    (tmp_path / "other").mkdir()
    other = Workspace(tmp_path / "other", name="other")
    boxes = Sandboxes({"bwrap": Named("bwrap")}, "bwrap", lambda *_: None, Confinement())
    provider = McpProvider(boxes, Workspace(tmp_path))
    decl = ServerDecl(name="box", command="/srv/mcp-server")
    launch = provider._launcher(decl)(provider._placer(decl)("box.tool", "a1"), other)
    assert (launch.workspace, launch.cwd, launch.env["HOME"]) == (
        other.root,
        other.root,
        str(other.root),
    )


def test_a_servers_image_reaches_its_launch_in_docker(tmp_path: Path) -> None:
    image = "execgate-test-mcp:1"
    name, launch = placed(tmp_path, SandboxDecl(backend="docker", image=image))
    assert (name, launch.image, launch.serve) == ("docker", image, True)
    assert launch.confinement.network is False
    assert launch.argv == ("/srv/mcp-server",)


def test_the_policy_rule_opens_the_network_and_lowers_the_limits(tmp_path: Path) -> None:
    limits = (("processes", 64), ("memory_bytes", 512 << 20))
    box = SandboxDecl(backend="docker", image="i:1", limits=limits)
    rules = "  - {tools: ['box.*'], network: true, limits: {processes: 16}}\n"
    name, launch = placed(tmp_path, box, rules)
    assert name == "docker"
    assert launch.confinement.network is True
    assert launch.confinement.processes == 16
    assert launch.confinement.memory_bytes == 512 << 20


def test_an_image_is_refused_where_the_policy_picks_another_backend(tmp_path: Path) -> None:
    rules = "  - {tools: ['box.*'], backend: bwrap}\n"
    with pytest.raises(SandboxError, match="names image i:1, but runs under bwrap"):
        placed(tmp_path, SandboxDecl(backend="docker", image="i:1"), rules)


def test_the_tools_file_may_not_choose_process_over_a_stronger_default(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="asks for the process backend, weaker than bwrap"):
        placed(tmp_path, SandboxDecl(backend="process"))
    rules = "  - {tools: ['box.*'], backend: process}\n"
    assert placed(tmp_path, SandboxDecl(backend="process"), rules)[0] == "process"
