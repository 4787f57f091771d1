"""What a run looks like next to its failure-free same-seed reference, observable by observable.

`compare` computes, once, everything the verdict, the goodput, the report and its figures use (they
never recompute it): per step of the reference, the difference of every observable of the two metrics
lines (analysis keeps none of them out: telemetry/lines.py says which fields are bookkeeping) and
whether the two lines are bit-identical; the steps the run lacks (missing) and the steps the reference
lacks (unverifiable); the steps computed by an attempt with another config (foreign); every step the
run logged twice, its pre-fault line next to the recomputed one (replays); the parameter digests at
every step both logged one; the per-tensor distances of parameters and optimizer moments at the
checkpoint steps both kept (analysis/state.py); the per-resume windows. docs/measures.md has the
definitions; analysis/verdict.py judges them against the floor, and counts what it could not compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import fmean

from truestep.analysis.provenance import differences as provenance_differences
from truestep.analysis.restores import restore_events
from truestep.analysis.runlog import RunLog, RunLogError, finite_abs_diff
from truestep.analysis.state import StateDistance, checkpoints
from truestep.config.fingerprint import diff_keys
from truestep.telemetry.lines import determined, line_differences

DEFAULT_MARGIN = 2.0
LOSS, GRAD_NORM = "loss", "grad_norm"


@dataclass(frozen=True)
class StepDelta:
    """One step of the reference, seen in the run."""

    step: int
    deltas: dict[str, float]
    """Observable -> |run - reference| (inf when one side is non-finite) for every observable both lines
    logged."""
    bitwise: bool
    """Every observable of the two lines has the same bits, and both lines log the same observables."""
    one_sided: tuple[str, ...] = ()
    """Observables only one of the two lines logged: not compared."""

    @property
    def dloss(self) -> float:
        return self.deltas.get(LOSS, math.inf)

    @property
    def dgrad_norm(self) -> float:
        return self.deltas.get(GRAD_NORM, math.inf)


@dataclass(frozen=True)
class Replay:
    """A step the run logged more than once: an earlier (pre-fault) line next to the line it is judged on
    (the one recomputed after the restart or rollback). Under "nothing is wrong" the two say the same."""

    step: int
    attempt: int
    """The attempt that wrote the earlier line."""
    judged_attempt: int
    deltas: dict[str, float]
    """Observable -> |earlier - judged| for every observable both lines logged."""
    differs: tuple[str, ...]
    """Observables that are not bit-identical (or logged by one line only)."""


@dataclass(frozen=True)
class Window:
    """The steps after one resume (computed by the attempt that resumed)."""

    resumed_at: int
    steps: int
    max_dloss: float
    mean_dloss: float
    max_dgrad_norm: float
    layout_changed: bool


@dataclass
class Comparison:
    steps: list[StepDelta]
    """Every step of the reference that the run also has, in step order (foreign steps included: a
    difference there is still a difference from the reference)."""
    missing_steps: list[int]
    """Steps of the reference the run never logged: it did not get there."""
    unverifiable_steps: list[int]
    """Steps of the run the reference does not have (a longer run, a reference that stopped early, or
    lines a stale attempt left past the job's end): nothing to compare them with."""
    digests: dict[int, bool]
    """Step -> the parameter digests of run and reference are equal (steps where both logged one)."""
    state: list[StateDistance] = field(default_factory=list)
    """Parameter and optimizer-moment distances at the checkpoint steps that were read."""
    windows: list[Window] = field(default_factory=list)
    layout_changed: bool = False
    foreign_steps: list[int] = field(default_factory=list)
    """Steps of the run computed by an attempt whose config fingerprint is not the reference's (or
    unknown): compared, but the reference cannot vouch for them, so they never count as agreement."""
    config_mismatch: list[str] = field(default_factory=list)
    """One phrase per such attempt, naming the keys that differ where both logged them."""
    replays: list[Replay] = field(default_factory=list)
    """Every earlier line of a step the run logged again (pre-fault line vs the recomputed one)."""
    replays_not_compared: list[int] = field(default_factory=list)
    """Steps whose earlier line was written at or after a step the NaN guard skipped in that attempt:
    a failed computation, expected to differ, so not compared."""
    digest_replays: dict[int, bool] = field(default_factory=dict)
    """Step -> every earlier digest logged for the step equals the judged one (steps saved again)."""
    checkpoint_steps: list[int] = field(default_factory=list)
    """Steps at which both the run and the reference kept a committed checkpoint under
    `<run>/checkpoints/`: where state distances can be taken."""
    run_only_checkpoints: list[int] = field(default_factory=list)
    """Checkpoint steps the run kept and the reference did not (an emergency save, another retention):
    nothing to compare them with; reported as unseen, not required."""
    state_read: bool = True
    """False when the caller chose not to read checkpoints (--skip-state)."""
    final_step: int | None = None
    """The reference's last step: where the final parameters are compared."""
    declared_gaps: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)
    """Evidence the run's own log says is missing, as (what, steps, detail): evidence_gap events
    (analysis/runlog.py), e.g. `truestep audit`'s fault that never fired or restart that started over."""
    final_checkpoint_lost: bool = False
    """The run's logs say its judged attempt committed a checkpoint at the final step, and none is on
    disk: the digest its logs claim for the final parameters cannot be re-read."""
    provenance: list[str] = field(default_factory=list)
    """What the run's recorded provenance (code, data, init source, torch) says that the reference's
    does not (analysis/provenance.py); empty: the same. Non-empty only where the caller compared anyway."""

    @property
    def config_differs(self) -> bool:
        """Some attempt of the run had a config fingerprint other than the reference's."""
        return bool(self.config_mismatch)

    @property
    def steps_compared(self) -> int:
        return len(self.steps)

    @property
    def max_dloss(self) -> float:
        return max((d.dloss for d in self.steps), default=0.0)

    @property
    def mean_dloss(self) -> float:
        return _mean([d.dloss for d in self.steps])

    @property
    def max_dgrad_norm(self) -> float:
        return max((d.dgrad_norm for d in self.steps), default=0.0)

    @property
    def fraction_bitwise_equal(self) -> float:
        total = len(self.steps) + len(self.missing_steps)
        return sum(d.bitwise for d in self.steps) / total if total else 1.0

    @property
    def first_divergent_step(self) -> int | None:
        """First step at which anything observable is not bit-identical: an observable of a metrics line,
        a missing step, a parameter digest, a nonzero state distance, a step whose pre-fault line
        differs from its recomputed one."""
        found = [d.step for d in self.steps if not d.bitwise] + self.missing_steps
        found += [s for s, equal in self.digests.items() if not equal]
        found += [d.step for d in self.state if d.nonzero]
        found += [r.step for r in self.replays if r.differs]
        found += [s for s, equal in self.digest_replays.items() if not equal]
        return min(found, default=None)

    @property
    def bitwise(self) -> bool:
        return self.first_divergent_step is None


def _mean(values: list[float]) -> float:
    if not values:
        return 0.0
    return fmean(values) if all(map(math.isfinite, values)) else math.inf


def _deltas(got: dict, want: dict) -> tuple[dict[str, float], tuple[str, ...]]:
    a, b = determined(got), determined(want)
    deltas = {k: finite_abs_diff(float(a[k]), float(b[k])) for k in sorted(set(a) & set(b))}
    return deltas, tuple(sorted(set(a) ^ set(b)))


def step_delta(step: int, got: dict, want: dict) -> StepDelta:
    deltas, one_sided = _deltas(got, want)
    return StepDelta(step, deltas, not line_differences(got, want), one_sided)


def step_deltas(run: RunLog, ref: RunLog, steps: set[int] | None = None) -> list[StepDelta]:
    """Every step of `ref` the run also has (restricted to `steps` when given)."""
    return [
        step_delta(step, run.final_steps[step], want)
        for step, want in ref.final_steps.items()
        if step in run.final_steps and (steps is None or step in steps)
    ]


def replays(run: RunLog) -> tuple[list[Replay], list[int]]:
    """Each earlier line of a step logged more than once, next to the judged line; and the steps whose
    earlier line came from a computation the NaN guard had already rejected (not compared)."""
    found, skipped = [], []
    for line in run.superseded:
        step, attempt = line["step"], int(line["attempt"])
        judged = run.final_steps[step]
        if any(k <= step for k in run.skipped_steps(attempt)):
            skipped.append(step)
            continue
        deltas, _ = _deltas(line, judged)
        differs = tuple(line_differences(line, judged))
        found.append(Replay(step, attempt, int(judged["attempt"]), deltas, differs))
    return found, sorted(set(skipped))


def config_differences(run: RunLog, ref: RunLog, attempt: int | None = None) -> str:
    """What differs between an attempt of `run` (its first by default) and the reference's config: the
    keys, where both logged them; otherwise the fingerprints. Empty: the same config."""
    prints = run.attempt_fingerprints()
    if attempt is None:
        attempt = min(prints, default=0)
    ours, theirs = prints.get(attempt), (ref.fingerprints() or [None])[0]
    if ours is not None and ours == theirs:
        return ""
    if ours is None:
        return f"attempt {attempt} logged no config fingerprint"
    keys, ref_keys = run.trajectory_keys(attempt), ref.trajectory_keys()
    changed = diff_keys(ref_keys, keys) if keys is not None and ref_keys is not None else []
    if changed:
        return "; ".join(changed)
    return f"config fingerprint {ours}, the reference's {theirs}"


def check_comparable(run: RunLog, ref: RunLog) -> None:
    """Refuse (exit 3) to judge a run of another experiment: its first attempt's config is not the
    reference's. A later attempt with another config (a resume that changed it) is judged, and its
    steps are counted as evidence the reference cannot vouch for."""
    differences = config_differences(run, ref)
    if differences:
        raise RunLogError(
            f"{run.path} is not a run of the reference's experiment ({differences}); give --compare-anyway "
            "to see the distances (the verdict is then INCOMPLETE)"
        )


def _foreign(run: RunLog, ref: RunLog) -> tuple[list[int], list[str]]:
    prints = run.attempt_fingerprints()
    want = (ref.fingerprints() or [None])[0]
    bad = {a for a in {int(m["attempt"]) for m in run.metrics} if prints.get(a) is None or prints[a] != want}
    steps = [s for s, line in run.final_steps.items() if int(line["attempt"]) in bad]
    phrases = [
        f"attempt {a}: {config_differences(run, ref, a) or 'no run_start logged'}" for a in sorted(bad)
    ]
    return steps, phrases


def _digest_replays(run: RunLog) -> dict[int, bool]:
    judged = run.digests()
    return {
        step: all(d == judged[step] for _, d in records)
        for step, records in run.digest_records().items()
        if len(records) > 1
    }


def _windows(run: RunLog, deltas: dict[int, StepDelta]) -> list[Window]:
    """One window per resume: the final-trajectory steps computed by the attempt that resumed (an
    attempt's first restore; a later NaN rollback inside it is not a resume)."""
    windows, seen = [], set()
    for event in restore_events(run):  # from disk or from memory
        attempt = event.get("attempt")
        if attempt in seen:
            continue
        seen.add(attempt)
        mine = [
            deltas[s] for s, line in run.final_steps.items() if line["attempt"] == attempt and s in deltas
        ]
        dl = [d.dloss for d in mine]
        windows.append(
            Window(
                resumed_at=event["step"],
                steps=len(mine),
                max_dloss=max(dl, default=0.0),
                mean_dloss=_mean(dl),
                max_dgrad_norm=max((d.dgrad_norm for d in mine), default=0.0),
                layout_changed=bool(event.get("layout_changed")),
            )
        )
    return windows


def _final_checkpoint_lost(run: RunLog, final: int | None, kept: dict[int, object]) -> bool:
    """The attempt that computed the final step logged a commit of its checkpoint, and it is not kept."""
    line = run.final_steps.get(final) if final is not None else None
    if line is None or final in kept:
        return False
    return any(
        e.get("step") == final and e.get("attempt") == line["attempt"] for e in run.named("checkpoint_commit")
    )


def compare(run: RunLog, ref: RunLog, state: list[StateDistance] | None = None) -> Comparison:
    """Everything observable about `run` next to `ref`. `state` is analysis.state.distances(run, ref)
    when the checkpoints were read (they are read once, by the caller that knows which steps count;
    None: not read)."""
    foreign, mismatch = _foreign(run, ref)
    deltas = step_deltas(run, ref)
    ref_digests, run_digests = ref.digests(), run.digests()
    found, not_compared = replays(run)
    kept, ref_kept = checkpoints(run.path), checkpoints(ref.path)
    final = max(ref.final_steps, default=None)
    return Comparison(
        steps=deltas,
        missing_steps=[s for s in ref.final_steps if s not in run.final_steps],
        unverifiable_steps=[s for s in run.final_steps if s not in ref.final_steps],
        digests={s: run_digests[s] == d for s, d in ref_digests.items() if s in run_digests},
        state=list(state or []),
        windows=_windows(run, {d.step: d for d in deltas}),
        layout_changed=bool(run.layout_changes()),
        foreign_steps=foreign,
        config_mismatch=mismatch,
        replays=found,
        replays_not_compared=not_compared,
        digest_replays=_digest_replays(run),
        checkpoint_steps=sorted(s for s in ref_kept if s in kept),
        run_only_checkpoints=sorted(s for s in kept if s not in ref_kept),
        state_read=state is not None,
        final_step=final,
        declared_gaps=run.declared_gaps(),
        final_checkpoint_lost=_final_checkpoint_lost(run, final, kept),
        provenance=provenance_differences(run, ref),
    )
