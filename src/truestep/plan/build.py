"""Assemble a plan's inputs: defaults, then measured costs (`--from`), then the user's TOML and overrides,
then the scaling model for the target size -- recording where every number came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from truestep.plan.fit import Measured, measure
from truestep.plan.inputs import PlanInputs, Provenance, apply_user, get, keys, put, validate
from truestep.plan.scaling import SCALED, CostModel, count_params, latencies

SIZE_BOUND = ("job.step_time_s", "job.step_overhead_s", "job.tokens_per_step")
"""Measured per-step numbers that hold only at the measured model and world (not extrapolated)."""


@dataclass
class Assembled:
    inputs: PlanInputs
    provenance: Provenance
    costs: CostModel
    """Scaled costs at any world size (the GPU-count sweep)."""
    measured: Measured | None
    target_params: float | None
    notes: list[str]
    unscaled: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Costs measured at another scale and not extrapolated -> (the measured value, truestep's at-scale
    assumption, if larger): the headline says so, with the goodput at both ends."""


def assemble(source: Path | None, config: Path | None, overrides: list[str]) -> Assembled:
    inputs, prov, notes = PlanInputs(), Provenance(), []
    measured = measure(source) if source is not None else None
    if measured is not None:
        notes += measured.notes
        for key, value in measured.values.items():
            put(inputs, key, type(get(inputs, key))(value))
            n = measured.samples[key]
            prov.source[key] = (
                f"measured (median of {n}, {source})" if n else f"from the run's config ({source})"
            )
        for key, value in measured.corrupts.items():
            put(inputs, key, value)
            prov.source[key] = f"measured (the ablation in {source})"
    apply_user(inputs, prov, config, overrides)
    target = _target_params(inputs, measured)
    same_size = measured is not None and target == measured.params and inputs.job.gpus == measured.world
    if measured is not None and not same_size:
        for key in SIZE_BOUND:
            if prov.kind(key) == "measured":
                put(inputs, key, type(get(inputs, key))(0))
                del prov.source[key]
        notes.append(
            f"the target ({inputs.job.gpus} GPUs) is not the measured job ({measured.world} ranks): step time "
            "is not extrapolated (set job.step_time_s); start-up, detection, teardown and relaunch costs are "
            "the measured ones, taken as independent of size"
        )
    validate(inputs, prov)  # again: a step-based input may have lost its measured step time above
    model = _cost_model(inputs, prov, measured, target)
    for key, value in model.at(inputs.job.gpus).items():
        full = f"costs.{key}"
        if prov.kind(full) == "set" or target is None:
            continue
        put(inputs, full, value)
        if same_size:
            continue
        base = "extrapolated from the measured latency" if prov.kind(full) == "measured" else "modelled"
        prov.source[full] = f"{base} + bytes/bandwidth at {target:.3g} params, {inputs.job.gpus} ranks"
    unscaled = {} if measured is None or same_size else _unscaled(inputs, prov, measured)
    return Assembled(inputs, prov, model, measured, target, notes, unscaled)


def _unscaled(inputs: PlanInputs, prov: Provenance, measured: Measured) -> dict[str, tuple[float, float]]:
    """The costs still as measured although the target is another size (start-up, detection, teardown,
    relaunch: no model scales them): labelled so, each with its measured value and the larger of it and
    truestep's default, which is an at-scale assumption (a cold start of 2 CPU ranks is seconds; of
    16,384 GPU ranks, minutes)."""
    defaults, found = PlanInputs(), {}
    for key in keys(inputs):
        if key.startswith("costs.") and prov.kind(key) == "measured":
            value = float(get(inputs, key))
            found[key] = (value, max(value, float(get(defaults, key))))
            prov.source[key] += (
                f" at {measured.world} ranks: not extrapolated to {inputs.job.gpus:,} GPUs (the headline "
                "gives the range)"
            )
    return found


def _target_params(inputs: PlanInputs, measured: Measured | None) -> float | None:
    if inputs.scaling.params > 0:
        return inputs.scaling.params
    if inputs.scaling.model:
        return count_params(inputs.scaling.model)
    return measured.params if measured is not None else None


def _cost_model(
    inputs: PlanInputs, prov: Provenance, measured: Measured | None, target: float | None
) -> CostModel:
    keys = [k.removeprefix("costs.") for k in (f"costs.{s}" for s in SCALED)]
    fixed = {k: get(inputs, f"costs.{k}") for k in keys if prov.kind(f"costs.{k}") == "set" or target is None}
    if measured is not None and measured.params:
        mine = {k: get(inputs, f"costs.{k}") for k in keys if prov.kind(f"costs.{k}") == "measured"}
        lat, scale = latencies(inputs.scaling, mine, measured.params, measured.world)
    else:
        lat, scale = latencies(inputs.scaling, {}, 1.0, 1)
    return CostModel(inputs.scaling, target, lat, scale, fixed)
