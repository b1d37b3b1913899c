"""What the `process` backend takes away from a command: root, capabilities, new privileges.

The process backend has no namespaces, so it cannot hide the host; what it can do
is make sure a command never holds the daemon's powers:

- under a daemon running as root, every command runs as an unprivileged user
  (`--run-as USER[:GROUP]`; default: the workspace directory's owner if that is not
  root, else `nobody`), with its supplementary groups cleared; uid 0 (and gid 0)
  is refused at startup;
- no-new-privileges is always set (a set-user-id binary gains nothing), and the
  capability sets are emptied: bounding, inheritable and ambient (effective and
  permitted follow from leaving uid 0);
- the daemon itself is made non-dumpable at startup (`PR_SET_DUMPABLE` 0), so a
  command of the same uid can neither ptrace it nor read /proc/<daemon>/mem or
  environ.

The drop is one more exec in the spawn chain: util-linux `setpriv`, after the
cgroup join and the rlimits (which need the daemon's rights), just before the
command.
"""

from __future__ import annotations

import ctypes
import grp
import logging
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from execgate.executor.core.errors import ConfigError

log = logging.getLogger("execgate.sandbox")

SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"
PR_SET_DUMPABLE = 4
NOBODY = "nobody"


@dataclass(frozen=True, slots=True)
class RunAs:
    """The user and group commands run as (never 0)."""

    uid: int
    gid: int
    name: str

    def describe(self) -> str:
        return f"uid {self.uid} ({self.name}), gid {self.gid}"


@dataclass(frozen=True, slots=True)
class Privileges:
    """What the spawn chain drops. `run_as` None: the daemon is not root, commands keep
    its uid (and still get no-new-privileges and no capabilities)."""

    run_as: RunAs | None

    def prefix(self, *, pdeathsig: bool = False) -> list[str]:
        """The `setpriv` step that execs the command without the daemon's powers.

        `pdeathsig`: the command (a long-lived server) is SIGKILLed when the daemon
        dies, however it dies (PR_SET_PDEATHSIG, set after the uid change, kept
        across the exec). Its own children are not covered: their cgroup leaf is
        removed at the next start (cleanup_stale)."""
        drop = ["--no-new-privs", "--inh-caps=-all", "--ambient-caps=-all"]
        if pdeathsig:
            drop.append("--pdeathsig=KILL")
        if self.run_as is not None:
            who = [f"--reuid={self.run_as.uid}", f"--regid={self.run_as.gid}", "--clear-groups"]
            drop = [*who, *drop, "--bounding-set=-all"]
        return [SETPRIV, *drop, "--"]

    def describe(self) -> str:
        who = (
            f"runs as {self.run_as.describe()}"
            if self.run_as is not None
            else f"runs as the daemon's uid {os.geteuid()}"
        )
        return (
            f"{who}, supplementary groups cleared, no-new-privs, capabilities dropped; "
            "NO file-system or network isolation (the command sees the host as that user)"
        )

    def available(self) -> str:
        """Empty if the drop can be done here, else why not."""
        if not os.access(SETPRIV, os.X_OK):
            return "setpriv (util-linux) not found: cannot drop privileges"
        return ""


def resolve(spec: str, workspace: Path) -> Privileges:
    """The privileges a daemon of this uid gives commands, from `--run-as` (may be "")."""
    if os.geteuid() != 0:
        if spec:
            who = _parse(spec)
            if who.uid != os.geteuid():
                raise ConfigError(
                    f"--run-as {spec}: only a daemon running as root can run commands "
                    f"as another user (this daemon is uid {os.geteuid()})"
                )
        return Privileges(None)
    who = _parse(spec) if spec else _default(workspace)
    if who.uid == 0 or who.gid == 0:
        raise ConfigError(
            f"--run-as {spec or who.name}: commands never run as uid 0 or gid 0; "
            "name an unprivileged user"
        )
    return Privileges(who)


def _default(workspace: Path) -> RunAs:
    """The workspace's owner (with the directory's group) unless root, else nobody."""
    try:
        st = workspace.stat()
    except OSError:
        st = None
    if st is not None and st.st_uid != 0:
        gid = st.st_gid if st.st_gid != 0 else _primary_gid(st.st_uid)
        return RunAs(st.st_uid, gid, _user_name(st.st_uid))
    return _parse(NOBODY)


def _parse(spec: str) -> RunAs:
    """USER[:GROUP], each a name or a number; the group defaults to the user's own."""
    user, _, group = spec.partition(":")
    if not user:
        raise ConfigError(f"--run-as {spec!r}: USER[:GROUP], a user name or uid")
    try:
        entry = pwd.getpwnam(user) if not user.isdigit() else pwd.getpwuid(int(user))
        uid, gid, name = entry.pw_uid, entry.pw_gid, entry.pw_name
    except KeyError:
        if not user.isdigit():
            raise ConfigError(f"--run-as {spec}: no user {user!r} on this host") from None
        if not group:
            raise ConfigError(
                f"--run-as {spec}: uid {user} has no passwd entry; name a group"
            ) from None
        uid, gid, name = int(user), -1, user
    if group:
        gid = _group(spec, group)
    return RunAs(uid, gid, name)


def _group(spec: str, group: str) -> int:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"--run-as {spec}: no group {group!r} on this host") from None


def _primary_gid(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def make_non_dumpable() -> bool:
    """PR_SET_DUMPABLE 0 for this process: no ptrace, no /proc/<pid>/mem or environ for
    a process of the same uid without CAP_SYS_PTRACE, no core dumps. True if it took."""
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0


def check_workspace(privs: Privileges, workspace: Path) -> str:
    """Empty if commands can write the workspace as the run-as user, else a warning."""
    if privs.run_as is None:
        return ""
    probe = [*privs.prefix(), "test", "-w", str(workspace), "-a", "-x", str(workspace)]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if ok:
        return ""
    return (
        f"the workspace {workspace} is not writable by {privs.run_as.describe()}: "
        "commands in the process sandbox cannot change it (chown it, or pass --run-as)"
    )
