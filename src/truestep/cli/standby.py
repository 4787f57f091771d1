"""`truestep standby FD CONFIG` (internal): a node's warm template, started by `truestep launch`.

It prepares itself for CONFIG (train/warm.py) and serves the socket FD: for each rank the supervisor
hands it, it forks a process that runs exactly what a fresh rank runs, `truestep train`
(supervisor/handoff.py).
"""

from __future__ import annotations

import sys


def standby_main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[0].isdigit():
        print("usage: truestep standby FD CONFIG (started by truestep launch, not by hand)", file=sys.stderr)
        return 2
    from truestep.cli.main import main
    from truestep.supervisor.handoff import serve
    from truestep.train.warm import warm_for

    rank_argv = serve(int(argv[0]), lambda: warm_for(argv[1]))  # returns in a forked rank only
    return main(rank_argv)
