"""Whether `prepare-data` starts every document with BOS (`--bos auto|always|never`).

`auto` does what the tokenizer does for a prompt: `add_bos_token` of the tokenizer_config.json beside the
tokenizer.json when it says, else whether the tokenizer's own post-processor puts BOS in front of a text
(Llama 3's tokenizer.json does). The built-in byte tokenizer has no BOS token: `auto` means none and
`always` is refused.
"""

from __future__ import annotations

from truestep.data.errors import DataError
from truestep.data.tokenizer import TOKENIZER_CONFIG, ByteTokenizer, HFTokenizer

BOS_MODES = ("auto", "always", "never")


def _config_add_bos(tok: HFTokenizer) -> bool | None:
    """`add_bos_token` from tokenizer_config.json beside the tokenizer, when it is there and a boolean."""
    value = tok.config.get("add_bos_token")
    return value if isinstance(value, bool) else None


def _post_processor_adds_bos(tok: HFTokenizer) -> bool:
    if tok.bos_id is None:
        return False
    with_specials = tok.encode("a", add_special_tokens=True)
    return bool(with_specials) and with_specials[0] == tok.bos_id and tok.encode("a")[:1] != [tok.bos_id]


def resolve_bos(tok: ByteTokenizer | HFTokenizer, mode: str) -> int | None:
    """The BOS id to put before every document, or None for none."""
    if mode not in BOS_MODES:
        raise DataError(f"--bos must be one of {', '.join(BOS_MODES)}, got {mode!r}")
    if mode == "never":
        return None
    if isinstance(tok, ByteTokenizer):
        if mode == "always":
            raise DataError("--bos always: the byte tokenizer has no BOS token (use a tokenizer.json)")
        return None
    if mode == "always":
        if tok.bos_id is None:
            raise DataError(
                f"--bos always: {tok.path} has no BOS token (no bos_token in {TOKENIZER_CONFIG} and none of "
                "the usual names in the vocabulary)"
            )
        return tok.bos_id
    wanted = _config_add_bos(tok)
    if wanted is None:
        wanted = _post_processor_adds_bos(tok)
    if wanted and tok.bos_id is None:
        raise DataError(
            f"{tok.path.parent / TOKENIZER_CONFIG} sets add_bos_token, but the tokenizer has no BOS token; "
            "pass --bos never"
        )
    return tok.bos_id if wanted else None
