"""Detection power and false-positive rate of the verdict at a nonzero floor: the envelope rule
(analysis/verdict.py `judge`) beside the former scalar rule (one floor number for the whole run, x2:
`scalar_rule`), on the same runs, under emulated GPU nondeterminism (`train.emulate_nondeterminism`).

Everything is repeated over D independent floor draws (each its own reference and K_max same-seed
repeats, with its own model seed `--seed + draw`), one process per run, on the demo model:

  reference + K_max floor repeats      failure-free, same seed (per draw)
  H halves                             train to STOP = max_steps / 2 (a planned stop with a checkpoint)
    each resumed once with every mechanism on         -> the false-positive trials (D x H in all)
  restore-error resumes                a half resumed with `train.emulate_restore_error = d` (every
                                       weight off by a relative d after the restore), S per d per draw
  mechanism-off resumes                optimizer-state, RNG, data-position restore off, M per draw each

Each resumed run is judged against its own draw's floor made of the first K repeats, for every K in
--ks (default 2, 3, 4), by both rules. Printed: per K the false-positive rate of all-on with its exact
95 % (Clopper-Pearson) interval, pooled over the draws, with the per-draw counts beside it (trials of one
draw share their floor, so they are not independent of each other: the per-draw spread shows how much
that matters); the detected fraction per restore error d and per disabled mechanism, both rules, per K.
A target is called MET only when the whole interval supports it (FP: upper bound <= 5 %; detection:
lower bound >= 95 %). The emulated noise is drawn from OS entropy by design (train/emulation.py): the
runs are not bit-reproducible; --seed fixes the model seeds of the draws, so a rerun draws the same
kind of floors, not the same floors.

    OMP_NUM_THREADS=1 python benchmarks/detection_power.py [--draws 5] [--halves 20] [--floors 4]
        [--ks 2,3,4] [--scale 1e-2] [--grid 1e-4,...] [--sweep 2] [--mechanisms 2] [--seed 0]
        [--jobs 2] [--out DIR] [--reuse] [--section.key=value ...]

Any `--section.key=value` is a config override of every run (e.g. `--train.max_steps=20`, which also
moves STOP to 10; `--model.dim=32`); it is validated before anything runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_common import clopper_pearson, load

from truestep.analysis.floor import FloorModel, measure_floor
from truestep.analysis.runlog import RunLog
from truestep.analysis.summary import analyze_run
from truestep.analysis.verdict import Status, scalar_rule
from truestep.config.load import load_config
from truestep.core.names import ENV_FAULTS

CONFIG = "demo"
INTERVAL = 5
ROWS = {
    "optimizer-restore-off": ["--checkpoint.restore_optimizer_state=false"],
    "rng-restore-off": ["--checkpoint.restore_rng_state=false"],
    "data-position-off": ["--checkpoint.restore_data_position=false"],
}
DEFAULT_GRID = "1e-5,1e-4,3e-4,1e-3,3e-3,1e-2"


def train(run_dir: Path, args: argparse.Namespace, *overrides: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(ENV_FAULTS, None)
    cmd = [
        sys.executable,
        "-m",
        "truestep",
        "train",
        CONFIG,
        f"--run.dir={run_dir}",
        *args.common,
        *overrides,
    ]
    with open(run_dir.parent / f"{run_dir.name}.log", "a") as log:
        code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"detection_power: {run_dir.name} exited {code} (see {run_dir}.log)")


def plan(base: Path, args: argparse.Namespace) -> dict[str, list[Path]]:
    """Role -> run directories of one draw."""
    runs = {
        "reference": [base / "reference"],
        "floors": [base / f"floor-{k}" for k in range(1, args.floors + 1)],
    }
    runs["halves"] = [base / f"half-{h}" for h in range(args.halves)]
    runs["all-on"] = [base / f"all-on-{h}" for h in range(args.halves)]
    for d in args.grid:
        runs[f"d={d:g}"] = [base / f"restore-{d:g}-{s}" for s in range(args.sweep)]
    for row in ROWS:
        runs[row] = [base / f"{row}-{m}" for m in range(args.mechanisms)]
    return runs


def run_draw(base: Path, draw: int, args: argparse.Namespace, pool: ThreadPoolExecutor) -> None:
    seed = [f"--train.seed={args.seed + draw}", f"--train.emulate_nondeterminism={args.scale:g}"]
    base.mkdir(parents=True)
    runs = plan(base, args)
    pending = [pool.submit(train, p, args, *seed) for p in runs["reference"] + runs["floors"]]
    stop = f"--train.stop_at_step={args.stop}"
    halves = [pool.submit(train, p, args, *seed, stop) for p in runs["halves"]]
    for f in halves:
        f.result()

    def resume(half: Path, dest: Path, *switches: str) -> None:
        shutil.copytree(half, dest)
        train(dest, args, *seed, *switches)

    extra = [
        (f"d={d:g}", [f"--train.emulate_restore_error={d:g}", "--checkpoint.verify_restored_digest=false"])
        for d in args.grid
    ] + list(ROWS.items())
    for half, dest in zip(runs["halves"], runs["all-on"], strict=True):
        pending.append(pool.submit(resume, half, dest))
    turn = 0
    for role, switches in extra:
        for dest in runs[role]:
            half = runs["halves"][turn % len(runs["halves"])]
            turn += 1
            pending.append(pool.submit(resume, half, dest, *switches))
    for f in pending:
        f.result()


def judge_both(run: Path, ref: RunLog, floor: FloorModel) -> tuple[bool, bool, str]:
    """(the envelope rule flags it, the scalar rule flags it, the verdict's status), one comparison,
    made as `truestep fidelity` makes it (analyze_run: ownership, provenance, the recovery the run
    claims, then the verdict)."""
    result = analyze_run(run.name, RunLog.load(run), ref, floor)
    c, v = result.comparison, result.verdict
    assert c is not None
    if v.status in (Status.INCOMPLETE, Status.INSUFFICIENT_FLOOR):
        raise SystemExit(f"detection_power: {run} judged {v.label}: the benchmark's runs must be complete")
    return not v.preserving, scalar_rule(c, floor) is not None, str(v.status)


def evaluate(base: Path, args: argparse.Namespace) -> dict:
    """Per K: per role the flags of every run of this draw, both rules."""
    runs = plan(base, args)
    ref = RunLog.load(runs["reference"][0])
    floors = [RunLog.load(p) for p in runs["floors"]]
    out: dict = {}
    for k in args.ks:
        floor = measure_floor(ref, floors[:k])
        per_role = {}
        for role, paths in runs.items():
            if role in ("reference", "floors", "halves"):
                continue
            flags = [judge_both(p, ref, floor) for p in paths]
            per_role[role] = {
                "n": len(flags),
                "new": sum(f[0] for f in flags),
                "scalar": sum(f[1] for f in flags),
            }
        out[str(k)] = {
            "k_distinct": floor.k,
            "notes": floor.notes,
            "tau": {name: fam.tau for name, fam in floor.families.items() if fam.envelope.steps},
            "floor_max_dloss": floor.max_dloss,
            "roles": per_role,
        }
    return out


def pooled(results: list[dict], k: int, role: str, rule: str) -> tuple[int, int, list[int]]:
    per_draw = [r[str(k)]["roles"][role][rule] for r in results]
    n = sum(r[str(k)]["roles"][role]["n"] for r in results)
    return sum(per_draw), n, per_draw


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def cell(hits: int, n: int) -> str:
    lo, hi = clopper_pearson(hits, n)
    return f"{hits}/{n} = {pct(hits / n if n else 0)} [{pct(lo)}, {pct(hi)}]"


def report(results: list[dict], args: argparse.Namespace) -> list[str]:
    """The results as Markdown tables (printed and returned for benchmarks/README.md)."""
    lines = [
        f"False positives of all-on resumes (pooled over {len(results)} floor draws; exact 95 % interval; "
        "per-draw counts in brackets):",
        "",
        "| K | envelope rule | per draw | scalar rule | bound r/(K+1) per observable | FP target (upper bound <= 5 %) |",
        "|---|---|---|---|---|---|",
    ]
    for k in args.ks:
        hits, n, per = pooled(results, k, "all-on", "new")
        s_hits, s_n, _ = pooled(results, k, "all-on", "scalar")
        bound = (2 if k >= 3 else 1) / (k + 1)
        met = "MET" if clopper_pearson(hits, n)[1] <= 0.05 else "not shown"
        lines.append(f"| {k} | {cell(hits, n)} | {per} | {cell(s_hits, s_n)} | {pct(bound)} | {met} |")
    lines += ["", "Detected fraction (envelope rule / scalar rule), pooled over the draws:", ""]
    lines.append("| resumed with | " + " | ".join(f"K={k} envelope | K={k} scalar" for k in args.ks) + " |")
    lines.append("|---|" + "---|---|" * len(args.ks))
    roles = [f"d={d:g}" for d in args.grid] + (list(ROWS) if args.mechanisms else [])
    for role in roles:
        row = [f"restore error {role[2:]}" if role.startswith("d=") else role]
        for k in args.ks:
            for rule in ("new", "scalar"):
                hits, n, _ = pooled(results, k, role, rule)
                row.append(f"{hits}/{n}")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def plot(results: list[dict], args: argparse.Namespace, path: Path) -> Path:
    """Detected fraction vs restore error d: the envelope rule per K, the scalar rule (K = max) beside."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    for k, color in zip(args.ks, ("#90caf9", "#1e88e5", "#0d47a1", "#000000"), strict=False):
        ys = [pooled(results, k, f"d={d:g}", "new") for d in args.grid]
        ax.plot(args.grid, [h / n for h, n, _ in ys], "-o", color=color, label=f"envelope rule, K={k}")
    k = max(args.ks)
    ys = [pooled(results, k, f"d={d:g}", "scalar") for d in args.grid]
    ax.plot(args.grid, [h / n for h, n, _ in ys], "--s", color="#9e9e9e", label=f"scalar rule, K={k}")
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("restore error d (relative, every weight)")
    ax.set_ylabel("fraction of resumes flagged")
    ax.set_title(f"emulator scale {args.scale:g}, {len(results)} floor draws")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.savefig(path, dpi=110)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=5, help="D: independent floor draws")
    p.add_argument("--halves", type=int, default=20, help="H: all-on resumes per draw (FP trials)")
    p.add_argument("--floors", type=int, default=4, help="K_max: floor repeats per draw")
    p.add_argument("--ks", default="2,3,4", help="floor sizes K to judge with (each <= --floors)")
    p.add_argument("--scale", type=float, default=1e-2, help="train.emulate_nondeterminism")
    p.add_argument("--grid", default=DEFAULT_GRID, help="restore errors d to sweep")
    p.add_argument("--sweep", type=int, default=2, help="S: resumes per restore error d per draw")
    p.add_argument("--mechanisms", type=int, default=2, help="M: resumes per disabled mechanism per draw")
    p.add_argument("--seed", type=int, default=0, help="model seed of draw 0 (draw i: seed + i)")
    p.add_argument("--jobs", type=int, default=2, help="processes at a time")
    p.add_argument("--out", help="keep the runs and results.json here (default: a temporary directory)")
    p.add_argument("--reuse", action="store_true", help="judge the runs already in --out, run nothing")
    args, overrides = p.parse_known_args()
    bad = [o for o in overrides if not o.startswith("--") or "=" not in o]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)} (config overrides are --section.key=value)")
    cfg = load_config(CONFIG, overrides)  # a bad override is refused here, before anything runs
    args.ks = sorted({int(x) for x in args.ks.split(",")})
    args.grid = [float(x) for x in args.grid.split(",")]
    if min(args.ks) < 2 or max(args.ks) > args.floors or args.halves < 1 or args.draws < 1:
        p.error("--ks must be >= 2 and <= --floors; --halves and --draws >= 1")
    if args.reuse and not args.out:
        p.error("--reuse judges the runs of an earlier --out DIR: give --out")
    args.stop = cfg.train.max_steps // 2
    args.common = [
        f"--checkpoint.interval={INTERVAL}",
        "--checkpoint.keep_last_n=0",
        "--metrics.progress=false",
    ]
    args.common += overrides
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="detection-power-"))
    per_draw = 1 + args.floors + 2 * args.halves + args.sweep * len(args.grid) + args.mechanisms * len(ROWS)
    print(
        f"detection power: D={args.draws} draws x ({per_draw} processes), K in {args.ks}, scale {args.scale:g}, "
        f"max_steps {cfg.train.max_steps}, stop {args.stop}, seed {args.seed} -> {out}\n{load()}",
        flush=True,
    )
    started, cpu0 = time.time(), os.times()
    results = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for draw in range(args.draws):
            base = out / f"draw-{draw}"
            if not args.reuse:
                run_draw(base, draw, args, pool)
            results.append(evaluate(base, args))
            print(f"  draw {draw}: done after {time.time() - started:.0f} s ({load()})", flush=True)
    lines = report(results, args)
    print("\n" + "\n".join(lines))
    cpu = os.times()
    cpu_s = cpu.children_user + cpu.children_system - cpu0.children_user - cpu0.children_system
    print(f"\nwall {time.time() - started:.0f} s, CPU of the runs {cpu_s:.0f} s, {load()}")
    (out / "results.json").write_text(
        json.dumps({"args": {k: v for k, v in vars(args).items()}, "draws": results}, indent=1)
    )
    if args.out:
        print(f"results: {out / 'results.json'}\nplot:    {plot(results, args, out / 'detection_power.png')}")
    else:
        shutil.rmtree(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
