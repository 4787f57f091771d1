"""Does `truestep plan` predict what a faulted job really gets? Local fault campaigns on the demo job.

Each campaign runs the demo job (`truestep launch demo --nproc 2`, the tiny model of `make demo`, longer)
once failure-free (the reference) and `--runs` times under a fault process of known rate: an injector
here draws the time to the next fault from an exponential distribution whenever an attempt starts (the
Poisson process of the plan, whose clock runs while the job's processes run), then SIGKILLs a rank
(crash), SIGSTOPs one (hang: found by its stale heartbeat) or SIGTERMs the supervisor (a preemption:
graceful stop, exit 75, relaunched here as a scheduler would), and logs `fault_injected` as the
built-in faults do. Nothing is injected once an attempt has ended its training (`run_end`).

The campaign directory is an experiment directory (experiment.json, runs/), so the analysis measures it
like any other: plain goodput (Σ step time of the final trajectory / wall) and correct goodput (steps
the verdict vouches for against the reference). `truestep plan --from CAMPAIGN_DIR` -- the job's own
measured costs -- with the campaign's rate and fault mix then predicts both; the script prints, per
campaign, every run, the mean measured, the mean predicted with the plan's 5-95 % replica range, and
the relative error.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/plan_campaigns.py [--runs 3] [--max-steps 400]
        [--campaigns A,B,C,D,E,F] [--out DIR] [--quick]

Not a test: it asserts nothing; benchmarks/README.md records a run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench_common import load

from truestep.analysis.runlog import RunLog
from truestep.core.names import ENV_FAULTS, EVENTS_FILE
from truestep.experiment.runner import GROUP_NOTES, JobSpec
from truestep.experiment.summary import summarize
from truestep.plan.build import assemble
from truestep.plan.scenario import planned_interval, round_interval
from truestep.plan.study import Headline, headline
from truestep.telemetry.jsonl import JsonlWriter, read_jsonl

REQUEUE_DELAY_S = 1.0


@dataclass
class Campaign:
    name: str
    gap: float
    """Mean up time between faults (1 / rate), as a fraction of the reference run's wall clock: the rate is
    fixed before the faulted runs start, and scales with how fast this machine runs the job today."""
    mix: dict[str, float]
    """kill / hang / term -> weight."""
    interval: int = 10
    overrides: list[str] = field(default_factory=list)
    note: str = ""


CAMPAIGNS = {
    "A": Campaign("A", 0.35, {"kill": 1}, 20, note="crashes"),
    "B": Campaign("B", 0.2, {"kill": 1}, 10, note="crashes, higher rate, shorter interval"),
    "C": Campaign("C", 0.35, {"hang": 1}, 20, note="hangs (heartbeat detection)"),
    "D": Campaign("D", 0.5, {"term": 1}, 20, note="preemptions (graceful stop, requeue)"),
    "E": Campaign(
        "E", 0.3, {"kill": 2, "hang": 1, "term": 1}, 20, ["--checkpoint.async_save=false"], "mixed, sync save"
    ),
    "F": Campaign(
        "F",
        0.35,
        {"kill": 1},
        20,
        ["--checkpoint.restore_optimizer_state=false"],
        "crashes, optimizer restore off",
    ),
}


class Injector:
    """Poisson faults into one run directory: armed at every attempt_start, disarmed at run_end."""

    def __init__(self, run_dir: Path, campaign: Campaign, mean_gap_s: float, rng: random.Random) -> None:
        self.run_dir, self.campaign, self.mean_gap_s, self.rng = run_dir, campaign, mean_gap_s, rng
        self.seen: set[int] = set()
        self.armed: tuple[int, float, list[int]] | None = None  # (attempt, fire at, pids)
        self.supervisor: subprocess.Popen[bytes] | None = None
        self.fired = 0

    def poll(self) -> None:
        events = read_jsonl(self.run_dir / EVENTS_FILE)
        ended = {
            e.get("attempt")
            for e in events
            if e["event"] in ("run_end", "failure_detected", "supervisor_end")
        }
        for e in events:
            if e["event"] == "attempt_start" and e["attempt"] not in self.seen:
                self.seen.add(e["attempt"])
                gap = self.rng.expovariate(1.0 / self.mean_gap_s)
                self.armed = (e["attempt"], e["time"] + gap, list(e["pids"]))
        if self.armed is None:
            return
        attempt, fire_at, pids = self.armed
        if attempt in ended:
            self.armed = None
        elif time.time() >= fire_at:
            self.armed = None
            self.fire(attempt, pids)

    def fire(self, attempt: int, pids: list[int]) -> None:
        kinds, weights = zip(*self.campaign.mix.items(), strict=True)
        kind = self.rng.choices(kinds, weights)[0]
        rank = self.rng.randrange(len(pids))
        try:
            if kind == "term":
                assert self.supervisor is not None
                self.supervisor.send_signal(signal.SIGTERM)
            else:
                os.kill(pids[rank], signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        except ProcessLookupError:
            return
        self.fired += 1
        writer = JsonlWriter(self.run_dir / EVENTS_FILE, {"source": "fault"})
        writer.write(
            {"event": "fault_injected", "kind": kind, "point": "external", "rank": rank, "attempt": attempt}
            | {"spec": f"{kind}:external:poisson"}
        )
        writer.close()


def run_job(
    run_dir: Path, spec: JobSpec, campaign: Campaign | None, mean_gap_s: float, seed: int, log: Path
) -> int:
    """Launch, requeue after a graceful preemption, inject while it runs."""
    env = {k: v for k, v in os.environ.items() if k != ENV_FAULTS} | {"OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "truestep",
        "launch",
        spec.config,
        f"--nproc={spec.nproc}",
        "--max-restarts=100",
    ]
    cmd += [f"--run.dir={run_dir}", *spec.overrides]
    injector = Injector(run_dir, campaign, mean_gap_s, random.Random(seed)) if campaign else None
    for _ in range(100):
        with open(log, "a") as out:
            proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        if injector:
            injector.supervisor = proc
        try:
            while proc.poll() is None:
                if injector:
                    injector.poll()
                time.sleep(0.02)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.returncode != 75:
            return proc.returncode
        time.sleep(REQUEUE_DELAY_S)
    return 1


def run_campaign(c: Campaign, out: Path, runs: int, max_steps: int, seed: int) -> float:
    """Run the reference, fix the rate from its wall clock, run the faulted runs; returns the mean gap."""
    base = [f"--train.max_steps={max_steps}", f"--checkpoint.interval={c.interval}", *c.overrides]
    jobs = [JobSpec("reference", "demo", base, 2, role="reference")]
    jobs += [JobSpec(f"run-{k}", "demo", base, 2, role="faulted") for k in range(1, runs + 1)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    (out / "experiment.json").write_text(json.dumps({"jobs": [asdict(j) for j in jobs], GROUP_NOTES: {}}))
    mean_gap = 0.0
    for k, job in enumerate(jobs):
        started = time.time()
        faulted = job.role == "faulted"
        log = out / "logs" / f"{job.name}.log"
        code = run_job(out / "runs" / job.name, job, c if faulted else None, mean_gap, seed * 100 + k, log)
        print(f"    {job.name}: exit {code} after {time.time() - started:.1f} s", flush=True)
        if code != 0:
            raise RuntimeError(f"{job.name} exited {code}; see {log}")
        if not faulted:
            mean_gap = c.gap * RunLog.load(out / "runs" / job.name).wall_s
            print(f"    fault rate fixed: one per {mean_gap:.1f} s of up time", flush=True)
    return mean_gap


@dataclass
class Measured:
    run: str
    plain: float
    correct: float
    faults: int
    seconds: dict[str, float]
    """wall, useful and every badput bucket of the report."""


def measured(out: Path) -> list[Measured]:
    """Every faulted run as the analysis measures it."""
    rows = []
    for name, r in summarize(out, write=False).groups[0].runs.items():
        if r.role != "faulted":
            continue
        g = r.goodput
        plain = sum(m["step_time"] for m in RunLog.load(r.path).final_steps.values()) / g.wall_s
        seconds = {"wall": g.wall_s, "useful": g.useful_s, **g.badput_s}
        rows.append(Measured(name, plain, g.useful_s / g.wall_s, len(r.faults), seconds))
    return rows


def predicted(out: Path, c: Campaign, mean_gap: float, max_steps: int, replicas: int) -> Headline:
    """The plan from the campaign's own measured costs, at the campaign's rate and mix."""
    total = sum(c.mix.values())
    failing = sum(w for k, w in c.mix.items() if k != "term")
    overrides = [
        "--job.gpus=2",
        "--job.gpus_per_node=2",
        f"--job.work_steps={max_steps}",
        f"--job.checkpoint_interval_steps={c.interval}",
        f"--job.replicas={replicas}",
        f"--failures.gpu_mtbf_hours={2 * mean_gap * total / failing / 3600 if failing else 1e12}",
        f"--failures.hang_fraction={c.mix.get('hang', 0) / failing if failing else 0}",
        "--failures.node_loss_fraction=0",
        f"--failures.preemptions_per_day={c.mix.get('term', 0) / total / mean_gap * 86400}",
        "--failures.preemption_notice_s=1000",
        *(o.replace("--checkpoint.", "--mechanisms.") for o in c.overrides),
    ]
    a = assemble(out, None, overrides)
    return headline(a.inputs, round_interval(a.inputs, planned_interval(a.inputs)))


def report(name: str, rows: list[Measured], h: Headline) -> str:
    for r in rows:
        print(f"    {r.run}: {r.faults} faults, plain {100 * r.plain:.1f} %, correct {100 * r.correct:.1f} %")
    print("    seconds             measured (mean)  predicted (mean)")
    predicted = {"wall": h.wall_s.mean, "useful": h.correct.mean * h.wall_s.mean}
    predicted |= {k: s.mean for k, s in h.badput_s.items()}
    for key, want in predicted.items():
        got = sum(r.seconds.get(key, 0.0) for r in rows) / len(rows)
        print(f"    {key:18s} {got:16.2f}  {want:16.2f}")
    faults = sum(r.faults for r in rows) / len(rows)
    print(
        f"    interruptions per run: measured {faults:.1f}, predicted {h.failures.mean + h.preemptions.mean:.1f}"
    )
    mp = sum(r.plain for r in rows) / len(rows)
    mc = sum(r.correct for r in rows) / len(rows)
    inside = sum(h.correct.p5 <= r.correct <= h.correct.p95 for r in rows)
    return (
        f"  {name}: measured plain {100 * mp:.1f} % correct {100 * mc:.1f} % | predicted plain "
        f"{100 * h.plain.mean:.1f} % [{100 * h.plain.p5:.1f}-{100 * h.plain.p95:.1f}] correct "
        f"{100 * h.correct.mean:.1f} % [{100 * h.correct.p5:.1f}-{100 * h.correct.p95:.1f}] | error plain "
        f"{100 * (h.plain.mean - mp) / mp:+.1f} % correct {100 * (h.correct.mean - mc) / mc:+.1f} % | "
        f"runs inside the 5-95 % range: {inside}/{len(rows)}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="faulted runs per campaign")
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--campaigns", default=",".join(CAMPAIGNS))
    p.add_argument("--replicas", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="keep the campaigns here (default: a temporary directory)")
    p.add_argument("--quick", action="store_true", help="2 campaigns, 1 run each, 150 steps: a smoke test")
    p.add_argument(
        "--analyse-only",
        action="store_true",
        help="do not run anything: analyse and predict the campaigns already under --out (the rate is read "
        "back from campaign.json)",
    )
    a = p.parse_args()
    names = ["A", "D"] if a.quick else a.campaigns.split(",")
    runs, steps = (1, 150) if a.quick else (a.runs, a.max_steps)
    root = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="plan-campaigns-"))
    what = "analysing what is there" if a.analyse_only else f"{runs} faulted runs each, {steps} steps"
    print(f"plan campaigns: {', '.join(names)}; {what}; {load()}; into {root}")
    started, table = time.time(), []
    for name in names:
        c = CAMPAIGNS[name]
        print(
            f"campaign {name} ({c.note}): mean gap {c.gap:g} x the reference's wall clock, mix {c.mix}, interval {c.interval}",
            flush=True,
        )
        out = root / f"campaign-{name}"
        if a.analyse_only:
            recorded = json.loads((out / "campaign.json").read_text())
            mean_gap, steps = recorded["mean_gap_s"], recorded["max_steps"]
        else:
            mean_gap = run_campaign(c, out, runs, steps, a.seed + ord(name))
            (out / "campaign.json").write_text(
                json.dumps({"mean_gap_s": mean_gap, "max_steps": steps, **asdict(c)})
            )
        line = report(name, measured(out), predicted(out, c, mean_gap, steps, a.replicas))
        table.append(line)
        print(line, flush=True)
    print(f"\nsummary ({time.time() - started:.0f} s wall; {load()}):")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
