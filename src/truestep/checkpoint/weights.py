"""Model weights of a checkpoint without a process group: what tensors it holds, reading them into
full tensors, and the model config they were saved with.

Weights are read through `safe_dcp` (no arbitrary unpickling, confined paths) with `no_dist=True`, into
plain full tensors allocated from the DCP metadata: DCP reassembles whatever layout (FSDP shards, TP
shards, one process) the checkpoint was saved with. Used by export, `init_from`, generation and inspection.

Nothing a checkpoint declares is believed before it is checked: the recorded model config must pass the
config rules (`validate_model`) and its layer count must match the layers actually stored before a model
is built for the shape comparison; the metadata's declared tensor sizes are bounded by the bytes on disk
(`dcp_checks`) before a tensor is allocated for them.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from truestep.checkpoint.errors import CheckpointContentError
from truestep.checkpoint.manifest import VerifyError, read_json
from truestep.checkpoint.safe_dcp import load_dcp, read_dcp_metadata
from truestep.checkpoint.state import read_rank_state
from truestep.config.errors import ConfigError
from truestep.config.load import coerce_table
from truestep.config.schema import ModelConfig
from truestep.config.validate import validate_model
from truestep.core.errors import RefusedError
from truestep.model.llama import Transformer

WEIGHTS_INFO_FILE = "interop.json"
"""Written in place of the rank-state files by a weights-only checkpoint (`truestep import-hf`): where
the weights came from and the model config they fit (flat `model.*` keys, as in `config_keys`)."""
WEIGHTS_INFO_FORMAT = "truestep-interop"
MODEL_PREFIX = "model."
TIED_OUTPUT, TIED_EMBEDDING = "output.weight", "tok_embeddings.weight"
"""With `model.tie_embeddings` the output projection is the embedding: one tensor, stored once."""


class WeightsError(RefusedError):
    """The checkpoint's weights cannot be read or do not fit; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


_LAYER = re.compile(r"^layers\.(\d+)\.")


def model_config_from_keys(keys: dict[str, Any], where: Path) -> ModelConfig:
    """The ModelConfig recorded as flat `model.*` keys, type-checked and validated like a config file
    (unknown keys, from a newer truestep, are ignored)."""
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    values = {
        k[len(MODEL_PREFIX) :]: v
        for k, v in keys.items()
        if isinstance(k, str) and k.startswith(MODEL_PREFIX)
    }
    if not values:
        raise WeightsError(f"{where} records no model.* config keys")
    cfg = ModelConfig()
    try:
        coerce_table(cfg, {k: v for k, v in values.items() if k in known}, str(where), "model")
        validate_model(cfg)
    except ConfigError as err:
        raise WeightsError(f"{where}: the recorded model config is invalid: {err}") from None
    return cfg


def read_model_config(ckpt_dir: Path) -> ModelConfig:
    """The model config a checkpoint was saved with: interop.json (imported weights) or rank00000.json."""
    info = ckpt_dir / WEIGHTS_INFO_FILE
    try:
        if info.is_file() or info.is_symlink():
            saved = read_json(info)
            keys = saved.get("config_keys") if isinstance(saved, dict) else None
            if not isinstance(keys, dict):
                raise WeightsError(f"{info} has no config_keys table")
            return model_config_from_keys(keys, info)
        return model_config_from_keys(read_rank_state(ckpt_dir, 0).config_keys, ckpt_dir)
    except VerifyError as err:
        raise WeightsError(f"{ckpt_dir}: model config unknown: {err}") from err


def weights_info(cfg: ModelConfig, source: dict[str, Any]) -> dict[str, Any]:
    """The interop.json of a weights-only checkpoint: where the weights came from, the config they fit."""
    return {
        "format": WEIGHTS_INFO_FORMAT,
        "version": 1,
        "kind": "weights-only",
        "created_at": time.time(),
        "source": source,
        "config_keys": {f"{MODEL_PREFIX}{k}": v for k, v in dataclasses.asdict(cfg).items()},
        "model_overrides": model_overrides(cfg),
    }


def model_overrides(cfg: ModelConfig) -> list[str]:
    """`--model.key=value` overrides that reproduce cfg's shape and numerics on the command line."""
    out = []
    for f in dataclasses.fields(ModelConfig):
        if f.name in ("dropout", "init_std"):  # training-time only: the weights do not depend on them
            continue
        value = getattr(cfg, f.name)
        out.append(f"--model.{f.name}={str(value).lower() if isinstance(value, bool) else value}")
    return out


def model_tensor_meta(ckpt_dir: Path) -> dict[str, TensorMeta]:
    """truestep FQN -> (full shape, dtype) of every model tensor stored in the checkpoint, by name."""
    try:
        metadata = read_dcp_metadata(ckpt_dir)
    except CheckpointContentError as err:
        raise WeightsError(f"{ckpt_dir}: {err}") from err
    except OSError as err:
        raise WeightsError(f"{ckpt_dir}: cannot read DCP metadata: {err.strerror or err}") from err
    found = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(item, TensorStorageMetadata):
            found[key[len(MODEL_PREFIX) :]] = TensorMeta(tuple(item.size), item.properties.dtype)
    if not found:
        raise WeightsError(f"{ckpt_dir}: the checkpoint holds no model weights")
    return dict(sorted(found.items()))


def load_model_tensors(
    ckpt_dir: Path,
    fqns: list[str] | None = None,
    meta: dict[str, TensorMeta] | None = None,
    into: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Full CPU tensors (stored dtype) for `fqns` (default: every model tensor).

    With `into`, DCP copies straight into those tensors (e.g. a model's own parameters) instead. A tied
    output weight the checkpoint stores only as the embedding (`import-hf` stores it once) is the
    embedding's tensor: it shares the model's storage already, or is returned as the same tensor.
    """
    stored = model_tensor_meta(ckpt_dir)
    if into is None:
        meta = meta if meta is not None else stored
        wanted = list(meta) if fqns is None else fqns
        aliased = TIED_OUTPUT in wanted and TIED_OUTPUT not in stored and TIED_EMBEDDING in stored
        reads = [f for f in wanted if f != TIED_OUTPUT or not aliased] + ([TIED_EMBEDDING] if aliased else [])
        into = allocate({**meta, **stored}, list(dict.fromkeys(reads)), ckpt_dir)
        _load_into(ckpt_dir, into)
        if aliased:
            into[TIED_OUTPUT] = into[TIED_EMBEDDING]
            if TIED_EMBEDDING not in wanted:
                del into[TIED_EMBEDDING]
        return into
    targets = dict(into)
    if TIED_OUTPUT not in stored and _shares_storage(into.get(TIED_OUTPUT), into.get(TIED_EMBEDDING)):
        del targets[TIED_OUTPUT]  # filled through the embedding it is tied to
    _load_into(ckpt_dir, targets)
    return into


def _load_into(ckpt_dir: Path, into: dict[str, torch.Tensor]) -> None:
    if not into:
        return
    try:
        load_dcp({"model": into}, ckpt_dir, no_dist=True)
    except CheckpointContentError as err:
        raise WeightsError(f"{ckpt_dir}: {err}") from err
    except RefusedError:
        raise
    except (RuntimeError, ValueError, KeyError) as err:  # e.g. a key the metadata does not hold
        raise WeightsError(f"{ckpt_dir}: the weights do not load: {type(err).__name__}: {err}") from err


def _shares_storage(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return False
    if a is b:
        return True
    local = [t.to_local() if hasattr(t, "to_local") else t for t in (a, b)]
    return local[0].untyped_storage().data_ptr() == local[1].untyped_storage().data_ptr()


def with_tied_output(meta: dict[str, TensorMeta], tied: bool) -> dict[str, TensorMeta]:
    """The stored tensors as the model sees them: a tied model's output weight, stored once as the
    embedding, is the embedding."""
    if tied and TIED_OUTPUT not in meta and TIED_EMBEDDING in meta:
        return {**meta, TIED_OUTPUT: meta[TIED_EMBEDDING]}
    return meta


def allocate(meta: dict[str, TensorMeta], fqns: list[str], where: Path) -> dict[str, torch.Tensor]:
    """Empty CPU tensors for `fqns` (sizes already bounded by the bytes on disk, see dcp_checks); a
    WeightsError saying how much, not an allocator traceback, when memory runs out."""
    try:
        return {fqn: torch.empty(meta[fqn].shape, dtype=meta[fqn].dtype) for fqn in fqns}
    except (RuntimeError, MemoryError) as err:  # torch: "DefaultCPUAllocator: can't allocate memory"
        total = sum(meta[fqn].nbytes for fqn in fqns)
        raise WeightsError(
            f"{where}: not enough memory for its weights ({total / 2**30:.1f} GiB): {str(err).splitlines()[0]}"
        ) from err


def layer_count_problem(
    meta: dict[str, TensorMeta], n_layers: int, stored: str = "checkpoint", wanted: str = "model expects"
) -> str | None:
    """The layer count a config declares against the layers actually stored, compared before anything
    is built for the config (a config declaring 100000 layers is answered at once)."""
    held = _layer_count(meta)
    return None if held == n_layers else f"{wanted} {n_layers} layers, the {stored} holds {held}"


def shape_problems(
    meta: dict[str, TensorMeta],
    expected: dict[str, tuple[int, ...]],
    name: Callable[[str], str] = str,
    stored: str = "checkpoint",
    wanted: str = "model expects",
) -> list[str]:
    """Differences between stored tensors and the expected {fqn: shape}, one line per key (named by `name`);
    a differing layer count comes first, as one line. (Callers that build `expected` from an untrusted
    config call `layer_count_problem` first, so `expected` never holds 100000 layers here.)"""
    problems = []
    stored_layers, wanted_layers = _layer_count(meta), _layer_count(expected)
    if stored_layers != wanted_layers:
        problems.append(f"{wanted} {wanted_layers} layers, the {stored} holds {stored_layers}")
    for fqn, shape in expected.items():
        if fqn not in meta:
            problems.append(f"{name(fqn)}: missing from the {stored} ({wanted} {list(shape)})")
        elif meta[fqn].shape != tuple(shape):
            problems.append(f"{name(fqn)}: {stored} has {list(meta[fqn].shape)}, {wanted} {list(shape)}")
    for fqn in meta:
        if fqn not in expected:
            problems.append(f"{name(fqn)}: in the {stored} but not a parameter of the model")
    return problems


def _layer_count(tensors: dict[str, Any]) -> int:
    return len({m.group(1) for fqn in tensors if (m := _LAYER.match(fqn))})


def problem_list(problems: list[str], limit: int = 8) -> str:
    """Problems as one line: the first `limit`, then how many more (an error is one line on stderr)."""
    more = f"; ... ({len(problems) - limit} more)" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{fqn: shape} of the persistent state of a Transformer(cfg).

    Built on the meta device with one layer, whose shapes every layer repeats: the cost does not grow
    with `n_layers` (a config declaring 100000 layers is answered in milliseconds, not minutes and GBs).
    A config whose sizes cannot even be described (overflowing element counts) is a WeightsError.
    """
    try:
        with torch.device("meta"):
            model = Transformer(dataclasses.replace(cfg, n_layers=1))
    except (RuntimeError, ValueError, OverflowError) as err:
        raise WeightsError(f"the model config describes tensors that cannot exist: {err}") from err
    before: dict[str, tuple[int, ...]] = {}
    layer: dict[str, tuple[int, ...]] = {}
    after: dict[str, tuple[int, ...]] = {}
    for fqn, value in model.state_dict().items():
        match = _LAYER.match(fqn)
        if match is not None:
            layer[fqn[match.end() :]] = tuple(value.shape)
        else:
            (after if layer else before)[fqn] = tuple(value.shape)
    shapes = dict(before)
    for index in range(cfg.n_layers):
        shapes.update({f"layers.{index}.{rest}": shape for rest, shape in layer.items()})
    shapes.update(after)
    return shapes


def check_config_fits(ckpt_dir: Path, cfg: ModelConfig, meta: dict[str, TensorMeta]) -> None:
    meta = with_tied_output(meta, cfg.tie_embeddings)
    layers = layer_count_problem(meta, cfg.n_layers)
    problems = [layers] if layers else shape_problems(meta, expected_shapes(cfg))
    if problems:
        raise WeightsError(
            f"{ckpt_dir}: the stored weights do not match the model config recorded with them: "
            + problem_list(problems)
        )
