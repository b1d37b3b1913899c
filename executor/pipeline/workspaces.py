"""Which workspace each call works in: the policy's grants, each root opened once.

A call names a workspace (`workspace` on its request), or none: then the one its run is
bound to (Runs.StartRun), else its agent's first (policy `workspaces:`; without that
section every agent's only workspace is `default`, the daemon's --workspace). A name
the agent was not given is REJECTED `permission_denied` naming the field `workspace`,
with the same words whether or not the name exists: an agent cannot even learn the
names of other agents' workspaces. The chosen workspace's name is pinned on the call's
request, so its journal row, its idempotency hash and its approval say where it ran.

Roots are resolved (relative: to the daemon's working directory at start, as
--workspace), made if missing and opened the first time a call needs them, then
kept: one `Workspace` per (name, root). A missing root is made with the owner, group
and mode of the daemon's --workspace (owner-only unless the operator made that one
otherwise), its missing parents owner-only (traversable, under a root daemon, for the
user its commands run as). Roots may not nest: a root inside another (or holding one),
the daemon's --workspace included, is refused, since one file would then have two lock
keys and a command in one workspace could change the other's files unseen. Two names
for one root are one workspace to the locks (keys name the canonical root).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from execgate.executor.core.errors import ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.core.paths import Workspace
from execgate.executor.policy import Grant

from .authorize import Authorizer
from .calls import CallRequest

log = logging.getLogger("execgate.dispatch")

FIELD = "workspace"
# Grants cached per (agent, memberships) for the policy in force; emptied when full.
_GRANTS_MAX = 4096


class Workspaces:
    """The workspaces this daemon serves, and the choice of one per call."""

    def __init__(self, default: Workspace, authorizer: Authorizer, base: Path | None = None):
        self.default = default
        self._authorizer = authorizer
        # Relative roots are relative to it: the daemon's working directory at start.
        self._base = base if base is not None else Path.cwd()
        # run id -> the workspace it is bound to (Runs.StartRun); set by the server.
        self.runs: Mapping[str, str] = {}
        # Invariant: every Workspace here is open; `_roots` holds each one's canonical
        # root (the default's included), so a new root is checked against all of them.
        self._open: dict[tuple[str, str], Workspace] = {}
        self._roots: set[str] = {default.lock_root}
        self._grants: dict[tuple[str, frozenset[str]], tuple[Grant, ...]] = {}
        self._policy = authorizer.policy

    def choose(self, req: CallRequest, agent: str) -> tuple[Workspace, CallRequest]:
        """The call's workspace, and its request with that workspace's name pinned on
        it; raises the REJECTED ToolError naming `workspace`."""
        bound = self.runs.get(req.run_id)
        if bound is not None and req.workspace not in ("", bound):
            raise _refused(
                f"run {req.run_id!r} works in workspace {bound!r}; its calls cannot name "
                f"{req.workspace[:100]!r}"
            )
        workspace = self.given(agent, req.workspace or bound or "")
        if req.workspace == workspace.name:
            return workspace, req
        return workspace, replace(req, workspace=workspace.name)

    def given(self, agent: str, name: str) -> Workspace:
        """The workspace called `name` ("": the agent's first), opened (its root made if
        missing), if the agent is given it; else the REJECTED ToolError naming
        `workspace`."""
        return self._opened(self.grant(agent, name))

    def grant(self, agent: str, name: str) -> Grant:
        """What the policy in force gives the agent under `name` ("": its first); else
        the REJECTED ToolError naming `workspace`. Nothing is opened (Runs.StartRun
        binds a run to the name)."""
        grants = self._grants_of(agent)
        if not name:
            if not grants:
                raise _refused(f"no workspace is given to {agent} (the policy's workspaces:)")
            return grants[0]
        for grant in grants:
            if grant.name == name:
                return grant
        # The same words for a name that exists and one that does not.
        raise _refused(f"workspace {name[:100]!r} is not given to {agent}")

    def close(self) -> None:
        for workspace in self._open.values():
            if workspace is not self.default:
                workspace.close()
        self._open.clear()

    # -- internals -----------------------------------------------------------------

    def _grants_of(self, agent: str) -> tuple[Grant, ...]:
        policy = self._authorizer.policy
        if policy is not self._policy:  # reloaded: what was given may have changed
            self._policy = policy
            self._grants.clear()
        memberships = self._authorizer.memberships(agent)
        key = (agent, memberships)
        found = self._grants.get(key)
        if found is None:
            if len(self._grants) >= _GRANTS_MAX:
                self._grants.clear()
            found = self._grants[key] = policy.workspaces_for(agent, memberships)
        return found

    def _opened(self, grant: Grant) -> Workspace:
        if not grant.root:
            return self.default
        key = (grant.name, grant.root)
        found = self._open.get(key)
        if found is None:
            found = self._open[key] = self._open_root(grant)
        return found

    def _open_root(self, grant: Grant) -> Workspace:
        path = self._base / grant.root
        try:
            if not path.is_dir():
                make_root(path, self.default.root)
            workspace = Workspace(path, name=grant.name, owner=self.default.owner)
        except OSError as exc:
            raise ToolError(
                ErrorClass.IO_ERROR,
                f"workspace {grant.name!r} ({grant.field}): its root {path} cannot be made "
                f"or opened: {exc.strerror}",
                field=FIELD,
                status=Status.REJECTED,
            ) from exc
        clash = next((r for r in self._roots if _nested(r, workspace.lock_root)), None)
        if clash is not None:
            workspace.close()
            raise _refused(
                f"workspace {grant.name!r} ({grant.field}): its root {workspace.root} and "
                f"the workspace root {clash} nest; roots may not (one file, two workspaces)"
            )
        self._roots.add(workspace.lock_root)
        log.info("workspace %s: %s", grant.name, workspace.root)
        return workspace


def make_root(path: Path, like: Path) -> None:
    """Make a missing workspace root with the owner, group and mode of `like` (the
    daemon's --workspace); missing parents owner-only, traversable for everyone under
    a root daemon (its commands run as another user, who must reach the root)."""
    st = os.stat(like)
    parents = 0o711 if os.geteuid() == 0 else 0o700
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for parent in reversed(missing[1:]):
        parent.mkdir(mode=parents, exist_ok=True)
        os.chmod(parent, parents)  # whatever the umask
    path.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, st.st_uid, st.st_gid)
    os.chmod(path, st.st_mode & 0o7777)


def _nested(a: str, b: str) -> bool:
    """Is one of two distinct canonical roots inside the other?"""
    return a != b and (b.startswith(a.rstrip("/") + "/") or a.startswith(b.rstrip("/") + "/"))


def _refused(message: str) -> ToolError:
    return ToolError(ErrorClass.PERMISSION_DENIED, message, field=FIELD, status=Status.REJECTED)
