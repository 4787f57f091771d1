"""Fingerprint of the trajectory-relevant part of a config, and a diff naming what changed."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from truestep.config.load import to_dict
from truestep.config.schema import TRAJECTORY_KEYS, TRAJECTORY_SECTIONS, JobConfig


def trajectory_keys(cfg: JobConfig) -> dict[str, Any]:
    """Flat {"section.key": value} of every key that shapes the trajectory."""
    flat: dict[str, Any] = {}
    for section, values in to_dict(cfg).items():
        for key, value in values.items():
            dotted = f"{section}.{key}"
            if section in TRAJECTORY_SECTIONS or dotted in TRAJECTORY_KEYS:
                if isinstance(value, list):  # data.sources: one key per item field, so a diff names it
                    for index, item in enumerate(value):
                        flat.update({f"{dotted}[{index}].{k}": v for k, v in item.items()})
                else:
                    flat[dotted] = value
    return flat


def fingerprint(keys: dict[str, Any]) -> str:
    blob = json.dumps(keys, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def diff_keys(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences, one per key, e.g. "model.dim: 256 -> 512".

    A key the saved side does not record (a checkpoint from before the key existed) counts as its
    default: a new key left at its default changes nothing, so it must not block a resume.
    """
    defaults = trajectory_keys(JobConfig())
    out = []
    for key in sorted(set(saved) | set(current)):
        old = saved.get(key, defaults.get(key, "<absent>"))
        new = current.get(key, "<absent>")
        if old != new:
            out.append(f"{key}: {old!r} -> {new!r}")
    return out
