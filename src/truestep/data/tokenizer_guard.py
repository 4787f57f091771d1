"""What a tokenizer.json may contain before the `tokenizers` library is handed it.

A tokenizer definition is a program of sorts: its normalizer, pre-tokenizer and decoder are pipelines of
steps that each rewrite the text. About a kilobyte of JSON -- forty `Replace("a" -> "aa")` steps in a
`Sequence` -- doubles a character forty times: the library tries to allocate terabytes and aborts the
process (SIGABRT, no message, no exception to catch), in `generate` and in every `prepare-data` worker.
So before a definition is loaded, each pipeline's worst-case growth is bounded from what its steps say:
how many characters one input character can become. The bound multiplies along a `Sequence`;
a definition whose bound exceeds GROWTH_LIMIT (real tokenizers stay far below: a SentencePiece
charsmap about 18, BERT's normalizer 36) is refused with one line naming the file and the step, as is
one nested deeper than MAX_DEPTH or longer than MAX_STEPS.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from truestep.core.outside import OutsideJsonError, loads_bounded
from truestep.data.errors import DataError

GROWTH_LIMIT = 1024
"""The most characters one input character may become through a normalizer and pre-tokenizer (or a
decoder), by the worst case of each step."""
MAX_DEPTH = 16
"""Sequences nested deeper than this are refused (real tokenizers nest one level)."""
MAX_STEPS = 256
"""Steps (over all nesting) one pipeline may have."""
UNICODE_GROWTH = {"NFC": 3, "NFD": 4, "NFKC": 18, "NFKD": 18}
"""The most code points one code point becomes under each normal form (Unicode's stated bounds)."""
FIXED_GROWTH = {
    "Lowercase": 3,  # a few characters lowercase to more than one ("İ" -> "i̇")
    "BertNormalizer": 36,  # spaces around CJK (x3), accents split (x4), lowercased (x3)
    "ByteLevel": 4,  # a character becomes one character per UTF-8 byte
    "Metaspace": 2,
    "Strip": 1,
    "StripAccents": 1,
    "Nmt": 1,
    "Split": 1,
    "Whitespace": 1,
    "WhitespaceSplit": 1,
    "Punctuation": 1,
    "Digits": 1,
    "BertPreTokenizer": 1,
    "CharDelimiterSplit": 1,
    "UnicodeScripts": 1,
    "FixedLength": 1,
    "WordPiece": 1,
    "BPEDecoder": 1,
    "CTC": 1,
    "Fuse": 1,
    "ByteFallback": 1,
}
UNKNOWN_GROWTH = 4
"""A step of a kind this list does not know (a newer `tokenizers`): assumed to grow a little."""
PIPELINES = (("normalizer", "normalizers"), ("pre_tokenizer", "pretokenizers"), ("decoder", "decoders"))
"""(key in tokenizer.json, key of a Sequence's members there)."""


class _Walk:
    def __init__(self, where: str, key: str, members: str) -> None:
        self.where, self.key, self.members, self.steps = where, key, members, 0

    def refuse(self, why: str) -> DataError:
        return DataError(f"{self.where}: refusing its {self.key}: {why} (the tokenizer is not loaded)")

    def growth(self, step: Any, depth: int) -> int:
        """The worst-case growth of `step` (a Sequence: the product of its members')."""
        self.steps += 1
        if depth > MAX_DEPTH or self.steps > MAX_STEPS:
            raise self.refuse(f"more than {MAX_STEPS} steps or sequences nested deeper than {MAX_DEPTH}")
        if step is None:
            return 1
        if not isinstance(step, dict):
            raise self.refuse(f"a step is {type(step).__name__}, not an object")
        kind = step.get("type")
        if kind == "Sequence":
            members = step.get(self.members)
            if not isinstance(members, list):
                raise self.refuse(f"a Sequence without its {self.members!r} list")
            total = 1
            for member in members:
                total *= self.growth(member, depth + 1)
                if total > GROWTH_LIMIT:
                    raise self.refuse(
                        f"its steps can make one character more than {GROWTH_LIMIT} (the growth bound); "
                        f"the step reaching it: {str(member)[:120]}"
                    )
            return total
        if kind == "Replace":
            return _replace_growth(step, self)
        if kind == "Prepend":
            prepend = step.get("prepend")
            return 1 + len(prepend) if isinstance(prepend, str) else UNKNOWN_GROWTH
        if kind == "Precompiled":
            return _charsmap_growth(step.get("precompiled_charsmap"), self)
        if kind in UNICODE_GROWTH:
            return UNICODE_GROWTH[kind]
        return FIXED_GROWTH.get(str(kind), UNKNOWN_GROWTH)


def _replace_growth(step: dict, walk: _Walk) -> int:
    """Replace(pattern -> content): a string pattern grows by len(content)/len(pattern); a regex may match
    at every position, empty or not, so by 1 + len(content)."""
    pattern, content = step.get("pattern"), step.get("content")
    if not isinstance(content, str) or not isinstance(pattern, dict):
        raise walk.refuse("a Replace step without a pattern object and a content string")
    literal = pattern.get("String")
    if isinstance(literal, str) and literal:
        return max(1, -(-len(content) // len(literal)))
    return 1 + len(content)


def _charsmap_growth(charsmap: Any, walk: _Walk) -> int:
    """A SentencePiece charsmap (base64: a u32 trie size, the trie, then the replacement strings, NUL
    separated) replaces one character by at most its longest replacement string."""
    if charsmap is None:
        return 1
    try:
        blob = base64.b64decode(charsmap, validate=True) if isinstance(charsmap, str) else b""
    except (binascii.Error, ValueError):
        blob = b""
    if len(blob) < 4:
        raise walk.refuse("a Precompiled step whose charsmap is not base64 of a SentencePiece charsmap")
    strings = blob[4 + int.from_bytes(blob[:4], "little") :].split(b"\0")
    return max(1, max(len(s.decode("utf-8", "replace")) for s in strings))


def check_tokenizer_definition(data: bytes | str, where: str) -> dict[str, Any]:
    """The parsed tokenizer.json when its pipelines are within bounds; DataError (one line) otherwise:
    not JSON within bounds, not an object, or a normalizer + pre-tokenizer or a decoder whose worst case
    grows one character beyond GROWTH_LIMIT."""
    try:
        definition = loads_bounded(data, where, allow_nan=True)  # the library judges its numbers
    except OutsideJsonError as err:
        raise DataError(str(err)) from None
    if not isinstance(definition, dict):
        raise DataError(f"{where}: not a tokenizer definition (a JSON object)")
    encoding = 1
    for key, members in PIPELINES:
        walk = _Walk(where, key, members)
        growth = walk.growth(definition.get(key), 0)
        if key != "decoder":
            encoding *= growth
            growth = encoding  # normalizer and pre-tokenizer apply one after the other
        if growth > GROWTH_LIMIT:
            raise walk.refuse(f"its steps can make one character {growth} (more than {GROWTH_LIMIT})")
    return definition
