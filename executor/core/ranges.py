"""The allowed range of every numeric setting: daemon flags, `limits:` and sandbox limits.

Every number an operator sets is checked once, where it enters (the command line
at startup, the policy file at load and at each reload), against a finite range:
NaN, infinities, booleans, strings, zero or negative values where they make no
sense, and values so large that they stop meaning anything (a grace of 1e308
never force-kills; a process limit of 2^40 makes every command fail to start)
are refused with a `SettingError` that names the setting and the range.

Process-count, open-file, memory, file-size and CPU limits are also bounded by
this host's hard rlimits (the ceiling a command could be given at all); where the
hard limit is unlimited, by a fixed ceiling.
"""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


class SettingError(ConfigError):
    """A numeric setting outside its range (or not a number)."""

    def __init__(self, setting: str, value: object, allowed: str) -> None:
        super().__init__(f"{setting}: must be {allowed}, not {value!r}")
        self.setting = setting
        self.value = value
        self.allowed = allowed


@dataclass(frozen=True, slots=True, kw_only=True)
class Range:
    """A closed range [low, high], or (low, high] when `positive` (low is then 0)."""

    low: float = 0
    high: float
    # Only integers (booleans never count as numbers).
    integer: bool = False
    # 0 itself is refused: the range is (0, high].
    positive: bool = False
    unit: str = ""

    def describe(self) -> str:
        word = "integer" if self.integer else "number"
        unit = f" ({self.unit})" if self.unit else ""
        if self.positive:
            return f"a positive {word}, at most {_fmt(self.high)}{unit}"
        article = "an" if self.integer else "a"
        return f"{article} {word} from {_fmt(self.low)} to {_fmt(self.high)}{unit}"

    def check(self, setting: str, value: object) -> float:
        """`value` as a number if it is in range; SettingError naming `setting` if not."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SettingError(setting, value, self.describe())
        if self.integer and not isinstance(value, int):
            raise SettingError(setting, value, self.describe())
        if not math.isfinite(value) or value > self.high:
            raise SettingError(setting, value, self.describe())
        if value < self.low or (self.positive and value <= 0):
            raise SettingError(setting, value, self.describe())
        return value

    def check_int(self, setting: str, value: object) -> int:
        return int(self.check(setting, value))


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# ---------------------------------------------------------------- call limits (seconds, bytes)

GRACE = Range(high=600, positive=True, unit="seconds")
TIMEOUT = Range(high=86400, positive=True, unit="seconds")
# A result cap under 1 KiB makes nearly every result PARTIAL.
OUTPUT_CAP = Range(low=KIB, high=64 * MIB, integer=True, unit="bytes")
RAW_CAP = Range(low=KIB, high=256 * MIB, integer=True, unit="bytes")
FILE_CAP = Range(low=KIB, high=GIB, integer=True, unit="bytes")
ARGUMENTS = Range(low=KIB, high=64 * MIB, integer=True, unit="bytes")
# The policy's `limits:` in its own units.
OUTPUT_CAP_KB = Range(low=1, high=64 * KIB, unit="KiB")
FILE_CAP_KB = Range(low=1, high=MIB, unit="KiB")
# The tools file's `max_message_kb` of an MCP server: one JSON-RPC message, 1 KiB - 1 GiB.
MCP_MESSAGE_KB = Range(low=1, high=MIB, integer=True, unit="KiB")


# ---------------------------------------------------------------- sandbox limits (rlimits)

# Where the host's hard limit is unlimited.
_FALLBACK_CEILING = {
    "cpu_seconds": 7 * 86400,
    "memory_bytes": 16 << 40,
    "file_size_bytes": 16 << 40,
}
RLIMITS = {
    "cpu_seconds": resource.RLIMIT_CPU,
    "memory_bytes": resource.RLIMIT_AS,
    "file_size_bytes": resource.RLIMIT_FSIZE,
    "open_files": resource.RLIMIT_NOFILE,
    "processes": resource.RLIMIT_NPROC,
}
# Below these a shell cannot even start the command.
_FLOOR = {
    "cpu_seconds": 1,
    "memory_bytes": 16 * MIB,
    "file_size_bytes": MIB,
    "open_files": 8,
    "processes": 1,
}


def ceiling(field: str) -> int:
    """The largest value `field` of a Confinement may have on this host."""
    hard = resource.getrlimit(RLIMITS[field])[1]
    if hard != resource.RLIM_INFINITY:
        return int(hard)
    if field == "processes":
        return _pid_max()
    if field == "open_files":
        return _nr_open()
    return _FALLBACK_CEILING[field]


def confinement_range(field: str, unit: int = 1) -> Range:
    """The range of a Confinement field, in units of `unit` (MiB for memory_mb, say)."""
    names = {1: "", MIB: "MiB"}
    return Range(
        low=-(-_FLOOR[field] // unit),
        high=ceiling(field) // unit,
        integer=True,
        unit=names.get(unit, ""),
    )


def _pid_max() -> int:
    return _read_int(Path("/proc/sys/kernel/pid_max"), 4 << 20)


def _nr_open() -> int:
    return _read_int(Path("/proc/sys/fs/nr_open"), 1 << 20)


def _read_int(path: Path, default: int) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default
