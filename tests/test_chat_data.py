"""prepare-data --chat: conversations rendered with the model's chat template (sandboxed and bounded), the
loss masked to the assistant's turns, packed whole into windows, the same for any worker count, resumed
after an interruption to the same shards and masks, and bad records or hostile templates refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import truestep.data.chat_template as chat_template_module
import truestep.data.readers as readers_module
from chat_cases import TEMPLATE, conversations, write_chat_tokenizer, write_chats
from hostile_cases import one_line, run_cli
from truestep.cli.prepare_data import prepare_data_main
from truestep.data.dataset import TokenDataset
from truestep.data.errors import DataError
from truestep.data.meta import JOURNAL_NAME, content_digest, read_meta, verify_data_dir
from truestep.data.shards import ChatOptions, prepare_data

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chat_tokenizer(tmp_path_factory.mktemp("chat-tok"))


def stream(out: Path) -> tuple[np.ndarray, np.ndarray]:
    meta = read_meta(out)
    tokens = np.concatenate([np.load(out / e["file"]) for e in meta["shards"]]).astype(np.int64)
    masks = np.concatenate([np.load(out / e["mask"]) for e in meta["shards"]])
    return tokens, masks


def files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def texts(tok: Path, ids: np.ndarray) -> list[str]:
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tok))
    return [vocab.id_to_token(int(i)) for i in ids]


def test_the_mask_is_exactly_the_assistants_turns(tok: Path, tmp_path: Path) -> None:
    chats = conversations(12)
    out = prepare_data(
        [write_chats(tmp_path / "c.jsonl", chats)], tmp_path / "d", str(tok), chat=ChatOptions(40)
    )
    tokens, mask = stream(out)
    words = texts(tok, tokens)
    # What the mask trains, in order: every answer's words and the <|end|> that closes its turn.
    trained = [w for w, m in zip(words, mask, strict=True) if m]
    answers = [
        t["content"].split() + ["<|end|>"] for turns in chats for t in turns if t["role"] == "assistant"
    ]
    assert trained == [w for answer in answers for w in answer]
    # What it does not: everything else the template wrote, the EOS after each conversation, the padding.
    untrained = [w for w, m in zip(words, mask, strict=True) if not m]
    assert untrained.count("<s>") == untrained.count("</s>") == len(chats)
    assert "<|assistant|>" in untrained and "<|user|>" in untrained and "<|system|>" in untrained
    meta = read_meta(out)
    assert meta["chat"]["trained_tokens"] == int(mask.sum()) and meta["documents"] == len(chats)
    assert verify_data_dir(out, check_hashes=True) == meta  # masks are listed and hashed like shards


def test_conversations_are_packed_whole_into_windows(tok: Path, tmp_path: Path) -> None:
    source = write_chats(tmp_path / "c.jsonl", conversations(30))
    for packing in ("pack", "pad"):
        out = prepare_data([source], tmp_path / packing, str(tok), chat=ChatOptions(32, packing))
        tokens, _ = stream(out)
        starts = np.flatnonzero(tokens == 1)  # BOS opens every conversation (the template writes it)
        ends = np.flatnonzero(tokens == 2)  # EOS closes it
        assert len(starts) == len(ends) == 30 and tokens.size % 32 == 1  # whole blocks + one token
        assert (starts // 32 == ends // 32).all(), "a conversation crosses a window boundary"
        if packing == "pad":
            assert (starts % 32 == 0).all()
        else:
            assert (np.diff(starts // 32) == 0).any(), "packing never put two conversations in one window"
        for seq_len in (32, 64):  # a multiple of the packed length holds whole blocks too
            assert len(TokenDataset(out, seq_len)) == (tokens.size - 1) // seq_len
    with pytest.raises(DataError, match="would cut them"):
        TokenDataset(tmp_path / "pack", 16)


def test_sharegpt_records_are_the_same_conversations(tok: Path, tmp_path: Path) -> None:
    chats = conversations(6)
    a = prepare_data(
        [write_chats(tmp_path / "a.jsonl", chats)], tmp_path / "a", str(tok), chat=ChatOptions(32)
    )
    b = prepare_data(
        [write_chats(tmp_path / "b.jsonl", chats, sharegpt=True)],
        tmp_path / "b",
        str(tok),
        chat=ChatOptions(32),
    )
    assert read_meta(a)["shards"] == read_meta(b)["shards"]


def test_workers_write_the_same_shards_and_masks_as_one(
    tok: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readers_module, "CHUNK_BYTES", 400)  # many chunks in flight, completed out of order
    source = write_chats(tmp_path / "c.jsonl", conversations(80))
    one = prepare_data(
        [source], tmp_path / "one", str(tok), shard_tokens=300, chat=ChatOptions(32), workers=1
    )
    two = prepare_data(
        [source], tmp_path / "two", str(tok), shard_tokens=300, chat=ChatOptions(32), workers=2
    )
    assert len(read_meta(one)["shards"]) > 5
    assert files(one) == files(two)


def test_an_interrupted_run_resumes_to_the_same_shards_and_masks(
    tok: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readers_module, "CHUNK_BYTES", 500)
    source = write_chats(tmp_path / "c.jsonl", conversations(60))
    options = {"shard_tokens": 100, "chat": ChatOptions(32)}
    reference = prepare_data([source], tmp_path / "ref", str(tok), **options)
    out = tmp_path / "out"
    calls: list[object] = []

    def progress(p: object) -> None:
        calls.append(p)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_data([source], out, str(tok), progress=progress, **options)
    journal = json.loads((out / JOURNAL_NAME).read_text())
    assert journal["counters"]["block_fill"] > 0  # it stopped inside a block: the packer's state matters
    logs: list[str] = []
    prepare_data([source], out, str(tok), log=logs.append, **options)
    assert "resuming" in logs[0]
    assert files(out) == files(reference)

    # A journal whose block fill is not where its shards end is not trusted: the run starts over.
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        prepare_data([source], out, str(tok), progress=progress, resume=False, **options)
    journal = json.loads((out / JOURNAL_NAME).read_text())
    journal["counters"]["block_fill"] = (journal["counters"]["block_fill"] + 5) % 32
    (out / JOURNAL_NAME).write_text(json.dumps(journal))
    logs.clear()
    prepare_data([source], out, str(tok), log=logs.append, **options)
    assert "cannot be resumed" in logs[0] and "do not end with the" in logs[0]
    assert files(out) == files(reference)


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{{ messages.__class__.__mro__ }}", "access to attribute '__class__' of 'list' object is unsafe"),
        ("{{ raise_exception.__globals__ }}", "access to attribute '__globals__' of 'function' object"),
        ("{{ cycler.__init__.__globals__.os }}", "access to attribute '__init__'"),
        ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "range() drew"),
        ("{{ 'x' * 1000000000 }}", "a repetition"),
        ("{{ 'x'|center(1000000000) }}", "the filter center was given 1000000000"),
        ("{% set s = messages[0].content * 9000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
         "ran longer than 0.5 s on one conversation"),
        ("{% for %}", "does not compile"),
    ],
)  # fmt: skip
def test_a_hostile_template_is_refused_in_one_line_and_leaves_nothing(
    template: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chat_template_module, "MAX_RENDER_SECONDS", 0.5)  # the workers=1 render is here
    tok = write_chat_tokenizer(tmp_path / "tok", template)
    source = write_chats(tmp_path / "c.jsonl", conversations(3))
    out = tmp_path / "out"
    rc, _, err = run_cli(
        prepare_data_main, source, "--out", out, "--tokenizer", tok, "--chat", "--seq-len", 32,
        "--workers", 1, "--skip-bad",  # a hostile template is no bad record: --skip-bad does not skip it
    )  # fmt: skip
    assert rc == 3, err
    assert said in one_line(err)
    assert not out.exists() or not any(out.iterdir())


def test_bad_conversations_are_named_or_skipped_and_counted(tok: Path, tmp_path: Path) -> None:
    good = conversations(2)
    long = [{"role": "user", "content": "the cat " * 40}, {"role": "assistant", "content": "sat"}]
    records = [
        {"messages": good[0]},
        {"text": "not a conversation"},
        {"messages": [{"role": "user", "content": None}]},
        {"conversations": [{"from": "alien", "value": "hi"}]},
        {"messages": long},
        {"messages": good[1]},
    ]
    source = tmp_path / "c.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    rc, _, err = run_cli(
        prepare_data_main, source, "--out", tmp_path / "x", "--tokenizer", tok, "--chat", "--seq-len", 32
    )
    assert rc == 3 and f"{source}:2: no 'messages' (or 'conversations') field (keys: text)" in one_line(err)
    out = prepare_data([source], tmp_path / "skip", str(tok), chat=ChatOptions(32), skip_bad=True)
    meta = read_meta(out)
    assert meta["documents"] == 2
    assert meta["skipped"] == {"missing_field": 1, "bad_conversation": 2, "conversation_too_long": 1}
    assert any(f"{source}:5: the conversation is" in m for m in meta["skipped_examples"])

    refusing = write_chat_tokenizer(
        tmp_path / "strict",
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}" + TEMPLATE,
    )
    rc, _, err = run_cli(
        prepare_data_main, write_chats(tmp_path / "s.jsonl", conversations(1)), "--out", tmp_path / "y",
        "--tokenizer", refusing, "--chat", "--seq-len", 32,
    )  # fmt: skip
    assert rc == 3 and "s.jsonl:1: the chat template refuses it: user first" in one_line(err)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--seq-len", "32"], "--seq-len and --packing go with --chat"),
        (["--chat"], "--chat needs --seq-len N"),
        (["--chat", "--seq-len", "32", "--tokenizer", "byte"], "not the byte tokenizer"),
    ],
)
def test_chat_usage_errors_exit_2(extra: list[str], said: str, tok: Path, tmp_path: Path) -> None:
    source = write_chats(tmp_path / "c.jsonl", conversations(1))
    rc, _, err = run_cli(
        prepare_data_main,
        source,
        "--out",
        tmp_path / "o",
        *(["--tokenizer", tok] if "byte" not in extra else []),
        *extra,
    )
    assert rc == 2 and said in one_line(err)


def test_a_tokenizer_without_a_template_or_a_text_input_is_refused(tok: Path, tmp_path: Path) -> None:
    source = write_chats(tmp_path / "c.jsonl", conversations(1))
    (tmp_path / "notes.txt").write_text("the cat")
    rc, _, err = run_cli(
        prepare_data_main,
        tmp_path / "notes.txt",
        "--out",
        tmp_path / "o",
        "--tokenizer",
        tok,
        "--chat",
        "--seq-len",
        32,
    )
    assert rc == 2 and "--chat reads conversations from JSON lines" in one_line(err)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes(tok.read_bytes())
    rc, _, err = run_cli(
        prepare_data_main,
        source,
        "--out",
        tmp_path / "o",
        "--tokenizer",
        bare / "tokenizer.json",
        "--chat",
        "--seq-len",
        32,
    )
    assert rc == 2 and "has no chat template" in one_line(err)


def test_the_cli_says_what_share_of_the_tokens_is_trained(tok: Path, tmp_path: Path) -> None:
    source = write_chats(tmp_path / "c.jsonl", conversations(5))
    out = tmp_path / "o"
    rc, said, err = run_cli(
        prepare_data_main, source, "--out", out, "--tokenizer", tok, "--chat", "--seq-len", 32,
        "--packing", "pad", "--no-progress",
    )  # fmt: skip
    assert rc == 0, err
    chat = read_meta(out)["chat"]
    assert chat["packing"] == "pad" and chat["conversations"] == 5
    assert f"5 conversations padded to windows of 32, loss on {chat['trained_tokens']} assistant" in said


def test_the_content_digest_covers_the_masks(tok: Path, tmp_path: Path) -> None:
    """run_start's data_sha256 (train/provenance.py): re-prepared masks are other data."""
    out = prepare_data(
        [write_chats(tmp_path / "c.jsonl", conversations(5))], tmp_path / "d", str(tok), chat=ChatOptions(32)
    )
    meta = read_meta(out)
    other = json.loads(json.dumps(meta))
    other["shards"][0]["mask_sha256"] = "0" * 64
    assert content_digest(meta) != content_digest(other)
