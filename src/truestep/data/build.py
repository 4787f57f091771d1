"""`build_loader`: the one call the trainer makes to get its data loader from the config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from truestep.data.dataset import TokenDataset
from truestep.data.demo import ensure_demo_data
from truestep.data.loader import BatchLoader
from truestep.data.mixture import MixtureLoader
from truestep.data.sampler import GlobalSampler

if TYPE_CHECKING:  # only for annotations; keeps data importable without pulling in the config package
    from truestep.config.schema import DataConfig


def build_loader(
    cfg_data: DataConfig,
    global_batch_size: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    allow_mixture_change: bool = False,
) -> BatchLoader | MixtureLoader:
    """Open the configured data (a mixture when `cfg_data.sources` is set, else `cfg_data.path`, else the
    demo corpus) for rank `dp_rank`, feeding micro-batches of `micro_batch_size` samples (the effective
    value: `TrainConfig.micro_batch`). `allow_mixture_change`: resume a mixture whose sources or weights
    changed (checkpoint.allow_config_change) instead of refusing."""
    if cfg_data.sources:
        sources = [(s.path, s.weight, Path(s.path).expanduser()) for s in cfg_data.sources]
        return MixtureLoader(
            sources,
            cfg_data.seq_len,
            global_batch_size,
            cfg_data.data_seed,
            dp_rank,
            dp_size,
            micro_batch_size,
            allow_change=allow_mixture_change,
        )
    data_dir = Path(cfg_data.path).expanduser() if cfg_data.path else ensure_demo_data()
    dataset = TokenDataset(data_dir, cfg_data.seq_len)
    sampler = GlobalSampler(len(dataset), global_batch_size, cfg_data.data_seed)
    return BatchLoader(dataset, sampler, dp_rank, dp_size, micro_batch_size)
