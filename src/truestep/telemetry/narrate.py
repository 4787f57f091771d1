"""What the console says during a recovery: one line on stderr per event an operator must know of.

The event log (events.jsonl) is the record; this is its spoken summary. Each writer of events narrates
its own: rank 0 (telemetry/run_logs.py) the preemption, Ctrl-C, the saves that stop makes, a resume
(which checkpoint, verified how, in how long), a quarantine and the fall-back past it, being back at
work after a restart; the supervisor (supervisor/restart_loop.py) a failure detected (kind, rank, after
how long), the restart (warm or cold) and the exit code it ends with. The two sets of event kinds do
not overlap, so nothing is said twice.

`LINES` maps an event kind to the function that words it (None: nothing to say for this record). The
narrator keeps the little state a line needs from earlier events (a stop pending, a quarantine before
the restore it explains, when the attempt started). Lines go through `tqdm.write` so a progress bar on
the same stream is redrawn below them instead of being torn.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from truestep.telemetry.jsonl import JsonlWriter

INTERRUPT_EXIT = 130
"""ExitCode.INTERRUPTED (core/errors.py), repeated here because telemetry sits below core's users."""


@dataclass
class Narrator:
    """Words events for one writer. `who` prefixes every line ("truestep train", "truestep launch")."""

    who: str
    out: TextIO | None = None
    """Where lines go; None: sys.stderr at the time of writing (so tests capturing stderr see them)."""
    says_exit: bool = True
    """Rank 0 says how the process ends only when no supervisor does (the supervisor owns the exit code)."""
    requeue_code: int = 75
    failure_time: Callable[[], float | None] = lambda: None
    """When the failure that led to this attempt was detected (None: unknown): for the back-at-work line."""
    enabled: bool = True
    stop_step: int | None = None
    quarantined: list[str] = field(default_factory=list)
    verified: dict[str, Any] | None = None
    restored_at: float | None = None
    attempt_started: float | None = None
    restarting: int = 0
    restart_reason: str = ""
    handoffs: int = 0
    handoffs_importing: int = 0
    """Of `handoffs`, ranks handed to a template still importing (no faster than a cold start)."""
    committed: set[int] = field(default_factory=set)
    """Steps whose checkpoint this writer saw committed (checkpoint_commit)."""
    banner: bool = True
    """Say the start banner (metrics.banner)."""
    weights_from: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None

    def tell(self, record: dict[str, Any]) -> str | None:
        """Say the record's line, if its kind has one; returns what was said."""
        if not self.enabled:
            return None
        words = LINES.get(str(record.get("event")))
        line = words(self, record) if words is not None else None
        if line is not None:
            # The newline in the same write: another process's line cannot land inside this one.
            tqdm.write(f"{self.who}: {line}\n", file=self.out or sys.stderr, end="")
            (self.out or sys.stderr).flush()
        return line

    def metrics(self, record: dict[str, Any]) -> str | None:
        """The first step after a restore: say the run is back at work, and how long that took."""
        if not self.enabled or self.restored_at is None:
            return None
        restored_at, self.restored_at = self.restored_at, None
        failed = self.failure_time()
        now = float(record.get("time", restored_at))
        since = f"{now - failed:.1f} s after the failure was detected" if failed is not None else None
        since = since or f"{now - restored_at:.1f} s after the restore"
        line = f"back at work: step {record.get('step')} done, {since}"
        tqdm.write(f"{self.who}: {line}\n", file=self.out or sys.stderr, end="")
        return line


# --- rank 0 ------------------------------------------------------------------------------------------


def _signal_received(n: Narrator, r: dict[str, Any]) -> str | None:
    if r.get("during_startup"):
        return None  # the rank stops before its first step; its one line says so (startup_stop.py)
    n.stop_step = r.get("stop_step")
    reason, signal = r.get("stop_reason"), r.get("signal")
    if reason == "preempted":
        return f"preempted ({signal}) at step {n.stop_step}: saving a checkpoint, then exit {n.requeue_code}"
    if reason == "interrupted":
        return (
            f"interrupted ({signal}) at step {n.stop_step}: saving a checkpoint, then exit {INTERRUPT_EXIT}"
        )
    return None


def _saved(n: Narrator, r: dict[str, Any]) -> str | None:
    step = r.get("step")
    if isinstance(step, int):
        n.committed.add(step)
    if n.stop_step is None or not isinstance(step, int) or step < n.stop_step:
        return None  # an interval save: the progress bar is enough
    return f"saved step {step} (committed and verifiable)"


def _already_saved(n: Narrator, r: dict[str, Any]) -> str | None:
    """The stop's save of a step already being saved is skipped: "already saved" only once that save is
    committed; before, the commit line follows ("saved step N") and this line says it is coming."""
    step = r.get("step")
    if n.stop_step is None or step != n.stop_step:
        return None
    if step in n.committed:
        return f"step {step} was already saved (committed and verifiable)"
    return f"step {step} is being saved already (an interval save): waiting for its commit"


def _run_end(n: Narrator, r: dict[str, Any]) -> str | None:
    if not n.says_exit:
        return None
    step, reason = r.get("step"), r.get("reason")
    if reason == "preempted":
        return (
            f"exit {n.requeue_code} (requeue me): preempted at step {step}, saved; requeue the job or run the "
            "same command again to resume from it"
        )
    if reason == "interrupted":
        return (
            f"exit {INTERRUPT_EXIT}: interrupted at step {step}, saved; run the same command again to resume"
        )
    return None


def _quarantined(n: Narrator, r: dict[str, Any]) -> str:
    n.quarantined.append(str(r.get("step")))
    return f"quarantined checkpoint step {r.get('step')} ({r.get('reason')}); moved to {r.get('moved_to')}"


def _verified(n: Narrator, r: dict[str, Any]) -> None:
    n.verified = r
    return None


def _restore(n: Narrator, r: dict[str, Any]) -> str:
    n.restored_at = float(r.get("time", 0.0))
    verified = n.verified or {}
    if not verified.get("checksums"):
        how = "commit marker and manifest, no checksums"
    elif verified.get("shard_bytes") == "hashed while loading":  # issue 20: each rank hashes what it loads
        how = "commit marker and manifest; every shard item's SHA-256 as it loads,"
    else:
        how = "SHA-256 of every file"
    verify_s = verified.get("verify_s")
    checked = f"verified by {how} in {verify_s:.1f} s" if isinstance(verify_s, float) else "not verified"
    past = f"; fell back past quarantined step {', '.join(n.quarantined)}" if n.quarantined else ""
    n.quarantined, n.verified = [], None
    restore_s = r.get("restore_s", 0.0)
    return (
        f"resuming from step {r.get('step')} ({r.get('path')}; {checked}; loaded in {restore_s:.1f} s){past}"
    )


def _memory_restore(n: Narrator, r: dict[str, Any]) -> str:
    n.restored_at = float(r.get("time", 0.0))
    buddies = r.get("from_buddies") or []
    sources = r.get("sources") or {}
    who = ", ".join(f"rank {b} from rank {sources.get(str(b))}'s copy" for b in buddies) or "none"
    lost = r.get("steps_lost")
    lost_words = f"; {lost} step(s) lost" if isinstance(lost, int) else ""
    return (
        f"restored step {r.get('step')} from memory (replaced ranks: {who}; the others their own; every "
        f"copy's SHA-256 and the model's digest checked) in {r.get('restore_s', 0.0):.1f} s{lost_words}"
    )


def _memory_lost(n: Narrator, r: dict[str, Any]) -> str:
    ranks = ", ".join(map(str, r.get("ranks", [])))
    return f"the snapshot memory of rank(s) {ranks} is lost with them: a buddy's copy (or the disk) restores them"


def _init_from(n: Narrator, r: dict[str, Any]) -> None:
    n.weights_from = r  # said in the start banner
    return None


def _count(value: Any) -> str:
    if not isinstance(value, int | float):
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= size:
            return f"{value / size:.2f}{unit}"
    return str(value)


def _run_start(n: Narrator, r: dict[str, Any]) -> str | None:
    """The start banner: what trains, where, on what, from where (three lines under one prefix)."""
    if not n.banner:
        return None
    keys, layout = r.get("trajectory_keys") or {}, r.get("layout") or {}
    start, total = r.get("start_step", 0), r.get("max_steps")
    where = "from step 0" if not start else f"resumed at step {start}"
    model = (
        f"{_count(r.get('parameters'))} parameters (dim {keys.get('model.dim')}, {keys.get('model.n_layers')} "
        f"layers, vocab {keys.get('model.vocab_size')})"
    )
    precision = r.get("compute_dtype", "float32")
    backend = layout.get("backend")
    group = f" ({backend})" if backend not in (None, "none") else " (one process, no process group)"
    place = (
        f"{layout.get('world_size')} rank(s) = dp {layout.get('dp')} x tp {layout.get('tp')} on "
        f"{r.get('device')}{group}, {precision}, activation checkpointing "
        f"{r.get('activation_checkpointing', 'none')}"
    )
    gbs, seq = keys.get("train.global_batch_size"), keys.get("data.seq_len")
    tokens = gbs * seq if isinstance(gbs, int) and isinstance(seq, int) else "?"
    data = f"data {r.get('data') or '?'}: {gbs} x {seq} = {tokens} tokens per step"
    if start:
        weights = "weights from the checkpoint it resumed"
    elif n.weights_from is not None:
        w = n.weights_from
        checked = "SHA-256 verified" if w.get("checksums") else "not checksummed"
        weights = f"weights from init_from {w.get('path')} (loaded, {w.get('tensors')} tensors, {checked})"
    else:
        weights = "weights initialized from train.seed (no init_from)"
    banner = f"training {r.get('name') or 'run'} {where} of {total}: {model}\n  {place}\n  {data}; {weights}"
    return banner + (f"\n  {memory_line(n.memory)}" if n.memory is not None else "")


def _memory_estimate(n: Narrator, r: dict[str, Any]) -> None:
    n.memory = r  # said in the start banner: a refusal before it (a bad checkpoint) stays one line
    return None


def memory_line(r: dict[str, Any]) -> str:
    """The estimate's line (parallel/memory.py terms, in GiB)."""

    def g(key: str) -> str:
        value = r.get(key)
        return f"{value / 2**30:.2f} GiB" if isinstance(value, int | float) else "?"

    available = r.get("available_bytes")
    fits = "" if available is None else f"; {g('host_need_bytes')} of {g('available_bytes')} available"
    return (
        f"memory estimate {g('peak_bytes')} per rank (parameters {g('parameters_bytes')}, gradients "
        f"{g('gradients_bytes')}, optimizer state {g('optimizer_state_bytes')}, activations "
        f"{g('activations_bytes')}, runtime {g('runtime_bytes')}){fits}"
    )


def _eval(n: Narrator, r: dict[str, Any]) -> str:
    return (
        f"eval at step {r.get('step')}: loss {r.get('loss', float('nan')):.4f}, perplexity "
        f"{r.get('perplexity', float('nan')):.2f} ({r.get('tokens')} tokens of {r.get('path')}, "
        f"{r.get('eval_s', 0.0):.1f} s)"
    )


def _deadline_beyond_lead(n: Narrator, r: dict[str, Any]) -> str:
    return (
        f"warning: a graceful stop may now take up to {r.get('deadline_s', 0.0):.0f} s ({r.get('rule')}), more "
        f"than resilience.scheduler_lead_time_s={r.get('scheduler_lead_time_s')}: a preemption would be killed "
        "mid-save; ask the scheduler for an earlier warning (SLURM --signal=TERM@N) and raise "
        "resilience.scheduler_lead_time_s to match"
    )


def _nan_rollback(n: Narrator, r: dict[str, Any]) -> str:
    return f"rolled back to step {r.get('to_step')} after {r.get('after_consecutive')} non-finite steps"


# --- the supervisor ----------------------------------------------------------------------------------


def _attempt_start(n: Narrator, r: dict[str, Any]) -> str | None:
    n.attempt_started = float(r.get("time", 0.0))
    handed, importing, restart, reason = n.handoffs, n.handoffs_importing, n.restarting, n.restart_reason
    if not restart:
        return None
    n.restarting = n.handoffs = n.handoffs_importing = 0
    ready = handed - importing
    if not handed:
        how = "cold: fresh processes"
    elif not importing:
        how = f"warm: {ready} rank(s) forked from the ready template"
    elif not ready:
        how = f"{importing} rank(s) forked from a template still importing: no faster than a cold start"
    else:
        how = (
            f"warm: {ready} rank(s) forked from the ready template, {importing} while it was still importing"
        )
    after = f" after {reason}" if reason else ""
    return f"restarting as attempt {r.get('attempt')} (restart {restart}{after}; {how})"


def _handoff(n: Narrator, r: dict[str, Any]) -> None:
    n.handoffs += 1
    n.handoffs_importing += 0 if r.get("ready") else 1
    return None


def _restart(n: Narrator, r: dict[str, Any]) -> None:
    n.restarting, n.handoffs, n.handoffs_importing = int(r.get("restart", 1)), 0, 0
    n.restart_reason = str(r.get("reason") or "")
    return None


def _failure_detected(n: Narrator, r: dict[str, Any]) -> str:
    detected = r.get("detected_at", r.get("time"))
    after = ""
    if n.attempt_started is not None and isinstance(detected, int | float):
        after = f" after {detected - n.attempt_started:.1f} s of attempt {r.get('attempt')}"
    rank = r.get("rank")
    where = f" on rank {rank}" if rank is not None else ""
    return f"failure detected: {r.get('kind')}{where}{after} ({r.get('detail')})"


def _supervisor_end(n: Narrator, r: dict[str, Any]) -> str | None:
    outcome, code, restarts = r.get("outcome"), r.get("exit_code"), r.get("restarts", 0)
    if outcome == "requeue" and r.get("after_failure"):
        return (
            f"exit {code} (requeue me): preempted, but a rank failed while the job stopped ({r['after_failure']}), "
            "so its checkpoint may not be saved; requeue the job or run the same command again: it resumes "
            "from the newest verified checkpoint"
        )
    if outcome == "requeue":
        return f"exit {code} (requeue me): preempted, checkpoint saved; requeue the job or run the same command again"
    if outcome == "interrupted":
        return f"exit {code}: interrupted, checkpoint saved; run the same command again to resume"
    if outcome == "gave_up":
        return f"exit {code}: gave up after {restarts} restart(s) (resilience.max_restarts)"
    if outcome == "completed" and restarts:
        return f"finished after {restarts} restart(s)"
    return None


LINES: dict[str, Callable[[Narrator, dict[str, Any]], str | None]] = {
    "signal_received": _signal_received,
    "checkpoint_commit": _saved,
    "checkpoint_skipped": _already_saved,
    "run_end": _run_end,
    "checkpoint_quarantined": _quarantined,
    "checkpoint_verified": _verified,
    "checkpoint_restore": _restore,
    "memory_restore": _memory_restore,
    "memory_lost": _memory_lost,
    "nan_rollback": _nan_rollback,
    "memory_estimate": _memory_estimate,
    "init_from": _init_from,
    "run_start": _run_start,
    "eval": _eval,
    "exit_deadline_beyond_lead_time": _deadline_beyond_lead,
    "attempt_start": _attempt_start,
    "standby_handoff": _handoff,
    "restart": _restart,
    "failure_detected": _failure_detected,
    "supervisor_end": _supervisor_end,
}
"""Event kind -> its line. Kinds written by rank 0 and by the supervisor do not overlap."""


class NarratedWriter(JsonlWriter):
    """An event log whose records are also narrated (the supervisor's: it and its standby pool write
    through one writer)."""

    def __init__(self, path: Path, static: dict[str, Any] | None, narrator: Narrator) -> None:
        super().__init__(path, static)
        self.narrator = narrator

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        line = super().write(record)
        self.narrator.tell(line)
        return line
