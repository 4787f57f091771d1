"""The same-seed floor: how far failure-free same-seed runs land from the reference, per observable and
per step, and the thresholds calibrated on them.

Observables ("families"): |Δloss| and |Δgrad norm| at every step, parameter-digest equality wherever
both runs logged one, and the per-kind state distances (params, exp_avg, exp_avg_sq, step) at the
checkpoint steps every floor run kept. For each family:

- the **envelope** E(s) is the running maximum over the floor repeats of the family's value at steps
  <= s + LOOKAHEAD (2): platform noise drifts (tiny early, large late), so the band grows with the run
  instead of being one number for all of it; where the floor is not bitwise, |Δloss| and |Δgrad norm| envelopes are at
  least one fp32 ulp of the reference's value (the resolution of the logged number);
- the **threshold multiplier** tau is calibrated by leave-one-out: each repeat is judged against the
  envelope of the others, its largest ratio value / envelope is one draw of the statistic under "nothing
  is wrong", and tau = margin x max(1, the largest such draw). With one repeat there is nothing to leave
  out: tau = margin, uncalibrated (the report says so).

docs/measures.md has the reasoning and what this cannot see. Floor runs are validated first: a floor
that is not a failure-free run of the same config is refused, loudly (RunLogError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from truestep.analysis.fidelity import DEFAULT_MARGIN, Comparison, compare
from truestep.analysis.runlog import RunLog, RunLogError
from truestep.analysis.state import checkpoints, distances

LOSS, GRAD_NORM, DIGEST = "loss", "grad_norm", "digest"
STEP_FAMILIES = (LOSS, GRAD_NORM)


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
        return len(self.loo) >= 2


@dataclass
class FloorModel:
    repeats: list[str]
    """The floor runs' directories (empty: no floor measured, exact equality assumed)."""
    margin: float
    bitwise: bool
    """Every repeat was bit-identical to the reference in every observable."""
    families: dict[str, FamilyFloor]
    comparisons: list[Comparison]
    """Each repeat against the reference (what the envelope is made of; drawn in the report)."""
    state_steps: list[int]
    """Checkpoint steps the reference and every repeat kept: where state distances are judged."""

    @property
    def source(self) -> str:
        return "measured" if self.repeats else "assumed-exact"

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
    out: dict[str, dict[int, float]] = {
        LOSS: {d.step: d.dloss for d in c.steps},
        GRAD_NORM: {d.step: d.dgrad_norm for d in c.steps},
        DIGEST: {s: 0.0 if equal else math.inf for s, equal in c.digests.items()},
    }
    for sd in c.state:
        for kind, value in sd.totals.items():
            out.setdefault(kind, {})[sd.step] = value
    return out


LOOKAHEAD = 2
"""The envelope at step s also takes the repeats' values up to s + LOOKAHEAD: a deviation measured at
one step is a single noisy draw (grad norm carries each step's fresh noise), and the first steps would
otherwise be judged against a maximum of K numbers."""


def _envelope(floors: list[dict[int, float]], resolution: dict[int, float]) -> Envelope:
    steps = sorted(set.intersection(*(set(f) for f in floors))) if floors else []
    values, running, ahead = [], 0.0, 0
    for step in steps:
        while ahead < len(steps) and steps[ahead] <= step + LOOKAHEAD:
            running = max(running, *(f[steps[ahead]] for f in floors))
            ahead += 1
        values.append(max(running, resolution.get(step, 0.0)))
    return Envelope(steps, values)


def _statistic(run: dict[int, float], envelope: Envelope) -> float:
    return max(
        (ratio(run[s], v) for s, v in zip(envelope.steps, envelope.values, strict=True) if s in run),
        default=0.0,
    )


def _resolutions(ref: RunLog) -> dict[str, dict[int, float]]:
    return {
        LOSS: {s: f32_ulp(m["loss"]) for s, m in ref.final_steps.items()},
        GRAD_NORM: {s: f32_ulp(m["grad_norm"]) for s, m in ref.final_steps.items()},
    }


def validate_run(run: RunLog, role: str) -> None:
    """A reference or floor run must be failure-free, finite, and of one config throughout."""
    if not run.final_steps:
        raise RunLogError(f"{role} {run.path} logged no steps")
    faults = run.fault_specs()
    if faults:
        raise RunLogError(
            f"{role} {run.path} had injected faults ({'; '.join(faults)}): it must be failure-free"
        )
    if run.named("checkpoint_restore"):
        raise RunLogError(
            f"{role} {run.path} resumed from a checkpoint: it must run uninterrupted from step 0"
        )
    bad = next(
        (s for s, m in run.final_steps.items() if not all(map(math.isfinite, (m["loss"], m["grad_norm"])))),
        None,
    )
    if bad is not None:
        raise RunLogError(f"{role} {run.path} has a non-finite loss or grad norm at step {bad}")
    if len(run.fingerprints()) > 1:
        raise RunLogError(
            f"{role} {run.path} changed its config between attempts: {', '.join(run.fingerprints())}"
        )


def _validate_repeat(repeat: RunLog, ref: RunLog) -> None:
    validate_run(repeat, "floor run")
    if repeat.fingerprints() != ref.fingerprints():
        raise RunLogError(
            f"floor run {repeat.path} has config fingerprint {', '.join(repeat.fingerprints()) or 'none'}, the "
            f"reference {', '.join(ref.fingerprints()) or 'none'}: a floor must be the same seed and config"
        )
    if list(repeat.final_steps) != list(ref.final_steps):
        raise RunLogError(
            f"floor run {repeat.path} has steps {_span(list(repeat.final_steps))}, the reference "
            f"{_span(list(ref.final_steps))}: a floor must cover exactly the reference's steps"
        )


def _span(steps: list[int]) -> str:
    return f"{steps[0]}..{steps[-1]} ({len(steps)})" if steps else "none"


def measure_floor(
    ref: RunLog, repeats: list[RunLog], margin: float = DEFAULT_MARGIN, read_state: bool = True
) -> FloorModel:
    """The floor from K >= 0 failure-free same-seed repeats of the reference (K = 0: exact equality)."""
    if not (margin >= 1.0 and math.isfinite(margin)):
        raise RunLogError(f"--margin must be a finite number >= 1, got {margin}")
    validate_run(ref, "reference")
    for repeat in repeats:
        _validate_repeat(repeat, ref)
    steps = sorted(checkpoints(ref.path)) if read_state else []
    for repeat in repeats:
        steps = [s for s in steps if s in checkpoints(repeat.path)]
    comparisons = [compare(r, ref, distances(r.path, ref.path, steps) if steps else []) for r in repeats]
    bitwise = all(c.bitwise for c in comparisons)
    seen = [observations(c) for c in comparisons]
    resolution = {} if bitwise else _resolutions(ref)
    families = {}
    for family in sorted({name for obs in seen for name in obs} | {LOSS, GRAD_NORM, DIGEST}):
        per_repeat = [obs.get(family, {}) for obs in seen]
        res = resolution.get(family, {})
        loo = (
            [
                _statistic(per_repeat[i], _envelope(per_repeat[:i] + per_repeat[i + 1 :], res))
                for i in range(len(per_repeat))
            ]
            if len(per_repeat) >= 2
            else []
        )
        families[family] = FamilyFloor(family, _envelope(per_repeat, res), margin * max([1.0, *loo]), loo)
    return FloorModel([str(r.path) for r in repeats], margin, bitwise, families, comparisons, steps)
