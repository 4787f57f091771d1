"""Recovery from peers' memory (resilience.snapshot_every_steps) against recovery from disk, side by side.

Four parts, each in one run, the sides interleaved in a counterbalanced order (bench_common.abba), every
result as median [min-max] with the load average beside it; nothing here asserts on speed:

  lost     steps lost per single-rank failure: the demo job (2 ranks, checkpoint every --interval steps),
           rank 1 SIGKILLed before a step drawn per round (the same step for both sides of a round);
           memory (snapshots every step + the same checkpoints) vs disk (checkpoints only). Read from the
           restore event's `steps_lost`.
  mttr     MTTR (fault -> first new step) phase by phase at each state size of --sizes (GB of weights +
           AdamW moments, 2 ranks): memory vs disk, the same fault (rank 1 SIGKILLed before step
           --fault-step, checkpoint every 5 steps), warm standbys on and ready before the fault. The sizes
           are interleaved too, so the size-independence ratio (largest / smallest) is measured side by
           side, the disk path's beside it.
  steady   step time with snapshots every k = 1, 2, 5, 10 steps vs off, at the demo preset and at each size of
           --steady-sizes: one torchrun job of 2 ranks per size, the sides in blocks of --block steps in
           one process pair (a block ends when its last snapshot is agreed: its cost stays in its block).
  project  a projection (not a measurement) for 8B / 70B / 405B: shard bytes per rank, the snapshot copy at
           a stated host bandwidth, the replica's transfer at a stated network bandwidth, MTTR from memory
           vs from disk with the paper's other recovery phases (217-235 s in all).

A rank is held (a `sleep` fault on rank 1 before the fault step, timing only) until the standbys are
ready, then SIGKILLed, so the kill lands at a known step however loaded the machine is. Snapshots live
under --shm (a tmpfs; default /dev/shm), removed at the end.

    OMP_NUM_THREADS=1 python benchmarks/memory_recovery.py [--parts lost,mttr,steady,project]
        [--repeats 5] [--sizes 0.3,1,2.5] [--steady-sizes 1] [--interval 10] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import abba, load, median, spread
from memory_projection import project_table
from recovery_phases import read_jsonl

SIDES = ("memory", "disk")
SIZES = {0.3: (512, 8), 1.0: (768, 13), 2.5: (1024, 18)}
"""State GB (fp32 weights + two AdamW moments) -> (model.dim, model.n_layers) on the demo preset."""
PHASES = ("detect", "teardown", "handoff", "rendezvous", "build", "restore", "first_step")
HOLD = "sleep:at=train:step:step={step}:rank=1:seconds=900"
BIG = [
    "--resilience.hang_timeout_s=900",  # the hold is no hang
    "--resilience.collective_timeout_s=900",  # rank 0 waits for the held rank in a collective
    "--resilience.startup_timeout_s=300",  # a loaded machine imports torch slowly
    "--resilience.liveness_timeout_s=30",  # at load 25 on 2 cores a heartbeat thread waits seconds for a CPU
    "--metrics.progress=false",
]


def size_overrides(gb: float | None) -> list[str]:
    if gb is None:
        return []
    dim, layers = SIZES[gb]
    return [f"--model.dim={dim}", f"--model.n_layers={layers}"]


def side_overrides(side: str, shm: Path) -> list[str]:
    if side == "disk":
        return ["--resilience.snapshot_every_steps=0"]
    return [
        "--resilience.snapshot_every_steps=1",
        f"--resilience.snapshot_dir={shm}",
        "--resilience.snapshot_memory_fraction=0.9",  # the 2.5 GB point needs 10 GB of a shared machine's
    ]


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024**2
    return 0.0


class Job:
    """One `truestep launch demo --nproc 2` in a session of its own (a timeout ends it with its ranks)."""

    def __init__(self, run_dir: Path, overrides: list[str], fault: str) -> None:
        cmd = [sys.executable, "-m", "truestep", "launch", "demo", "--nproc=2", "--max-restarts=2"]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("TRUESTEP_FAULTS", None)
        self.log = run_dir.parent / f"{run_dir.name}.log"
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                [*cmd, f"--run.dir={run_dir}", f"--fault={fault}", *overrides],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"the job did not finish in {timeout:.0f}s:\n{self.tail()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own session: the supervisor and its ranks
            self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text()[-3000:]


def wait_held(run_dir: Path, job: Job, timeout: float) -> int:
    """Wait until rank 1 is in its hold and the warm template is ready; return rank 1's pid."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if job.proc.poll() is not None:
            raise RuntimeError(f"the job exited ({job.proc.returncode}) before the fault:\n{job.tail()}")
        events = read_jsonl(run_dir / "events.jsonl")
        held = any(e["event"] == "fault_injected" and e.get("kind") == "sleep" for e in events)
        ready = any(e["event"] == "standby_ready" and e.get("source") == "supervisor" for e in events)
        if held and ready:
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, KeyError):
                return int(json.loads((run_dir / "heartbeats" / "rank00001.json").read_text())["pid"])
        time.sleep(0.05)
    raise RuntimeError("rank 1 never reached its hold with the warm template ready")


def phases(run_dir: Path, fault_t: float) -> dict[str, Any]:
    """The recovery after `fault_t`, in contiguous phases that add up to the MTTR."""
    events = read_jsonl(run_dir / "events.jsonl")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    sup = [e for e in events if e.get("source") == "supervisor"]
    trainer = [e for e in events if e.get("source") != "supervisor"]

    def first(records: list[dict], what: str) -> dict:
        if not records:
            raise KeyError(f"no {what} in {run_dir}")
        return records[0]

    t1 = first([e for e in sup if e["event"] == "failure_detected"], "failure_detected")["detected_at"]
    t2 = first([e for e in sup if e["event"] == "teardown_complete" and e["time"] >= t1], "teardown")["time"]
    relaunch = first([e for e in sup if e["event"] == "attempt_start" and e["time"] > t2], "attempt_start")
    restores = [
        e
        for e in trainer
        if e["event"] in ("memory_restore", "checkpoint_restore") and e["time"] > relaunch["time"]
    ]
    restore = first(restores, "restore after the relaunch")
    attempt = restore["attempt"]
    meet = first([e for e in trainer if e["event"] == "rendezvous" and e["attempt"] == attempt], "rendezvous")
    new = [m for m in metrics if m.get("attempt") == attempt]
    line = first(new, "a step of the new attempt")
    t4, t5 = meet["began"], meet["began"] + meet["rendezvous_s"]
    t6, t7, t8 = restore["time"] - restore["restore_s"], restore["time"], line["time"]
    pre = max(
        (m["step"] for m in metrics if m.get("attempt", 0) < attempt and m["time"] <= fault_t), default=0
    )
    regained = first([m for m in new if m["step"] >= pre], "the pre-fault step regained")["time"]
    skipped = [e for e in trainer if e["event"] == "memory_restore_skipped" and e.get("attempt") == attempt]
    return {
        "detect": t1 - fault_t,
        "teardown": t2 - t1,
        "handoff": t4 - t2,
        "rendezvous": t5 - t4,
        "build": t6 - t5,
        "restore": t7 - t6,
        "first_step": t8 - t7,
        "mttr": t8 - fault_t,
        "regain": regained - fault_t,
        "source": restore.get("source", "disk"),
        "step": restore["step"],
        "steps_lost": restore.get("steps_lost"),
        "skipped": skipped[0]["reason"] if skipped else "",
        "step_s": line["step_time"],
    }


def trial(side: str, run_dir: Path, shm: Path, overrides: list[str], fault_step: int, args: Any) -> dict:
    job = Job(run_dir, [*BIG, *overrides, *side_overrides(side, shm)], HOLD.format(step=fault_step))
    try:
        pid = wait_held(run_dir, job, args.timeout)
        fault_t = time.time()
        os.kill(pid, signal.SIGKILL)
        code = job.wait(args.timeout)
        if code != 0:
            raise RuntimeError(f"the job exited {code}:\n{job.tail()}")
    finally:
        job.kill()
        shutil.rmtree(shm, ignore_errors=True)
    got = phases(run_dir, fault_t)
    if got["source"] != ("memory" if side == "memory" else "disk"):
        raise RuntimeError(f"side {side} restored from {got['source']} ({got['skipped']})")
    got["load"] = os.getloadavg()[0]
    return got


def fmt_trial(label: str, got: dict[str, Any]) -> str:
    parts = ", ".join(f"{p.replace('_', ' ')} {got[p]:.3f}" for p in PHASES)
    return (
        f"  {label}: restored step {got['step']} from {got['source']}, {got['steps_lost']} step(s) lost; "
        f"MTTR {got['mttr']:.3f} s = {parts}; regained {got['regain']:.3f} s; load {got['load']:.1f}"
    )


def part_lost(args: Any, tmp: Path, shm_root: Path) -> None:
    rng = random.Random(args.seed)
    interval, first = args.interval, 2 * args.interval + 1
    overrides = [f"--checkpoint.interval={interval}", f"--train.max_steps={first + interval + 2}"]
    print(
        f"\n## lost: demo preset, 2 ranks, checkpoint every {interval} steps, rank 1 killed before a step "
        f"drawn from [{first}, {first + interval}) per round (seed {args.seed}); {load()}",
        flush=True,
    )
    got: dict[str, list[dict]] = {s: [] for s in SIDES}
    order = abba(SIDES, args.repeats)
    for r in range(args.repeats):
        step = rng.randrange(first, first + interval)
        for side in order[2 * r : 2 * r + 2]:
            run = tmp / f"lost-{side}-{r}"
            try:
                result = trial(side, run, shm_root / run.name, overrides, step, args)
            except (KeyError, RuntimeError) as err:
                print(f"  {side} #{r}: FAILED: {err}", flush=True)
                continue
            got[side].append(result)
            print(fmt_trial(f"{side:<6} #{r} kill before step {step}", result), flush=True)
    for side in SIDES:
        lost = [float(g["steps_lost"]) for g in got[side]]
        mean = sum(lost) / len(lost) if lost else float("nan")
        print(
            f"  {side:<6} steps lost per failure: {spread(lost, '{:.0f}')} (mean {mean:.2f}); "
            f"MTTR {spread([g['mttr'] for g in got[side]])} s; regain {spread([g['regain'] for g in got[side]])} s"
        )
    print(f"  expected on the disk path: (interval - 1) / 2 = {(interval - 1) / 2:.1f} steps; {load()}")


def part_mttr(args: Any, tmp: Path, shm_root: Path) -> None:
    sizes = args.sizes
    print(
        f"\n## mttr: sizes {sizes} GB, 2 ranks, checkpoint every 5 steps, rank 1 killed before step "
        f"{args.fault_step}, warm standbys ready; {load()}; MemAvailable {mem_available_gb():.1f} GB",
        flush=True,
    )
    got: dict[tuple[float, str], list[dict]] = {(g, s): [] for g in sizes for s in SIDES}
    order = abba(SIDES, args.repeats)
    overrides = ["--checkpoint.interval=5", f"--train.max_steps={args.fault_step + 1}"]
    for r in range(args.repeats):
        for gb in sizes[r % len(sizes) :] + sizes[: r % len(sizes)]:
            for side in order[2 * r : 2 * r + 2]:
                need = 4 * gb + 4  # 2 slots x 2 copies of the state in tmpfs, plus the ranks themselves
                if side == "memory" and mem_available_gb() < need:
                    print(
                        f"  {gb} GB {side} #{r}: SKIPPED: MemAvailable {mem_available_gb():.1f} < {need} GB"
                    )
                    continue
                run = tmp / f"mttr-{gb}-{side}-{r}"
                try:
                    result = trial(
                        side,
                        run,
                        shm_root / run.name,
                        [*overrides, *size_overrides(gb)],
                        args.fault_step,
                        args,
                    )
                except (KeyError, RuntimeError) as err:
                    print(f"  {gb} GB {side} #{r}: FAILED: {err}", flush=True)
                    continue
                got[(gb, side)].append(result)
                print(fmt_trial(f"{gb} GB {side:<6} #{r}", result), flush=True)
                if not args.keep:
                    shutil.rmtree(run, ignore_errors=True)
    rows = (*PHASES, "mttr", "regain")
    for gb in sizes:
        mem, disk = got[(gb, "memory")], got[(gb, "disk")]
        print(f"\n  {gb} GB: {len(mem)} memory trials, {len(disk)} disk; seconds, median [min-max]")
        print(f"  {'':<12}{'memory':<26}{'disk':<26}memory/disk")
        for key in rows:
            a, b = [g[key] for g in mem], [g[key] for g in disk]
            ratio = f"{median(a) / median(b):.2f}" if a and b and median(b) > 0 else "-"
            print(f"  {key:<12}{spread(a):<26}{spread(b):<26}{ratio}")
        loads = [g["load"] for g in mem + disk]
        print(
            f"  steps lost: memory {spread([float(g['steps_lost']) for g in mem], '{:.0f}')}, disk "
            f"{spread([float(g['steps_lost']) for g in disk], '{:.0f}')}; load {spread(loads, '{:.1f}')}"
        )
    lo, hi = min(sizes), max(sizes)
    if lo != hi:
        for side in SIDES:
            a, b = [g["mttr"] for g in got[(lo, side)]], [g["mttr"] for g in got[(hi, side)]]
            if a and b:
                print(
                    f"  size growth {hi}/{lo} GB, {side}: MTTR {median(b) / median(a):.2f}x "
                    f"(restore phase {median([g['restore'] for g in got[(hi, side)]]) / max(1e-9, median([g['restore'] for g in got[(lo, side)]])):.2f}x)"
                )
    print(f"  {load()}")


def part_steady(args: Any, tmp: Path, shm_root: Path) -> None:
    here = Path(__file__).resolve().parent
    for gb in [None, *args.steady_sizes]:
        label = "demo preset" if gb is None else f"{gb} GB"
        block = args.block if gb is None else args.block_big
        print(f"\n## steady: {label}, 2 ranks (torchrun), blocks of {block} steps; {load()}", flush=True)
        shm = shm_root / f"steady-{gb}"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            str(here / "memory_steady.py"), f"--rounds={args.repeats}", f"--steps={block}",
            f"--resilience.snapshot_dir={shm}", *size_overrides(gb),
        ]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1")
        try:
            subprocess.run(cmd, env=env, check=True, timeout=args.timeout * 4)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            print(f"  FAILED: {err}", flush=True)
        finally:
            shutil.rmtree(shm, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="lost,mttr,steady,project")
    parser.add_argument("--repeats", type=int, default=5, help="trials per side (and size)")
    parser.add_argument("--sizes", default="0.3,1,2.5", help=f"state GB of the mttr part, of {list(SIZES)}")
    parser.add_argument("--steady-sizes", default="1", help="state GB of the steady part besides the demo")
    parser.add_argument("--interval", type=int, default=10, help="checkpoint interval of the lost part")
    parser.add_argument("--fault-step", type=int, default=8, help="mttr part: kill rank 1 before this step")
    parser.add_argument("--block", type=int, default=40, help="steady part: steps per block, demo preset")
    parser.add_argument("--block-big", type=int, default=10, help="steady part: steps per block, sized")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="per job, seconds")
    parser.add_argument("--shm", default="/dev/shm", help="a tmpfs for the snapshots")
    parser.add_argument("--dir", default=None, help="parent of the run directories (default: system tmp)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    args.sizes = [float(s) for s in args.sizes.split(",") if s]
    args.steady_sizes = [float(s) for s in args.steady_sizes.split(",") if s]
    if unknown := [g for g in args.sizes + args.steady_sizes if g not in SIZES]:
        parser.error(f"sizes {unknown} unknown; choose from {list(SIZES)}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    started = time.time()
    print(f"memory_recovery.py {' '.join(sys.argv[1:])}; {load()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="truestep-memory-bench-", dir=args.dir))
    shm_root = Path(tempfile.mkdtemp(prefix="truestep-memory-bench-", dir=args.shm))
    try:
        if "lost" in parts:
            part_lost(args, tmp, shm_root)
        if "mttr" in parts:
            part_mttr(args, tmp, shm_root)
        if "steady" in parts:
            part_steady(args, tmp, shm_root)
        if "project" in parts:
            print("\n## project (a projection, not a measurement)\n")
            print(project_table())
    finally:
        shutil.rmtree(shm_root, ignore_errors=True)
        if args.keep:
            print(f"run directories kept under {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{time.time() - started:.0f} s in all; {load()}")


if __name__ == "__main__":
    main()
