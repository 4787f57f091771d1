"""The one place that turns a plain Transformer into a TP x FSDP2 model on the 2-D mesh.

Order matters: tensor parallelism first (on the "tp" mesh dim), then FSDP2 `fully_shard` per block and
on the root (on the "dp" dim). Without sequence parallelism, activations between blocks are replicated
across TP ranks, so norms stay plain (FSDP-only) parameters.

`build_model` builds on the meta device, shards, and only then allocates: each rank holds its shards,
never the whole model (at 70B the whole model in fp32 is 280 GB per rank). Allocating is all a resume
needs (the load overwrites every parameter); a fresh start then initializes (`init_parameters`): in
the default "blockwise" scheme each rank computes only its own shard's values, O(shard), and the
weights are the ones an unsharded init from the same seed gives, bit for bit, in every layout.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from truestep.config.errors import ConfigError
from truestep.config.schema import JobConfig
from truestep.model.init import INIT_SCHEMES, fill_blockwise, on_meta, param_std
from truestep.model.llama import Transformer
from truestep.parallel.dist import DistContext


def apply_tp(model: Transformer, ctx: DistContext) -> None:
    assert ctx.mesh is not None
    tp_mesh = ctx.mesh["tp"]
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate(), use_local_output=True),
        },
    )
    if model.cfg.tie_embeddings:
        # parallelize_module gave each module its own new DTensor parameter, silently untying them. Both
        # are sharded by vocabulary row (Shard(0)), so one tensor serves both again.
        embedding, output = model.tok_embeddings.weight, model.output.weight
        assert embedding.placements == output.placements, (embedding.placements, output.placements)
        model.output.weight = embedding
    block_plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan)


def apply_fsdp(model: Transformer, ctx: DistContext, cfg: JobConfig) -> None:
    assert ctx.mesh is not None
    kwargs: dict = {"mesh": ctx.mesh["dp"]}
    if uses_mixed_precision(cfg, ctx.device.type):
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers.values():
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)


def uses_mixed_precision(cfg: JobConfig, device_type: str) -> bool:
    """Whether FSDP2 computes in bf16 here: parallel.mixed_precision on CUDA, and on CPU only with
    parallel.mixed_precision_cpu (CPU runs are fp32 unless asked)."""
    p = cfg.parallel
    return p.mixed_precision and (device_type == "cuda" or p.mixed_precision_cpu)


def reshard(model: nn.Module) -> None:
    """Free every FSDP2 module's unsharded parameters. A forward without a backward (a witness, an
    evaluation) leaves the root unsharded (FSDP2 keeps the root's parameters gathered after forward,
    expecting the backward), and model.parameters() would then be full tensors, not the shards every
    digest and checkpoint reads. A no-op for a model without FSDP."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


# FSDP2 warns when the root returns a view (TP's local logits are one): in-place ops on it would skip
# a hook. The loss is computed out of place, so the warning is noise here.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def parallelize(model: Transformer, ctx: DistContext, cfg: JobConfig) -> nn.Module:
    """Apply TP then FSDP2 as the layout asks, then put the model on its device: `to_empty` for a model
    built on the meta device (nothing to copy; initialize it after), a copy otherwise."""
    if cfg.parallel.mixed_precision_cpu and ctx.device.type == "cpu" and ctx.dp == 1:
        raise ConfigError(
            "parallel.mixed_precision_cpu=true needs FSDP (dp > 1: launch 2 or more data-parallel ranks); "
            "a single data-parallel rank would silently run fp32"
        )
    on_meta = any(p.is_meta for p in model.parameters())
    if not on_meta:
        model.to(ctx.device)
    if ctx.distributed and ctx.tp > 1:
        apply_tp(model, ctx)
    if ctx.distributed and ctx.dp > 1:
        apply_fsdp(model, ctx, cfg)
    if on_meta:
        model.to_empty(device=ctx.device)
    return model


@torch.no_grad()
def init_parameters(model: nn.Module, seed: int, scheme: str = "blockwise") -> None:
    """Give a (possibly sharded) Transformer its initial weights from `seed` (model/init.py), local only:
    no collective, and every layout gets the weights of an unsharded init bit for bit.

    "blockwise": each rank computes only the rectangle of each parameter it holds (its global offset and
    shape, as DCP computes them for a save), from the tiles that rectangle touches: O(this rank's shard).
    "full": each parameter's full value is drawn on the CPU, as an unsharded init draws it, and this
    rank keeps its own part of it (`src_data_rank=None`: every rank draws the same values)."""
    reshard(model)  # a gathered root would take the values into its unsharded copy only
    transformer: Transformer = model  # type: ignore[assignment] - FSDP2 subclasses the module in place
    if scheme == "full":
        for param, values in transformer.initial_values(seed):
            values = values.to(param.device)
            if isinstance(param, DTensor):
                param.copy_(
                    distribute_tensor(values, param.device_mesh, param.placements, src_data_rank=None)
                )
            else:
                param.copy_(values)
    elif scheme == "blockwise":
        for name, param in transformer.named_parameters():
            std = param_std(name, transformer.cfg)
            local, offset = _local_region(param)
            fill_blockwise(local, seed, name, param.shape, std, offset)
    else:
        raise ValueError(f"unknown init scheme {scheme!r}; expected one of {', '.join(INIT_SCHEMES)}")
    transformer.init_buffers()


def _local_region(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """This rank's part of `param` (its local tensor, written in place) and that part's offset in the
    global value. A DTensor's local part is a rectangle of the global value in every layout truestep
    builds (DCP saves it as one chunk at this offset)."""
    if not isinstance(param, DTensor):
        return param.data, (0,) * param.dim()
    local = param.to_local()
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    if tuple(local.shape) != tuple(shape):  # loud: the offset would describe other values than it holds
        raise RuntimeError(f"local shard of shape {tuple(local.shape)} where DTensor computes {tuple(shape)}")
    return local, tuple(offset)


def build_model(ctx: DistContext, cfg: JobConfig, initialize: bool = True) -> nn.Module:
    """The training model of this rank. With `initialize`, initialized from `train.seed` in
    `train.init_scheme`; without, only allocated (its parameters hold whatever the allocator left
    there; the RoPE tables are computed): for a resume, which loads every parameter, or for
    `init_parameters` to fill later (train/trainer.py `Trainer.initialize`). With `parallel.meta_init`
    (default) no rank ever holds the whole model; off, every rank builds (and initializes) the full model
    first and shards it after (the older path, kept for benchmarks/init_memory.py)."""
    seed, scheme = cfg.train.seed, cfg.train.init_scheme
    if not cfg.parallel.meta_init:
        with on_meta():
            model = Transformer(cfg.model)
        model.to_empty(device="cpu")  # the whole model, without nn.Linear's own (discarded) random init
        if initialize:
            model.init_weights(seed, scheme)
        else:
            model.init_buffers()
        return parallelize(model, ctx, cfg)
    with on_meta():
        model = Transformer(cfg.model)
    sharded = parallelize(model, ctx, cfg)
    if initialize:
        init_parameters(sharded, seed, scheme)
    else:
        sharded.init_buffers()  # type: ignore[operator] - derived from the config, never loaded
    return sharded
