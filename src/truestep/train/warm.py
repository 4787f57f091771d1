"""What a warm standby prepares before it knows its rank: the imports a rank of this config will do.

Only imports, because only they are the same for every attempt: model weights, optimizer state, RNG
streams, the data position, the process group — all of it is derived from the attempt (its checkpoint,
its rendezvous) and is built after the handoff, exactly as in a fresh process. Building the model
ahead is not done either: on a GPU it would hold a second copy of the weights next to the live rank.

Measured here (2 cores, tiny model): `truestep.train.run` pulls in torch, torch.distributed, DCP and
FSDP (2.5-6 s); `torch.use_deterministic_algorithms` lazily imports torch._inductor (~0.7-1 s, paid
inside the Trainer otherwise); the rest of a run (restore, steps, saves) imports a handful of small
modules more.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from truestep.config.load import load_config

LAZY_MODULES = ("numpy.random", "torch.utils.serialization.config", "torch.utils._sympy.reference")
"""Imported by a run after start-up (found by diffing sys.modules over a run with restore and saves)."""


def warm_for(config_file: str) -> Callable[[], None]:
    """Import what a rank of `config_file` will import; return what undoes the imports' side effects.

    The config only decides which imports; the rank loads its own attempt's config after the handoff.
    """
    cfg = load_config(config_file, [])
    import torch

    rng = torch.get_rng_state()  # what a fresh process's default generator holds after `import torch`
    importlib.import_module("truestep.train.run")  # torch.distributed, DCP, FSDP, the model, the data
    if cfg.train.deterministic:
        importlib.import_module("torch._inductor.config")  # what use_deterministic_algorithms imports
    for name in LAZY_MODULES:
        importlib.import_module(name)

    def undo() -> None:
        torch.set_rng_state(rng)

    return undo
