"""Everything the instrument reports about one run, as plain JSON-able dicts."""

from __future__ import annotations

from typing import Any

from truestep.analysis.fidelity import DEFAULT_MARGIN, Floor, compare, first_violation
from truestep.analysis.goodput import checkpoint_overhead, goodput
from truestep.analysis.mttr import incidents
from truestep.analysis.runlog import RunLog

EXACT_FLOOR = Floor(0.0, 0.0, True)


def analyze(
    run: RunLog, ref: RunLog | None, base: Floor | None, margin: float = DEFAULT_MARGIN
) -> dict[str, Any]:
    """Fidelity (if a reference is given), goodput, MTTR and checkpoint overhead of one run.

    Without a measured floor the threshold is exact equality (the CPU expectation), and the summary says
    so in `floor_source`.
    """
    out: dict[str, Any] = {"path": str(run.path), "faults": [e["spec"] for e in run.named("fault_injected")]}
    violation = None
    if ref is not None:
        floor_used = base or EXACT_FLOOR
        fid = compare(run, ref)
        violation = first_violation(run, ref, floor_used, margin)
        out["fidelity"] = fid.to_dict()
        out["first_violation_step"] = violation
        out["preserving"] = violation is None
        out["floor_source"] = "measured" if base is not None else "assumed-exact"
    out["goodput"] = goodput(run, violation).to_dict()
    out["mttr"] = [i.to_dict() for i in incidents(run)]
    out["checkpoint"] = checkpoint_overhead(run)
    out["restarts"] = len(run.named("checkpoint_restore"))
    return out
