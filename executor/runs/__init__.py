"""The runs room: the daemon's record of each agent loop (proto/execgate/v1/runs.proto).

`registry` holds the run rules -- who owns a run, which transitions continue its history,
when a run has ended -- and the store the Runs service and the dispatcher use. Its module
is imported directly, so `__all__` is empty.
"""

__all__: list[str] = []
