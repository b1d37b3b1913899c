"""Where a process-based tool runs: `process`, `bwrap` or `docker` (see base.py)."""

from __future__ import annotations

from .base import (
    MARKER_ENV,
    Captured,
    Confinement,
    Exit,
    Launch,
    Probe,
    Running,
    Sandbox,
    SandboxError,
    Serving,
)
from .process import ProgramNotExecutable, ProgramNotFound

__all__ = [
    "MARKER_ENV",
    "Captured",
    "Confinement",
    "Exit",
    "Launch",
    "Probe",
    "ProgramNotExecutable",
    "ProgramNotFound",
    "Running",
    "Sandbox",
    "SandboxError",
    "Serving",
]
