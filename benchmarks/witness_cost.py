"""What the stop witness (train/hooks/witness.py) costs a graceful stop, against a training step of the
same run: each trial is one `truestep train PRESET --train.stop_at_step=S` in a fresh run directory;
from its event log and metrics it takes `stop_witness.witness_s` (fingerprints + one forward pass, no
backward, not applied) and the median `step_time` of its steps after the first (warm-up). Prints
min/median/max of both over the trials and the ratio of the medians. The witness is at most a forward,
so the ratio should sit well under 1 (a forward is about a third of a forward + backward + update).

    python benchmarks/witness_cost.py [--preset tiny] [--trials 5] [--stop-at 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_common import load, median, spread


def trial(preset: str, stop_at: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "truestep", "train", preset, f"--run.dir={run}"]
        cmd += [f"--train.max_steps={stop_at * 2}", f"--train.stop_at_step={stop_at}"]
        cmd += ["--checkpoint.async_save=false"]
        subprocess.run(cmd, check=True, capture_output=True)
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        (witness,) = [e for e in events if e["event"] == "stop_witness"]
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [m["step_time"] for m in lines if m["step"] > 1]
        return float(witness["witness_s"]), median(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--stop-at", type=int, default=4)
    args = parser.parse_args()
    witness, step = [], []
    for _ in range(args.trials):
        w, s = trial(args.preset, args.stop_at)
        witness.append(w)
        step.append(s)
    print(f"preset {args.preset}, {args.trials} trials, load {load()}")
    print(f"witness_s (stop path)  median [min-max] {spread(witness, '{:.4f}')}")
    print(f"step_time (median/run) median [min-max] {spread(step, '{:.4f}')}")
    print(f"witness / step (medians): {median(witness) / median(step):.2f}")


if __name__ == "__main__":
    main()
