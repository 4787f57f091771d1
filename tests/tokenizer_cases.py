"""A tiny Llama-like Hugging Face tokenizer (BOS added by its post-processor, EOS, PAD, a
tokenizer_config.json naming them) and a corpus for it, for the tokenizer/generate tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "while", "bird", "sang"]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def write_tiny_tokenizer(directory: Path) -> Path:
    """tokenizer.json + tokenizer_config.json in `directory`; returns the tokenizer.json path."""
    from tokenizers import Tokenizer, processors
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory / "tokenizer.json"


def write_corpus(directory: Path, documents: int = 4, words: int = 600) -> list[Path]:
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(documents):
        path = directory / f"doc{i}.txt"
        path.write_text(" ".join(rng.choice(WORDS) for _ in range(words)))
        paths.append(path)
    return paths
