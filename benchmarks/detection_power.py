"""Detection power of the verdict where the floor is not zero: the envelope rule (analysis/verdict.py
`judge`) against the former scalar rule (one floor number for the whole run, x2: `scalar_rule`), on the
same runs, under emulated GPU nondeterminism (`train.emulate_nondeterminism`).

For each emulator scale (default: 6e-8, about one fp32 ulp of relative gradient noise per element, the
realistic per-op scale; and 1e-2, strong enough for a loss floor >= 1e-4) it runs, all with one process
and the demo model (its dropout makes the RNG streams matter):

  reference + K floor repeats            failure-free, same seed
  R first halves                         train to step STOP (a planned stop with a checkpoint) ...
    ... each resumed (a copy of the half's run directory) with every mechanism on (twice: the
        false-positive rate is measured on 2R runs), optimizer-state restore off, RNG restore off,
        data-position restore off
  R atomic-commit-off runs               a crash inside the save at STOP, then the resume that trusts
                                         the torn directory
  S x |grid| restore-error runs          half s resumed with `train.emulate_restore_error = d`: every
                                         weight off by a relative d after the restore

Both rules judge every resumed run against the reference and the K repeats. Printed per scale: the
floor, the detection rate of each disabled mechanism and the false-positive rate of all-on for both
rules side by side, and the smallest restore error each rule detects in every repeat. Targets (issue
11): every disabled mechanism detected in >= 95 % of repeats, all-on flagged in <= 5 %, at both scales;
the script exits 1 if the envelope rule misses them.

    OMP_NUM_THREADS=1 python benchmarks/detection_power.py [--quick] [--repeats 10] [--floors 4]
        [--scales 6e-8,1e-2] [--grid 1e-7,...,1e-2] [--sweep-repeats 3] [--jobs 2] [--out DIR]
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
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from truestep.analysis.fidelity import compare
from truestep.analysis.floor import FloorModel, measure_floor
from truestep.analysis.runlog import RunLog
from truestep.analysis.state import distances
from truestep.analysis.verdict import judge, scalar_rule
from truestep.core.names import ENV_FAULTS

MAX_STEPS, STOP, INTERVAL = 30, 15, 5
COMMON = [
    f"--train.max_steps={MAX_STEPS}",
    f"--checkpoint.interval={INTERVAL}",
    "--checkpoint.keep_last_n=0",
    "--metrics.progress=false",
]
ROWS = {
    "optimizer-restore-off": ["--checkpoint.restore_optimizer_state=false"],
    "rng-restore-off": ["--checkpoint.restore_rng_state=false"],
    "data-position-off": ["--checkpoint.restore_data_position=false"],
}
ATOMIC_OFF = ["--checkpoint.atomic_commit=false"]
TORN_SAVE = f"crash-in-save:phase=mid-shards:step={STOP}:rank=0"
DEFAULT_GRID = "1e-7,1e-6,1e-5,1e-4,3e-4,1e-3,3e-3,1e-2"


def train(run_dir: Path, *overrides: str, faults: str = "") -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(ENV_FAULTS, None)
    if faults:
        env[ENV_FAULTS] = faults
    cmd = [sys.executable, "-m", "truestep", "train", "demo", f"--run.dir={run_dir}", *COMMON, *overrides]
    with open(run_dir.parent / f"{run_dir.name}.log", "a") as log:
        return subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def must(code: int, what: str) -> None:
    if code != 0:
        raise SystemExit(f"detection_power: {what} exited {code} (see its .log beside the run directory)")


def resume_copy(half: Path, dest: Path, noise: str, *switches: str) -> Path:
    shutil.copytree(half, dest)
    must(train(dest, noise, *switches), f"resume {dest.name}")
    return dest


def layout(base: Path, args: argparse.Namespace) -> dict[str, list[Path]]:
    """Row -> the resumed run directories of one scale (and the reference and floors), by name."""
    runs: dict[str, list[Path]] = {"reference": [base / "reference"]}
    runs["floors"] = [base / f"floor-{k}" for k in range(1, args.floors + 1)]
    runs["all-on"] = [base / f"all-on-{r}-{copy}" for r in range(args.repeats) for copy in (1, 2)]
    for row in ROWS:
        runs[row] = [base / f"{row}-{r}" for r in range(args.repeats)]
    runs["atomic-commit-off"] = [base / f"atomic-commit-off-{r}" for r in range(args.repeats)]
    for d in args.grid:
        runs[f"restore-error={d:g}"] = [base / f"restore-error-{d:g}-{s}" for s in range(args.sweep_repeats)]
    return runs


def run_scale(base: Path, scale: float, args: argparse.Namespace, pool: ThreadPoolExecutor) -> None:
    """Every run of one scale, into the directories `layout` names."""
    noise = f"--train.emulate_nondeterminism={scale:g}"
    base.mkdir(parents=True)
    runs = layout(base, args)

    def full(run: Path) -> None:
        must(train(run, noise), run.name)

    def half(r: int) -> Path:
        must(train(base / f"half-{r}", noise, f"--train.stop_at_step={STOP}"), f"half-{r}")
        return base / f"half-{r}"

    def atomic(run: Path) -> None:
        train(run, noise, *ATOMIC_OFF, faults=TORN_SAVE)  # dies in the save at STOP, as intended
        must(train(run, noise, *ATOMIC_OFF), run.name)

    pending = [pool.submit(full, run) for run in runs["reference"] + runs["floors"]]
    halves = [pool.submit(half, r) for r in range(max(args.repeats, args.sweep_repeats))]
    pending += [pool.submit(atomic, run) for run in runs["atomic-commit-off"]]
    done = [f.result() for f in halves]
    for r in range(args.repeats):
        for copy in (1, 2):
            pending.append(pool.submit(resume_copy, done[r], base / f"all-on-{r}-{copy}", noise))
        for row, switches in ROWS.items():
            pending.append(pool.submit(resume_copy, done[r], base / f"{row}-{r}", noise, *switches))
    for d in args.grid:
        error = f"--train.emulate_restore_error={d:g}"
        for s, run in enumerate(runs[f"restore-error={d:g}"]):
            pending.append(pool.submit(resume_copy, done[s], run, noise, error))
    for future in pending:
        future.result()


def judge_both(run: Path, ref: RunLog, floor: FloorModel) -> tuple[str | None, bool]:
    """(the observable the envelope rule flagged it on, or None; the scalar rule flags it), from one
    comparison."""
    log = RunLog.load(run)
    c = compare(log, ref, distances(log.path, ref.path, floor.state_steps))
    v = judge(c, floor)
    return (v.violation.observable if v.violation else None), scalar_rule(c, floor) is not None


def evaluate(runs: dict[str, list[Path]]) -> dict:
    ref = RunLog.load(runs["reference"][0])
    floor = measure_floor(ref, [RunLog.load(p) for p in runs["floors"]])
    params = floor.families["params"].envelope
    result = {
        "floor_max_dloss": floor.max_dloss,
        "floor_max_dgrad_norm": floor.max_dgrad_norm,
        "floor_params_at_end": params.values[-1] if params.values else None,
        "tau": {name: fam.tau for name, fam in floor.families.items()},
        "rows": {},
    }
    for row, paths in runs.items():
        if row in ("reference", "floors"):
            continue
        flags = [judge_both(p, ref, floor) for p in paths]
        seen = Counter(f[0] for f in flags if f[0] is not None)
        result["rows"][row] = {
            "n": len(flags),
            "new": sum(f[0] is not None for f in flags),
            "scalar": sum(f[1] for f in flags),
            "seen_on": dict(seen.most_common()),
        }
    return result


def smallest(rows: dict, rule: str, grid: list[float]) -> str:
    hit = [d for d in grid if (r := rows.get(f"restore-error={d:g}")) and r["n"] and r[rule] == r["n"]]
    return f"{min(hit):g}" if hit else f"> {max(grid):g}"


def report(scale: float, res: dict, grid: list[float], args: argparse.Namespace) -> bool:
    rows = res["rows"]
    print(f"\nscale {scale:g}  (train.emulate_nondeterminism; 6e-8 is about one fp32 ulp)")
    print(
        f"  floor over {args.floors} repeats: max |Δloss| {res['floor_max_dloss']:.3g}, max |Δgrad norm| "
        f"{res['floor_max_dgrad_norm']:.3g}, params distance at step {MAX_STEPS} {res['floor_params_at_end']:.3g}"
    )
    print(f"  {'row':<34}{'envelope rule':>16}{'scalar rule':>16}   envelope rule flagged on")
    ok = True
    for row, r in rows.items():
        if row.startswith("restore-error"):
            continue
        label = "all-on (false positives)" if row == "all-on" else f"{row} (detected)"
        cells = [f"{r[k]}/{r['n']} {100 * r[k] / r['n']:5.1f} %" for k in ("new", "scalar")]
        seen = ", ".join(f"{k} {n}" for k, n in r["seen_on"].items())
        print(f"  {label:<34}{cells[0]:>16}{cells[1]:>16}   {seen}")
        rate = r["new"] / r["n"]
        ok &= rate <= 0.05 if row == "all-on" else rate >= 0.95
    print(f"  {'restore error d detected in':<34}{'':>16}{'':>16}")
    for d in grid:
        r = rows[f"restore-error={d:g}"]
        seen = ", ".join(f"{k} {n}" for k, n in r["seen_on"].items())
        print(f"    d = {d:<8g}{'':<20}{r['new']:>11}/{r['n']}{r['scalar']:>13}/{r['n']}   {seen}")
    print(
        f"  {'smallest d detected every time':<34}{smallest(rows, 'new', grid):>16}{smallest(rows, 'scalar', grid):>16}"
    )
    print(
        f"  targets (>= 95 % detected, <= 5 % false positives): {'MET' if ok else 'NOT MET'} by the envelope rule"
    )
    return ok


def plot(results: dict, grid: list[float], path: Path) -> Path:
    """Detected fraction vs restore error d, both rules, one panel per scale."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.5 * len(results), 3.6), layout="constrained")
    for index, (scale, res) in enumerate(results.items(), 1):
        ax = fig.add_subplot(1, len(results), index)
        for rule, label, color in (("new", "envelope rule", "#1565c0"), ("scalar", "scalar rule", "#9e9e9e")):
            rows = [res["rows"][f"restore-error={d:g}"] for d in grid]
            ax.plot(grid, [r[rule] / r["n"] for r in rows], "-o", color=color, label=label)
        ax.set_xscale("log")
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("restore error d (relative, every weight)")
        ax.set_ylabel("fraction of repeats flagged")
        ax.set_title(f"emulator scale {scale}: floor |Δloss| {res['floor_max_dloss']:.2g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="R=3, K=2, 2 sweep repeats, a 4-point grid")
    p.add_argument("--repeats", type=int, default=10, help="R: resumes per mechanism row (all-on: 2R)")
    p.add_argument("--floors", type=int, default=4, help="K: floor repeats")
    p.add_argument("--scales", default="6e-8,1e-2")
    p.add_argument("--grid", default=DEFAULT_GRID, help="restore errors d to sweep")
    p.add_argument("--sweep-repeats", type=int, default=3, help="resumes per restore error d")
    p.add_argument("--jobs", type=int, default=2, help="processes at a time")
    p.add_argument("--out", help="keep the runs and results.json here (default: a temporary directory)")
    p.add_argument("--reuse", action="store_true", help="judge the runs already in --out, run nothing")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.floors, args.sweep_repeats, args.grid = 3, 2, 2, "1e-6,1e-4,1e-3,1e-2"
    if args.reuse and not args.out:
        p.error("--reuse judges the runs of an earlier --out DIR: give --out")
    args.grid = [float(x) for x in args.grid.split(",")]
    scales = [float(x) for x in args.scales.split(",")]
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="detection-power-"))
    started, cpu0 = time.time(), os.times()
    # halves R, atomic-commit-off 2R (crash + resume), all-on 2R, one resume per other row
    per_scale = args.repeats * (1 + 2 + 2 + len(ROWS))
    total = len(scales) * (1 + args.floors + per_scale + args.sweep_repeats * len(args.grid))
    print(
        f"detection power: {len(scales)} scales, R={args.repeats}, K={args.floors}, "
        f"{'judging the runs in' if args.reuse else f'{total} processes ->'} {out}",
        flush=True,
    )
    results, ok = {}, True
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for scale in scales:
            base = out / f"scale-{scale:g}"
            if not args.reuse:
                run_scale(base, scale, args, pool)
            results[f"{scale:g}"] = evaluate(layout(base, args))
            print(f"  scale {scale:g}: done after {time.time() - started:.0f} s", flush=True)
    for scale in scales:
        ok &= report(scale, results[f"{scale:g}"], args.grid, args)
    cpu = os.times()
    cpu_s = cpu.children_user + cpu.children_system - cpu0.children_user - cpu0.children_system
    if args.reuse:
        print(f"\njudged the runs of {out} again (nothing run), {time.time() - started:.0f} s")
    else:
        print(f"\n{total} processes, wall {time.time() - started:.0f} s, CPU of the runs {cpu_s:.0f} s")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    if args.out:
        print(
            f"results: {out / 'results.json'}\nplot:    {plot(results, args.grid, out / 'detection_power.png')}"
        )
    else:
        shutil.rmtree(out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
