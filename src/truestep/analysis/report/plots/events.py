"""The run events the figures mark: resumes (from a checkpoint or from peers' memory) and injected faults,
by step."""

from __future__ import annotations

from truestep.analysis.restores import restore_events
from truestep.analysis.runlog import RunLog


def resume_steps(run: RunLog) -> list[int]:
    return [int(e["step"]) for e in restore_events(run) if e.get("step") is not None]


def fault_steps(run: RunLog) -> list[tuple[int, str]]:
    return [
        (int(e["step"]), str(e.get("kind", "fault")))
        for e in run.named("fault_injected")
        if e.get("step") is not None
    ]
