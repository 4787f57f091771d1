"""A tiny chat tokenizer (the tokenizer_cases one plus turn tokens and a chat template) and conversations
for it, for the chat/SFT tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizer_cases import WORDS, write_tiny_tokenizer

TURN_TOKENS = ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_chat_tokenizer(directory: Path, template: str = TEMPLATE) -> Path:
    """tokenizer.json (+ tokenizer_config.json, chat_template.jinja) in `directory`; its tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer

    path = write_tiny_tokenizer(directory)
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens([AddedToken(t, special=True) for t in TURN_TOKENS])
    tok.save(str(path))
    (directory / "chat_template.jinja").write_text(template)
    return path


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def conversations(count: int, seed: int = 0, trailing_user: bool = False) -> list[list[dict[str, str]]]:
    """`count` conversations of 1-2 exchanges (some with a system turn); `trailing_user`: each ends with a
    user turn after the last answer."""
    rng = random.Random(seed)
    out = []
    for k in range(count):
        turns = [{"role": "system", "content": words(rng, 1, 3)}] if k % 3 == 0 else []
        for _ in range(rng.randint(1, 2)):
            turns.append({"role": "user", "content": words(rng, 1, 4)})
            turns.append({"role": "assistant", "content": words(rng, 1, 4)})
        if trailing_user:
            turns.append({"role": "user", "content": words(rng, 2, 3)})
        out.append(turns)
    return out


def write_chats(path: Path, chats: list[list[dict[str, str]]], sharegpt: bool = False) -> Path:
    speaker = {"user": "human", "assistant": "gpt", "system": "system"}
    lines = []
    for turns in chats:
        if sharegpt:
            record = {"conversations": [{"from": speaker[t["role"]], "value": t["content"]} for t in turns]}
        else:
            record = {"messages": turns, "id": len(lines)}
        lines.append(json.dumps(record))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
