"""Learning rate as a pure function of the step: nothing to checkpoint but the step itself."""

from __future__ import annotations

import math

from truestep.config.schema import JobConfig


def lr_at(step: int, cfg: JobConfig) -> float:
    """Learning rate for optimizer step `step` (0-based) under warmup + cosine/constant/wsd."""
    peak = cfg.optim.lr
    sched = cfg.schedule
    total = cfg.train.max_steps
    if sched.warmup_steps and step < sched.warmup_steps:
        return peak * (step + 1) / sched.warmup_steps
    floor = peak * sched.min_lr_ratio
    if sched.kind == "constant":
        return peak
    if sched.kind == "cosine":
        span = max(1, total - sched.warmup_steps - 1)  # the last step (total-1) lands on the floor
        progress = min(1.0, (step - sched.warmup_steps) / span)
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    # wsd: hold the peak, then decay linearly to the floor over the last decay_steps.
    decay = sched.decay_steps_for(total)
    decay_start = total - decay
    if step < decay_start:
        return peak
    progress = min(1.0, (step - decay_start + 1) / decay)
    return peak + (floor - peak) * progress
