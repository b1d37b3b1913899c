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
)
from .process import ProgramNotFound

__all__ = [
    "MARKER_ENV",
    "Captured",
    "Confinement",
    "Exit",
    "Launch",
    "Probe",
    "ProgramNotFound",
    "Running",
    "Sandbox",
    "SandboxError",
]
