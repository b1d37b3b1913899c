"""The pure core of the client's agent loop: no gRPC, no I/O, no clock it does not get given.

    states    the run's state machine: `State`, the transition table, `Machine`, `Transition`
    tally     the run's figures (`Tally`) and the fingerprints that tell repeats apart
    stops     stop rules, one object per bound, composed in priority order by `StopRules`
    observe   what the model sees of each call: a bounded `Observation` with a hint
    errors    `LoopError` and its tree

The model proposes; this package decides what is legal, when to stop and what to say back.
A `Loop` that talks to the daemon and a model is built on top of it.
"""

from .errors import Breakage, BrokenHistory, IllegalTransition, LoopError
from .observe import Observation, Refusal, hint_for, not_run, observe
from .states import TERMINAL, TRANSITIONS, Machine, State, Transition, check_transition
from .stops import (
    Cancelled,
    Deadline,
    MaxConsecutiveErrors,
    MaxCost,
    MaxSteps,
    MaxTokens,
    NoProgress,
    Stop,
    StopRule,
    StopRules,
)
from .tally import CancelRequest, Tally, canonical_arguments, fingerprint

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "Breakage",
    "BrokenHistory",
    "CancelRequest",
    "Cancelled",
    "Deadline",
    "IllegalTransition",
    "LoopError",
    "Machine",
    "MaxConsecutiveErrors",
    "MaxCost",
    "MaxSteps",
    "MaxTokens",
    "NoProgress",
    "Observation",
    "Refusal",
    "State",
    "Stop",
    "StopRule",
    "StopRules",
    "Tally",
    "Transition",
    "canonical_arguments",
    "check_transition",
    "fingerprint",
    "hint_for",
    "not_run",
    "observe",
]
