"""A foreign job's record (job.py) written as a truestep run directory, so the analysis room judges it
like any run: metrics.jsonl (one line per logged step: step, loss, grad_norm, lr where logged,
tokens_seen, wall-clock time, step_time, attempt) and events.jsonl (each attempt's start, the faults,
failure detection and teardown, the resume as seen in the logs, the run's end with the weights digest,
and every piece of evidence the audit knows is missing, as evidence_gap).

What a black box does not say is inferred from its logs and said to be: a resume is a checkpoint_restore
with `inferred: true` at the step before the first step the restarted command logged, with restore_s 0
(its start-up and restore cannot be told apart; both count as start-up); a step's time is when the
trainer logged it (TensorBoard's wall time, a JSON line's `time`) or else when the audit first read it.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path
from statistics import median
from typing import Any

import truestep
from truestep.analysis.runlog import DIGEST_LOGGED, EVIDENCE_GAP, PRECISION
from truestep.audit.job import Attempt, JobRecord, Seen
from truestep.audit.spec import OBSERVABLES, REQUIRED
from truestep.config.fingerprint import fingerprint
from truestep.core.fsio import atomic_write
from truestep.core.names import EVENTS_FILE, METRICS_FILE

LAYOUT = "black box"
MAX_DECIMALS = 6
MIN_ROUNDED = 4
"""Distinct values needed before a rounding is inferred from them."""


def trajectory_keys(command: list[str], logs: str) -> dict[str, Any]:
    """What makes two runs of an audit the same job: the command as given (before {run_dir}) and where
    its logs are. The environment is the audit's own and is not compared."""
    return {"command": list(command), "logs": logs}


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0] if math.isfinite(x) and abs(x) < 3e38 else x


def _rounded_to(values: list[float], decimals: int) -> bool:
    return all(v == round(v, decimals) or v == _f32(round(v, decimals)) for v in values)


def logged_precision(records: list[Seen]) -> dict[str, float]:
    """Observable -> 10^-d where every logged value is a number of d <= 6 decimals (as stored: a
    TensorBoard float32 of it counts), judged from at least MIN_ROUNDED distinct finite values: the
    trainer rounded it before logging (Hugging Face Trainer 4.x logged the loss at 4 decimals)."""
    found = {}
    for name in OBSERVABLES:
        values = sorted({v for s in records for k, v in s.record.values if k == name and math.isfinite(v)})
        if len(values) < MIN_ROUNDED:
            continue
        decimals = next((d for d in range(MAX_DECIMALS + 1) if _rounded_to(values, d)), None)
        if decimals is not None:
            found[name] = 10.0**-decimals
    return found


def _when(seen: Seen, attempt: Attempt) -> float:
    """The trainer's own time of a record when it lies within the attempt, else when it was read."""
    t, end = seen.record.time, attempt.exited or seen.seen
    return t if t is not None and attempt.started - 1.0 <= t <= end + 1.0 else seen.seen


def _completed(records: list[Seen]) -> list[Seen]:
    """A poll can read a step while the trainer is still writing it (loss flushed, lr not yet): that read
    is superseded by the fuller record of the same step a later poll finds, which holds every value it
    held. A step logged again with other values stays: the attempt logged it twice."""
    by_step: dict[int, list[Seen]] = {}
    for seen in records:
        values = set(seen.record.values)
        same = by_step.setdefault(seen.record.step, [])
        same[:] = [k for k in same if not set(k.record.values) < values] + [seen]
    return [seen for same in by_step.values() for seen in same]


def _lines(attempt: Attempt, tokens_per_step: int) -> tuple[list[dict[str, Any]], list[int]]:
    usable, incomplete = [], []
    for seen in _completed(attempt.records):
        observed = seen.record.observed
        if all(k in observed for k in REQUIRED):
            usable.append((_when(seen, attempt), seen.record.step, observed))
        else:
            incomplete.append(seen.record.step)  # never logged whole by this attempt
    usable.sort(key=lambda x: x[0])
    gaps = [b[0] - a[0] for a, b in zip(usable, usable[1:], strict=False)]
    lines = []
    for index, (t, step, observed) in enumerate(usable):
        # The first step of an attempt: as long as the attempt's others, never before the attempt began.
        first = min(median(gaps) if gaps else math.inf, t - attempt.started)
        step_time = gaps[index - 1] if index else first
        lines.append(
            {
                "step": step,
                **observed,
                "tokens_seen": step * tokens_per_step,
                "time": t,
                "step_time": max(0.0, step_time),
                "attempt": attempt.number,
            }
        )
    return lines, incomplete


def _gap(what: str, detail: str, t: float, steps: list[int] | None = None) -> dict[str, Any]:
    return {
        "event": EVIDENCE_GAP,
        "time": t,
        "what": what,
        "detail": detail,
        "steps": sorted(set(steps or [])),
    }


def _restart_events(
    attempt: Attempt, lines: list[dict[str, Any]], first_ever: int | None
) -> list[dict[str, Any]]:
    """The resume seen in a restarted attempt's logs: its first step comes after the job's first step.
    A restart that logged its first step again (it started over) or logged no step did not resume; that
    is the scenario rule's to say (analysis/scenario.py reads each attempt's run_start `start_step`), so
    one cause is one gap."""
    if not attempt.number or not lines:
        return []
    first = lines[0]
    if first_ever is not None and first["step"] <= first_ever:
        return []
    return [
        {
            "event": "checkpoint_restore",
            "time": first["time"] - first["step_time"],
            "attempt": attempt.number,
            "step": first["step"] - 1,
            "restore_s": 0.0,
            "inferred": True,
            "source": "audit",
        }
    ]


NAMED_FILES = "in source_sha256 (the files the command names)"
NOT_SEEN = "not seen by the audit (the audited trainer's own)"


def provenance(attempt: Attempt) -> dict[str, str]:
    """The run_start `provenance` of an audited attempt (analysis/provenance.py compares it like a
    truestep run's): the code and data are the files its command line names, by content; the torch the
    audited trainer imported is its own, which the audit cannot see (the same phrase on every audited run:
    an audit judges runs of one command, and a changed script or data file named on it is told apart)."""
    named = json.dumps(attempt.files, sort_keys=True).encode()
    return {
        "truestep_version": truestep.__version__,
        "source_sha256": hashlib.sha256(named).hexdigest(),
        "torch_version": NOT_SEEN,
        "data_sha256": NAMED_FILES,
        "init_from_sha256": "",
    }


def build(job: JobRecord, tokens_per_step: int = 1) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(metrics lines, events) of one job."""
    spec = job.spec
    keys = trajectory_keys(spec.command, spec.logs.text)
    precision = logged_precision([s for a in job.attempts for s in a.records])
    metrics: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    first_ever = None
    for attempt in job.attempts:
        lines, incomplete = _lines(attempt, tokens_per_step)
        a = attempt.number
        events.append({"event": "attempt_start", "time": attempt.started, "attempt": a, "source": "audit"})
        events.append(
            dict(
                event="run_start",
                time=attempt.started,
                attempt=a,
                process_start=attempt.started,
                pid=attempt.pid,
                config_fingerprint=fingerprint(keys),  # the field analysis/runlog.py reads
                trajectory_keys=keys,
                layout=LAYOUT,
                command=attempt.command,
                command_files=attempt.files,
                provenance=provenance(attempt),
                start_step=lines[0]["step"] - 1 if lines else None,
                source="audit",
                **{PRECISION: precision, DIGEST_LOGGED: spec.weights is not None},
            )
        )
        events += _restart_events(attempt, lines, first_ever)
        if lines and first_ever is None:
            first_ever = lines[0]["step"]
        if incomplete:
            what = f"steps logged without {' or '.join(REQUIRED)}"
            events.append(_gap(what, f"attempt {a}", attempt.started, incomplete))
        for fired in (f for f in job.fired if f.attempt == a):
            if fired.delivered and fired.step is None:
                detail = (
                    f"{fired.spec.text} stopped attempt {a} before it logged a step: no resume was exercised"
                )
                events.append(_gap("the fault came before the first logged step", detail, t=fired.time))
            if fired.delivered:
                events.append(
                    {
                        "event": "fault_injected",
                        "time": fired.time,
                        "attempt": a,
                        "kind": fired.spec.kind,
                        "spec": fired.spec.text,
                        "step": fired.step,
                        "forced_at": fired.forced_at,
                        "source": "audit",
                    }
                )
            else:
                events.append(_gap("a fault found the command already exited", fired.spec.text, t=fired.time))
        events += _end_events(job, attempt, metrics + lines)
        metrics += lines
    for fault in spec.faults:
        if not any(f.spec is fault for f in job.fired):
            detail = f"{fault.text}: its trigger was never met before the command finished"
            events.append(_gap("the fault never fired", detail, t=job.attempts[-1].exited or job.started))
    if job.gave_up is not None:
        events.append(
            _gap("the command did not finish", job.gave_up, t=job.attempts[-1].exited or job.started)
        )
    last = job.attempts[-1]
    end = last.exited or last.started
    if last.problems:
        events.append(_gap("logs not fully readable", "; ".join(last.problems[:3]), t=end))
    if job.weights_problem:
        events.append(_gap("no final weights", job.weights_problem, t=end))
    return metrics, sorted(events, key=lambda e: e["time"])


def _end_events(job: JobRecord, attempt: Attempt, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    a, out = attempt.number, []
    ended = attempt.exited or attempt.started
    final = attempt is job.attempts[-1] and job.finished
    if final:
        end = {"event": "run_end", "time": ended, "attempt": a, "reason": "completed", "source": "audit"}
        end["step"] = max((m["step"] for m in lines), default=0)
        if job.digest is not None:
            end["param_digest"] = job.digest
        return [end]
    out.append(
        {
            "event": "failure_detected",
            "time": ended,
            "detected_at": ended,
            "attempt": a,
            "exit_code": attempt.exit_code,
            "source": "audit",
        }
    )
    if attempt.down is not None:
        out.append(
            {
                "event": "teardown_complete",
                "time": attempt.down,
                "teardown_s": attempt.down - ended,
                "source": "audit",
            }
        )
    return out


def write(
    job: JobRecord, run_dir: Path, tokens_per_step: int = 1
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Write the job's metrics.jsonl and events.jsonl into `run_dir`; returns what was written."""
    metrics, events = build(job, tokens_per_step)
    for name, records in ((METRICS_FILE, metrics), (EVENTS_FILE, events)):
        text = "".join(json.dumps(r, separators=(",", ":"), allow_nan=True) + "\n" for r in records)
        atomic_write(run_dir / name, text.encode())
    return metrics, events
