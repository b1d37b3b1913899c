"""tools/tools.schema.json (for editors) and the loader describe one format: the same
keys at every level, the shipped examples valid under both, wrong files refused by both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from execgate.executor.core.errors import ToolFileError
from execgate.executor.policy.runrules import CONFINEMENT_KEYS
from execgate.executor.tools import toolparts
from execgate.executor.tools.toolfile import parse_sources

TOOLS = Path(__file__).parents[3] / "tools"
SCHEMA: dict[str, Any] = json.loads((TOOLS / "tools.schema.json").read_text())


def keys(node: dict[str, Any]) -> set[str]:
    return set(node["properties"])


def test_the_schema_is_valid_and_names_the_loaders_keys() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    command, server = SCHEMA["$defs"]["command"], SCHEMA["$defs"]["server"]
    assert keys(SCHEMA) == toolparts.FILE_KEYS
    assert keys(command) == toolparts.COMMAND_KEYS
    assert keys(server) == toolparts.SERVER_KEYS
    assert keys(command["properties"]["env"]) == toolparts.ENV_KEYS
    assert keys(command["properties"]["effects"]) == toolparts.EFFECT_KEYS
    assert keys(command["properties"]["sandbox"]) == toolparts.SANDBOX_KEYS
    assert keys(server["properties"]["sandbox"]) == toolparts.SERVER_SANDBOX_KEYS
    assert keys(command["properties"]["sandbox"]["properties"]["limits"]) == set(CONFINEMENT_KEYS)
    override = server["properties"]["tools"]["additionalProperties"]
    assert keys(override) == toolparts.OVERRIDE_KEYS


def test_the_shipped_examples_are_valid_under_both() -> None:
    for path in TOOLS.glob("*.yaml"):
        text = path.read_text()
        jsonschema.validate(yaml.safe_load(text), SCHEMA)
        parse_sources([(str(path), text)])


@pytest.mark.parametrize(
    "text",
    [
        "version: 2\n",
        "version: 1\nextra: 1\n",
        "version: 1\ntools: [{name: t, description: d, input_schema: {type: object}}]\n",
        "version: 1\ntools: [{name: t, description: d, input_schema: {type: object}, argv: [x],"
        " output: xml}]\n",
        "version: 1\nservers: [{name: s, command: c, pool: thread}]\n",
        "version: 1\nservers: [{name: s, command: c, sandbox: {image: busybox}}]\n",
        "version: 1\nservers: [{name: s, command: c, sandbox: {image: 'a b', backend: docker}}]\n",
        "version: 1\ntools: [{name: t, description: d, input_schema: {type: object}, argv: [x],"
        " sandbox: {backend: docker, image: busybox}}]\n",
    ],
)
def test_a_wrong_file_is_refused_by_both(text: str) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(yaml.safe_load(text), SCHEMA)
    with pytest.raises(ToolFileError):
        parse_sources([("t.yaml", text)])


def test_a_servers_image_is_valid_under_both() -> None:
    text = (
        "version: 1\nservers: [{name: s, command: /srv/s, sandbox: "
        "{backend: docker, image: 'registry.local:5000/mcp/s:1', limits: {memory_mb: 64}}}]\n"
    )
    jsonschema.validate(yaml.safe_load(text), SCHEMA)
    [server] = parse_sources([("t.yaml", text)]).servers
    assert server.sandbox.image == "registry.local:5000/mcp/s:1"
