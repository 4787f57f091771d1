"""What each run's recovery path did, from its event log: every restore from disk (which checkpoint, how
long, whether the layout changed) or from peers' memory (how long, which ranks came from a buddy's copy),
the steps each lost, a memory restore that was not possible (why), every checkpoint quarantined (why) or
set aside, every fresh start and NaN rollback. A
quarantine followed by a restore of an older step is the proof that the fall-back worked, so the report
lists it in the run's own section instead of leaving it to events.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from truestep.analysis.report.blocks import Block, Para, Table
from truestep.analysis.report.format import fmt_seconds
from truestep.analysis.runlog import RunLog
from truestep.analysis.summary import RunAnalysis
from truestep.core.errors import RefusedError
from truestep.core.names import EVENTS_FILE
from truestep.telemetry.jsonl import read_jsonl


def _lost(e: dict[str, Any]) -> str:
    lost = e.get("steps_lost")
    return f"; {lost} step(s) lost" if isinstance(lost, int) and not isinstance(lost, bool) else ""


def _restore(e: dict[str, Any]) -> str:
    detail = f"from `{Path(str(e.get('path', '?'))).name}` in {fmt_seconds(e.get('restore_s'))}"
    return detail + (", layout changed" if e.get("layout_changed") else "") + _lost(e)


def _memory_restore(e: dict[str, Any]) -> str:
    moved = e.get("from_buddies")
    replaced = ", ".join(f"rank {r}" for r in moved) if isinstance(moved, list) and moved else "none"
    return (
        f"from peers' memory in {fmt_seconds(e.get('restore_s'))} (replaced from a buddy's copy: {replaced})"
        + _lost(e)
    )


WORDS = {
    "checkpoint_restore": ("restored", _restore),
    "memory_restore": ("restored from memory", _memory_restore),
    "memory_restore_skipped": ("memory not used", lambda e: f"recovering from disk: {e.get('reason', '')}"),
    "checkpoint_quarantined": ("quarantined", lambda e: str(e.get("reason", ""))),
    "checkpoint_set_aside": ("set aside", lambda e: str(e.get("reason", ""))),
    "fresh_start": ("fresh start", lambda e: str(e.get("reason", ""))),
    "fresh_start_forced": ("fresh start (forced)", lambda e: str(e.get("reason", ""))),
    "nan_rollback": ("NaN rollback", lambda e: f"after {e.get('after_consecutive')} non-finite steps"),
}
"""Event kind -> (what happened, its detail)."""


def recovery_rows(run_dir: Path, commits: dict[int, str] | None = None) -> list[list[str]]:
    """`commits`: RunLog.commit_evidence, for what a restore's row says about its checkpoint's commit."""
    rows = []
    for e in read_jsonl(run_dir / EVENTS_FILE):
        words = WORDS.get(str(e.get("event")))
        if words is None:
            continue
        step = e.get("step", e.get("to_step"))
        detail = words[1](e)
        if e.get("event") == "checkpoint_restore" and commits is not None and isinstance(step, int):
            evidence = commits.get(step)
            detail += (
                f"; committed: {evidence}"
                if evidence
                else "; NOT known to be committed (no commit event, no verified or on-disk marker)"
            )
        rows.append([str(e.get("attempt", "—")), words[0], "—" if step is None else str(step), detail])
    return rows


def recovery_blocks(run: RunAnalysis) -> list[Block]:
    try:
        rows = recovery_rows(Path(run.path), RunLog.load(run.path).commit_evidence())
    except (
        OSError,
        ValueError,
        RefusedError,
    ) as err:  # RunLogError, where checkpoints are kept  # the run's other sections still stand; say what is missing
        return [Para(f"Recovery path: the event log could not be read ({err}).")]
    if not rows:
        return [Para("Recovery path: no checkpoint was restored, quarantined or set aside.")]
    return [
        Para("Recovery path (from the run's event log):"),
        Table(["attempt", "what", "step", "detail"], rows),
    ]
