"""What `prepare-data --chat` decides once, in the main process, before any record is read: the chat
template (checked by compiling it), the inputs it can read (JSON lines), the BOS rule, and what the
resume journal and meta.json record about it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from truestep.data.bos import resolve_bos
from truestep.data.chat import ChatSpec
from truestep.data.chat_template import ChatTemplate, special_token_texts, template_source
from truestep.data.errors import DataUsageError
from truestep.data.inputs import JSONL, JSONL_GZ, JSONL_ZST, InputFile
from truestep.data.meta import PACKINGS
from truestep.data.packing import Packer
from truestep.data.tokenizer import ByteTokenizer, HFTokenizer

MIN_SEQ_LEN = 2


@dataclass(frozen=True)
class ChatOptions:
    """`--chat --seq-len N --packing pack|pad`."""

    seq_len: int
    packing: str = "pack"


def chat_spec(
    options: ChatOptions,
    inputs: list[InputFile],
    tok: ByteTokenizer | HFTokenizer,
    files: dict[str, bytes],
) -> ChatSpec:
    """The spec every worker renders with; refuses (one line) what chat data cannot be made from."""
    if options.packing not in PACKINGS:
        raise DataUsageError(f"--packing must be one of {', '.join(PACKINGS)}, got {options.packing!r}")
    if options.seq_len < MIN_SEQ_LEN:
        raise DataUsageError(f"--seq-len must be at least {MIN_SEQ_LEN}, got {options.seq_len}")
    if isinstance(tok, ByteTokenizer):
        raise DataUsageError(
            "--chat needs the model's tokenizer.json with its chat template (--tokenizer PATH), not the "
            "byte tokenizer"
        )
    for item in inputs:
        if item.kind not in (JSONL, JSONL_GZ, JSONL_ZST):
            raise DataUsageError(
                f"{item.path}: --chat reads conversations from JSON lines (.jsonl, .jsonl.gz, .jsonl.zst), "
                f"not {item.kind}"
            )
    where = str(tok.path.parent)
    source, origin = template_source(files, where)
    special = special_token_texts(files, where)
    ChatTemplate(source, special, origin)  # compiled once here: a template that does not is one line now
    return ChatSpec(source, origin, special, options.seq_len)


def chat_bos(tok: ByteTokenizer | HFTokenizer, mode: str) -> int | None:
    """BOS before each conversation: the template writes its own, so `auto` adds none."""
    return None if mode == "auto" else resolve_bos(tok, mode)


def pad_id(tok: ByteTokenizer | HFTokenizer) -> int:
    """What fills the rest of a block: the tokenizer's pad token, else EOS (never trained either way)."""
    return tok.pad_id if tok.pad_id is not None else tok.eos_id


def chat_settings(spec: ChatSpec, options: ChatOptions, pad: int) -> dict[str, Any]:
    """What a resumed run must share with the interrupted one (beside the tokenizer and inputs)."""
    return {
        "template_sha256": hashlib.sha256(spec.template.encode("utf-8")).hexdigest(),
        "seq_len": options.seq_len,
        "packing": options.packing,
        "pad_id": pad,
    }


def packer(settings: dict[str, Any], fill: int = 0) -> Packer:
    chat = settings["chat"]
    return Packer(chat["seq_len"], chat["packing"], chat["pad_id"], fill)


def chat_meta(settings: dict[str, Any], conversations: int, trained: int) -> dict[str, Any]:
    """meta.json's `chat` record."""
    return {**settings["chat"], "conversations": conversations, "trained_tokens": trained}
