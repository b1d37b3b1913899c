"""The cli room: the `execgate` command line, for operators, policy authors and developers.

`main` builds the parser and registers every subcommand, importing only the module of the
command being run, so `execgate --help` stays fast (`options` is what every parser shares,
importing nothing heavy). `serve` is the only command that imports the daemon's server;
the others talk to a daemon through `execgate.client`, or read local files (`policy check`).
Nothing imports this room, so `__all__` is empty.
"""

__all__: list[str] = []
