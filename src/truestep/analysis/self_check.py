"""What a run said about its own resumes (train/hooks/resume_check.py, train/hooks/witness.py): the
resume self-check's events, summed up for the report's run table beside the reference-based verdict."""

from __future__ import annotations

from truestep.analysis.runlog import RunLog

SELF_CHECK_EVENTS = ("resume_verified", "resume_unverified", "resume_diverged")


def self_check_label(run: RunLog) -> str:
    """`verified N`, `unverified N` and `DIVERGED at S` parts joined; `-` when no resume judged itself."""
    found = [e for e in run.events if e.get("event") in SELF_CHECK_EVENTS]
    if not found:
        return "-"
    parts = []
    diverged = [e for e in found if e["event"] == "resume_diverged"]
    if diverged:
        steps = ", ".join(str(e.get("first_step", "?")) for e in diverged)
        parts.append(f"DIVERGED at {steps}")
    for name in ("verified", "unverified"):
        count = sum(e["event"] == f"resume_{name}" for e in found)
        if count:
            parts.append(f"{name} {count}")
    return "; ".join(parts)
