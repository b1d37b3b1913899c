"""The execgate daemon (`execgate serve`) and the `execgate` command line.

The daemon is a house of rooms, one sub-package each, whose imports only go down:
`cli` -> `server` -> `pipeline` -> `tools` -> `sandbox` -> `policy`, `runs` -> `locks`,
`telemetry`, `journal` -> `core` (docs/architecture.md says what each room is for). This
package itself exports nothing: import from the rooms, whose `__all__` say what they offer.
"""

__all__: list[str] = []
