"""Throughput of a step: tokens per second and, where the device's peak is known, MFU."""

from __future__ import annotations

import torch

PEAK_FLOPS = {  # dense peak per GPU from the vendor's data sheets: (bf16, fp32 without TF32)
    "H200": (989e12, 67e12),
    "H100": (989e12, 67e12),
    "A100": (312e12, 19.5e12),
    "L40S": (362e12, 91.6e12),
    "A10G": (70e12, 31.2e12),
}
"""Only devices named here get an MFU; on CPU there is no known peak, so none is claimed."""


def device_peak_flops(device: torch.device, bf16: bool) -> float | None:
    """The peak FLOP/s of one device of this kind at this precision; None: unknown (every CPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, (peak_bf16, peak_fp32) in PEAK_FLOPS.items():
        if key in name:
            return peak_bf16 if bf16 else peak_fp32
    return None


def mfu(
    tokens_per_s: float, flops_per_token: float, peak_per_device: float | None, devices: int
) -> float | None:
    """Model FLOPs utilization: achieved model FLOP/s over the peak of all devices; None when unknown."""
    if peak_per_device is None or devices < 1:
        return None
    return tokens_per_s * flops_per_token / (peak_per_device * devices)
