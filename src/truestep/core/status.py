"""What a rank is doing (`Phase`), why a run stopped (`StopReason`), and the small status object the
training loop writes and the heartbeat reads."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.StrEnum):
    """Reported in heartbeats; the supervisor's hang rule applies only to TRAIN."""

    LOADING = "loading"
    """Importing torch and the trainer. Loading native libraries holds the GIL, so the heartbeat thread
    may not beat for a while (1.5 s measured on a loaded 2-core machine): the supervisor allows a
    loading rank startup_timeout_s of silence instead of liveness_timeout_s."""
    STARTUP = "startup"
    """Process group, model build, data: before anything is restored."""
    RESTORE = "restore"
    """Resolving and loading a checkpoint (at start or in a NaN rollback)."""
    TRAIN = "train"
    """Taking optimizer steps."""
    CHECKPOINT = "checkpoint"
    """Saving or committing a checkpoint (slow writes are not hangs)."""
    SHUTDOWN = "shutdown"
    """Final save, logs, process-group teardown."""


class StopReason(enum.StrEnum):
    """Why the loop stopped; `exit_code_for` maps it to the process exit code."""

    COMPLETED = "completed"
    STOP_AT_STEP = "stop_at_step"
    PREEMPTED = "preempted"
    INTERRUPTED = "interrupted"


@dataclass
class RankStatus:
    """Written only by the training loop (train room); read by the heartbeat thread."""

    phase: Phase = Phase.STARTUP
    step: int = 0
    longest_step_s: float = 0.0
    """Seconds the longest step this process has completed took, batch fetch included (0 before the
    first): the supervisor's hang allowance grows with it (resilience.hang_step_multiple). The longest,
    not the last: a slow step followed by fast ones between two heartbeats must still be seen."""
