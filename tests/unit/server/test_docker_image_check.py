"""Startup refuses a docker sandbox without --docker-image where something would need it:
the policy's sandbox rules, a command tool, or an MCP server that names no image."""

from __future__ import annotations

from pathlib import Path

import pytest

from execgate.executor.core.errors import ConfigError
from execgate.executor.policy import load_policy
from execgate.executor.sandbox.registry import SandboxConfig
from execgate.executor.server.config import ServeConfig
from execgate.executor.server.serve import _check_docker_image
from execgate.executor.tools.toolfile import parse_sources

SERVER = "  - {name: s, command: /srv/s, sandbox: {backend: docker%s}}\n"
COMMAND = (
    "tools: [{name: t, description: d, input_schema: {type: object}, argv: [x],"
    " sandbox: {backend: docker}}]\n"
)


def check(tmp_path: Path, tools: str, *, rule: bool = False, image: str = "") -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\ndefault: deny\nrules: []\n"
        + ("sandbox: [{tools: ['*'], backend: docker}]\n" if rule else "")
    )
    declared = parse_sources([("t.yaml", "version: 1\n" + tools)])
    config = ServeConfig(sandbox=SandboxConfig(docker_image=image))
    _check_docker_image(config, declared, load_policy(policy))


def test_servers_that_name_their_image_need_no_default(tmp_path: Path) -> None:
    check(tmp_path, "servers:\n" + SERVER % ", image: 'i:1'")


@pytest.mark.parametrize(
    ("tools", "rule", "who"),
    [
        ("servers:\n" + SERVER % "", False, "the tools file"),
        (COMMAND, False, "the tools file"),
        ("servers:\n" + SERVER % ", image: 'i:1'", True, "the policy's sandbox rules"),
    ],
)
def test_anything_else_in_docker_needs_the_default(
    tmp_path: Path, tools: str, rule: bool, who: str
) -> None:
    with pytest.raises(ConfigError, match=f"{who} run tools in the docker sandbox"):
        check(tmp_path, tools, rule=rule)
    check(tmp_path, tools, rule=rule, image="busybox:1")
