"""The core room: what every other room shares and nothing else depends on.

The typed outcomes and their closed sets (`outcomes`), the exception tree of the whole
daemon (`errors`), the clock timelines read, the workspace boundary and the descriptor-based
path opening beneath it (`paths`, `beneath`), numeric setting ranges, regex bounds, YAML with
positions, the approval and run records, and the bounded fan-out behind watch streams. It
imports no other room. Its modules are imported directly (`from execgate.executor.core.errors
import ToolError`), so that importing one never loads the rest: `__all__` is empty.
"""

__all__: list[str] = []
