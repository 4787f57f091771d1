"""The dtypes an export may be written in, and the one cast every export goes through.

truestep's master weights are fp32; bf16 halves the files (an 8B model: 32 -> 16 GB) with
round-to-nearest-even, as `tensor.to(torch.bfloat16)` does. fp16 has a narrow range, so a weight that
would become infinite is refused instead of written.
"""

from __future__ import annotations

import torch

from truestep.interop.errors import InteropError

EXPORT_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """The name transformers writes as `torch_dtype` (float32, bfloat16, float16)."""
    return str(dtype).removeprefix("torch.")


def export_dtype(name: str) -> torch.dtype:
    if name not in EXPORT_DTYPES:
        raise InteropError(f"unknown export dtype {name!r}; use one of {', '.join(EXPORT_DTYPES)}")
    return EXPORT_DTYPES[name]


def cast_for_export(tensor: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """`tensor` in `dtype`, contiguous; InteropError if a finite value does not fit (fp16 overflow)."""
    out = tensor.to(dtype).contiguous()
    if dtype != tensor.dtype and not bool(torch.isfinite(out).all()) and bool(torch.isfinite(tensor).all()):
        raise InteropError(f"{name}: values beyond the range of {dtype_name(dtype)}; export as bf16 or fp32")
    return out
