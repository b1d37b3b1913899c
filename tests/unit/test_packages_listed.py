"""Every Python package of the repository is in the distribution's package list
(pyproject's [tool.setuptools] packages): an editable install finds a package that is
missing there, a wheel (the Docker image, pip install) does not."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"executor": "execgate.executor", "client": "execgate.client"}


def test_every_package_folder_is_listed() -> None:
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for folder, name in ROOTS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / folder).parts
            if "node_modules" in parts or "typescript" in parts:
                continue
            found.add(".".join((name, *parts)))
    assert found - listed == set()
