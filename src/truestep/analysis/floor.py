"""The same-seed floor: how far failure-free same-seed runs land from the reference, per observable and
per step, and the thresholds calibrated on them.

Observables ("families"): the difference of every observable of a metrics line (loss, grad norm, lr,
tokens seen, ...) at every step, parameter-digest equality wherever both runs logged one, and the
per-kind state distances (params, exp_avg, exp_avg_sq, step) at the checkpoint steps every floor run
kept. With K distinct repeats, r = 2 if K >= 3 else 1, and for each family:

- the **envelope** E(s) is the r-th largest, over the repeats, of each repeat's running maximum of the
  family's value at steps <= s + LOOKAHEAD (2): platform noise drifts (tiny early, large late), so the
  band grows with the run; taking the second largest from K = 3 on means one odd repeat (a transient
  spike) cannot widen it. Where the floor is not bitwise, loss and grad-norm envelopes are at least one
  fp32 ulp of the reference's value (the resolution of the logged number);
- the **threshold multiplier** tau = margin x max(1, the r-th largest leave-one-out statistic), each
  repeat judged against the envelope of the others (same r): one odd repeat cannot inflate it either.
  For exchangeable runs a failure-free run then exceeds tau x E in that family with probability at most
  r / (K + 1), whatever the noise distribution (`guarantee`; docs/measures.md has the argument).

Floor runs are validated first, loudly (RunLogError, exit 3): failure-free, finite, one config and one
attempt, the reference's fingerprint, steps and layout (another layout only when asked for, and then
labelled), not the reference itself. Repeats that are the same run (a copy: identical start times) or,
at a nonzero floor, carry bit-identical observables (to each other, or to the reference) count once: K
counts distinct draws. Fewer than 2 at a nonzero floor is an insufficient floor (analysis/verdict.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from truestep.analysis.draws import independent
from truestep.analysis.fidelity import DEFAULT_MARGIN, GRAD_NORM, LOSS, Comparison, compare
from truestep.analysis.provenance import check_provenance, same_run
from truestep.analysis.provenance import differences as provenance_differences
from truestep.analysis.provenance import ownership_problem as owned_problem
from truestep.analysis.restores import restore_events
from truestep.analysis.runlog import RunLog, RunLogError
from truestep.analysis.state import checkpoints, distances
from truestep.telemetry.lines import determined

DIGEST = "digest"
STEP_FAMILIES = (LOSS, GRAD_NORM)
ROBUST_FROM = 3
"""From this many distinct repeats on, envelopes and thresholds use the second largest value, not the
largest: one odd repeat changes neither."""
MIN_REPEATS = 2
"""Distinct repeats needed before a nonzero floor can judge anything."""


@dataclass(frozen=True)
class Envelope:
    """A family's floor as a step function: `values[j]` holds for steps[j] (the steps every repeat observed)."""

    steps: list[int]
    values: list[float]

    def at(self, step: int) -> float | None:
        """The envelope at an observed step; None where the floor has no observation (not judged)."""
        try:
            return self.values[self.steps.index(step)]
        except ValueError:
            return None


@dataclass
class FamilyFloor:
    family: str
    envelope: Envelope
    tau: float
    """A run's value v at step s violates the floor iff v > tau * E(s) (with E(s) = 0: iff v > 0)."""
    loo: list[float] = field(default_factory=list)
    """Leave-one-out statistic of each repeat: max over steps of its value / the others' envelope."""

    @property
    def calibrated(self) -> bool:
        return len(self.loo) >= MIN_REPEATS


@dataclass
class FloorModel:
    repeats: list[str]
    """The distinct floor runs the floor is made of (empty: no floor measured, exact equality assumed)."""
    margin: float
    bitwise: bool
    """Every repeat was bit-identical to the reference in every observable."""
    families: dict[str, FamilyFloor]
    comparisons: list[Comparison]
    """Each distinct repeat against the reference (what the envelope is made of; drawn in the report)."""
    state_steps: list[int]
    """Checkpoint steps the reference and every repeat kept: where state distances are judged."""
    notes: list[str] = field(default_factory=list)
    """Floor runs given but not counted as draws, and why (a copy, bit-identical observables)."""
    cross_layout: bool = False
    """Some repeat ran in another layout than the reference (allowed only when asked for)."""
    layouts: list[str] = field(default_factory=list)
    """The layouts of the reference and the repeats, reference first."""
    precision: list[str] = field(default_factory=list)
    """One phrase per observable the reference declared it logged rounded: compared at that precision
    (`precision_notes`)."""
    provenance: list[str] = field(default_factory=list)
    """How repeats' provenance differs from the reference's, where the caller accepted it (labelled)."""

    @property
    def k(self) -> int:
        return len(self.repeats)

    @property
    def order(self) -> int:
        """r: envelopes and tau use the r-th largest value (2 from ROBUST_FROM repeats on)."""
        return 2 if self.k >= ROBUST_FROM else 1

    @property
    def insufficient(self) -> bool:
        """A nonzero floor with fewer than MIN_REPEATS distinct repeats: no threshold can be calibrated."""
        return not self.bitwise and self.k < MIN_REPEATS

    @property
    def guarantee(self) -> float | None:
        """Upper bound on the chance that a failure-free run exceeds one family's threshold, for
        exchangeable runs (None where the floor is bitwise or insufficient)."""
        return None if self.bitwise or self.insufficient else self.order / (self.k + 1)

    @property
    def source(self) -> str:
        label = "measured" if self.repeats else "assumed-exact"
        return f"{label}, cross-layout" if self.cross_layout else label

    @property
    def label(self) -> str:
        """How the floor was obtained, in a phrase: what every report and CLI line says about it."""
        layout = " (CROSS-LAYOUT: " + " / ".join(self.layouts) + ")" if self.cross_layout else ""
        layout += " (PROVENANCE DIFFERS: " + "; ".join(self.provenance) + ")" if self.provenance else ""
        if not self.repeats:
            return "no floor measured (exact equality assumed)" + layout
        if self.bitwise:
            return f"bitwise over {self.k} distinct repeat{'s' if self.k > 1 else ''}{layout}"
        if self.insufficient:
            return f"INSUFFICIENT: {self.k} distinct repeat, {MIN_REPEATS} needed at a nonzero floor{layout}"
        robust = "the 2nd-largest" if self.order == 2 else "the largest"
        return (
            f"calibrated over {self.k} distinct repeats (threshold {self.margin:g} x {robust} leave-one-out "
            f"statistic; a failure-free run exceeds it in one observable with probability <= "
            f"{self.order}/{self.k + 1} = {100 * self.order / (self.k + 1):.0f} %){layout}"
        )

    @property
    def max_dloss(self) -> float:
        return max((c.max_dloss for c in self.comparisons), default=0.0)

    @property
    def max_dgrad_norm(self) -> float:
        return max((c.max_dgrad_norm for c in self.comparisons), default=0.0)


def ratio(value: float, envelope: float) -> float:
    """value / envelope, with 0/0 = 0, v/0 = inf, and inf/inf = 0 (an uninformative envelope)."""
    if envelope == 0:
        return math.inf if value > 0 else 0.0
    if math.isinf(envelope):
        return 0.0
    return value / envelope


def f32_ulp(x: float) -> float:
    """The spacing of fp32 numbers at x: the resolution of a logged fp32 value."""
    if not math.isfinite(x) or x == 0:
        return 2.0**-149
    _, exponent = math.frexp(abs(x))
    return 2.0 ** (exponent - 24)


def observations(c: Comparison) -> dict[str, dict[int, float]]:
    """Family -> step -> the run's value of that observable against the reference."""
    out: dict[str, dict[int, float]] = {LOSS: {}, GRAD_NORM: {}}
    for d in c.steps:
        for name, value in d.deltas.items():
            out.setdefault(name, {})[d.step] = value
    out[DIGEST] = {s: 0.0 if equal else math.inf for s, equal in c.digests.items()}
    for sd in c.state:
        for kind, value in sd.totals.items():
            out.setdefault(kind, {})[sd.step] = value
    return out


LOOKAHEAD = 2
"""The envelope at step s also takes the repeats' values up to s + LOOKAHEAD: a deviation measured at
one step is a single noisy draw (grad norm carries each step's fresh noise), and the first steps would
otherwise be judged against a maximum of K numbers."""


def _running_max(values: dict[int, float], steps: list[int]) -> list[float]:
    out, running, ahead = [], 0.0, 0
    for step in steps:
        while ahead < len(steps) and steps[ahead] <= step + LOOKAHEAD:
            running = max(running, values[steps[ahead]])
            ahead += 1
        out.append(running)
    return out


def _envelope(floors: list[dict[int, float]], resolution: dict[int, float], order: int) -> Envelope:
    """The r-th largest (r = `order`) of the repeats' running maxima, at least the resolution."""
    steps = sorted(set.intersection(*(set(f) for f in floors))) if floors else []
    runs = [_running_max(f, steps) for f in floors]
    values = []
    for j, step in enumerate(steps):
        ranked = sorted((r[j] for r in runs), reverse=True)
        values.append(max(ranked[min(order, len(ranked)) - 1], resolution.get(step, 0.0)))
    return Envelope(steps, values)


def _statistic(run: dict[int, float], envelope: Envelope) -> float:
    return max(
        (ratio(run[s], v) for s, v in zip(envelope.steps, envelope.values, strict=True) if s in run),
        default=0.0,
    )


def _resolutions(ref: RunLog, comparisons: list[Comparison]) -> dict[str, dict[int, float]]:
    """Family -> step -> the smallest difference the family can resolve there: one fp32 ulp of the
    reference's logged value (every observable of a metrics line), of the L2 norm of the reference's
    tensors of a state kind (at a checkpoint), or the rounding step a run declared for an observable (a
    trainer that logs the loss at 4 decimals cannot show a change below 1e-4), whichever is larger. No
    envelope falls below it, so a repeat that is too close (zero where the others are not) cannot make a
    leave-one-out statistic, or a threshold, infinite."""
    out: dict[str, dict[int, float]] = {}
    for s, line in ref.final_steps.items():
        for name, value in determined(line).items():
            out.setdefault(name, {})[s] = f32_ulp(float(value))
    for c in comparisons:
        for d in c.state:
            for kind, norm in d.scale.items():
                out.setdefault(kind, {})[d.step] = f32_ulp(norm)
    for name, step in ref.precision().items():
        held = out.setdefault(name, {})
        for s in ref.final_steps:
            held[s] = max(held.get(s, 0.0), step)
    return out


def precision_notes(ref: RunLog) -> list[str]:
    """What the report says about observables logged rounded: compared at the precision logged."""
    return [
        f"{name} was logged rounded to {step:g} (declared by the run): compared at that precision, "
        "a smaller change cannot be seen"
        for name, step in sorted(ref.precision().items())
    ]


def validate_run(run: RunLog, role: str) -> None:
    """A reference or floor run must be one failure-free, finite attempt of one config that ran to its
    end and logged how it started and ended: missing logs are not evidence of a clean run."""
    where = f"{role} {run.path}"
    if not run.final_steps:
        raise RunLogError(f"{where} logged no steps")
    if not run.named("run_start") or not run.fingerprints():
        raise RunLogError(f"{where} has no run_start with a config fingerprint (events.jsonl missing?)")
    faults = run.fault_specs()
    if faults:
        raise RunLogError(f"{where} had injected faults ({'; '.join(faults)}): it must be failure-free")
    if restore_events(run):
        raise RunLogError(
            f"{where} resumed (from a checkpoint or peers' memory): it must run uninterrupted from step 0"
        )
    attempts = sorted({int(m["attempt"]) for m in run.metrics})
    if len(attempts) > 1 or len(run.metrics) != len(run.final_steps):
        raise RunLogError(
            f"{where} logged steps more than once or in several attempts ({attempts}): it restarted"
        )
    problem = owned_problem(run)
    if problem:
        raise RunLogError(f"{where} holds another run's logs ({problem})")
    for s, m in run.final_steps.items():
        bad = sorted(k for k, v in determined(m).items() if not math.isfinite(v))
        if bad:
            what = "loss or grad norm" if set(bad) & {LOSS, GRAD_NORM} else "observable"
            raise RunLogError(f"{where} has a non-finite {what} at step {s} ({', '.join(bad)})")
    if len(run.fingerprints()) > 1:
        raise RunLogError(f"{where} changed its config between attempts: {', '.join(run.fingerprints())}")
    last = max(run.final_steps)
    digest = run.logs_param_digest()  # a run that declared it cannot log one still must have ended
    ends = [e for e in run.named("run_end") if e.get("step") == last and ("param_digest" in e or not digest)]
    if not ends:
        what = "a run_end with a parameter digest" if digest else "a run_end"
        raise RunLogError(f"{where} logged no {what} at its last step {last}")
    planned = [e["max_steps"] for e in run.named("run_start") if isinstance(e.get("max_steps"), int)]
    reason = ends[-1].get("reason", "completed")
    if reason not in ("completed", "final") or (planned and last != planned[0]):
        target = f" of {planned[0]}" if planned else ""
        raise RunLogError(
            f"{where} stopped at step {last}{target} ({reason}): a reference or floor must run to its end"
        )


def _span(steps: list[int]) -> str:
    return f"{steps[0]}..{steps[-1]} ({len(steps)})" if steps else "none"


def _validate_repeat(repeat: RunLog, ref: RunLog, cross_layout: bool, any_provenance: bool) -> list[str]:
    """Refuse a repeat that is no same-seed repeat of the reference; returns its provenance
    differences where the caller accepts them (`any_provenance`)."""
    if repeat.path.resolve() == ref.path.resolve():
        raise RunLogError(f"floor run {repeat.path} is the reference itself: a floor must be other runs")
    validate_run(repeat, "floor run")
    differs = provenance_differences(repeat, ref)
    if differs and not any_provenance:
        check_provenance(repeat, ref, "floor run")
    absent = next(
        (
            (s, sorted(set(determined(line)) ^ set(determined(repeat.final_steps[s]))))
            for s, line in ref.final_steps.items()
            if s in repeat.final_steps and set(determined(line)) != set(determined(repeat.final_steps[s]))
        ),
        None,
    )
    if absent is not None:
        raise RunLogError(
            f"floor run {repeat.path} and the reference log different observables at step {absent[0]} "
            f"({', '.join(absent[1])}): every observable judged needs a floor"
        )
    if repeat.fingerprints() != ref.fingerprints():
        raise RunLogError(
            f"floor run {repeat.path} has config fingerprint {', '.join(repeat.fingerprints())}, the "
            f"reference {', '.join(ref.fingerprints())}: a floor must be the same seed and config"
        )
    if list(repeat.final_steps) != list(ref.final_steps):
        raise RunLogError(
            f"floor run {repeat.path} has steps {_span(list(repeat.final_steps))}, the reference "
            f"{_span(list(ref.final_steps))}: a floor must cover exactly the reference's steps"
        )
    if not cross_layout and repeat.layouts() != ref.layouts():
        raise RunLogError(
            f"floor run {repeat.path} ran in layout {', '.join(repeat.layouts()) or 'unknown'}, the reference "
            f"in {', '.join(ref.layouts()) or 'unknown'}: a floor of another layout measures other noise "
            "(give --cross-layout-floor to use it anyway; the floor is then labelled cross-layout)"
        )
    return differs


def _distinct(ref: RunLog, repeats: list[RunLog]) -> tuple[list[RunLog], list[str]]:
    """Repeats that are separate runs: not a copy of the reference or of an earlier repeat."""
    kept: list[RunLog] = []
    notes = []
    for repeat in repeats:
        twin = next((str(o.path) for o in kept if same_run(o, repeat)), None)
        twin = "the reference" if same_run(ref, repeat) else twin
        if twin is not None:
            notes.append(f"{repeat.path} is a copy of {twin} (same run): not counted")
            continue
        kept.append(repeat)
    return kept, notes


def _check_finite(repeats: list[RunLog], comparisons: list[Comparison]) -> None:
    """Every observation a repeat contributes must be a number: an infinite state distance (a tensor
    in one checkpoint only, or of another shape) would make its family's envelope infinite."""
    for repeat, c in zip(repeats, comparisons, strict=True):
        for family, values in observations(c).items():
            bad = sorted(s for s, v in values.items() if not math.isfinite(v))
            if bad and family != DIGEST:
                raise RunLogError(
                    f"floor run {repeat.path}: {family} is not comparable with the reference's at step "
                    f"{bad[0]} (a tensor in one checkpoint only, or of another shape): not a same-config repeat"
                )


def measure_floor(
    ref: RunLog,
    repeats: list[RunLog],
    margin: float = DEFAULT_MARGIN,
    read_state: bool = True,
    cross_layout: bool = False,
    any_provenance: bool = False,
) -> FloorModel:
    """The floor from K >= 0 failure-free same-seed repeats of the reference (K = 0: exact equality).
    `any_provenance`: accept repeats whose provenance differs from the reference's (labelled)."""
    if not (margin >= 1.0 and math.isfinite(margin)):
        raise RunLogError(f"--margin must be a finite number >= 1, got {margin}")
    validate_run(ref, "reference")
    differs = [d for repeat in repeats for d in _validate_repeat(repeat, ref, cross_layout, any_provenance)]
    repeats, notes = _distinct(ref, repeats)
    steps = sorted(checkpoints(ref.path)) if read_state else []
    for repeat in repeats:
        steps = [s for s in steps if s in checkpoints(repeat.path)]
    comparisons = [compare(r, ref, distances(r.path, ref.path, steps) if steps else []) for r in repeats]
    bitwise = all(c.bitwise for c in comparisons)
    if not bitwise:
        kept, more = independent(ref, repeats, comparisons, LOOKAHEAD)
        repeats, comparisons, notes = [repeats[i] for i in kept], [comparisons[i] for i in kept], notes + more
        _check_finite(repeats, comparisons)
    layouts = list(dict.fromkeys([*ref.layouts(), *(x for r in repeats for x in r.layouts())]))
    seen = [observations(c) for c in comparisons]
    resolution = {} if bitwise else _resolutions(ref, comparisons)
    order = 2 if len(seen) >= ROBUST_FROM else 1
    families = {}
    for family in sorted({name for obs in seen for name in obs} | {LOSS, GRAD_NORM, DIGEST}):
        per_repeat = [obs.get(family, {}) for obs in seen]
        res = resolution.get(family, {})
        loo = (
            [
                _statistic(per_repeat[i], _envelope(per_repeat[:i] + per_repeat[i + 1 :], res, order))
                for i in range(len(per_repeat))
            ]
            if len(per_repeat) >= MIN_REPEATS
            else []
        )
        ranked = sorted(loo, reverse=True)
        calibration = ranked[order - 1] if len(ranked) >= order else 1.0
        tau = margin * max(1.0, calibration)
        families[family] = FamilyFloor(family, _envelope(per_repeat, res, order), tau, loo)
    return FloorModel(
        [str(r.path) for r in repeats],
        margin,
        bitwise,
        families,
        comparisons,
        steps,
        notes,
        cross_layout=len(layouts) > 1,
        layouts=layouts,
        precision=precision_notes(ref),
        provenance=list(dict.fromkeys(differs)),
    )
