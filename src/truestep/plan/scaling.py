"""The scaling model: model shape -> checkpoint bytes per rank -> save and restore time at a bandwidth.

    bytes_total = params x bytes_per_param            (fp32 weights + two AdamW moments: 12 B/param)
    bytes_rank  = bytes_total / world                 (FSDP x TP shard every tensor over all ranks)
    blocking    = latency_b + bytes_rank / staging_gbps_per_rank                (async save)
    write       = latency_w + max(bytes_rank / write_gbps_per_rank, bytes_total / write_gbps_total)
    commit      = latency_c + bytes_rank / hash_gbps_per_rank                    (each rank its shards)
    restore     = latency_r + max(bytes_rank / read_gbps_per_rank, bytes_total / read_gbps_total)
    graceful_stop = latency_s + write + commit                                   (the emergency save)
    snapshot_capture = latency_p + bytes_rank / staging_gbps_per_rank + bytes_rank / hash_gbps_per_rank
                                         (peer snapshots: the copy to host memory and its SHA-256)
    memory_restore = latency_m + bytes_rank / network_gbps_per_rank + bytes_rank / hash_gbps_per_rank
                                + bytes_rank / staging_gbps_per_rank   (a buddy's copy: received, checked, loaded)

A measurement at one size gives each latency: the measured time minus the bandwidth term at the
measured size. When the measurement is faster than the bandwidth term alone, the assumed bandwidth is
wrong for this storage: the latency is 0 and the bandwidth is raised to what was measured (the term is
scaled by measured / term). A cost the user set is kept as is; a cost with neither a measurement
nor a known model size stays the assumed constant of plan/inputs.py. Everything else in a recovery
(start-up, detection, teardown, relaunch) is taken as independent of size: the output says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from truestep.plan.inputs import ScalingInputs

GB = 1e9
SCALED = (
    "save_blocking_s",
    "save_write_s",
    "save_commit_s",
    "restore_s",
    "graceful_stop_s",
    "snapshot_capture_s",
    "memory_restore_s",
)
"""The cost inputs the scaling model extrapolates."""
ASSUMED_LATENCY_S = {
    "save_blocking_s": 0.1,
    "save_write_s": 1.0,
    "save_commit_s": 0.5,
    "restore_s": 5.0,
    "graceful_stop_s": 10.0,
    "snapshot_capture_s": 0.01,
    "memory_restore_s": 1.0,
}
"""Latencies when a model size is known but nothing was measured (assumed)."""


def count_params(model: str) -> float:
    """Parameters of a preset or trainer config's model (meta device: no memory, no weights)."""
    from truestep.config.load import load_config
    from truestep.model import count_parameters

    return float(count_parameters(load_config(model).model))


def bandwidth_terms(s: ScalingInputs, params: float, world: int) -> dict[str, float]:
    """The size-dependent part of each scaled cost but the graceful stop (seconds)."""
    total = params * s.bytes_per_param
    rank = total / world
    write = max(rank / (s.write_gbps_per_rank * GB), total / (s.write_gbps_total * GB))
    commit = rank / (s.hash_gbps_per_rank * GB)
    return {
        "save_blocking_s": rank / (s.staging_gbps_per_rank * GB),
        "save_write_s": write,
        "save_commit_s": commit,
        "restore_s": max(rank / (s.read_gbps_per_rank * GB), total / (s.read_gbps_total * GB)),
        **snapshot_terms(s, rank),
    }


def snapshot_terms(s: ScalingInputs, rank: float) -> dict[str, float]:
    """Peer snapshots, the way truestep takes them: a capture copies the shard to host memory and hashes
    it, one after the other; a restore receives a buddy's copy, checks its SHA-256 and loads it."""
    copy, sha = rank / (s.staging_gbps_per_rank * GB), rank / (s.hash_gbps_per_rank * GB)
    return {
        "snapshot_capture_s": copy + sha,
        "memory_restore_s": rank / (s.network_gbps_per_rank * GB) + sha + copy,
    }


@dataclass
class CostModel:
    """Scaled costs as a function of the world size (for the target and for the GPU-count sweep)."""

    scaling: ScalingInputs
    params: float | None
    """Target parameters (None: unknown, costs stay constant)."""
    latency_s: dict[str, float] = field(default_factory=dict)
    term_scale: dict[str, float] = field(default_factory=dict)
    """Per cost, < 1 where the measurement showed a faster bandwidth than assumed."""
    fixed_s: dict[str, float] = field(default_factory=dict)
    """Costs kept constant at every size (set by the user, or no size known)."""

    def at(self, world: int) -> dict[str, float]:
        if self.params is None:
            return dict(self.fixed_s)
        terms = bandwidth_terms(self.scaling, self.params, world)
        out = {k: self.latency_s[k] + terms[k] * self.term_scale.get(k, 1.0) for k in terms}
        out.update({k: v for k, v in self.fixed_s.items() if k != "graceful_stop_s"})
        out["graceful_stop_s"] = self.fixed_s.get(
            "graceful_stop_s", self.latency_s["graceful_stop_s"] + out["save_write_s"] + out["save_commit_s"]
        )
        return out

    def bytes_per_rank(self, world: int) -> float | None:
        return None if self.params is None else self.params * self.scaling.bytes_per_param / world


def latencies(
    s: ScalingInputs, measured: dict[str, float], measured_params: float, measured_world: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Each scaled cost's latency (measured time minus its bandwidth term at the measured size) and the
    factor on its bandwidth term (1, or measured / term where the measurement beat the term)."""
    terms = bandwidth_terms(s, measured_params, measured_world)
    out, scale = dict(ASSUMED_LATENCY_S), {}
    for key in terms:
        if key in measured:
            out[key] = max(0.0, measured[key] - terms[key])
            if measured[key] < terms[key]:
                scale[key] = measured[key] / terms[key]
    if "graceful_stop_s" in measured and "save_write_s" in measured and "save_commit_s" in measured:
        # The stop's own part (agreeing on the signal, finishing the step) without its save.
        save = measured["save_write_s"] + measured["save_commit_s"]
        out["graceful_stop_s"] = max(0.0, measured["graceful_stop_s"] - save)
    return out, scale
