"""Time to recover from a fault, phase by phase, under `truestep launch` (the local supervisor).

Runs `truestep launch tiny --nproc 2` on a tiny model (steps take milliseconds, so the recovery path
dominates) and, for each fault class, injects the fault once rank 1 reports the given step:

  sigkill   SIGKILL rank 1: the supervisor sees the exit, kills the rest, restarts the job;
  sigstop   SIGSTOP rank 1: alive but frozen; found by its stale heartbeat (liveness timeout), then the
            same teardown and restart;
  sigterm   SIGTERM to the supervisor (a scheduler's preemption notice): forwarded to the ranks, which
            agree on a stop step, save, exit 75; the supervisor exits 75 and this script relaunches it
            at once, as a requeue would (a real scheduler adds its own queueing delay here).

Phases, from the run's events.jsonl / metrics.jsonl (every record has a wall-clock `time`; trainer
records carry their `attempt`, the supervisor's `source: supervisor`) and the fault's wall-clock time:

  detect       failure_detected.detected_at - fault  (sigterm: signal_received, i.e. the ranks agreed)
  teardown     teardown_complete.teardown_s          (sigterm: signal_received -> supervisor exited,
                                                      which includes the emergency save and commit)
  relaunch     teardown end -> next attempt_start    (sigterm: supervisor exit -> new supervisor's
                                                      attempt_start, including its own start-up)
  restored     attempt_start -> checkpoint_restore of the new attempt, split (rank 0's view) into: spawn
               -> truestep imported (run_start.process_start), -> start of verify (torch import,
               rendezvous, model build), verify_s and restore_s (the events' own)
  first step   checkpoint_restore -> first metrics line of the new attempt
  MTTR         fault -> first metrics line of the new attempt
  regained     fault -> the new attempt's metrics reach the last step completed before the fault

Prints one line per trial, then a table of medians over the repeats (fault classes as columns).

    OMP_NUM_THREADS=1 python benchmarks/recovery.py [--repeats 2] [--faults sigkill,sigstop,sigterm]
        [--fault-step 7] [--max-steps 20] [--section.key=value ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The tiny model of tests/harness.py: steps take milliseconds, so multi-process runs on 2 cores stay quick.
TINY = [
    "--model.dim=64",
    "--model.n_layers=2",
    "--model.n_heads=4",
    "--model.n_kv_heads=2",
    "--model.vocab_size=512",
    "--model.multiple_of=32",
    "--model.max_seq_len=64",
    "--data.seq_len=32",
    "--train.global_batch_size=8",
    "--metrics.progress=false",
]
FAULTS = ("sigkill", "sigstop", "sigterm")
PHASES = (
    ("fault_step", "fault at step (rank 1 heartbeat)", "{:.0f}"),
    ("detect", "fault -> detected", "{:.2f}"),
    ("teardown", "teardown", "{:.2f}"),
    ("relaunch", "relaunch (-> attempt_start)", "{:.2f}"),
    ("restored", "attempt_start -> restored", "{:.2f}"),
    ("spawn", "  of which spawn -> truestep imported", "{:.2f}"),
    ("build", "  of which torch, rendezvous, build", "{:.2f}"),
    ("verify_s", "  of which verify_s", "{:.3f}"),
    ("restore_s", "  of which restore_s", "{:.3f}"),
    ("first_step", "restored -> first new step", "{:.2f}"),
    ("mttr", "MTTR: fault -> first new step", "{:.2f}"),
    ("regained", "fault -> pre-fault step regained", "{:.2f}"),
    ("redone", "steps redone", "{:.0f}"),
)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a torn line of a killed writer
            records.append(json.loads(line))
    return records


def first(records: list[dict[str, Any]], what: str) -> dict[str, Any]:
    """The first record; KeyError with a readable message when there is none."""
    if not records:
        raise KeyError(f"no {what} in the run's logs")
    return records[0]


class Job:
    """One `truestep launch` process (a new session, so a timeout can end it with all its ranks)."""

    def __init__(self, run_dir: Path, args: argparse.Namespace, overrides: list[str], log: Path) -> None:
        cmd = [sys.executable, "-m", "truestep", "launch", "tiny", "--nproc=2", "--max-restarts=2"]
        cmd += [f"--run.dir={run_dir}", *TINY, *overrides]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("TRUESTEP_FAULTS", None)
        self.log = log
        with open(log, "a") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def finish(self, timeout: float) -> tuple[int, float]:
        """(exit code, wall-clock exit time as seen from here)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"supervisor did not finish in {timeout:.0f}s; log:\n{self.tail()}") from None
        return code, time.time()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own session: the supervisor and its ranks
            self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text()[-3000:]


def wait_for_step(run_dir: Path, rank: int, step: int, job: Job, timeout: float) -> dict[str, Any]:
    """Wait until `rank`'s heartbeat shows at least `step` in phase train; return the heartbeat."""
    path = run_dir / "heartbeats" / f"rank{rank:05d}.json"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if job.proc.poll() is not None:
            raise RuntimeError(f"supervisor exited ({job.proc.returncode}) before step {step}:\n{job.tail()}")
        try:
            beat = json.loads(path.read_text())
            if beat["step"] >= step and beat["phase"] == "train":
                return beat
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.02)
    raise RuntimeError(f"rank {rank} never reached step {step}")


def trial(kind: str, run_dir: Path, args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    log = run_dir / "launch.log"
    job = Job(run_dir, args, overrides, log)
    try:
        beat = wait_for_step(run_dir, 1, args.fault_step, job, args.timeout)
        fault_t = time.time()
        if kind == "sigkill":
            os.kill(beat["pid"], signal.SIGKILL)
        elif kind == "sigstop":
            os.kill(beat["pid"], signal.SIGSTOP)
        else:
            job.proc.send_signal(signal.SIGTERM)
        code, exit_t = job.finish(args.timeout)
        if kind == "sigterm":
            if code != 75:
                raise RuntimeError(f"preempted supervisor exited {code}, not 75:\n{job.tail()}")
            job = Job(run_dir, args, overrides, log)  # the requeue
            code, _ = job.finish(args.timeout)
        if code != 0:
            raise RuntimeError(f"supervisor exited {code}:\n{job.tail()}")
    finally:
        job.kill()
    return phases(kind, run_dir, fault_t, exit_t, beat["step"])


def phases(kind: str, run_dir: Path, fault_t: float, exit_t: float, fault_step: int) -> dict[str, Any]:
    events = read_jsonl(run_dir / "events.jsonl")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    sup = [e for e in events if e.get("source") == "supervisor"]
    trainer = [e for e in events if e.get("source") != "supervisor"]
    out: dict[str, Any] = {"fault_step": fault_step, "notes": []}
    if kind == "sigterm":
        stop = first([e for e in trainer if e["event"] == "signal_received"], "signal_received")
        out["detect"] = stop["time"] - fault_t
        out["teardown"] = exit_t - stop["time"]
        relaunched_after = exit_t
    else:
        failure = first([e for e in sup if e["event"] == "failure_detected"], "failure_detected")
        teardown = first(
            [e for e in sup if e["event"] == "teardown_complete" and e["time"] >= failure["time"]],
            "teardown_complete",
        )
        out["detect"] = failure["detected_at"] - fault_t
        out["teardown"] = teardown["teardown_s"]
        out["notes"].append(f"{failure['kind']} on rank {failure['rank']}")
        relaunched_after = teardown["time"]
    attempt = first(
        [e for e in sup if e["event"] == "attempt_start" and e["time"] > relaunched_after],
        "a new attempt_start",
    )
    out["relaunch"] = attempt["time"] - relaunched_after
    # The trainer attempt that took over: the first one after the relaunch that got to run_start (a
    # later one if that attempt failed too, which is then part of the recovery time).
    started = first(
        [e for e in trainer if e["event"] == "run_start" and e["time"] > attempt["time"]],
        "run_start after the relaunch",
    )
    new = started["attempt"]
    extra = [
        e for e in sup if e["event"] == "failure_detected" and attempt["time"] < e["time"] < started["time"]
    ]
    if extra:
        out["notes"].append(f"{len(extra)} more failure(s) before it ran: {[e['kind'] for e in extra]}")
    restored = [e for e in trainer if e["event"] == "checkpoint_restore" and e.get("attempt") == new]
    ready_t = restored[0]["time"] if restored else started["time"]
    if restored:
        out["restored"] = restored[0]["time"] - attempt["time"]
        out["restore_s"] = restored[0]["restore_s"]
        restored_step = restored[0]["step"]
    else:
        out["notes"].append("fresh start: no committed checkpoint at the fault (async commit still pending)")
        restored_step = 0
    verified = [e for e in trainer if e["event"] == "checkpoint_verified" and e.get("attempt") == new]
    if verified:
        out["verify_s"] = verified[0]["verify_s"]
    began = started.get("process_start")  # when rank 0 imported truestep (before torch)
    if began is not None:
        out["spawn"] = began - attempt["time"]
        if verified:
            out["build"] = verified[0]["time"] - verified[0]["verify_s"] - began
    new_metrics = [m for m in metrics if m.get("attempt") == new]
    before = [m["step"] for m in metrics if m.get("attempt", 0) < new and m["time"] <= fault_t]
    pre_fault = max(before, default=0)
    first_step = first(new_metrics, "metrics of the new attempt")
    out["first_step"] = first_step["time"] - ready_t
    out["mttr"] = first_step["time"] - fault_t
    regained = first([m for m in new_metrics if m["step"] >= pre_fault], "the pre-fault step regained")
    out["regained"] = regained["time"] - fault_t
    out["redone"] = max(0, pre_fault - restored_step)  # sigterm saves past the fault: none
    return out


def fmt_trial(got: dict[str, Any]) -> str:
    parts = []
    for key, label in (
        ("detect", "detect"),
        ("teardown", "teardown"),
        ("relaunch", "relaunch"),
        ("restored", "restored"),
        ("first_step", "first step"),
        ("mttr", "MTTR"),
        ("regained", "regained"),
    ):
        if key in got:
            parts.append(f"{label} {got[key]:.2f}s")
    parts.append(f"{got['redone']:.0f} steps redone")
    notes = f"  [{'; '.join(got['notes'])}]" if got["notes"] else ""
    return ", ".join(parts) + notes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=2, help="trials per fault class")
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated subset of " + ",".join(FAULTS)
    )
    parser.add_argument("--fault-step", type=int, default=7, help="inject once rank 1 reports this step")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--interval", type=int, default=5, help="checkpoint.interval")
    parser.add_argument("--heartbeat", type=float, default=0.25, help="resilience.heartbeat_interval_s")
    parser.add_argument("--liveness", type=float, default=3.0, help="resilience.liveness_timeout_s")
    parser.add_argument("--hang", type=float, default=4.0, help="resilience.hang_timeout_s")
    parser.add_argument("--timeout", type=float, default=180.0, help="per supervisor run, seconds")
    parser.add_argument("--dir", default=None, help="parent of the temporary run dirs (default: system tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (to inspect them)")
    args, extra = parser.parse_known_args()
    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    if unknown := set(kinds) - set(FAULTS):
        parser.error(f"unknown fault classes {sorted(unknown)}; known: {', '.join(FAULTS)}")
    overrides = [
        f"--train.max_steps={args.max_steps}",
        f"--checkpoint.interval={args.interval}",
        f"--resilience.heartbeat_interval_s={args.heartbeat}",
        f"--resilience.liveness_timeout_s={args.liveness}",
        f"--resilience.hang_timeout_s={args.hang}",
        "--resilience.collective_timeout_s=20",
        *extra,
    ]
    print(
        f"truestep launch tiny --nproc 2 (TINY overrides), {args.max_steps} steps, checkpoint every "
        f"{args.interval}, heartbeat {args.heartbeat}s, liveness {args.liveness}s, hang {args.hang}s; "
        f"fault once rank 1 reports step {args.fault_step}; {args.repeats} repeats",
        flush=True,
    )
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    started = time.time()
    failed: list[Path] = []
    keep = tempfile.mkdtemp(prefix="truestep-recovery-bench-", dir=args.dir) if args.keep else None
    workdir = (
        contextlib.nullcontext(keep)
        if keep
        else tempfile.TemporaryDirectory(prefix="truestep-recovery-bench-", dir=args.dir)
    )
    with workdir as tmp:
        for repeat in range(args.repeats):
            # Rotate the order, so that a noisy stretch of the machine does not always hit one class.
            order = kinds[repeat % len(kinds) :] + kinds[: repeat % len(kinds)]
            for kind in order:
                run_dir = Path(tmp) / f"{kind}-{repeat}"
                run_dir.mkdir()
                try:
                    got = trial(kind, run_dir, args, overrides)
                except (KeyError, RuntimeError) as err:
                    print(f"  {kind:<8} #{repeat}: FAILED: {err}", flush=True)
                    failed.append(run_dir)
                    continue
                results[kind].append(got)
                print(f"  {kind:<8} #{repeat}: {fmt_trial(got)}", flush=True)
    if keep:
        print(f"run directories kept under {keep}")
    print(f"medians over the trials, seconds ({time.time() - started:.0f}s in all; {len(failed)} failed):")
    width = max(len(label) for _, label, _ in PHASES)
    print(f"  {'phase':<{width}}" + "".join(f"{k:>10}" for k in kinds))
    for key, label, fmt in PHASES:
        cells = []
        for kind in kinds:
            values = [r[key] for r in results[kind] if key in r]
            cells.append(fmt.format(statistics.median(values)) if values else "-")
        print(f"  {label:<{width}}" + "".join(f"{c:>10}" for c in cells))
    print(
        "  teardown: sigkill/sigstop = kill the survivors and reap them; sigterm = agreed stop -> emergency "
        "save + commit -> exit.\n  relaunch: sigterm includes the new supervisor's own start-up (a real "
        "requeue adds scheduler delay)."
    )


if __name__ == "__main__":
    main()
