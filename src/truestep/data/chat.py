"""Chat records into tokens and a loss mask: which tokens are the assistant's.

A record is a JSON object with `messages`, a list of {role, content} (other keys of a message are handed
to the template as they are), or ShareGPT's `conversations`, a list of {from, value} (`human` -> user,
`gpt` -> assistant). The conversation is rendered with the model's chat template (data/chat_template.py)
prefix by prefix, so the turns are cut exactly where the template puts them:

    r_k = render(messages[:k])                          the first k messages
    g_k = render(messages[:k], add_generation_prompt)   and the header that opens the assistant's turn

A user (system, tool, ...) message k is the text r_(k+1) - r_k, not trained; an assistant message is
g_k - r_k (its header, not trained) then r_(k+1) - g_k (its content and whatever closes its turn, such as
`<|eot_id|>`: trained, so the model learns to end its turn). Each piece must begin where the one before
ended (each render a prefix of the next); a template that renders earlier turns differently once later
ones exist is refused for that conversation (a bad record), since its turns cannot be told apart.

Each piece is tokenized on its own (no special tokens added: the template writes them), so a token never
straddles two turns; templates put special tokens at turn boundaries, where tokenizing the whole text
cuts the same way. The conversation becomes [BOS] pieces EOS: BOS only when --bos says (the template
usually writes its own), EOS as the document boundary every prepared document ends with, not trained.
The first token of a conversation is never trained (nothing before it in the window is its context).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from truestep.data.chat_template import ChatTemplate, TemplateFailed

MAX_MESSAGES = 512
"""Rendering prefix by prefix costs the square of a conversation's length in messages."""
TRAINED_ROLE = "assistant"
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool"}  # fmt: skip


@dataclass(frozen=True)
class ChatSpec:
    """What a worker needs to encode chat records; plain data, so it pickles to a spawned process."""

    template: str
    where: str
    """Where the template came from, for messages."""
    special_tokens: dict[str, str]
    seq_len: int
    """Conversations are packed into blocks of this many tokens (data/packing.py): a longer one is a bad
    record (`conversation_too_long`)."""


class BadConversation(Exception):
    """A record that is not a conversation truestep can train on: (bad-input class, message)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


def conversation(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The messages of a record, each with a string role and content. BadConversation otherwise."""
    if "messages" in record:
        messages, role_key, text_key, field = record["messages"], "role", "content", "messages"
    elif "conversations" in record:
        messages, role_key, text_key, field = record["conversations"], "from", "value", "conversations"
    else:
        keys = ", ".join(list(record)[:8])
        raise BadConversation(
            "missing_field", f"{where}: no 'messages' (or 'conversations') field (keys: {keys})"
        )
    if not isinstance(messages, list) or not messages:
        raise BadConversation("bad_conversation", f"{where}: {field!r} is not a non-empty list of messages")
    if len(messages) > MAX_MESSAGES:
        raise BadConversation(
            "bad_conversation",
            f"{where}: {len(messages)} messages, more than the {MAX_MESSAGES} a conversation may have",
        )
    out = []
    for k, message in enumerate(messages):
        at = f"{where}: {field}[{k}]"
        if not isinstance(message, dict):
            raise BadConversation("bad_conversation", f"{at} is not an object")
        role, text = message.get(role_key), message.get(text_key)
        if not isinstance(role, str) or not isinstance(text, str):
            raise BadConversation(
                "bad_conversation", f"{at} needs a string {role_key!r} and a string {text_key!r}"
            )
        if role_key == "from":
            if role not in SHAREGPT_ROLES:
                raise BadConversation("bad_conversation", f"{at}: unknown speaker {role[:40]!r}")
            message = {"role": SHAREGPT_ROLES[role], "content": text}
        out.append(message)
    return out


def _after(text: str, prefix: str, k: int) -> str:
    if not text.startswith(prefix):
        raise TemplateFailed(
            f"the chat template does not render it turn by turn (the render up to message {k} is not the "
            "start of the next one): its turns cannot be told apart"
        )
    return text[len(prefix) :]


def segments(template: ChatTemplate, messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """(text, trained) pieces whose concatenation is the whole conversation's render (module docstring).
    TemplateFailed / TemplateRefused from the template."""
    pieces: list[tuple[str, bool]] = []
    with template.conversation():
        full = template.render(messages, False)
        try:
            before = template.render([], False)
        except TemplateFailed:  # many templates read messages[0]: nothing comes before the first turn
            before = ""
        if not full.startswith(before):
            before = ""
        pieces.append((before, False))  # what the template writes before any turn (often BOS)
        for k, message in enumerate(messages):
            upto = full if k + 1 == len(messages) else template.render(messages[: k + 1], False)
            if message.get("role") == TRAINED_ROLE:
                header = template.render(messages[:k], True)
                pieces.append((_after(header, before, k), False))
                pieces.append((_after(upto, header, k), True))
            else:
                pieces.append((_after(upto, before, k), False))
            before = upto
    return [(text, trained) for text, trained in pieces if text]


@dataclass
class Encoded:
    tokens: np.ndarray
    mask: np.ndarray
    """1 where the token is trained (the assistant's), uint8."""


def encode_conversation(
    pieces: list[tuple[str, bool]],
    ids: Callable[[list[str]], list[Any]],
    bos_id: int | None,
    eos_id: int,
) -> Encoded:
    """[BOS] pieces EOS as token ids and their mask; `ids` tokenizes texts one by one (no specials added)."""
    encoded = ids([text for text, _ in pieces])
    lengths = [len(x) for x in encoded]
    head = 0 if bos_id is None else 1
    total = head + sum(lengths) + 1
    tokens = np.empty(total, dtype=np.int64)
    mask = np.zeros(total, dtype=np.uint8)
    if bos_id is not None:
        tokens[0] = bos_id
    pos = head
    for (_, trained), piece, length in zip(pieces, encoded, lengths, strict=True):
        tokens[pos : pos + length] = piece
        mask[pos : pos + length] = trained
        pos += length
    tokens[pos] = eos_id
    mask[0] = 0  # nothing before it in its window is its context
    return Encoded(tokens, mask)
