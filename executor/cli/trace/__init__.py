"""`execgate trace`: a run's calls on one time axis, as text, JSON or one HTML page.

`command` is the subcommand; `timeline` and `rows` cut each call's marks into segments,
`text` and `html` render them. Imported by module (the cli registers `command`), so
`__all__` is empty.
"""

__all__: list[str] = []
