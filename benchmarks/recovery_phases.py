"""One recovery, phase by phase, from a run directory's events.jsonl and metrics.jsonl.

Every record carries a wall-clock `time`; trainer records (rank 0) carry their `attempt`, the
supervisor's carry `source: supervisor`. With t0 the fault's time (taken by the benchmark), the phases
are contiguous, so they add up to the MTTR exactly:

  detect      t0 -> failure_detected.detected_at (process faults) or signal_received (preemptions: the
              ranks agreed on a stop step)
  teardown    -> teardown_complete (survivors killed and reaped); local requeue: -> the supervisor's
              `restart` (emergency save, commit, every rank exited 75); supervisor SIGTERM: -> the
              supervisor exited (as seen by the benchmark)
  handoff     -> the new attempt's `rendezvous.began` on rank 0: the supervisor's relaunch (lease,
              config file, handing a standby its rank or spawning a process), then the rank's start:
              a warm standby wakes up; a cold process starts Python and imports torch and truestep.
              Supervisor SIGTERM: also the new supervisor's own start-up (a scheduler adds its queue)
  rendezvous  `rendezvous.rendezvous_s`: process group and device mesh
  restore     -> `checkpoint_restore`: Trainer build, resolve + verify (`verify_s`), load (`restore_s`)
  first step  -> the new attempt's first metrics line

The limit of a restart is detect + verify_s + restore_s + one step (the first new step's own
`step_time`); `gap` is what the MTTR spends beyond it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

PROCESS_FAULTS = ("sigkill", "sigstop")
PHASES = ("detect", "teardown", "handoff", "rendezvous", "restore", "first_step")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a torn line of a killed writer
                records.append(json.loads(line))
    return records


def first(records: list[dict[str, Any]], what: str) -> dict[str, Any]:
    """The first record; KeyError with a readable message when there is none."""
    if not records:
        raise KeyError(f"no {what} in the run's logs")
    return records[0]


def _teardown_end(kind: str, sup: list[dict], detected: float, exit_t: float | None) -> float:
    if kind in PROCESS_FAULTS:
        down = [e for e in sup if e["event"] == "teardown_complete" and e["time"] >= detected]
        return first(down, "teardown_complete")["time"]
    if kind == "requeue":
        restarts = [e for e in sup if e["event"] == "restart" and e["time"] >= detected]
        return first(restarts, "the supervisor's restart")["time"]
    if exit_t is None:
        raise KeyError("the preempted supervisor's exit time")
    return exit_t


def phases(kind: str, run_dir: Path, fault_t: float, exit_t: float | None = None) -> dict[str, Any]:
    """The phases (seconds) of the first recovery after `fault_t`, plus MTTR, limit, gap and facts."""
    events = read_jsonl(run_dir / "events.jsonl")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    sup = [e for e in events if e.get("source") == "supervisor"]
    trainer = [e for e in events if e.get("source") != "supervisor"]
    if kind in PROCESS_FAULTS:
        failure = first([e for e in sup if e["event"] == "failure_detected"], "failure_detected")
        t1 = failure["detected_at"]
    else:
        t1 = first([e for e in trainer if e["event"] == "signal_received"], "signal_received")["time"]
    t2 = _teardown_end(kind, sup, t1, exit_t)
    relaunch = first([e for e in sup if e["event"] == "attempt_start" and e["time"] > t2], "attempt_start")
    # The attempt that took over: the first after the relaunch that restored (a later one if that one
    # failed too, which then belongs to this recovery's time).
    restored = [e for e in trainer if e["event"] == "checkpoint_restore" and e["time"] > relaunch["time"]]
    restore = first(restored, "checkpoint_restore after the relaunch")
    attempt = restore["attempt"]
    meet = first([e for e in trainer if e["event"] == "rendezvous" and e["attempt"] == attempt], "rendezvous")
    verified = [e for e in trainer if e["event"] == "checkpoint_verified" and e["attempt"] == attempt]
    new_steps = [m for m in metrics if m.get("attempt") == attempt]
    line = first(new_steps, "metrics of the new attempt")
    t4, t5, t7, t8 = meet["began"], meet["began"] + meet["rendezvous_s"], restore["time"], line["time"]
    verify_s = verified[0]["verify_s"] if verified else 0.0
    out: dict[str, Any] = {
        "detect": t1 - fault_t,
        "teardown": t2 - t1,
        "handoff": t4 - t2,
        "rendezvous": t5 - t4,
        "restore": t7 - t5,
        "build": (verified[0]["time"] - verify_s if verified else t7 - restore["restore_s"]) - t5,
        "verify_s": verify_s,
        "restore_s": restore["restore_s"],
        "first_step": t8 - t7,
        "mttr": t8 - fault_t,
        "step_s": line["step_time"],
        "restored_step": restore["step"],
        "attempt": attempt,
    }
    out["limit"] = out["detect"] + verify_s + out["restore_s"] + out["step_s"]
    out["gap"] = out["mttr"] - out["limit"]
    handed = [e for e in sup if e["event"] == "standby_handoff" and e["time"] >= t2]
    handed = [e for e in handed if e["time"] <= relaunch["time"]]
    out["standbys"] = f"{sum(1 for e in handed if e['ready'])}/{len(relaunch['pids'])} ready standbys"
    before = [m["step"] for m in metrics if m.get("attempt", 0) < attempt and m["time"] <= fault_t]
    pre_fault = max(before, default=0)
    regained = [m for m in new_steps if m["step"] >= pre_fault]
    out["regained"] = first(regained, "the pre-fault step regained")["time"] - fault_t
    out["redone"] = max(0, pre_fault - restore["step"])
    return out


def standby_memory(run_dir: Path) -> list[dict[str, Any]]:
    """The ready reports of the run's warm templates (pid, warm_s, rss/pss/private KiB)."""
    return [
        e
        for e in read_jsonl(run_dir / "events.jsonl")
        if e.get("source") == "supervisor" and e["event"] == "standby_ready"
    ]


def attempt0_step_times(run_dir: Path) -> list[float]:
    return [m["step_time"] for m in read_jsonl(run_dir / "metrics.jsonl") if m.get("attempt") == 0]
