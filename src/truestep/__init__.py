"""truestep: a PyTorch-native trainer whose promise is correct recovery."""

import time

__version__ = "0.1.0"
STARTED_AT = time.time()
"""Wall-clock time this process imported truestep (before torch): start-up is measured from here. A rank
forked by the warm template resets it at the fork (supervisor/handoff.py): its life as a rank starts there."""
HANDED_OVER_AT: float | None = None
"""Wall-clock time the supervisor handed this process's rank to the warm template that forked it (None: a
fresh process). A template still importing when handed a rank forks it only once its imports are done,
so STARTED_AT is then later than the handoff: the rank's life began at the handoff (run_start.handoff_at),
and the wait in between is its start-up, not the job waiting to be relaunched."""
