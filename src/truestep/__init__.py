"""truestep: a PyTorch-native trainer whose promise is correct recovery."""

import time

__version__ = "0.1.0"
STARTED_AT = time.time()
"""Wall-clock time this process imported truestep (before torch): start-up is measured from here. A warm
standby resets it when it is handed its rank (resilience/handoff.py): its life as a rank starts there."""
