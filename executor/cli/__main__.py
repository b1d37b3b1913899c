"""`python -m execgate.executor.cli`: the `execgate` command without its console script."""

from .main import main

raise SystemExit(main(own_process=True))
