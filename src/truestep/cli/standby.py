"""`truestep standby FD CONFIG` (internal): a warm standby rank started by `truestep launch`.

It prepares itself for CONFIG (train/warm.py), parks on the socket FD until the supervisor hands it a
rank (supervisor/handoff.py), then runs exactly what a fresh rank runs: `truestep train ...`.
"""

from __future__ import annotations

import sys


def standby_main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[0].isdigit():
        print("usage: truestep standby FD CONFIG (started by truestep launch, not by hand)", file=sys.stderr)
        return 2
    from truestep.cli.main import main
    from truestep.supervisor.handoff import park
    from truestep.train.warm import warm_for

    rank_argv = park(int(argv[0]), lambda: warm_for(argv[1]))
    return main(rank_argv)
