"""Budgets of the security corpus: bounded in `make test`, long under `make fuzz`.

`make fuzz` sets EXECGATE_FUZZ=1: every fuzzer here runs 100 times the examples and
every race test 10 times the rounds. Use `fuzzing()` as a decorator on a
hypothesis test and `race_rounds()` for the number of calls a race test makes.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

FUZZ = os.environ.get("EXECGATE_FUZZ") == "1"


def fuzzing(examples: int = 200) -> Any:
    """Hypothesis settings for a fuzzer: `examples` in `make test`, 100x under `make fuzz`."""
    return settings(
        max_examples=examples * 100 if FUZZ else examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def race_rounds(default: int) -> int:
    """How many calls a race test makes under the swapping loop (10x under `make fuzz`)."""
    return default * 10 if FUZZ else default
