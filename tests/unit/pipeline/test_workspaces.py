"""pipeline/workspaces.py: which workspace a call works in, roots made and never nested,
a run's binding, and a policy reload changing what an agent is given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.core.paths import Workspace
from execgate.executor.core.requests import CallRequest
from execgate.executor.pipeline.authorize import Authorizer
from execgate.executor.pipeline.workspaces import Workspaces
from execgate.executor.policy import parse_policy

HEAD = "version: 1\ndefault: deny\nrules:\n  - {id: all, effect: allow, tools: ['*']}\n"


def policy(root: Path, extra: str = "") -> str:
    return (
        HEAD
        + "workspaces:\n"
        + f'  - {{name: home, root: "{root}/spaces/{{agent}}", agents: [ann, ben]}}\n'
        + '  - {name: rel, root: "rel/{agent}", agents: [ann]}\n'
        + extra
    )


@pytest.fixture
def spaces(tmp_path: Path) -> Workspaces:
    (tmp_path / "default").mkdir(mode=0o750)
    os.chmod(tmp_path / "default", 0o750)
    authorizer = Authorizer(parse_policy(policy(tmp_path), "p.yaml"))
    return Workspaces(Workspace(tmp_path / "default"), authorizer, base=tmp_path / "cwd")


def req(workspace: str = "", run_id: str = "r") -> CallRequest:
    return CallRequest(
        run_id=run_id,
        call_id="c",
        batch_id="b",
        index=0,
        tool="noop",
        arguments_json="{}",
        workspace=workspace,
    )


def refused(err: pytest.ExceptionInfo[ToolError], words: str) -> None:
    e = err.value
    assert (e.status, e.error_class, e.field) == (
        Status.REJECTED,
        ErrorClass.PERMISSION_DENIED,
        "workspace",
    )
    assert words in e.message


def test_a_call_naming_none_works_in_its_agents_first_with_the_name_pinned(
    spaces: Workspaces, tmp_path: Path
) -> None:
    ws, pinned = spaces.choose(req(), "ann")
    assert (ws.name, ws.root, pinned.workspace) == ("home", tmp_path / "spaces" / "ann", "home")
    again, _ = spaces.choose(req("home"), "ann")
    assert again is ws  # opened once
    # A relative root is relative to the daemon's working directory at start (`base`).
    rel, _ = spaces.choose(req("rel"), "ann")
    assert rel.root == tmp_path / "cwd" / "rel" / "ann"


def test_a_made_root_is_made_like_the_default_and_its_parents_owner_only(
    spaces: Workspaces, tmp_path: Path
) -> None:
    ws, _ = spaces.choose(req(), "ben")
    like = (tmp_path / "default").stat()
    made = ws.root.stat()
    assert (made.st_mode, made.st_uid, made.st_gid) == (like.st_mode, like.st_uid, like.st_gid)
    parent = (tmp_path / "spaces").stat().st_mode & 0o777
    assert parent == (0o711 if os.geteuid() == 0 else 0o700)


def test_a_name_not_given_is_refused_in_the_same_words_as_one_that_does_not_exist(
    spaces: Workspaces,
) -> None:
    for name in ("rel", "nowhere"):
        with pytest.raises(ToolError) as err:
            spaces.choose(req(name), "ben")
        refused(err, f"workspace {name!r} is not given to ben")
    with pytest.raises(ToolError) as err:
        spaces.choose(req(), "stranger")
    refused(err, "no workspace is given to stranger")


def test_a_bound_run_refuses_another_workspace(spaces: Workspaces) -> None:
    spaces.runs = {"bound": "rel"}
    ws, pinned = spaces.choose(req(run_id="bound"), "ann")
    assert (ws.name, pinned.workspace) == ("rel", "rel")
    with pytest.raises(ToolError) as err:
        spaces.choose(req("home", run_id="bound"), "ann")
    refused(err, "run 'bound' works in workspace 'rel'")
    with pytest.raises(ToolError) as err:  # ben was never given it
        spaces.choose(req(run_id="bound"), "ben")
    refused(err, "workspace 'rel' is not given to ben")


def test_roots_may_not_nest_with_each_other_or_the_default(tmp_path: Path) -> None:
    extra = (
        f'  - {{name: inside, root: "{tmp_path}/default/in", agents: [ann]}}\n'
        f'  - {{name: above, root: "{tmp_path}/spaces", agents: [ann]}}\n'
    )
    (tmp_path / "default").mkdir()
    authorizer = Authorizer(parse_policy(policy(tmp_path, extra), "p.yaml"))
    spaces = Workspaces(Workspace(tmp_path / "default"), authorizer, base=tmp_path)
    with pytest.raises(ToolError) as err:
        spaces.choose(req("inside"), "ann")
    refused(err, "nest")
    spaces.choose(req("home"), "ann")  # spaces/ann: now `spaces` would hold it
    with pytest.raises(ToolError) as err:
        spaces.choose(req("above"), "ann")
    refused(err, "nest")


def test_a_reload_changes_what_is_given_from_the_next_call(
    spaces: Workspaces, tmp_path: Path
) -> None:
    spaces.choose(req("rel"), "ann")
    authorizer = spaces._authorizer
    authorizer.policy = parse_policy(HEAD, "p.yaml")  # no workspaces: `default` for all
    ws, pinned = spaces.choose(req(), "ann")
    assert (ws, pinned.workspace) == (spaces.default, "default")
    with pytest.raises(ToolError) as err:
        spaces.choose(req("rel"), "ann")
    refused(err, "workspace 'rel' is not given to ann")
