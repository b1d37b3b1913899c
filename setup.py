"""Build hook: generate `execgate.v1` from proto/ before setuptools looks at packages.

Generated code lives in gen/ (git-ignored). It is produced whenever setuptools
loads this file -- `pip install .`, `pip install -e .`, building a wheel -- so it
can never drift from the .proto files or be edited by hand. It runs before
`setup()` because setuptools checks that every package directory exists while
it reads the configuration, before any build command runs.
"""

from __future__ import annotations

import pathlib

from setuptools import setup

ROOT = pathlib.Path(__file__).parent.resolve()
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "gen"


def generate_protos() -> None:
    from grpc_tools import protoc  # build-time dependency (pyproject build-system)

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    package_dir = OUT_ROOT / "execgate" / "v1"
    package_dir.mkdir(parents=True, exist_ok=True)
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={OUT_ROOT}",
        f"--pyi_out={OUT_ROOT}",
        f"--grpc_python_out={OUT_ROOT}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed for " + " ".join(protos))
    (package_dir / "__init__.py").write_text('"""Generated from proto/execgate/v1. Do not edit."""\n')


generate_protos()
setup()
