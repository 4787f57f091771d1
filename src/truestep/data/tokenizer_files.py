"""The tokenizer travels with the data: `prepare-data` copies a `tokenizer.json` (and the config files
beside it) into the data directory, and meta.json names them relative to that directory.

So a data directory moved to another machine, or read by `truestep export`/`generate` from elsewhere,
still knows how its ids were made. meta.json may come from anywhere: the names it lists must be bare
file names from a fixed set, and symlinks are not followed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from truestep.data.atomic import atomic_write_bytes
from truestep.data.errors import DataError
from truestep.data.tokenizer import TOKENIZER_CONFIG, TOKENIZER_JSON, ByteTokenizer, HFTokenizer
from truestep.data.tokenizer_read import parse_json_object, read_tokenizer_file

SPECIAL_TOKENS_MAP = "special_tokens_map.json"
CHAT_TEMPLATE = "chat_template.jinja"
"""Where transformers 5 keeps the chat template (older versions: `chat_template` in tokenizer_config.json)."""
GENERATION_CONFIG = "generation_config.json"
"""The model's generation defaults and its full eos list (an Instruct model stops at several ids)."""
TOKENIZER_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, CHAT_TEMPLATE, GENERATION_CONFIG)
"""Everything `prepare-data` copies (the first always, the others when they sit beside it), `import-hf`
keeps and `export` gives back: what makes a model usable travels with its tokenizer."""
BYTE_EOS_TOKEN = "<|end_of_text|>"


@dataclass(frozen=True)
class DataTokenizer:
    """The tokenizer of a prepared data directory, as its meta.json records it."""

    kind: str
    """"byte" or "hf" (a tokenizer.json copied into the directory)."""
    files: tuple[Path, ...]
    """The copied tokenizer files (empty for the byte tokenizer)."""
    vocab_size: int
    eos_id: int
    bos_id: int | None
    pad_id: int | None

    def load(self, eos_token: str | None = None) -> ByteTokenizer | HFTokenizer:
        if self.kind == "byte":
            return ByteTokenizer()
        return HFTokenizer(self.files[0], eos_token=eos_token)


def read_tokenizer_files(tokenizer_json: Path) -> dict[str, bytes]:
    """`tokenizer_json` and the companion config files beside it, as {name in the data directory: bytes}:
    each confined to the tokenizer's folder and bounded (data/tokenizer_read.py), the JSON ones checked to
    be JSON objects within bounds (no NaN: they travel into exports, which write strict JSON).

    Read before the output directory is claimed: the source may be the copy inside a data directory
    that is being prepared again.
    """
    root = tokenizer_json.parent
    found = {}
    for name in TOKENIZER_FILES:
        source = tokenizer_json if name == TOKENIZER_JSON else root / name
        data = read_tokenizer_file(source, root)
        if data is None:
            if name == TOKENIZER_JSON:
                raise DataError(f"tokenizer file not found: {source}")
            continue
        if name.endswith(".json") and name != TOKENIZER_JSON:
            parse_json_object(data, source)  # refused here, in one line, if it is not one
        found[name] = data
    return found


def write_tokenizer_files(files: dict[str, bytes], out_dir: Path) -> list[str]:
    """Write the files of `read_tokenizer_files` into `out_dir`; return their names (tokenizer.json first).

    Through a temp file and a rename: a symlink planted at the destination is replaced, never followed.
    """
    for name, data in files.items():
        atomic_write_bytes(out_dir / name, data)
    return list(files)


def _optional_id(meta: dict[str, Any], key: str, vocab_size: int, where: Path) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab_size:
        raise DataError(f"{where}: {key} must be null or an id below vocab_size {vocab_size}, got {value!r}")
    return value


def data_tokenizer(data_dir: Path, meta: dict[str, Any]) -> DataTokenizer:
    """The tokenizer recorded in a data directory's (already structurally validated) meta.json."""
    where = Path(data_dir) / "meta.json"
    vocab_size, eos_id = int(meta["vocab_size"]), int(meta["eos_id"])
    bos_id = _optional_id(meta, "bos_id", vocab_size, where)
    pad_id = _optional_id(meta, "pad_id", vocab_size, where)
    if meta.get("tokenizer") == "byte":
        return DataTokenizer("byte", (), vocab_size, eos_id, bos_id, pad_id)
    names = meta.get("tokenizer_files")
    if names is None:
        raise DataError(
            f"{where}: the tokenizer ({meta.get('tokenizer')!r}) was not copied into the data directory "
            "(prepared by an older truestep); run `truestep prepare-data` again to bundle it"
        )
    if (
        not isinstance(names, list)
        or not names
        or names[0] != TOKENIZER_JSON
        or any(name not in TOKENIZER_FILES for name in names)
    ):
        raise DataError(
            f"{where}: tokenizer_files must list {TOKENIZER_JSON} first, then only {TOKENIZER_FILES}"
        )
    files = []
    for name in names:
        path = Path(data_dir) / name
        if path.is_symlink() or not path.is_file():
            raise DataError(f"tokenizer file {path} listed in {where} is missing (or a symlink)")
        files.append(path)
    return DataTokenizer("hf", tuple(files), vocab_size, eos_id, bos_id, pad_id)


def byte_tokenizer_json() -> bytes:
    """A Hugging Face tokenizer.json that encodes exactly as `ByteTokenizer`: id = UTF-8 byte, 256 = EOS.

    A byte-level BPE with no merges: the byte-level pre-tokenizer maps each byte to one printable
    character and the vocabulary maps that character back to the byte's value.
    """
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError as e:
        raise DataError(
            "writing a tokenizer.json needs the `tokenizers` package: pip install tokenizers"
        ) from e
    tokenizer = Tokenizer(models.BPE(vocab=_byte_level_vocab(), merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(BYTE_EOS_TOKEN, special=True)])
    return tokenizer.to_str(pretty=True).encode("utf-8")


def _byte_level_vocab() -> dict[str, int]:
    """{character: byte value} for the byte-level pre-tokenizer's table (GPT-2's): printable bytes map
    to themselves, the others to characters from U+0100 on, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return {char: b for b, char in chars.items()}


def byte_tokenizer_config() -> bytes:
    return json.dumps(
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": BYTE_EOS_TOKEN,
            "clean_up_tokenization_spaces": False,
        },
        indent=2,
    ).encode("utf-8")
