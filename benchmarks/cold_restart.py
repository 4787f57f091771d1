"""Issue 37: the cold restart as a whole, phase by phase, fresh start vs resume, side by side.

For each --sizes checkpoint size (GB of fp32 weights + AdamW moments: 12 bytes per parameter; the model
is the tiny preset widened, see SHAPES) and each --worlds W, real jobs under the local supervisor
(`truestep launch tiny --nproc W`, no warm standby), --trials rounds in counterbalanced order
(bench_common.abba), each ending after its first step (train.stop_at_step; the final save then runs,
outside every phase):

  fresh       a new run directory: allocate, initialize (train.init_scheme=blockwise, each rank its own
              shards), first step;
  fresh_full  the same with train.init_scheme=full (every rank draws every parameter: the only scheme
              before issue 37), for the fresh build as it was;
  resume      a run directory holding one committed checkpoint (made once, unmeasured): allocate (no
              init), verify, load (each item hashed as read, streamed into its target), first step. The
              checkpoint it writes at the end is removed after the trial, so every trial resumes alike.

Phases of the new attempt (rank 0), contiguous from the supervisor's spawn:
  process   attempt_start (supervisor) -> the rank's `process_start` (Python up, truestep imported);
  import, build, init, verify, load   the run's own `run_start.startup_phases`;
  rendezvous  the `rendezvous` event (process group and mesh);
  first step  `run_start` -> the attempt's first metrics line;
  total       attempt_start -> that metrics line.

    OMP_NUM_THREADS=1 python benchmarks/cold_restart.py [--sizes 0.3 1 2.5] [--worlds 1 2 4] [--trials 5]
        [--sides fresh fresh_full resume] [--dir PATH] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from bench_common import abba, load, median, spread

SHAPES = {0.3: (512, 8), 1.0: (768, 12), 2.5: (1024, 18)}
"""checkpoint GB -> (model.dim, model.n_layers): 0.29, 1.0 and 2.7 GB of weights + AdamW moments."""
SIDES = ("fresh", "fresh_full", "resume")
PHASES = ("process", "import", "rendezvous", "build", "init", "verify", "load", "first step", "total")


def overrides(gb: float, world: int) -> list[str]:
    dim, layers = SHAPES[gb]
    return [
        f"--model.dim={dim}",
        f"--model.n_layers={layers}",
        "--model.n_heads=8",
        "--model.n_kv_heads=8",
        "--model.multiple_of=256",
        "--model.max_seq_len=64",
        "--data.seq_len=16",
        f"--train.global_batch_size={world}",
        "--train.max_steps=3",
        "--checkpoint.interval=0",
        "--checkpoint.async_save=false",
        "--checkpoint.keep_last_n=0",
        "--metrics.progress=false",
        "--metrics.narrate=false",
        "--resilience.warm_standby=false",
        "--resilience.startup_timeout_s=600",
        "--resilience.liveness_timeout_s=600",
        "--resilience.hang_timeout_s=600",
    ]


def launch(run_dir: Path, world: int, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "truestep", "launch", "tiny", "--nproc", str(world), f"--run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def phases_of_last_attempt(run_dir: Path) -> dict[str, float]:
    events = _records(run_dir / "events.jsonl")
    start = [e for e in events if e.get("event") == "run_start"][-1]
    attempt = start["attempt"]
    spawned = [
        e["time"]
        for e in events
        if e.get("event") == "attempt_start"
        and e.get("source") == "supervisor"
        and e.get("attempt") == attempt
    ][-1]
    rendezvous = [e for e in events if e.get("event") == "rendezvous" and e.get("attempt") == attempt][-1]
    first = next(m for m in _records(run_dir / "metrics.jsonl") if m.get("attempt") == attempt)
    got = {"process": start["process_start"] - spawned, "rendezvous": rendezvous["rendezvous_s"]}
    got.update(start["startup_phases"])
    got["first step"] = first["time"] - start["time"]
    got["total"] = first["time"] - spawned
    return got


def prepare(base: Path, gb: float, world: int) -> Path:
    """A run directory with one committed checkpoint at step 1, for the resume trials."""
    run = base / f"template-{gb}-{world}"
    launch(run, world, [*overrides(gb, world), "--train.stop_at_step=1"])
    return run


def trial(base: Path, side: str, gb: float, world: int, template: Path) -> dict[str, float]:
    args = overrides(gb, world)
    if side == "resume":
        launch(template, world, [*args, "--train.stop_at_step=2"])
        got = phases_of_last_attempt(template)
        shutil.rmtree(template / "checkpoints" / "step_00000002")  # the next trial resumes from step 1 again
        return got
    run = base / "fresh"
    shutil.rmtree(run, ignore_errors=True)
    scheme = "full" if side == "fresh_full" else "blockwise"
    launch(run, world, [*args, "--train.stop_at_step=1", f"--train.init_scheme={scheme}"])
    got = phases_of_last_attempt(run)
    shutil.rmtree(run)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=float, nargs="*", default=[0.3, 1.0, 2.5], choices=sorted(SHAPES))
    parser.add_argument("--worlds", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--sides", nargs="*", default=list(SIDES), choices=SIDES)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument(
        "--out", type=Path, default=None, help="append every trial's phases here (JSON lines)"
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="cold-restart-", dir=args.dir))
    try:
        print(f"# {load()}", flush=True)
        for gb in args.sizes:
            for world in args.worlds:
                template = prepare(base, gb, world)
                res: dict[str, dict[str, list[float]]] = {side: defaultdict(list) for side in args.sides}
                for side in abba(tuple(args.sides), args.trials):
                    got = trial(base, side, gb, world, template)
                    for phase, seconds in got.items():
                        res[side][phase].append(seconds)
                    if args.out is not None:
                        with args.out.open("a") as out:
                            out.write(json.dumps({"gb": gb, "world": world, "side": side, **got}) + "\n")
                shutil.rmtree(template)
                print(f"## {gb} GB, world {world}, {args.trials} trials: seconds median [min-max]; {load()}")
                print("  phase       " + "".join(f"{side:28s}" for side in args.sides))
                for phase in PHASES:
                    print(f"  {phase:11s} " + "".join(f"{spread(res[s][phase]):28s}" for s in args.sides))
                if {"fresh", "resume"} <= set(args.sides):
                    fresh = median(res["fresh"]["build"]) + median(res["fresh"]["init"])
                    print(
                        f"  resume build / fresh build+init {median(res['resume']['build']) / fresh:.3f}"
                        + (
                            f"; fresh_full build+init {median(res['fresh_full']['build']) + median(res['fresh_full']['init']):.3f} s"
                            if "fresh_full" in args.sides
                            else ""
                        ),
                        flush=True,
                    )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
