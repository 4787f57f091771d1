"""Time to recover from a fault, phase by phase, with warm standby on and off side by side.

Runs the demo job (`truestep launch demo --nproc 2`: the tiny model of `make demo` on its corpus) and
injects one fault per trial once rank 1 reports `--fault-step` in phase `train` — and, with warm
standby on, once every standby has reported ready, so that the comparison is of a warm restart against
a cold one, not of a half-imported standby:

  sigkill   SIGKILL rank 1: the supervisor sees the exit, kills the rest, restarts the job;
  sigstop   SIGSTOP rank 1: alive but frozen; found by its stale heartbeat (liveness timeout);
  requeue   SIGTERM to rank 1 only (a preemption notice that reaches the ranks): they agree on a stop
            step, save, exit 75, and the supervisor restarts them locally, as a requeue would;
  sigterm   SIGTERM to the supervisor (the scheduler ends the job): forwarded, agreed, saved, exit 75;
            this script relaunches the supervisor at once, as a requeue would. A new supervisor has no
            standby yet: this class measures what warm standby cannot help (a scheduler adds its queue).

Every fault class runs `--repeats` trials per side, the sides in ABBA order (on off off on ...), the
classes rotated, all in one run. Phases come from the run directory (recovery_phases.py). Prints one
line per trial, then per class the median [min-max] of every phase for each side, the ratio off/on of
the medians, the gap to the physical limit (detect + verify + restore + one step), the memory of a
parked standby and what standbys cost the training they run beside (attempt-0 step time, job time).

    OMP_NUM_THREADS=1 python benchmarks/recovery.py [--repeats 5] [--faults sigkill,requeue,sigstop,sigterm]
        [--fault-step 100] [--max-steps 160] [--keep] [--section.key=value ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import abba, load, median, spread
from recovery_phases import PHASES, attempt0_step_times, phases, standby_memory

FAULTS = ("sigkill", "requeue", "sigstop", "sigterm")
SIDES = ("on", "off")
ROWS = (
    *((p, p.replace("_", " ")) for p in PHASES),
    ("build", "  restore: of which Trainer build"),
    ("verify_s", "  restore: of which verify_s"),
    ("restore_s", "  restore: of which restore_s"),
    ("mttr", "MTTR: fault -> first new step"),
    ("limit", "limit: detect + verify + restore + step"),
    ("gap", "gap: MTTR - limit"),
    ("regained", "fault -> pre-fault step regained"),
    ("job_s", "job wall time (launch -> exit)"),
    ("step0_ms", "attempt-0 step time, ms (median)"),
)


class Job:
    """One `truestep launch` process in a session of its own, so a timeout can end it with its ranks."""

    def __init__(self, run_dir: Path, overrides: list[str], log: Path) -> None:
        cmd = [sys.executable, "-m", "truestep", "launch", "demo", "--nproc=2", "--max-restarts=2"]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("TRUESTEP_FAULTS", None)
        self.log = log
        with open(log, "a") as out:
            self.proc = subprocess.Popen(
                [*cmd, f"--run.dir={run_dir}", *overrides],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
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


def wait_for_fault_point(run_dir: Path, side: str, args: argparse.Namespace, job: Job) -> dict[str, Any]:
    """Wait until rank 1 trains at step >= --fault-step (and, side on, every standby is ready)."""
    path = run_dir / "heartbeats" / "rank00001.json"
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        if job.proc.poll() is not None:
            raise RuntimeError(f"supervisor exited ({job.proc.returncode}) before the fault:\n{job.tail()}")
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, KeyError):
            beat = json.loads(path.read_text())
            ready = side == "off" or bool(standby_memory(run_dir))  # the node's template is ready
            if beat["step"] >= args.fault_step and beat["phase"] == "train" and ready:
                return beat
        time.sleep(0.02)
    raise RuntimeError(f"rank 1 never reached step {args.fault_step} (with standbys ready: side {side})")


def trial(kind: str, side: str, run_dir: Path, args: argparse.Namespace, overrides: list[str]) -> dict:
    log = run_dir / "launch.log"
    overrides = [*overrides, f"--resilience.warm_standby={'true' if side == 'on' else 'false'}"]
    launched = time.time()
    job = Job(run_dir, overrides, log)
    exit_t = None
    try:
        beat = wait_for_fault_point(run_dir, side, args, job)
        fault_t = time.time()
        if kind == "sigkill":
            os.kill(beat["pid"], signal.SIGKILL)
        elif kind == "sigstop":
            os.kill(beat["pid"], signal.SIGSTOP)
        elif kind == "requeue":
            os.kill(beat["pid"], signal.SIGTERM)
        else:
            job.proc.send_signal(signal.SIGTERM)
            code, exit_t = job.finish(args.timeout)
            if code != 75:
                raise RuntimeError(f"preempted supervisor exited {code}, not 75:\n{job.tail()}")
            job = Job(run_dir, overrides, log)  # the requeue
        code, ended = job.finish(args.timeout)
        if code != 0:
            raise RuntimeError(f"supervisor exited {code}:\n{job.tail()}")
    finally:
        job.kill()
    got = phases(kind, run_dir, fault_t, exit_t)
    got.update(fault_step=beat["step"], job_s=ended - launched)
    got["step0_ms"] = 1e3 * median(attempt0_step_times(run_dir))
    got["memory"] = standby_memory(run_dir)
    return got


def fmt_trial(kind: str, side: str, repeat: int, got: dict[str, Any]) -> str:
    parts = [f"{p.replace('_', ' ')} {got[p]:.3f}" for p in PHASES]
    return (
        f"  {kind:<8} {side:<3} #{repeat}: fault at step {got['fault_step']}, {', '.join(parts)}; "
        f"MTTR {got['mttr']:.3f}s (limit {got['limit']:.3f}, gap {got['gap']:.3f}); restored step "
        f"{got['restored_step']}, {got['redone']} redone; {got['standbys']}"
    )


def report(kinds: list[str], results: dict[tuple[str, str], list[dict]], args: argparse.Namespace) -> None:
    width = max(len(label) for _, label in ROWS)
    for kind in kinds:
        on, off = results[(kind, "on")], results[(kind, "off")]
        print(f"\n{kind}: {len(on)} trials with warm standby on, {len(off)} off; seconds, median [min-max]")
        print(f"  {'':<{width}}  {'standby on':<24}{'standby off':<24}off/on")
        for key, label in ROWS:
            a, b = [r[key] for r in on], [r[key] for r in off]
            ratio = f"{median(b) / median(a):.2f}" if a and b and median(a) > 0 else "-"
            print(f"  {label:<{width}}  {spread(a):<24}{spread(b):<24}{ratio}")
    memory = [m for (_, side), runs in results.items() if side == "on" for r in runs for m in r["memory"]]
    if memory:
        mb = {k: [m[k] / 1024 for m in memory if k in m] for k in ("rss_kb", "pss_kb", "private_kb")}
        print(
            f"\nparked standby ({len(memory)} reports): warm-up {spread([m['warm_s'] for m in memory])} s; "
            f"RSS {spread(mb['rss_kb'], '{:.0f}')} MB, PSS {spread(mb['pss_kb'], '{:.0f}')} MB, "
            f"private {spread(mb['private_kb'], '{:.0f}')} MB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="trials per fault class and side")
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated subset of " + ",".join(FAULTS)
    )
    parser.add_argument("--fault-step", type=int, default=100, help="inject once rank 1 reports this step")
    parser.add_argument("--max-steps", type=int, default=160)
    parser.add_argument("--timeout", type=float, default=240.0, help="per supervisor run, seconds")
    parser.add_argument("--dir", default=None, help="parent of the temporary run dirs (default: system tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (to inspect them)")
    args, extra = parser.parse_known_args()
    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    if unknown := set(kinds) - set(FAULTS):
        parser.error(f"unknown fault classes {sorted(unknown)}; known: {', '.join(FAULTS)}")
    if args.repeats < 1 or args.fault_step >= args.max_steps:
        parser.error("--repeats must be >= 1 and --fault-step below --max-steps")
    overrides = [f"--train.max_steps={args.max_steps}", *extra]
    print(
        f"truestep launch demo --nproc 2, {args.max_steps} steps; fault once rank 1 reports step "
        f"{args.fault_step} (and, standby on, every standby is ready); {args.repeats} trials per class "
        f"and side, ABBA; overrides {extra or 'none'}; {load()}",
        flush=True,
    )
    results: dict[tuple[str, str], list[dict]] = {(k, s): [] for k in kinds for s in SIDES}
    started, failed = time.time(), 0
    keep = tempfile.mkdtemp(prefix="truestep-recovery-bench-", dir=args.dir) if args.keep else None
    workdir = (
        contextlib.nullcontext(keep)
        if keep
        else tempfile.TemporaryDirectory(prefix="truestep-recovery-bench-", dir=args.dir)
    )
    with workdir as tmp:
        order = abba(SIDES, args.repeats)
        for repeat in range(args.repeats):
            rotated = kinds[repeat % len(kinds) :] + kinds[: repeat % len(kinds)]
            for kind in rotated:
                for side in order[2 * repeat : 2 * repeat + 2]:
                    run_dir = Path(tmp) / f"{kind}-{side}-{repeat}"
                    run_dir.mkdir()
                    try:
                        got = trial(kind, side, run_dir, args, overrides)
                    except (KeyError, RuntimeError) as err:
                        print(f"  {kind:<8} {side:<3} #{repeat}: FAILED: {err}", flush=True)
                        failed += 1
                        continue
                    results[(kind, side)].append(got)
                    print(fmt_trial(kind, side, repeat, got), flush=True)
    if keep:
        print(f"run directories kept under {keep}")
    print(f"\n{time.time() - started:.0f}s in all, {failed} failed trials; at the end: {load()}")
    report(kinds, results, args)


if __name__ == "__main__":
    main()
