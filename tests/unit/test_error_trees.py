"""One exception tree per package, drawn in its root module's docstring.

For `execgate.executor` (root `ExecgateError`, drawn in `core/errors.py`) and
`execgate.client` (root `ExecgateClientError`, drawn in `client/errors.py`): every
exception class a module of the package defines derives from the root, and the drawing
names each one under the base it derives from, with the module that defines it.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

import pytest

from execgate.client import errors as client_errors
from execgate.executor.core import errors as executor_errors

# Exception classes that may stand outside their package's root, each with why. Even the
# private control-flow ones (`_TooBig`, `_Cancelled`, `_Corrupt`) derive from the root,
# so an `except` of the root never has to guess what a room raises.
OUTSIDE_THE_TREE: dict[str, str] = {
    "execgate.executor.sandbox.supervisor.Refused": (
        "raised and caught inside a warm sandbox's supervisor, which runs on the standard "
        "library alone; it reaches the daemon as a message (warm_call turns it into a "
        "SandboxError)"
    ),
}


@dataclass(frozen=True)
class Package:
    name: str
    root: type[BaseException]
    drawing: ModuleType


PACKAGES = [
    Package("execgate.executor", executor_errors.ExecgateError, executor_errors),
    Package("execgate.client", client_errors.ExecgateClientError, client_errors),
]
# An entry of the drawing: the tree's guides, then (after a branch) the class name and
# the module, relative to the package, that defines it.
_ENTRY = re.compile(
    r"^    (?P<guides>(?:[│ ]   )*)(?P<branch>[├└]── )?(?P<name>_?[A-Z]\w*)\s+"
    r"(?P<module>[a-z_]+(?:\.[a-z_]+)*)\b"
)


def _modules(package: str) -> Iterator[ModuleType]:
    top = importlib.import_module(package)
    yield top
    for info in pkgutil.walk_packages(top.__path__, package + "."):
        if not info.name.endswith(".__main__"):  # runs the CLI when imported
            yield importlib.import_module(info.name)


def _defined(package: str) -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of `package`, by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for module in _modules(package):
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def _drawn(pkg: Package) -> dict[str, tuple[str, str | None]]:
    """The drawing: class name -> (its module relative to the package, its drawn parent)."""
    doc = pkg.drawing.__doc__ or ""
    drawn: dict[str, tuple[str, str | None]] = {}
    path: list[str] = []  # the names of the entries above, one per depth
    for line in doc.splitlines():
        m = _ENTRY.match(line)
        if m is None or (m["branch"] is None and drawn):
            continue  # prose, or a description's continuation line
        depth = len(m["guides"]) // 4 + (1 if m["branch"] else 0)
        del path[depth:]
        assert len(path) == depth, f"{m['name']}: drawn deeper than its parent"
        assert m["name"] not in drawn, f"{m['name']} is drawn twice"
        drawn[m["name"]] = (m["module"], path[-1] if path else None)
        path.append(m["name"])
    return drawn


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.name)
def test_every_exception_derives_from_the_root(pkg: Package) -> None:
    strays = sorted(
        name
        for name, cls in _defined(pkg.name).items()
        if not issubclass(cls, pkg.root) and name not in OUTSIDE_THE_TREE
    )
    assert not strays, f"derive these from {pkg.root.__name__} (or justify them): {strays}"


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.name)
def test_the_drawing_names_every_exception_under_its_base(pkg: Package) -> None:
    drawn = _drawn(pkg)
    assert pkg.root.__name__ in drawn, "the root is not drawn"
    defined = _defined(pkg.name)
    problems = []
    for name, cls in sorted(defined.items()):
        if name in OUTSIDE_THE_TREE:
            continue
        module = cls.__module__.removeprefix(pkg.name + ".")
        if cls.__name__ not in drawn:
            problems.append(f"{name} is not drawn")
            continue
        drawn_module, parent = drawn[cls.__name__]
        if drawn_module != module:
            problems.append(f"{cls.__name__} is drawn in {drawn_module}, defined in {module}")
        bases = {b.__name__ for b in cls.__bases__}
        if parent is not None and parent not in bases:
            problems.append(f"{cls.__name__} is drawn under {parent}, derives from {bases}")
        if parent is None and cls is not pkg.root:
            problems.append(f"{cls.__name__} is drawn as a root")
    names = {cls.__name__ for cls in defined.values()}
    problems += [f"{n} is drawn but not defined" for n in sorted(set(drawn) - names)]
    assert not problems, "\n".join(problems)


def test_names_are_unique_within_each_package() -> None:
    """The drawing names classes by their bare name: two of one name would be ambiguous."""
    for pkg in PACKAGES:
        names = [cls.__name__ for cls in _defined(pkg.name).values()]
        assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
