"""Tokenizers: the built-in byte tokenizer and a thin wrapper around a HF `tokenizer.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from truestep.data.errors import DataError
from truestep.data.native import native_calls
from truestep.data.tokenizer_guard import check_tokenizer_definition
from truestep.data.tokenizer_read import parse_json_object, read_tokenizer_file, read_tokenizer_json_object

# Names tried, in order, when a HF tokenizer is loaded without an explicit --eos-token. They cover
# Llama 3, Llama 2 / Mistral / T5, GPT-2 / NeoX and Gemma style vocabularies.
COMMON_EOS_TOKENS: tuple[str, ...] = ("<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>")
# Likewise for the beginning-of-sequence token when no tokenizer_config.json names one.
COMMON_BOS_TOKENS: tuple[str, ...] = ("<|begin_of_text|>", "<s>", "<bos>")
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


class Tokenizer(Protocol):
    """What `prepare_data` needs from a tokenizer."""

    name: str
    vocab_size: int
    eos_id: int
    bos_id: int | None
    pad_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def encode_array(self, text: str) -> np.ndarray: ...


class ByteTokenizer:
    """Token = UTF-8 byte value (0..255); EOS is the extra id 256.

    It needs no files and no downloads, so the demo corpus and the tests work on every machine.
    """

    name = "byte"
    eos_id = 256
    bos_id = None
    pad_id = None
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no EOS appended)."""
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        """Same ids as `encode`, as a numpy array; avoids a Python int per byte on big files."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, ids: list[int] | np.ndarray) -> str:
        """Inverse of `encode`; EOS ids are dropped and invalid UTF-8 is replaced, not raised."""
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer loaded from a `tokenizer.json` file."""

    def __init__(
        self,
        path: str | Path,
        eos_token: str | None = None,
        eos_id: int | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        """`eos_id`, when known (e.g. from a model's config), is used as it is instead of looking it up.
        `files`: the tokenizer.json (and tokenizer_config.json) already read (`read_tokenizer_files`), so
        that what is loaded is what is copied; else they are read from beside `path`, confined to its
        folder and bounded (data/tokenizer_read.py). The definition is checked before the library sees
        it (data/tokenizer_guard.py): a normalizer bomb is refused, not run into an abort."""
        self.path = Path(path)
        try:
            # Imported lazily: `tokenizers` is an optional dependency and the byte path must not need it.
            import tokenizers
        except ImportError as e:
            raise DataError(
                "loading a tokenizer.json needs the `tokenizers` package: pip install tokenizers"
            ) from e
        root = self.path.parent
        data = files.get(TOKENIZER_JSON) if files is not None else read_tokenizer_file(self.path, root)
        if data is None:
            raise DataError(f"tokenizer file not found: {self.path}")
        check_tokenizer_definition(data, str(self.path))
        try:
            self._tok: Any = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # the Rust side raises plain Exception subclasses; UnicodeDecodeError
            raise DataError(f"cannot load tokenizer {self.path}: {' '.join(str(e).split())[:300]}") from e
        self.name = str(path)
        self.config: dict[str, Any] = _config(root, files)
        """tokenizer_config.json beside it ({} without one)."""
        self.vocab_size: int = int(self._tok.get_vocab_size())
        self.eos_id: int = self._find_eos(eos_token) if eos_id is None else eos_id
        named = _special_tokens_named(self.config)
        self.bos_id: int | None = self._find(named.get("bos_token"), COMMON_BOS_TOKENS)
        self.pad_id: int | None = self._find(named.get("pad_token"), ())

    def _find(self, token: str | None, fallbacks: tuple[str, ...]) -> int | None:
        """The id of `token` (named by tokenizer_config.json), else of the first fallback in the vocabulary."""
        if token is not None:
            token_id = self._tok.token_to_id(token)
            if token_id is None:
                raise DataError(
                    f"{self.path.parent / TOKENIZER_CONFIG} names {token!r}, which is not in the vocabulary "
                    f"of {self.path}"
                )
            return int(token_id)
        for candidate in fallbacks:
            token_id = self._tok.token_to_id(candidate)
            if token_id is not None:
                return int(token_id)
        return None

    def _find_eos(self, eos_token: str | None) -> int:
        if eos_token is not None:
            eos_id = self._tok.token_to_id(eos_token)
            if eos_id is None:
                raise DataError(f"EOS token {eos_token!r} is not in the vocabulary of {self.path}")
            return int(eos_id)
        for candidate in COMMON_EOS_TOKENS:
            eos_id = self._tok.token_to_id(candidate)
            if eos_id is not None:
                return int(eos_id)
        raise DataError(
            f"could not find an end-of-text token in {self.path} (tried {', '.join(COMMON_EOS_TOKENS)}); "
            "name it with --eos-token"
        )

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`.

        add_special_tokens=False by default: post-processors such as Llama's would insert a BOS per call,
        and document boundaries are marked by the EOS that `prepare_data` appends instead. A prompt for
        generation wants them (True), as `transformers`' tokenizer(text) adds them.
        """
        with native_calls(f"encoding with {self.path}"):
            return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens included as their text."""
        with native_calls(f"decoding with {self.path}"):
            return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))

    def encode_array(self, text: str) -> np.ndarray:
        """Same ids as `encode`, as an int64 numpy array."""
        return np.asarray(self.encode(text), dtype=np.int64)


def _config(root: Path, files: dict[str, bytes] | None) -> dict[str, Any]:
    """tokenizer_config.json of the tokenizer folder `root` ({} without one), from `files` when given."""
    where = root / TOKENIZER_CONFIG
    if files is None:
        return read_tokenizer_json_object(where, root) or {}
    data = files.get(TOKENIZER_CONFIG)
    return {} if data is None else parse_json_object(data, where)


def _special_tokens_named(config: dict[str, Any]) -> dict[str, str]:
    """bos_token/pad_token named by a tokenizer_config.json beside the tokenizer.json (if there is one)."""
    named = {}
    for key in ("bos_token", "pad_token"):
        value = config.get(key)
        if isinstance(value, dict):  # the AddedToken form: {"content": "<s>", ...}
            value = value.get("content")
        if isinstance(value, str):
            named[key] = value
    return named


def load_tokenizer(spec: str, eos_token: str | None = None) -> ByteTokenizer | HFTokenizer:
    """Return the tokenizer named by `spec`: "byte" or a path to a HF tokenizer.json."""
    if spec == "byte":
        if eos_token is not None:
            # The byte tokenizer's EOS is fixed; silently ignoring the flag would hide a mistake.
            raise DataError("--eos-token only applies to a tokenizer.json, not to the byte tokenizer")
        return ByteTokenizer()
    return HFTokenizer(spec, eos_token=eos_token)
