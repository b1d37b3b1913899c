"""What the policy sees of a declared command tool: the argv it will run (argv_prefix
rules) and the paths its effects resolved (paths rules), as for the built-ins."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from execgate.executor.core.paths import Workspace
from execgate.executor.pipeline.authorize import Authorizer
from execgate.executor.pipeline.calls import CallRequest
from execgate.executor.pipeline.validate import Validator
from execgate.executor.policy import Effect, parse_policy
from execgate.executor.tools import Limits, builtin_tools
from execgate.executor.tools.decl import CommandDecl, EffectsDecl
from execgate.executor.tools.declared import CommandTool
from execgate.executor.tools.toolset import ToolSet

POLICY = """\
version: 1
default: deny
rules:
  - {id: rm, effect: ask, argv_prefix: [rm], approvers: [approver]}
  - {id: vault, effect: deny, paths: ["vault/**"]}
  - {id: all, effect: allow, tools: ["*"]}
"""
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}


def decl(name: str, argv: tuple[str, ...]) -> CommandDecl:
    effects = EffectsDecl(declared=True, writes=("{path}",))
    return CommandDecl(name=name, description="d", input_schema=SCHEMA, argv=argv, effects=effects)


@pytest.mark.parametrize(
    ("tool", "path", "effect"),
    [("remove", "notes.txt", Effect.ASK), ("touch", "notes.txt", Effect.ALLOW),
     ("touch", "vault/key", Effect.DENY)],
)  # fmt: skip
def test_the_policy_decides_on_the_expanded_argv_and_the_effects_paths(
    tmp_path: Path, tool: str, path: str, effect: Effect
) -> None:
    ws = Workspace(tmp_path)
    commands = [CommandTool(decl("remove", ("rm", "--", "{path}"))),
                CommandTool(decl("touch", ("touch", "{path}")))]  # fmt: skip
    validator = Validator(ToolSet.build(builtin_tools().values(), commands), ws, Limits())
    authorizer = Authorizer(parse_policy(POLICY, "p.yaml"))
    req = CallRequest(run_id="r", call_id="c", batch_id="b", index=0, tool=tool,
                      arguments_json=json.dumps({"path": path}))  # fmt: skip
    valid = asyncio.run(validator.validate(req))
    assert authorizer.authorize(valid, "agent").decision.effect is effect
