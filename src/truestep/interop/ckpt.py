"""The truestep side of interop: find and verify a checkpoint, read its model config and weights, write
a weights-only checkpoint.

Weights are read through `checkpoint.safe_dcp` (no arbitrary unpickling) with `no_dist=True`, into
plain full tensors allocated from the DCP metadata: DCP reassembles whatever layout (FSDP shards, TP
shards, one process) the checkpoint was saved with. Nothing here needs a process group.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from truestep.checkpoint.fsio import atomic_write, fsync_dir
from truestep.checkpoint.inspect import checkpoint_root
from truestep.checkpoint.layout import rank_state_name, step_dir_name, step_dirs, step_of
from truestep.checkpoint.manifest import VerifyError, read_json, verify, write_manifest, write_marker
from truestep.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner, UnsafeCheckpointError
from truestep.config.schema import ModelConfig
from truestep.interop.dtypes import cast_for_export, dtype_name
from truestep.interop.errors import InteropError
from truestep.interop.names import sort_key
from truestep.model.llama import Transformer


@contextmanager
def _single_process():
    """DCP warns that it runs without a process group: exactly the intent here (no_dist=True)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


INTEROP_FILE = "interop.json"
"""Written by `truestep import-hf` in place of the rank-state files: where the weights came from and the
model config they fit (flat `model.*` keys, as in rankNNNNN.json `config_keys`)."""
INTEROP_FORMAT = "truestep-interop"
MODEL_PREFIX = "model."


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * torch.empty((), dtype=self.dtype).element_size()


def verified_checkpoint(path: Path, checksums: bool = True) -> Path:
    """The checkpoint directory `path` names, verified with `manifest.verify`.

    `path` is a `step_XXXXXXXX` directory (which must verify), or a checkpoint root / run directory, in
    which case the newest step that verifies is used (nothing is quarantined: this is read-only).
    """
    path = Path(path)
    if not path.is_dir():
        raise InteropError(f"{path}: no such checkpoint directory")
    if step_of(path) is not None:
        try:
            verify(path, checksums)
        except VerifyError as err:
            raise InteropError(
                f"{path} does not verify ({err}); refusing to read an incomplete or corrupted checkpoint"
            ) from err
        return path
    candidates = step_dirs(checkpoint_root(path))
    if not candidates:
        raise InteropError(
            f"{path}: not a checkpoint directory (step_XXXXXXXX) and holds no checkpoints "
            "(neither directly nor under checkpoints/)"
        )
    reasons = []
    for candidate in candidates:
        try:
            verify(candidate, checksums)
        except VerifyError as err:
            reasons.append(f"{candidate.name}: {err}")
            continue
        return candidate
    raise InteropError(f"no checkpoint under {path} verifies:\n  " + "\n  ".join(reasons))


def _model_config_from_keys(keys: dict[str, Any], where: Path) -> ModelConfig:
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    values = {k[len(MODEL_PREFIX) :]: v for k, v in keys.items() if k.startswith(MODEL_PREFIX)}
    if not values:
        raise InteropError(f"{where} records no model.* config keys")
    return ModelConfig(**{k: v for k, v in values.items() if k in known})


def read_model_config(ckpt_dir: Path) -> ModelConfig:
    """The model config a checkpoint was saved with: interop.json (imported weights) or rank00000.json."""
    for name in (INTEROP_FILE, rank_state_name(0)):
        path = ckpt_dir / name
        if not path.is_file():
            continue
        try:
            saved = read_json(path)
        except VerifyError as err:
            raise InteropError(f"{path}: {err}") from err
        keys = saved.get("config_keys") if isinstance(saved, dict) else None
        if not isinstance(keys, dict):
            raise InteropError(f"{path} has no config_keys table")
        return _model_config_from_keys(keys, path)
    raise InteropError(f"{ckpt_dir}: neither {INTEROP_FILE} nor {rank_state_name(0)}: model config unknown")


def model_overrides(cfg: ModelConfig) -> list[str]:
    """`--model.key=value` overrides that reproduce cfg's shape and numerics on the command line."""
    out = []
    for f in dataclasses.fields(ModelConfig):
        if f.name in ("dropout", "init_std"):  # training-time only: the weights do not depend on them
            continue
        value = getattr(cfg, f.name)
        out.append(f"--model.{f.name}={str(value).lower() if isinstance(value, bool) else value}")
    return out


def _reader(ckpt_dir: Path) -> SafeFileSystemReader:
    return SafeFileSystemReader(ckpt_dir)


def model_tensor_meta(ckpt_dir: Path) -> dict[str, TensorMeta]:
    """truestep FQN -> (full shape, dtype) of every model tensor stored in the checkpoint."""
    try:
        metadata = _reader(ckpt_dir).read_metadata()
    except UnsafeCheckpointError as err:
        raise InteropError(f"{ckpt_dir}: {err}") from err
    except OSError as err:
        raise InteropError(f"{ckpt_dir}: cannot read DCP metadata: {err}") from err
    found = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(item, TensorStorageMetadata):
            found[key[len(MODEL_PREFIX) :]] = TensorMeta(tuple(item.size), item.properties.dtype)
    if not found:
        raise InteropError(f"{ckpt_dir}: the checkpoint holds no model weights")
    return dict(sorted(found.items(), key=lambda kv: sort_key(kv[0])))


def load_model_tensors(
    ckpt_dir: Path,
    fqns: list[str] | None = None,
    meta: dict[str, TensorMeta] | None = None,
    into: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Full CPU tensors (stored dtype) for `fqns` (default: every model tensor).

    With `into`, DCP copies straight into those tensors (e.g. a model's own parameters) instead.
    """
    if into is None:
        meta = meta if meta is not None else model_tensor_meta(ckpt_dir)
        wanted = list(meta) if fqns is None else fqns
        into = {fqn: torch.empty(meta[fqn].shape, dtype=meta[fqn].dtype) for fqn in wanted}
    if into:
        try:
            with _single_process():
                dcp.load(
                    {"model": into}, storage_reader=_reader(ckpt_dir), planner=SafeLoadPlanner(), no_dist=True
                )
        except UnsafeCheckpointError as err:
            raise InteropError(f"{ckpt_dir}: {err}") from err
    return into


def shape_problems(
    meta: dict[str, TensorMeta],
    expected: dict[str, tuple[int, ...]],
    name: Callable[[str], str] = str,
    stored: str = "checkpoint",
    wanted: str = "model expects",
) -> list[str]:
    """Differences between stored tensors and the expected {fqn: shape}, one line per key (named by `name`)."""
    problems = []
    for fqn, shape in expected.items():
        if fqn not in meta:
            problems.append(f"{name(fqn)}: missing from the {stored} ({wanted} {list(shape)})")
        elif meta[fqn].shape != tuple(shape):
            problems.append(f"{name(fqn)}: {stored} has {list(meta[fqn].shape)}, {wanted} {list(shape)}")
    for fqn in meta:
        if fqn not in expected:
            problems.append(f"{name(fqn)}: in the {stored} but not a parameter of the model")
    return problems


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{fqn: shape} of the persistent state of a Transformer(cfg), built on the meta device."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_config_fits(ckpt_dir: Path, cfg: ModelConfig, meta: dict[str, TensorMeta]) -> None:
    problems = shape_problems(meta, expected_shapes(cfg))
    if problems:
        raise InteropError(
            f"{ckpt_dir}: the stored weights do not match the model config recorded with them:\n  "
            + "\n  ".join(problems[:20])
        )


def export_torch(
    ckpt: Path, file: Path, checksums: bool = True, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """Consolidate the model weights of a (verified) checkpoint into one `torch.save` state dict (`dtype`)."""
    ckpt_dir = verified_checkpoint(ckpt, checksums)
    cfg = read_model_config(ckpt_dir)
    meta = model_tensor_meta(ckpt_dir)
    check_config_fits(ckpt_dir, cfg, meta)
    tensors = load_model_tensors(ckpt_dir, meta=meta)
    state = {fqn: cast_for_export(t, dtype, fqn) for fqn, t in tensors.items()}
    if cfg.tie_embeddings and "output.weight" in state:
        state["output.weight"] = state["tok_embeddings.weight"]  # tied as in the module's state_dict
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp.{os.getpid()}")
    try:
        torch.save(state, tmp)
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)
    return {
        "checkpoint": str(ckpt_dir),
        "file": str(file),
        "tensors": len(state),
        "bytes": file.stat().st_size,
        "dtype": dtype_name(dtype),
    }


def prepare_new_dir(path: Path, what: str) -> Path:
    """A fresh staging directory next to `path`; `path` itself must not exist or be empty."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InteropError(
            f"{path} already exists and is not an empty directory; refusing to overwrite {what}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    return staging


def publish_dir(staging: Path, path: Path) -> None:
    """Move a finished staging directory into place (a single rename)."""
    umask = os.umask(0)
    os.umask(umask)
    for item in staging.iterdir():  # some writers create 0600 files; give them the usual mode
        item.chmod(0o666 & ~umask)
    staging.chmod(0o777 & ~umask)
    if path.is_dir():
        path.rmdir()  # empty, checked by prepare_new_dir
    os.replace(staging, path)
    fsync_dir(path.parent)


def write_weights_checkpoint(
    out: Path,
    tensors: dict[str, torch.Tensor],
    cfg: ModelConfig,
    source: dict[str, Any],
    step: int = 0,
    extra_files: dict[str, bytes] | None = None,
    extra_info: dict[str, Any] | None = None,
) -> Path:
    """Write a weights-only truestep checkpoint (DCP + interop.json + manifest + COMMITTED).

    `out` is the `step_XXXXXXXX` directory itself, or a checkpoint root under which
    `step_XXXXXXXX` (for `step`) is created. `extra_files` (bare name -> bytes, e.g. a tokenizer) are
    written beside the weights and covered by the manifest; `extra_info` is merged into interop.json.
    Returns the step directory; it verifies.
    """
    out = Path(out)
    if step_of(out) is not None:
        step_dir, step = out, step_of(out) or 0
    else:
        step_dir = out / step_dir_name(step)
    staging = prepare_new_dir(step_dir, "a checkpoint")
    try:
        with _single_process():
            writer = FileSystemWriter(staging, sync_files=True)
            dcp.save({"model": tensors}, storage_writer=writer, no_dist=True)
        info = {
            "format": INTEROP_FORMAT,
            "version": 1,
            "kind": "weights-only",
            "created_at": time.time(),
            "source": source,
            "config_keys": {f"{MODEL_PREFIX}{k}": v for k, v in dataclasses.asdict(cfg).items()},
            "model_overrides": model_overrides(cfg),
            **(extra_info or {}),
        }
        atomic_write(staging / INTEROP_FILE, json.dumps(info, indent=1).encode())
        for name, data in (extra_files or {}).items():
            atomic_write(staging / Path(name).name, data)
        manifest = write_manifest(staging, step)
        write_marker(staging, step, manifest)
        publish_dir(staging, step_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    verify(step_dir, checksums=True)
    return step_dir
