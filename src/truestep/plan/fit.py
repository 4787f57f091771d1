"""Phase costs measured from run directories: `truestep plan --from RUN_OR_EXPERIMENT`.

Nothing here parses a log a second way: the runs are read by the analysis room (`RunLog`), their spans
come from `analysis.goodput` (the report's badput buckets), their recoveries from `analysis.mttr`, an
experiment's ablation verdicts from `experiment.summary` (the one verdict), checkpoint sizes from
`checkpoint.inspect`. Each cost is the median over every sample in the runs, with the sample count.

An experiment directory pools the runs of its main group (one world size); a run directory is used
alone. Costs a run cannot show (a hang's detection when no hang was injected) come from the run's
config and say so.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from truestep.analysis.goodput import Goodput
from truestep.analysis.mttr import Incident
from truestep.analysis.runlog import RunLog, RunLogError
from truestep.analysis.summary import RunAnalysis, analyze_run
from truestep.checkpoint.inspect import list_checkpoints
from truestep.config.load import load_config
from truestep.core.names import CONFIG_FILE
from truestep.experiment.plan import ABLATION_ROWS

CRASH_FAULTS = ("kill", "crash", "crash-in-save", "corrupt")
ROW_KEYS = {
    "optimizer-restore-off": "mechanisms.optimizer_corrupts",
    "rng-restore-off": "mechanisms.rng_corrupts",
    "data-position-off": "mechanisms.data_position_corrupts",
    "atomic-commit-off": "mechanisms.atomic_commit_corrupts",
}
"""Ablation rows (experiment/plan.py) -> the plan input that says which resumes the row corrupts."""
assert set(ROW_KEYS) == set(ABLATION_ROWS) - {"all-on"}, "an ablation row without a plan input"


@dataclass
class Measured:
    source: str
    runs: int
    world: int
    values: dict[str, float] = field(default_factory=dict)
    """`section.key` -> value (median of the samples)."""
    samples: dict[str, int] = field(default_factory=dict)
    """`section.key` -> how many samples; 0 = from the run's config, not measured."""
    corrupts: dict[str, str] = field(default_factory=dict)
    """`mechanisms.*_corrupts` -> the resumes the experiment's ablation flagged."""
    params: float | None = None
    checkpoint_bytes: float | None = None
    notes: list[str] = field(default_factory=list)

    def put(self, key: str, samples: Iterable[float | None]) -> None:
        values = [float(v) for v in samples if v is not None]
        if values:
            self.values[key] = statistics.median(values)
            self.samples[key] = len(values)


def _analyses(path: Path) -> tuple[list[RunAnalysis], list[tuple[str, str, bool]]]:
    """The runs to pool, and the ablation cells as (row, mode, flagged)."""
    if (path / "experiment.json").is_file():
        from truestep.experiment.summary import summarize

        summary = summarize(path, write=False)
        main = summary.groups[0]
        cells = [(c.row, c.mode, not c.verdict.preserving) for g in summary.groups for c in g.cells]
        return list(main.runs.values()), cells
    run = RunLog.load(path)
    return [analyze_run(path.name, run, None, None)], []


def _attempt_kinds(run: RunLog, good: Goodput) -> dict[int, str]:
    """Attempt -> `first`, `in_place` (the supervisor restarted it) or `relaunch` (a new launch)."""
    launches = [e["time"] for e in run.named("supervisor_start")]
    kinds, previous = {}, None
    for attempt, began in good.attempts.items():
        if previous is None:
            kinds[attempt] = "first"
        else:
            relaunched = any(previous < t <= began for t in launches)
            kinds[attempt] = "relaunch" if relaunched else "in_place"
        previous = began
    return kinds


def _spans(good: Goodput, kind: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for s in good.spans:
        if s.kind == kind and s.attempt is not None:
            out[s.attempt] = out.get(s.attempt, 0.0) + s.duration
    return out


def _step_overhead(good: Goodput) -> list[float]:
    """Per attempt: wall between its first step's start and last step's end that is neither a step nor a
    blocking save, per step."""
    out = []
    for attempt in good.attempts:
        steps = [
            s
            for s in good.spans
            if s.attempt == attempt and s.kind in ("useful", "lost_work", "after_violation")
        ]
        if len(steps) < 2:
            continue
        lo, hi = min(s.start for s in steps), max(s.end for s in steps)
        blocking = sum(
            min(s.end, hi) - max(s.start, lo)
            for s in good.spans
            if s.attempt == attempt and s.kind == "checkpoint_blocking" and s.end > lo and s.start < hi
        )
        out.append(max(0.0, (hi - lo) - sum(s.duration for s in steps) - blocking) / len(steps))
    return out


def _training(run: RunLog, incident: Incident) -> bool:
    """Whether the incident's attempt had started its first step when the fault came."""
    lines = run.attempt_metrics(incident.attempt) if incident.attempt is not None else []
    return bool(lines) and lines[0]["time"] - lines[0]["step_time"] <= incident.fault_time


def _phase(incidents: list[Incident], kinds: tuple[str, ...], *phases: str) -> list[float | None]:
    out: list[float | None] = []
    for i in incidents:
        if i.kind in kinds:
            values = [i.phases_s.get(p) for p in phases]
            out.append(None if any(v is None for v in values) else sum(v for v in values if v is not None))
    return out


def measure(path: Path) -> Measured:
    """Fit every cost the runs under `path` show (an experiment directory or one run directory)."""
    analyses, cells = _analyses(path)
    runs = [(a, RunLog.load(a.path)) for a in analyses]
    worlds = {e["layout"]["world_size"] for _, r in runs for e in r.named("run_start") if "layout" in e}
    if len(worlds) != 1:
        raise RunLogError(f"{path}: the runs pooled for costs have world sizes {sorted(worlds) or 'unknown'}")
    m = Measured(str(path), len(runs), worlds.pop())
    events = [(r, e) for _, r in runs for e in r.events]
    m.put("job.step_time_s", (line["step_time"] for _, r in runs for line in r.final_steps.values()))
    m.put("job.step_overhead_s", (v for a, _ in runs for v in _step_overhead(a.goodput)))
    m.put("job.tokens_per_step", (r.tokens_per_step for _, r in runs))
    saves = [e for _, e in events if e["event"] == "checkpoint_save" and e.get("reason") == "interval"]
    m.put("costs.save_blocking_s", (e.get("blocking_s") for e in saves))
    m.put("costs.save_write_s", (e.get("write_s") for _, e in events if e["event"] == "checkpoint_written"))
    m.put("costs.save_commit_s", (e.get("commit_s") for _, e in events if e["event"] == "checkpoint_commit"))
    m.put("costs.restore_s", (e.get("restore_s") for _, e in events if e["event"] == "checkpoint_restore"))
    cold, in_place, requeue = [], [], []
    for a, r in runs:
        kinds, startup, wait = (
            _attempt_kinds(r, a.goodput),
            _spans(a.goodput, "startup"),
            _spans(a.goodput, "requeue_wait"),
        )
        for attempt, kind in kinds.items():
            if kind == "in_place":  # wait + start-up together: a template still importing shows as wait
                in_place.append(wait.get(attempt, 0.0) + startup.get(attempt, 0.0))
            else:
                cold.append(startup.get(attempt))
                if kind == "relaunch":
                    requeue.append(wait.get(attempt))
    m.put("costs.startup_cold_s", cold)
    m.put("costs.requeue_delay_s", requeue)
    incidents = [i for a, _ in runs for i in a.incidents]
    m.put("costs.detect_crash_s", _phase(incidents, CRASH_FAULTS, "detect"))
    m.put("costs.detect_hang_s", _phase(incidents, ("hang",), "detect"))
    m.put("costs.teardown_s", _phase(incidents, (*CRASH_FAULTS, "hang"), "teardown"))
    # A signal during start-up is acted on once the ranks are up: only a stop from training is a sample.
    training = [i for a, r in runs for i in a.incidents if i.kind == "term" and _training(r, i)]
    m.put("costs.graceful_stop_s", _phase(training, ("term",), "detect", "teardown"))
    # A restart in place: the supervisor's relaunch (teardown done -> the attempt starts), then the rest
    # of what it took until the first step, restore excluded, as start-up.
    m.put("costs.restart_delay_s", _phase(incidents, (*CRASH_FAULTS, "hang"), "relaunch"))
    if in_place:
        m.put(
            "costs.startup_warm_s",
            [max(0.0, t - m.values.get("costs.restart_delay_s", 0.0)) for t in in_place],
        )
    config = load_config(str(Path(analyses[0].path) / CONFIG_FILE))
    if not config.resilience.warm_standby:
        m.notes.append("the runs had no warm standby: startup_warm_s is a cold restart in place")
    if "costs.detect_hang_s" not in m.values:
        r = config.resilience
        longest = max(
            (line["step_time"] for _, run in runs for line in run.final_steps.values()), default=0.0
        )
        m.values["costs.detect_hang_s"] = r.hang_allowance(longest)[0]
        m.samples["costs.detect_hang_s"] = 0
        m.notes.append(
            "no hang was injected: hang detection is the run's max(resilience.hang_timeout_s, "
            "hang_step_multiple x its longest step)"
        )
    _snapshots(m, runs)
    _other(m, runs)
    _sizes(m, runs)
    _corrupts(m, cells)
    return m


def _snapshots(m: Measured, runs: list[tuple[RunAnalysis, RunLog]]) -> None:
    """Peer snapshots' costs where the runs took them: the capture and the agreement per snapshot (what
    training waited: the update for the capture, inside a step's time, and the agreement, between
    steps) and the restore from memory. The
    stalls come out of the step time and the between-step overhead, so that a plan charges them once,
    through mechanisms.snapshot_every_steps, and a plan with snapshots off does not pay them."""
    agreed = [e for _, r in runs for e in r.named("snapshot_agreed")]
    m.put("costs.memory_restore_s", (e.get("restore_s") for _, r in runs for e in r.named("memory_restore")))
    if not agreed:
        return
    wait = [float(e.get("wait_s", 0.0)) for e in agreed]
    blocked = [float(e.get("blocked_s", 0.0)) for e in agreed]
    m.put("costs.snapshot_capture_s", (e.get("capture_s") for e in agreed))
    m.put("costs.snapshot_agree_s", blocked)
    steps = sum(len(r.final_steps) for _, r in runs)
    if steps:
        for key, part in (("job.step_time_s", sum(wait)), ("job.step_overhead_s", sum(blocked))):
            if key in m.values:
                m.values[key] = max(0.0, m.values[key] - part / steps)
    m.notes.append(
        f"the runs took peer snapshots ({len(agreed)} agreed): their stalls are taken out of step_time_s and "
        "step_overhead_s and charged through costs.snapshot_capture_s and snapshot_agree_s when "
        "mechanisms.snapshot_every_steps > 0"
        + (
            ""
            if any("wait_s" in e for e in agreed)
            else " (their events predate wait_s: the update's wait is missed)"
        )
    )


def _other(m: Measured, runs: list[tuple[RunAnalysis, RunLog]]) -> None:
    """Per attempt: the report's `other` less what the simulation adds to it itself (between-step
    overhead, the final save's wait for its commit, a graceful stop's part after its save). From the
    runs without injected faults when there are any: an attempt killed before its `run_start` leaves no
    start-up span, so its whole life is `other` in the report, while the simulation counts it as start-up."""
    overhead = m.values.get("job.step_overhead_s", 0.0)
    final_wait = max(
        0.0,
        m.values.get("costs.save_write_s", 0.0)
        + m.values.get("costs.save_commit_s", 0.0)
        - m.values.get("costs.save_blocking_s", 0.0),
    )
    stop_rest = max(
        0.0, m.values.get("costs.graceful_stop_s", 0.0) - m.values.get("costs.save_blocking_s", 0.0)
    )
    clean = [(a, r) for a, r in runs if not r.named("fault_injected")]
    per_attempt = []
    for a, r in clean or runs:
        terms = sum(1 for i in a.incidents if i.kind == "term")
        rest = a.goodput.badput_s["other"] - overhead * len(r.metrics) - final_wait - stop_rest * terms
        per_attempt.append(max(0.0, rest) / max(1, len(a.goodput.attempts)))
    m.put("costs.other_per_attempt_s", per_attempt)
    if not clean:
        m.notes.append(
            "every run had faults: other_per_attempt_s is fitted from them and includes the life of any "
            "attempt killed before it logged run_start"
        )


def _sizes(m: Measured, runs: list[tuple[RunAnalysis, RunLog]]) -> None:
    from truestep.plan.scaling import count_params

    m.params = count_params(str(Path(runs[0][0].path) / CONFIG_FILE))
    sizes = [
        c["size_bytes"]
        for _, r in runs
        for c in list_checkpoints(r.path, checksums=False)
        if c["committed"] and c["status"] == "ok"
    ]
    if sizes:  # shown beside the scaling model's bytes_per_param, which it does not replace: at this
        # size per-rank state and metadata weigh as much as a few bytes per parameter
        m.checkpoint_bytes = statistics.median(sizes)


def _corrupts(m: Measured, cells: list[tuple[str, str, bool]]) -> None:
    for row, key in ROW_KEYS.items():
        mine = [(mode, flagged) for r, mode, flagged in cells if r == row]
        if not mine:
            continue
        if row == "atomic-commit-off":  # both of its cells crash inside a save: a torn checkpoint
            m.corrupts[key] = "torn" if any(flagged for _, flagged in mine) else ""
        else:
            m.corrupts[key] = ",".join(sorted({mode for mode, flagged in mine if flagged}))
    if any(flagged for r, _, flagged in cells if r == "all-on"):
        m.notes.append("an all-on ablation cell was flagged: truestep itself did not preserve a resume there")
