"""Which sandbox each call runs in, with which limits: the daemon's backends plus policy.

Built once at startup. The default backend is `--sandbox` (`auto`: bwrap where it
works, else process); a policy `sandbox:` rule may send a tool elsewhere, open
its network, or change its limits. A backend that the configuration or the policy
asks for but that does not work on this machine stops the daemon at startup with
the reason -- never a silent fall back to something weaker.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from execgate.executor.core.errors import ConfigError
from execgate.executor.policy import SandboxRule

from .base import Confinement, Probe, Sandbox, SandboxError, fit_confinement
from .bwrap import BwrapSandbox
from .cgroup import CgroupRoot, remove_root
from .privileges import Privileges, check_workspace, resolve
from .process import ProcessSandbox
from .warm_pool import WarmBwrapSandbox

log = logging.getLogger("execgate.sandbox")

CHOICES = ("auto", "process", "bwrap", "docker")


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxConfig:
    # "auto" (bwrap if it works here, else process), "process", "bwrap" or "docker".
    default: str = "auto"
    confinement: Confinement = field(default_factory=Confinement)
    # Extra host paths bwrap binds read-only (an interpreter outside /usr, say).
    ro_paths: tuple[Path, ...] = ()
    docker_image: str = ""
    docker_mode: str = "per-call"
    # bwrap: "warm" (a run's calls in a sandbox built once; cold where the kernel lacks
    # what it needs) or "cold" (a sandbox built per call).
    bwrap_mode: str = "warm"
    # Warm bwrap sandboxes kept at most (warm_pool.py); past them a call goes cold.
    warm_sandboxes: int = 64
    # Per-call cgroup leaves where the daemon may create them.
    cgroups: bool = True
    # --run-as USER[:GROUP] for the process backend under a root daemon ("": the
    # workspace's owner unless root, else nobody); see privileges.py.
    run_as: str = ""
    # The daemon's workspace (the default run-as user is its owner).
    workspace: Path = Path("workspace")


# What a tool's declaration says about where it runs: (backend, Confinement limits).
Placement = tuple[str, tuple[tuple[str, int], ...]]

# Policy.sandbox_for: (tool, agent, memberships) -> the first sandbox rule covering it.
RuleFor = Callable[[str, str, frozenset[str]], SandboxRule | None]


def daemon_id(state_dir: Path) -> str:
    """Stable per state dir: a restarted daemon recognises what its predecessor left."""
    return hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:12]


class Sandboxes:
    """The backends this daemon runs calls in, and which one each tool gets."""

    def __init__(
        self,
        backends: dict[str, Sandbox],
        default: str,
        rule_for: RuleFor,
        base: Confinement,
        cgroups: CgroupRoot | None = None,
    ) -> None:
        self.backends = backends
        self.default = default
        self._rule_for = rule_for
        self._base = base
        self._cgroups = cgroups
        self._cache: dict[
            tuple[str, str, frozenset[str], Placement | None], tuple[Sandbox, Confinement]
        ] = {}

    def for_call(
        self,
        tool: str,
        agent: str = "local",
        memberships: frozenset[str] = frozenset(),
        placed: Placement | None = None,
    ) -> tuple[Sandbox, Confinement]:
        """The backend and confinement of the call: the first sandbox rule covering it,
        over what the tool's declaration says (`placed`: its backend and limits).

        A rule's backend other than "default" wins over the declaration's; the
        declaration's limits apply, a rule's limit on the same field may only lower
        them; the network is the rule's alone (never opened by a declaration).
        """
        key = (tool, agent, memberships, placed)
        found = self._cache.get(key)
        if found is None:
            found = self._choose(self._rule_for(tool, agent, memberships), placed)
            self._cache[key] = found
        return found

    def _choose(
        self, rule: SandboxRule | None, placed: Placement | None
    ) -> tuple[Sandbox, Confinement]:
        backend, declared = placed if placed is not None else ("default", ())
        limits: dict[str, Any] = dict(declared)  # Confinement field -> its int value
        network = False
        if rule is not None:
            if rule.backend != "default":
                backend = rule.backend
            for f, v in rule.limits:  # the rule may lower a declared limit, never raise it
                limits[f] = min(v, int(limits[f])) if f in limits else v
            network = rule.network
        conf = replace(self._base, **limits)
        if rule is not None:
            conf = replace(conf, network=network)
        name = self.default if backend == "default" else backend
        if placed is not None and name == "process" and _weakened(rule, self.default):
            raise SandboxError(
                "the tools file asks for the process backend, weaker than "
                f"{self.default}: no read-only workspace, no network namespace, one uid "
                "for every call; only a policy sandbox rule may choose process for a tool"
            )
        if name not in self.backends:
            raise SandboxError(f"backend {name} is not running in this daemon (restart it)")
        return self.backends[name], conf

    async def cleanup_stale(self) -> int:
        return sum([await b.cleanup_stale() for b in self.backends.values()])

    def run_ended(self, run_id: str) -> None:
        """A run ended: backends that keep warm state per run let it go."""
        for backend in self.backends.values():
            backend.run_ended(run_id)

    async def close(self) -> None:
        for backend in self.backends.values():
            await backend.close()
        if self._cgroups is not None:
            remove_root(self._cgroups)


def build(
    config: SandboxConfig,
    ident: str,
    wanted_by_policy: set[str],
    rule_for: RuleFor,
) -> Sandboxes:
    privs = resolve(config.run_as, config.workspace)
    cgroups = CgroupRoot(ident) if config.cgroups else None
    if cgroups is not None and not cgroups.available:
        cgroups = None
    default = _default(config, cgroups)
    backends: dict[str, Sandbox] = {}
    for name in sorted({default, *wanted_by_policy}):
        backend = _make(name, config, ident, cgroups, privs)
        probe = backend.probe()
        if not probe.ok:
            who = "--sandbox" if name == default else "the policy"
            raise ConfigError(
                f"{who} asks for the {name} sandbox, which does not work here: {probe.detail}"
            )
        backends[name] = backend
        log.info("sandbox %s: %s", name, probe.detail)
        if name == "process" and (warning := check_workspace(privs, config.workspace)):
            log.warning("sandbox process: %s", warning)
    log.info("default sandbox: %s", default)
    base, lowered = fit_confinement(config.confinement)
    for note in lowered:
        log.warning("sandbox limit lowered: %s", note)
    return Sandboxes(backends, default, rule_for, base, cgroups)


def probe_all(config: SandboxConfig, ident: str) -> tuple[list[Probe], str]:
    """Every backend's probe and the default `auto` picks here (for `execgate doctor`)."""
    privs = resolve(config.run_as, config.workspace)
    cgroups = CgroupRoot(ident) if config.cgroups else None
    try:
        probes = [_make(n, config, ident, cgroups, privs).probe() for n in BACKENDS]
        return probes, _default(config, cgroups)
    finally:
        if cgroups is not None:
            remove_root(cgroups)


BACKENDS = ("process", "bwrap", "docker")


def _make(
    name: str,
    config: SandboxConfig,
    ident: str,
    cgroups: CgroupRoot | None,
    privs: Privileges | None = None,
) -> Sandbox:
    if name == "process":
        return ProcessSandbox(cgroups, privs)
    if name == "bwrap":
        if config.bwrap_mode == "warm":
            limits, _ = fit_confinement(config.confinement)
            return WarmBwrapSandbox(cgroups, config.ro_paths, limits, config.warm_sandboxes)
        return BwrapSandbox(cgroups, config.ro_paths)
    from .docker import DockerSandbox  # the docker SDK is imported only when asked for

    return DockerSandbox(config.docker_image, daemon_id=ident, mode=config.docker_mode)


def _default(config: SandboxConfig, cgroups: CgroupRoot | None) -> str:
    if config.default != "auto":
        return config.default
    return "bwrap" if BwrapSandbox(cgroups, config.ro_paths).probe().ok else "process"


def _weakened(rule: SandboxRule | None, default: str) -> bool:
    """A declaration's `process` would loosen what the policy and the daemon chose."""
    chosen = rule.backend if rule is not None and rule.backend != "default" else default
    return chosen != "process"
