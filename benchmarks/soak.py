"""Soak: one long job on the demo model under a seeded Poisson stream of faults of every class the
supervisor survives, compared bit for bit with a failure-free reference, with what it holds sampled
over time (benchmarks/README.md, "soak.py").

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/soak.py --steps 5000 --faults 30 --out DIR

The job is `truestep launch demo --nproc 2`, checkpointing every `--interval` steps, keeping
`--keep-last-n` committed and `--keep-quarantined` quarantined checkpoints. The faults (soak_plan.py)
are armed through TRUESTEP_FAULTS, one per attempt; a preemption ends the launch with 75 and this
script relaunches it with the next TRUESTEP_JOB_GENERATION, as a scheduler's requeue would. Every
`--sample-s` it samples the supervisor and the run directory (soak_probe.py). At the end: the losses of
every step and the final parameter digest against the reference's, the faults that fired against the
plan, the resources first vs last quarter (soak_report.py), and anything left behind (a process, a
listening port, a shared-memory segment). Writes plan.json, samples.jsonl, summary.json and soak.png
to --out; exits 1 when the run is not bitwise, a fault did not fire, a bound is missed or something
was left behind.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import soak_plan
import soak_probe
import soak_report
from bench_common import load

REQUEUE = 75
DEADLINES = ["--resilience.liveness_timeout_s=10", "--resilience.hang_timeout_s=10"]


def job_cmd(run_dir: Path, args: argparse.Namespace, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "truestep", "launch", "demo", "--nproc=2", "--max-restarts=100000",
        f"--run.dir={run_dir}", f"--train.max_steps={args.steps}", f"--checkpoint.interval={args.interval}",
        f"--checkpoint.keep_last_n={args.keep_last_n}", f"--checkpoint.keep_quarantined={args.keep_quarantined}",
        "--allow-env-faults", *extra,  # run_job arms this soak's faults through TRUESTEP_FAULTS
    ]  # fmt: skip


def run_job(
    run_dir: Path, args: argparse.Namespace, extra: list[str], faults: str, samples: list[dict] | None
) -> dict:
    """Launch until the job ends other than by a preemption; sample while it runs (when `samples`)."""
    log = open(run_dir.parent / f"{run_dir.name}.log", "ab")  # noqa: SIM115 - closed below
    tail = soak_probe.EventTail(run_dir / "events.jsonl")
    seen: set[tuple[int, int]] = set()
    launches: list[float] = []
    codes: list[int] = []
    started = time.time()
    while True:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TRUESTEP_JOB_ID": f"soak-{args.seed}",
               "TRUESTEP_JOB_GENERATION": str(len(launches)), "TRUESTEP_FAULTS": faults}  # fmt: skip
        launches.append(time.time())
        proc = subprocess.Popen(job_cmd(run_dir, args, extra), env=env, stdout=log, stderr=subprocess.STDOUT)
        seen.add(soak_probe.identity(proc.pid) or (proc.pid, 0))
        while proc.poll() is None:
            if samples is not None:
                s = soak_probe.sample(time.time(), len(launches) - 1, proc.pid, run_dir, tail)
                seen.update(s.processes)
                samples.append(s.record())
                if len(samples) % 50 == 0:
                    print(
                        f"  {time.time() - started:7.0f}s  attempt {tail.attempt}  {progress(run_dir)}",
                        flush=True,
                    )
            time.sleep(args.sample_s)
        codes.append(proc.returncode)
        if proc.returncode != REQUEUE or len(launches) > args.faults + 1:
            break
    log.close()
    tail.poll()
    return {
        "codes": codes,
        "launches": launches,
        "wall_s": time.time() - started,
        "seen": seen,
        "ports": tail.ports,
    }


def progress(run_dir: Path) -> str:
    try:
        beat = json.loads((run_dir / "heartbeats" / "rank00000.json").read_text())
        return f"step {beat['step']} ({beat['phase']})"
    except (OSError, ValueError, KeyError):
        return "starting"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def loss_bits(run_dir: Path) -> dict[int, str]:
    """step -> float32 bit pattern of its loss; a replayed step keeps its last value."""
    return {m["step"]: struct.pack(">f", m["loss"]).hex() for m in jsonl(run_dir / "metrics.jsonl")}


def digest(run_dir: Path) -> str | None:
    ends = [e for e in jsonl(run_dir / "events.jsonl") if e.get("event") == "run_end"]
    return ends[-1].get("param_digest") if ends else None


def compare(run: Path, ref: Path, steps: int) -> dict:
    got, want = loss_bits(run), loss_bits(ref)
    differ = [s for s in range(1, steps + 1) if got.get(s) != want.get(s)]
    return {"steps_compared": steps, "steps_differing": len(differ), "first_differing": differ[:5],
            "digest": digest(run), "reference_digest": digest(ref),
            "bitwise": not differ and digest(ref) is not None and digest(run) == digest(ref)}  # fmt: skip


def fired(run: Path, planned: list[soak_plan.PlannedFault]) -> dict:
    by_spec = {f.spec: f for f in planned}
    injected = [e for e in jsonl(run / "events.jsonl") if e.get("event") == "fault_injected"]
    fired_specs = [e["spec"] for e in injected]
    classes: dict[str, int] = {}
    for spec in fired_specs:
        cls = by_spec[spec].cls if spec in by_spec else "unplanned"
        classes[cls] = classes.get(cls, 0) + 1
    return {"planned": len(planned), "fired": len(fired_specs), "by_class": classes,
            "not_fired": [f.spec for f in planned if f.spec not in fired_specs],
            "times": [e["time"] for e in injected]}  # fmt: skip


def unplanned(run: Path) -> list[dict]:
    """Failures the supervisor detected in an attempt where no fault fired (e.g. a start-up that missed its
    liveness deadline on a loaded machine): survived too, but each shifts the plan by one attempt."""
    events = jsonl(run / "events.jsonl")
    faulted = {e.get("attempt") for e in events if e.get("event") == "fault_injected"}
    return [
        {k: e.get(k) for k in ("attempt", "kind", "rank", "detail")}
        for e in events
        if e.get("event") == "failure_detected" and e.get("attempt") not in faulted
    ]


def steps_trained_by(run: Path, samples: list[dict]) -> dict[int, float]:
    """For each sample index: the steps trained by then, replays included (metrics records so far)."""
    times = sorted(m["time"] for m in jsonl(run / "metrics.jsonl"))
    return {i: float(bisect.bisect_right(times, s["time"])) for i, s in enumerate(samples)}


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The soak's options, and the config overrides (--section.key=value) passed on to the job."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--faults", type=int, default=30, help="faults planned (one per attempt)")
    parser.add_argument("--min-faults", type=int, default=25, help="faults that must fire (default 25)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--interval", type=int, default=50)
    parser.add_argument("--keep-last-n", type=int, default=2)
    parser.add_argument("--keep-quarantined", type=int, default=2)
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=Path("soak-out"))
    args, extra = parser.parse_known_args(argv)
    # Detection deadlines with room for a loaded 2-core machine: a missed one is an unplanned attempt.
    return args, [*DEADLINES, *extra]


def main(argv: list[str] | None = None) -> int:
    return 0 if run(*parse(argv))["ok"] else 1


def run(args: argparse.Namespace, extra: list[str]) -> dict:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    planned = soak_plan.plan(args.seed, args.faults, args.steps, args.interval, world=2)
    (out / "plan.json").write_text(json.dumps(soak_plan.as_records(planned), indent=1))
    print(f"soak: {args.steps} steps, {len(planned)} faults (seed {args.seed}); {load()}", flush=True)
    shm_before = soak_probe.shared_memory()
    samples: list[dict] = []
    soak = run_job(out / "soak", args, extra, ";".join(f.spec for f in planned), samples)
    left = soak_probe.leftovers(soak["seen"], soak["ports"], shm_before)
    print(f"soak: ended {soak['codes']} in {soak['wall_s']:.0f}s; reference ...; {load()}", flush=True)
    reference = run_job(out / "reference", args, extra, "", None)
    (out / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    faults = fired(out / "soak", planned)
    faults["unplanned"] = unplanned(out / "soak")
    bounds = soak_report.level_bounds(samples, args.keep_quarantined)
    rates = soak_report.log_rates(samples, steps_trained_by(out / "soak", samples))
    soak_report.plot(samples, faults["times"], soak["launches"], out / "soak.png")
    comparison = compare(out / "soak", out / "reference", args.steps)
    attempts = max((s["attempt"] for s in samples), default=0) + 1
    summary = {
        "args": {k: str(v) for k, v in vars(args).items()}, "extra": extra,
        "soak": {"exit_codes": soak["codes"], "launches": len(soak["launches"]), "wall_s": soak["wall_s"],
                 "attempts": attempts, "samples": len(samples)},
        "reference": {"exit_codes": reference["codes"], "wall_s": reference["wall_s"]},
        "comparison": comparison, "faults": faults, "bounds": [vars(b) for b in bounds], "log_rates": rates,
        "leftovers": left, "load": load(),
    }  # fmt: skip
    summary["ok"] = bool(
        comparison["bitwise"]
        and soak["codes"][-1] == 0
        and faults["fired"] >= min(args.min_faults, len(planned))
        and set(faults["by_class"]) >= set(soak_plan.CLASSES)
        and all(b.bounded for b in bounds)
        and not any(left.values())
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(soak_report.table(bounds))
    print(
        json.dumps(
            {k: summary[k] for k in ("soak", "reference", "comparison", "log_rates", "leftovers")}, indent=1
        )
    )
    print(f"faults fired {faults['fired']}/{faults['planned']} by class {faults['by_class']}; "
          f"unplanned failures {faults['unplanned']}; ok={summary['ok']}")  # fmt: skip
    return summary


if __name__ == "__main__":
    sys.exit(main())
