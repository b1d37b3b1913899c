"""The policy's `workspaces:`: loading, its errors, and which workspaces an agent is given."""

from __future__ import annotations

import textwrap

import pytest

from execgate.executor.core.errors import PolicyError
from execgate.executor.policy import Grant, parse_policy

HEAD = """\
version: 1
default: deny
rules:
  - {id: all, effect: allow, tools: ["*"]}
"""


def policy(workspaces: str) -> str:
    return HEAD + "workspaces:\n" + textwrap.indent(textwrap.dedent(workspaces), "  ")


POLICY = policy(
    """\
    - name: home
      root: workspaces/{agent}
    - name: "{agent}-scratch"
      root: /srv/scratch/{agent}
      agents: [group:builders]
    - name: shared
      root: /srv/shared
      agents: [group:builders, ops]
    - name: default
      agents: [role:operator]
    """
)


def test_an_agent_gets_every_entry_covering_it_in_file_order() -> None:
    p = parse_policy(POLICY, "p.yaml")
    assert p.workspaces_for("alice") == (Grant("home", "workspaces/alice", "workspaces[0]"),)
    assert p.workspaces_for("bob", frozenset({"group:builders"})) == (
        Grant("home", "workspaces/bob", "workspaces[0]"),
        Grant("bob-scratch", "/srv/scratch/bob", "workspaces[1]"),
        Grant("shared", "/srv/shared", "workspaces[2]"),
    )
    # `default` has no root: the daemon's --workspace.
    assert p.workspaces_for("ops", frozenset({"role:operator"}))[1:] == (
        Grant("shared", "/srv/shared", "workspaces[2]"),
        Grant("default", "", "workspaces[3]"),
    )


def test_without_a_section_every_agent_works_in_default() -> None:
    p = parse_policy(HEAD, "p.yaml")
    assert p.workspaces_for("anyone") == (Grant("default", ""),)


def test_a_name_an_agent_is_given_twice_is_the_first_entrys() -> None:
    """`{agent}` may make a template's name equal a literal one for one agent."""
    p = parse_policy(
        policy(
            """\
            - {name: "{agent}", root: "ws/{agent}"}
            - {name: shared, root: /srv/shared}
            """
        ),
        "p.yaml",
    )
    assert p.workspaces_for("shared") == (Grant("shared", "ws/shared", "workspaces[0]"),)
    assert [g.name for g in p.workspaces_for("amy")] == ["amy", "shared"]


def test_an_agent_no_entry_covers_is_given_none() -> None:
    p = parse_policy(policy("- {name: s, root: /s, agents: [group:x]}\n"), "p.yaml")
    assert p.workspaces_for("stranger") == ()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("- {root: /x}", "workspaces[0].name: required"),
        ("- {name: x}", "workspaces[0].root: required"),
        ("- {name: default, root: /x}", "workspaces[0].root: `default` is the daemon's"),
        ("- {name: ../x, root: /x}", "is not a workspace name"),
        ("- {name: 'a b', root: /x}", "is not a workspace name"),
        ("- {name: x, root: '/w/{run}'}", "workspaces[0].root: '/w/{run}': the only placeholder"),
        ("- {name: '{user}', root: /x}", "workspaces[0].name: '{user}': the only placeholder"),
        ("- {name: x, root: /x, size: 3}", "unknown key 'size'"),
        ("- {name: x, root: /x}\n- {name: x, root: /y}", "'x' is workspaces[0]'s too"),
        ("[]", "workspaces"),
    ],
)
def test_a_bad_entry_refuses_the_file_naming_the_field(entry: str, message: str) -> None:
    with pytest.raises(PolicyError, match=r"p\.yaml:") as err:
        parse_policy(policy(entry + "\n"), "p.yaml")
    assert message in str(err.value)
