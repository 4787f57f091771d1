"""The tokenizer of a checkpoint, and the tokenizer files + special-token ids an HF export carries.

Where a checkpoint's tokenizer is found:
- an imported checkpoint (`interop.json`) carries the source's tokenizer files in its own directory
  (covered by its manifest) and the source's bos/eos/pad ids;
- a training checkpoint records the run's `data.path` (rank-state `config_keys`); the data directory
  holds the tokenizer `prepare-data` copied into it and the ids in its meta.json. An empty `data.path`
  is the built-in demo corpus, byte-tokenized. A relative `data.path` is relative to where training ran:
  when it is not found from here, say so and ask for `--data DIR` (or `--no-tokenizer`), never guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from truestep.checkpoint.manifest import VerifyError, read_json
from truestep.checkpoint.state import read_rank_state
from truestep.checkpoint.weights import WEIGHTS_INFO_FILE
from truestep.config.schema import ModelConfig
from truestep.core.fsio import OversizeFileError, UnsafePathError, atomic_write, read_regular
from truestep.core.outside import OutsideJsonError, loads_bounded
from truestep.data.errors import DataError
from truestep.data.meta import read_meta
from truestep.data.tokenizer import ByteTokenizer, HFTokenizer
from truestep.data.tokenizer_files import (
    BYTE_EOS_TOKEN,
    GENERATION_CONFIG,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TOKENIZER_FILES,
    TOKENIZER_JSON,
    byte_tokenizer_config,
    byte_tokenizer_json,
    data_tokenizer,
)
from truestep.interop.errors import InteropError
from truestep.interop.hf_config import SPECIAL_TOKEN_KEYS, merged_eos

MAX_GENERATION_CONFIG_BYTES = 1 << 20

BYTE_NOTE = "TOKENIZER.md"
_BYTE_NOTE_TEXT = f"""# Tokenizer: truestep's byte tokenizer

This model was trained on truestep's built-in byte tokenizer, not on a vocabulary of its own:

- token id = the value of one UTF-8 byte (0-255): `list(text.encode("utf-8"))`
- id 256 = end of text (`{BYTE_EOS_TOKEN}`); no beginning-of-sequence token
- ids from 257 up to `vocab_size` never occur in the training data

`tokenizer.json` here encodes exactly that (a byte-level BPE with no merges), so
`AutoTokenizer.from_pretrained(this_dir)` works; to decode by hand,
`bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")`.
"""


@dataclass(frozen=True)
class CheckpointTokenizer:
    kind: str
    """"byte", "hf" (tokenizer files) or "none" (an imported model whose source had no tokenizer)."""
    files: tuple[Path, ...]
    special_tokens: dict[str, Any]
    """bos_token_id, eos_token_id (an id or a list of ids), pad_token_id; None when unknown."""
    source: str
    """Where it was found, for messages."""
    vocab_size: int | None = None
    """Ids the tokenizer can produce, where known (the data directory's or the byte tokenizer's)."""

    def eos_ids(self) -> list[int]:
        eos = self.special_tokens.get("eos_token_id")
        return [] if eos is None else list(eos) if isinstance(eos, list) else [eos]

    def load(self) -> ByteTokenizer | HFTokenizer:
        if self.kind == "byte":
            return ByteTokenizer()
        if self.kind == "none":
            raise InteropError(f"{self.source} has no tokenizer files; give token ids with --prompt-ids")
        try:
            return HFTokenizer(self.files[0], eos_id=self.eos_ids()[0] if self.eos_ids() else None)
        except DataError as err:
            raise InteropError(f"tokenizer of {self.source}: {err}") from err


def _bundled_files(directory: Path, names: Any, where: Path) -> tuple[Path, ...]:
    """Tokenizer files listed by name in a JSON record: bare names from the known set, no symlinks."""
    if not isinstance(names, list) or any(name not in TOKENIZER_FILES for name in names):
        raise InteropError(f"{where}: tokenizer files must be among {TOKENIZER_FILES}, got {names!r}")
    if names and names[0] != TOKENIZER_JSON:
        raise InteropError(f"{where}: tokenizer files must start with {TOKENIZER_JSON}")
    files = tuple(directory / name for name in names)
    for path in files:
        if path.is_symlink() or not path.is_file():
            raise InteropError(f"tokenizer file {path} listed in {where} is missing (or a symlink)")
    return files


def _from_data_dir(data_dir: Path, why: str) -> CheckpointTokenizer:
    try:
        meta = read_meta(data_dir)
        found = data_tokenizer(data_dir, meta)
    except DataError as err:
        raise InteropError(f"{why}: {err}") from err
    ids = {"bos_token_id": found.bos_id, "eos_token_id": found.eos_id, "pad_token_id": found.pad_id}
    # The eos the documents were separated by first, then the model's others (an Instruct model's turn end).
    ids["eos_token_id"] = merged_eos(found.eos_id, bundled_generation(found.files).get("eos_token_id"))
    return CheckpointTokenizer(found.kind, found.files, ids, f"data directory {data_dir}", found.vocab_size)


def bundled_generation(files: tuple[Path, ...]) -> dict[str, Any]:
    """The generation_config.json among a tokenizer's bundled files ({} without one); its eos ids checked
    to be ids (the vocabulary bound is checked against the model by `check_tokenizer_fits`)."""
    path = next((p for p in files if p.name == GENERATION_CONFIG), None)
    if path is None:
        return {}
    try:
        # Strict: its defaults are exported as they are, and an export writes only strict JSON (NaN and
        # Infinity are not JSON: a loader elsewhere refuses the file).
        data = loads_bounded(
            read_regular(path, MAX_GENERATION_CONFIG_BYTES, follow_symlinks=False), str(path)
        )
    except OutsideJsonError as err:
        raise InteropError(str(err)) from None
    except (OSError, UnsafePathError, OversizeFileError) as err:
        raise InteropError(f"{path}: unreadable: {err}") from None
    if not isinstance(data, dict):
        raise InteropError(f"{path} is not a JSON object")
    eos = data.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise InteropError(f"{path}: eos_token_id={eos!r} is not a list of ids")
    return data


def checkpoint_tokenizer(ckpt_dir: Path, data_dir: Path | None = None) -> CheckpointTokenizer:
    """The tokenizer `ckpt_dir`'s model reads (see the module docstring); `data_dir` overrides the lookup."""
    if data_dir is not None:
        return _from_data_dir(Path(data_dir), f"--data {data_dir}")
    try:
        interop = ckpt_dir / WEIGHTS_INFO_FILE
        if interop.is_file() or interop.is_symlink():
            info = read_json(interop)
            record = info.get("tokenizer") if isinstance(info, dict) else None
            if not isinstance(record, dict):
                raise InteropError(
                    f"{interop} records no tokenizer (imported by an older truestep); give --data DIR or "
                    "--no-tokenizer"
                )
            files = _bundled_files(ckpt_dir, record.get("files"), interop)
            ids = {key: record.get(key) for key in SPECIAL_TOKEN_KEYS}
            ids["eos_token_id"] = merged_eos(
                ids["eos_token_id"], bundled_generation(files).get("eos_token_id")
            )
            return CheckpointTokenizer(
                "hf" if files else "none", files, ids, f"imported checkpoint {ckpt_dir}"
            )
        keys = read_rank_state(ckpt_dir, 0).config_keys
    except VerifyError as err:
        raise InteropError(f"{ckpt_dir}: {err}") from err
    if "data.path" not in keys:
        raise InteropError(
            f"{ckpt_dir}: the run's data.path is not recorded; give --data DIR or --no-tokenizer"
        )
    recorded = keys["data.path"]
    if recorded == "" and "data.sources[0].path" in keys:
        # A mixture (data/mixture.py): every source was checked to share one tokenizer; the first names it.
        recorded = keys["data.sources[0].path"]
    if not isinstance(recorded, str) or "\0" in recorded:
        raise InteropError(
            f"{ckpt_dir}: the recorded data.path {recorded!r:.80} is not a path; give --data DIR"
        )
    if recorded == "":
        byte_ids = {"bos_token_id": None, "eos_token_id": ByteTokenizer.eos_id, "pad_token_id": None}
        return CheckpointTokenizer(
            "byte", (), byte_ids, "the built-in demo corpus (byte tokenizer)", ByteTokenizer.vocab_size
        )
    path = Path(recorded).expanduser()
    if not path.is_dir():
        raise InteropError(
            f"the run's data directory {recorded!r} (data.path; a relative path is relative to where training "
            f"ran) is not found from {Path.cwd()}; give it with --data DIR, or --no-tokenizer to export the "
            "weights alone"
        )
    return _from_data_dir(path, f"data.path={recorded}")


def check_tokenizer_fits(tok: CheckpointTokenizer, cfg: ModelConfig) -> None:
    """Refuse a tokenizer that can produce ids the model has no embedding for (a wrong --data, say)."""
    ids = [v for key in ("bos_token_id", "pad_token_id") if (v := tok.special_tokens.get(key)) is not None]
    largest = max([*ids, *tok.eos_ids(), (tok.vocab_size or 0) - 1])
    if largest >= cfg.vocab_size:
        raise InteropError(
            f"the tokenizer of {tok.source} has ids up to {largest}, beyond model.vocab_size={cfg.vocab_size}: "
            "not this model's tokenizer (give the right one with --data DIR)"
        )


SPECIAL_TOKEN_NAMES = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "pad_token": "pad_token_id"}
"""A tokenizer config's special-token attribute -> the id field it stands for."""
MAX_TOKENIZER_CONFIG_BYTES = 16 << 20
"""A tokenizer_config.json may hold an inline chat template: megabytes at most."""


def _named_in(path: Path) -> dict[str, str]:
    """The special tokens a tokenizer_config.json or special_tokens_map.json names, as their text (a
    string, or an AddedToken record's `content`)."""
    try:
        data = json.loads(read_regular(path, MAX_TOKENIZER_CONFIG_BYTES, follow_symlinks=False))
    except (OSError, UnsafePathError, OversizeFileError, ValueError, RecursionError) as err:
        raise InteropError(f"{path}: unreadable: {err}") from None
    if not isinstance(data, dict):
        raise InteropError(f"{path} is not a JSON object")
    found = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = data.get(name)
        text = value.get("content") if isinstance(value, dict) else value
        if isinstance(text, str):
            found[name] = text
    return found


def special_token_texts(tok: CheckpointTokenizer) -> dict[str, str]:
    """bos/eos/pad token text as the tokenizer's own files name them (special_tokens_map.json over
    tokenizer_config.json, as transformers reads them); a token they do not name is the text of its id
    (the first eos id). What the export writes must say what it read: an Instruct model's tokenizer names
    `<|eot_id|>` as its eos_token while its first eos id is `<|end_of_text|>`, and chat and SFT code reads
    the attribute."""
    named: dict[str, str] = {}
    for file_name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):  # the map last: it wins
        path = next((p for p in tok.files if p.name == file_name), None)
        if path is not None:
            named.update(_named_in(path))
    loaded = tok.load()
    assert isinstance(loaded, HFTokenizer)
    for name, key in SPECIAL_TOKEN_NAMES.items():
        ids = tok.eos_ids()[:1] if key == "eos_token_id" else [tok.special_tokens.get(key)]
        if name not in named and ids and ids[0] is not None:
            named[name] = loaded.decode(ids)
    return named


def _minimal_tokenizer_config(tok: CheckpointTokenizer) -> bytes:
    """tokenizer_config.json for a tokenizer.json without one: load it as it is, with its special tokens."""
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        **special_token_texts(tok),
    }
    return json.dumps(config, indent=2).encode()


def write_tokenizer(tok: CheckpointTokenizer, staging: Path) -> list[str]:
    """Write the tokenizer files (and, for the byte tokenizer, a note saying what it is) into `staging`."""
    if tok.kind == "none":
        return []
    if tok.kind == "byte":
        atomic_write(staging / TOKENIZER_JSON, byte_tokenizer_json())
        atomic_write(staging / TOKENIZER_CONFIG, byte_tokenizer_config())
        atomic_write(staging / BYTE_NOTE, _BYTE_NOTE_TEXT.encode())
        return [TOKENIZER_JSON, TOKENIZER_CONFIG, BYTE_NOTE]
    written = []
    for path in tok.files:
        if path.name == GENERATION_CONFIG:  # written by the export itself, with the ids merged in
            continue
        atomic_write(staging / path.name, path.read_bytes())
        written.append(path.name)
    if TOKENIZER_CONFIG not in written:
        atomic_write(staging / TOKENIZER_CONFIG, _minimal_tokenizer_config(tok))
        written.append(TOKENIZER_CONFIG)
    if SPECIAL_TOKENS_MAP not in written:
        atomic_write(staging / SPECIAL_TOKENS_MAP, _special_tokens_map(tok))
        written.append(SPECIAL_TOKENS_MAP)
    return written


def _special_tokens_map(tok: CheckpointTokenizer) -> bytes:
    """special_tokens_map.json for a tokenizer without one: the same tokens its config names (written for
    readers that look for the map; it never contradicts the config beside it)."""
    return json.dumps(special_token_texts(tok), indent=2).encode()


def generation_config(tok: CheckpointTokenizer) -> dict[str, Any]:
    """generation_config.json: the source's generation defaults (do_sample, temperature, top_p, ...) where
    the tokenizer carries them, with the ids `generate()` stops at (every eos) and pads with."""
    return {
        **bundled_generation(tok.files),
        **{key: tok.special_tokens.get(key) for key in SPECIAL_TOKEN_KEYS},
    }
