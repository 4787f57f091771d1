"""Small runs just work: a preset's warm-up (and wsd decay) shrinks to fit a short `train.max_steps`.

`truestep train tiny --train.max_steps=3` is the first thing people try; the preset's 5 warm-up steps
do not fit, and refusing that is unhelpful: the preset chose the warm-up for its own length, not the
user's. So a warm-up (or a wsd decay length) that came from a preset, a config file or the defaults is
fitted to the run, and the change is said in one note. A value the user set on the command line is
theirs: it is never changed, and validation refuses it with the fix (config/validate.py).

The fit: the wsd decay keeps its default share (20% of max_steps, at least 1); the warm-up takes at most
half of the steps left, so a short run still spends half its steps at (or decaying from) the peak.
"""

from __future__ import annotations

from truestep.config.schema import JobConfig


def overridden_keys(overrides: list[str]) -> set[str]:
    """The `section.key` names set on the command line."""
    return {raw.removeprefix("--").split("=", 1)[0] for raw in overrides}


def fit_schedule(cfg: JobConfig, explicit: set[str]) -> str | None:
    """Shrink warm-up / wsd decay that do not fit train.max_steps (unless set in `explicit`); return
    the note that says what changed, or None when nothing did."""
    s, total = cfg.schedule, cfg.train.max_steps
    if total < 1 or "schedule.warmup_steps" in explicit:
        return None
    decay = s.decay_steps_for(total) if s.kind == "wsd" else 0
    if s.warmup_steps + decay <= total:
        return None
    changed = []
    if s.kind == "wsd" and decay > total and "schedule.decay_steps" not in explicit:
        changed.append(f"schedule.decay_steps {s.decay_steps} -> 0 (20% of the run)")
        s.decay_steps = 0
        decay = s.decay_steps_for(total)
    if decay > total:
        return None  # an explicit decay that cannot fit: validation says so
    warmup = (total - decay) // 2
    changed.append(f"schedule.warmup_steps {s.warmup_steps} -> {warmup}")
    s.warmup_steps = warmup
    return (
        f"note: train.max_steps={total} is shorter than the schedule's warm-up; fitted: "
        + ", ".join(changed)
        + " (set --schedule.warmup_steps to choose)"
    )
