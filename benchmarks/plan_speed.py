"""How fast `truestep plan` simulates: 1,000 replicas of a 30-day job at 16,384 GPUs (the issue's target:
<= 10 s on this machine), then the whole plan (interval sweep, mechanisms, sensitivity, GPU sweep).

    OMP_NUM_THREADS=1 python benchmarks/plan_speed.py [--trials 5] [--replicas 1000] [--gpus 16384]
        [--days 30] [--whole]

Prints min/median/max over the trials (the first, unmeasured, warms numpy up) and the load average. Not
a test: nothing asserts on the time.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench_common import load, spread

from truestep.plan.build import assemble
from truestep.plan.scenario import daly_for, params
from truestep.plan.simulate import simulate
from truestep.plan.study import make_plan


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--replicas", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=16384)
    p.add_argument("--days", type=float, default=30.0)
    p.add_argument("--whole", action="store_true", help="also time the whole plan (make_plan), 3 trials")
    a = p.parse_args()
    print(f"plan speed: {a.replicas} replicas, {a.days:g} days at {a.gpus} GPUs; {load()}")
    inputs = assemble(None, None, [f"--job.gpus={a.gpus}", f"--job.job_days={a.days}"]).inputs
    tau = daly_for(inputs)
    times, failures = [], 0.0
    for trial in range(a.trials + 1):
        started = time.perf_counter()
        result = simulate(params(inputs, a.replicas, tau), seed=trial)
        elapsed = time.perf_counter() - started
        failures = float(result.failures.mean())
        if trial:
            times.append(elapsed)
    print(f"  simulate: {spread(times)} s, median [min-max]; {failures:.0f} failures per job")
    print(f"  mean correct goodput {result.correct_goodput.mean():.4f} at Daly's interval {tau:.0f} s")
    if a.whole:
        whole = []
        for _ in range(3):
            started = time.perf_counter()
            make_plan(assemble(None, None, [f"--job.gpus={a.gpus}", f"--job.job_days={a.days}"]))
            whole.append(time.perf_counter() - started)
        print(f"  whole plan (headline {a.replicas} replicas, sweeps 200 per setting): {spread(whole)} s")
    print(f"  {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
