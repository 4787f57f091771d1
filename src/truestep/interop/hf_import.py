"""Hugging Face Llama directory -> weights-only truestep checkpoint (`truestep import-hf`).

An HF directory from someone else is untrusted input, so nothing it declares is believed before it is
checked against what is actually there, and nothing is allocated before that:

1. `config.json` (and `generation_config.json`, the index) are read as bounded regular files (a FIFO is
   refused, never opened for reading) and must describe a valid truestep model (`validate_model`);
2. the weight files are the index's entries, each a plain file name inside the directory (no `/`, no
   `..`: the Hugging Face cache's own symlinks into its blob store are followed, names that leave the
   directory are not), each a regular file;
3. every file's safetensors *header* is read first (names, dtypes, shapes; safetensors checks that the
   header's byte ranges fit the file): a tensor stored twice (in two shards, or not where the index says)
   is refused, non-float dtypes are refused, and the shapes (the layer count first) are compared with what
   `config.json` implies before a byte of tensor data is read;
4. only then are tensors read, one at a time, and each must be finite.
Only safetensors are read: pickled `.bin` weights are refused.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import torch

from truestep.checkpoint.weights import (
    TensorMeta,
    WeightsError,
    expected_shapes,
    layer_count_problem,
    model_overrides,
    problem_list,
    shape_problems,
)
from truestep.checkpoint.weights_only import write_weights_checkpoint
from truestep.core.fsio import OversizeFileError, UnsafePathError, plain_file_name, read_regular
from truestep.core.outside import OutsideJsonError, UnconfinedPathError, loads_bounded
from truestep.core.outside import confined as outside_confined
from truestep.data.errors import DataError
from truestep.data.tokenizer import HFTokenizer
from truestep.data.tokenizer_files import GENERATION_CONFIG, TOKENIZER_FILES, TOKENIZER_JSON
from truestep.data.tokenizer_read import parse_json_object
from truestep.interop.errors import InteropError
from truestep.interop.hf_config import (
    ARCHITECTURE,
    CONFIG,
    merged_eos,
    model_config_from_hf,
    special_token_ids,
)
from truestep.interop.names import from_hf, to_hf

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_JSON_BYTES = 64 << 20
"""config.json is a few KB and an index a few MB; a tokenizer.json tens of MB."""
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
"""safetensors dtypes a Llama checkpoint's weights may have; anything else (integers, fp8, bool) is refused."""
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def safetensors_module() -> Any:
    try:
        import safetensors.torch
    except ImportError as err:
        raise InteropError(
            "Hugging Face interop needs the safetensors package: pip install 'truestep[hf]'"
        ) from err
    return safetensors


def safetensors_failure(err: Exception, path: Path, doing: str) -> Exception:
    """A safetensors error as truestep's: an OSError (`(os error 28)` is a full disk) or an InteropError."""
    found = _OS_ERROR.search(str(err))
    if found:
        number = int(found.group(1))
        return OSError(number, os.strerror(number), str(path))
    return InteropError(f"{path}: {doing}: {err}")


def confined(path: Path) -> Path:
    """`path`, a file of an HF directory, with a symlink resolved only when it stays inside the directory
    (or, for a Hugging Face cache snapshot, inside that repository's `blobs/`): a link a git clone
    carries to `~/.ssh/...` or `/etc/...` is refused, never read or copied into a checkpoint."""
    try:
        return outside_confined(path)
    except UnconfinedPathError as err:
        raise InteropError(str(err)) from None


def read_hf_json(path: Path, required: bool = True, allow_nan: bool = True) -> Any:
    """A JSON file of an HF directory (symlinks followed only within it, as in the HF cache; never a
    FIFO; bounded; nesting bounded). NaN and Infinity only with `allow_nan` (config.json: its values are
    validated one by one, and say which is not finite)."""
    try:
        data = read_regular(confined(path), MAX_JSON_BYTES, follow_symlinks=False)
    except FileNotFoundError:
        if required:
            raise InteropError(f"{path.parent}: no {path.name}; not a Hugging Face model directory") from None
        return None
    except (UnsafePathError, OversizeFileError) as err:
        raise InteropError(f"{path}: {err.strerror if isinstance(err, OSError) else err}") from None
    try:
        return loads_bounded(data, str(path), allow_nan=allow_nan)
    except OutsideJsonError as err:  # not UTF-8 JSON, nested too deeply, a huge int, NaN or Infinity
        raise InteropError(str(err)) from None


def _regular(path: Path, why: str) -> Path:
    """`path` (its name kept: the index names it), a regular file or a link within its directory (see
    `confined`)."""
    try:
        mode = os.stat(confined(path)).st_mode
    except FileNotFoundError:
        raise InteropError(f"{why} names {path.name}, which does not exist") from None
    if not stat.S_ISREG(mode):
        raise InteropError(f"{why} names {path.name}, which is not a regular file")
    return path


def weight_files(hf_dir: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files to read and the index's weight map (None without an index)."""
    index_path = hf_dir / INDEX_FILE
    if os.path.lexists(index_path):
        index = read_hf_json(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise InteropError(f"{index_path}: not a safetensors index (no weight_map table)")
        bad = [
            f"{k!r:.60}: {v!r:.60}"
            for k, v in weight_map.items()
            if not isinstance(k, str) or not plain_file_name(v)
        ]
        if bad:
            raise InteropError(
                f"{index_path}: weight_map entries must name files inside the directory: {', '.join(bad[:3])}"
            )
        files = sorted(set(weight_map.values()))
        return [_regular(hf_dir / name, str(index_path)) for name in files], weight_map
    if os.path.lexists(hf_dir / SINGLE_FILE):
        return [_regular(hf_dir / SINGLE_FILE, str(hf_dir))], None
    if any(hf_dir.glob("*.bin")) or any(hf_dir.glob("*.pt")) or any(hf_dir.glob("*.pth")):
        raise InteropError(
            f"{hf_dir} holds only pickled weights (.bin/.pt): only safetensors are imported, since loading "
            "a pickle can run code; convert with transformers (save_pretrained(..., safe_serialization=True))"
        )
    raise InteropError(f"{hf_dir}: no {SINGLE_FILE} or {INDEX_FILE}")


def _headers(
    files: list[Path], weight_map: dict[str, str] | None
) -> tuple[dict[str, tuple[Path, str, TensorMeta]], list[str]]:
    """HF name -> (file, safetensors dtype, meta) from the headers alone, and the unknown names."""
    st = safetensors_module()
    found: dict[str, tuple[Path, str, TensorMeta]] = {}
    unknown: list[str] = []
    for path in files:
        try:
            with st.safe_open(str(path), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                    piece = handle.get_slice(name)
                    kind, shape = piece.get_dtype(), tuple(piece.get_shape())
                    if name in found:
                        raise InteropError(
                            f"{name} is stored twice: in {found[name][0].name} and in {path.name}"
                        )
                    if weight_map is not None and weight_map.get(name) != path.name:
                        where = weight_map.get(name)
                        raise InteropError(
                            f"{name} is stored in {path.name}, but {INDEX_FILE} "
                            + (f"says {where}" if where else "does not list it")
                        )
                    fqn = from_hf(name)
                    if fqn is None:
                        if not name.endswith(
                            "rotary_emb.inv_freq"
                        ):  # a derived buffer some old exports carry
                            unknown.append(name)
                        continue
                    if kind not in FLOAT_DTYPES:
                        raise InteropError(
                            f"{path.name}: {name} is stored as {kind}; only float weights "
                            f"({', '.join(FLOAT_DTYPES)}) are imported (integer or fp8 tensors mean a quantized "
                            "or non-Llama checkpoint)"
                        )
                    found[name] = (path, kind, TensorMeta(shape, FLOAT_DTYPES[kind]))
        except InteropError:
            raise
        except Exception as err:  # SafetensorError (bad header, truncated file), OSError
            raise safetensors_failure(err, path, "not a readable safetensors file") from err
    if weight_map is not None:
        missing = sorted(set(weight_map) - set(found) - set(unknown))
        if missing:
            raise InteropError(f"{INDEX_FILE} lists tensors no file holds: {', '.join(missing[:5])}")
    return found, unknown


FINITE_CHUNK = 1 << 24
"""Elements checked at once: the check's temporary is 16 MB, not as large as the tensor."""


MAX_HEADER_BYTES = 100_000_000
"""safetensors' own limit on a header."""


def _data_start(path: Path) -> tuple[int, dict[str, Any]]:
    """(where tensor data begins, the header) of a safetensors file whose header safetensors has already
    validated (`_headers`: offsets within the file, no overlaps)."""
    with open(path, "rb") as stream:
        size = int.from_bytes(stream.read(8), "little")
        if not 0 < size <= MAX_HEADER_BYTES:
            raise InteropError(f"{path.name}: header size {size} out of range")
        header = json.loads(stream.read(size))
    return 8 + size, header


def _read_one(path: Path, start: int, entry: dict[str, Any], meta: TensorMeta) -> torch.Tensor:
    """One tensor read straight into its own memory with plain reads: no mapping of the file (whose
    pages would count against the process too) and no intermediate copy. safetensors stores
    little-endian, as every machine truestep runs on (checked at import)."""
    if sys.byteorder != "little":
        raise InteropError("importing safetensors needs a little-endian machine")
    begin, end = entry["data_offsets"]
    tensor = torch.empty(meta.shape, dtype=meta.dtype)
    if end - begin != meta.nbytes:
        raise InteropError(f"{path.name}: data of {end - begin} bytes for a {meta.nbytes}-byte tensor")
    target = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
    with open(path, "rb", buffering=0) as stream:
        stream.seek(start + begin)
        done = 0
        while done < len(target):
            got = stream.readinto(target[done:])
            if not got:
                raise InteropError(f"{path.name}: ends inside a tensor's data")
            done += got
    return tensor


def _all_finite(tensor: torch.Tensor) -> bool:
    flat = tensor.reshape(-1)
    return all(
        bool(torch.isfinite(flat[i : i + FINITE_CHUNK]).all()) for i in range(0, flat.numel(), FINITE_CHUNK)
    )


class _TensorReader:
    """Produces one imported tensor at a time (truestep FQN -> tensor in the target dtype), for the
    streaming checkpoint writer: neither the model nor a whole shard (nor mapped pages of it) is ever
    held; each tensor must be finite."""

    def __init__(self, headers: dict[str, tuple[Path, str, TensorMeta]], dtype: torch.dtype | None) -> None:
        self.where = {from_hf(name) or name: (path, name, meta) for name, (path, _, meta) in headers.items()}
        self.files: dict[Path, tuple[int, dict[str, Any]]] = {}
        self.dtype = dtype

    def template(self, headers: dict[str, tuple[Path, str, TensorMeta]]) -> dict[str, torch.Tensor]:
        """Meta-device tensors with each imported tensor's shape and target dtype."""
        return {
            from_hf(name) or name: torch.empty(meta.shape, dtype=self.dtype or meta.dtype, device="meta")
            for name, (_, _, meta) in headers.items()
        }

    def __call__(self, fqn: str) -> torch.Tensor:
        path, name, meta = self.where[fqn]
        try:
            if path not in self.files:
                self.files[path] = _data_start(path)
            start, header = self.files[path]
            tensor = _read_one(path, start, header[name], meta)
            if self.dtype is not None and tensor.dtype != self.dtype:
                tensor = tensor.to(self.dtype)
            tensor = tensor.contiguous()
            if not _all_finite(tensor):
                raise InteropError(f"{path.name}: {name} holds NaN or infinite values; refusing to import it")
            return tensor
        except InteropError:
            raise
        except (RuntimeError, MemoryError) as err:
            if "allocate" in str(err) or isinstance(err, MemoryError):
                raise InteropError(f"{path}: not enough memory to read {name}: {err}") from err
            raise safetensors_failure(err, path, "tensor data does not load") from err
        except Exception as err:  # SafetensorError, OSError
            raise safetensors_failure(err, path, "tensor data does not load") from err


def _special_tokens(hf: dict[str, Any], hf_dir: Path, vocab_size: int) -> dict[str, Any]:
    """bos/eos/pad ids of config.json, completed from generation_config.json where config.json has none;
    the eos ids of both, all of them (an Instruct model stops at several)."""
    found = special_token_ids(hf, vocab_size, str(hf_dir / CONFIG))
    # Strict: its defaults travel into every export, which writes only strict JSON.
    extra = read_hf_json(hf_dir / GENERATION_CONFIG, required=False, allow_nan=False)
    if extra is not None:
        if not isinstance(extra, dict):
            raise InteropError(f"{hf_dir / GENERATION_CONFIG} is not a JSON object")
        more = special_token_ids(extra, vocab_size, str(hf_dir / GENERATION_CONFIG))
        eos = merged_eos(found["eos_token_id"], more["eos_token_id"])
        found = {key: found[key] if found[key] is not None else more[key] for key in found}
        found["eos_token_id"] = eos
    return found


def tokenizer_files_left_out(hf_dir: Path) -> list[str]:
    """Tokenizer companion files (a chat template, a tokenizer config, generation defaults) beside a
    model that has no tokenizer.json: they are not kept (what they describe is a tokenizer the directory
    does not hold; the eos ids of generation_config.json are kept all the same), and import says so."""
    if os.path.lexists(hf_dir / TOKENIZER_JSON):
        return []
    return [name for name in TOKENIZER_FILES if os.path.lexists(hf_dir / name)]


def _tokenizer_files(hf_dir: Path, special: dict[str, Any]) -> dict[str, bytes]:
    """The tokenizer files of an HF directory (none without a tokenizer.json), checked to load."""
    if not os.path.lexists(hf_dir / TOKENIZER_JSON):
        return {}
    files = {}
    for name in TOKENIZER_FILES:
        if os.path.lexists(hf_dir / name):
            try:
                files[name] = read_regular(
                    confined(_regular(hf_dir / name, str(hf_dir))), MAX_JSON_BYTES, follow_symlinks=False
                )
            except OversizeFileError as err:
                raise InteropError(str(err)) from None
            if name.endswith(".json") and name != TOKENIZER_JSON:  # kept, and exported: JSON objects only
                try:
                    parse_json_object(files[name], hf_dir / name)
                except DataError as err:
                    raise InteropError(str(err)) from None
    eos = special.get("eos_token_id")
    try:
        HFTokenizer(hf_dir / TOKENIZER_JSON, eos_id=(eos[0] if isinstance(eos, list) else eos))
    except DataError as err:
        raise InteropError(
            f"{hf_dir}: {err}; remove the tokenizer files to import the weights alone"
        ) from err
    return files


def import_hf(hf_dir: Path, out: Path, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Write the weights of an HF Llama directory as a weights-only truestep checkpoint, streaming: one
    tensor at a time is read, converted to `dtype` (None: as stored) and written. A tied output weight is
    stored once, as the embedding.

    The tokenizer files beside the weights are copied into the checkpoint (and covered by its manifest)
    and the bos/eos/pad ids recorded in interop.json, so an export gives them back.
    """
    hf_dir = Path(hf_dir)
    hf = read_hf_json(hf_dir / CONFIG)
    cfg = model_config_from_hf(hf, str(hf_dir / CONFIG))
    special = _special_tokens(hf, hf_dir, cfg.vocab_size)
    tokenizer_files = _tokenizer_files(hf_dir, special)
    headers, unknown = _headers(*weight_files(hf_dir))
    if unknown:
        biases = [n for n in unknown if n.endswith(".bias")]
        what = (
            "bias tensors (biases are not supported)" if biases else "tensors truestep's Llama does not have"
        )
        raise InteropError(f"{hf_dir}: {what}: {', '.join(unknown[:8])}")
    meta = {from_hf(name) or name: entry[2] for name, entry in headers.items()}
    if cfg.tie_embeddings and "tok_embeddings.weight" in meta:
        # transformers ties lm_head to embed_tokens and usually omits it from the files
        meta["output.weight"] = meta["tok_embeddings.weight"]
    elif not cfg.tie_embeddings and "output.weight" not in meta:
        raise InteropError(f"{hf_dir}: lm_head.weight missing although tie_word_embeddings is false")
    layers = layer_count_problem(meta, cfg.n_layers, "safetensors", f"{CONFIG} implies")
    if layers:
        raise InteropError(f"{hf_dir}: the weights do not match {CONFIG}: {layers}")
    try:
        expected = expected_shapes(cfg)
    except WeightsError as err:
        raise InteropError(f"{hf_dir / CONFIG}: {err}") from None
    problems = shape_problems(meta, expected, to_hf, "safetensors", f"{CONFIG} implies")
    if problems:
        raise InteropError(f"{hf_dir}: the weights do not match {CONFIG}: {problem_list(problems)}")
    if cfg.tie_embeddings:  # a tied lm_head some exports write anyway is the embedding: stored once
        headers = {name: entry for name, entry in headers.items() if from_hf(name) != "output.weight"}
    reader = _TensorReader(headers, dtype)
    state = reader.template(headers)
    dtypes = sorted({str(entry[2].dtype).removeprefix("torch.") for entry in headers.values()})
    source = {
        "type": "huggingface",
        "path": str(hf_dir.resolve()),
        "architecture": ARCHITECTURE,
        "dtypes": dtypes,
        "stored_dtype": str(dtype).removeprefix("torch.") if dtype is not None else "as the source",
        "config": hf,
    }
    record = {"files": list(tokenizer_files), **special}
    step_dir = write_weights_checkpoint(
        Path(out),
        state,
        cfg,
        source,
        extra_files=tokenizer_files,
        extra_info={"tokenizer": record},
        produce=reader,
    )
    n_params = sum(t.numel() for t in state.values())
    return {
        "hf_dir": str(hf_dir),
        "checkpoint": str(step_dir),
        "tensors": len(state),
        "parameters": n_params,
        "source_dtypes": dtypes,
        "model": cfg,
        "model_overrides": model_overrides(cfg),
        "tokenizer_files": list(tokenizer_files),
        "tokenizer_left_out": tokenizer_files_left_out(hf_dir),
        "special_tokens": special,
    }
