"""Tests of truestep.data: tokenizers, shard format, dataset windows, sampler order, loader state."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from truestep.cli.prepare_data import prepare_data_main
from truestep.config.schema import DataConfig
from truestep.data import (
    BatchLoader,
    ByteTokenizer,
    DataError,
    GlobalSampler,
    TokenDataset,
    build_loader,
    demo_corpus_files,
    dtype_for_vocab,
    ensure_demo_data,
    load_tokenizer,
    prepare_data,
    read_meta,
)

# ----------------------------------------------------------------------------------------------
# helpers


def write_docs(tmp_path: Path, docs: list[str]) -> list[Path]:
    paths = []
    for i, text in enumerate(docs):
        p = tmp_path / f"doc{i}.txt"
        p.write_text(text, encoding="utf-8")
        paths.append(p)
    return paths


def stream(data_dir: Path) -> np.ndarray:
    """The whole token stream, read independently of TokenDataset."""
    meta = read_meta(data_dir)
    parts = [np.load(data_dir / s["file"], allow_pickle=False) for s in meta["shards"]]
    return np.concatenate(parts).astype(np.int64)


@pytest.fixture
def small_dir(tmp_path: Path) -> Path:
    """Byte-tokenized corpus of 3 documents, 9 tokens per shard so windows cross shards."""
    files = write_docs(tmp_path, ["hello world", "héllo", "abcdefghijklmnopqrstuvwxyz"])
    return prepare_data(files, tmp_path / "data", shard_tokens=9)


def train_hf_tokenizer(path: Path, with_eos: bool = True) -> Path:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from tokenizers.trainers import WordLevelTrainer

    tok = Tokenizer(WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    specials = ["<unk>", "</s>"] if with_eos else ["<unk>"]
    trainer = WordLevelTrainer(special_tokens=specials)
    tok.train_from_iterator(["the cat sat", "the dog ran", "a cat ran far"], trainer=trainer)
    tok.save(str(path))
    return path


# ----------------------------------------------------------------------------------------------
# tokenizers


def test_byte_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    text = "héllo, wörld ✓\n"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert ids[1:3] == [0xC3, 0xA9]  # "é" is two bytes
    assert tok.decode(ids + [tok.eos_id]) == text
    assert (tok.vocab_size, tok.eos_id, tok.name) == (257, 256, "byte")
    assert tok.encode_array(text).tolist() == ids


def test_dtype_for_vocab() -> None:
    assert dtype_for_vocab(257) == np.uint16
    assert dtype_for_vocab(65535) == np.uint16
    assert dtype_for_vocab(65536) == np.uint32
    assert dtype_for_vocab(128_256) == np.uint32
    with pytest.raises(DataError):
        dtype_for_vocab(0)


def test_hf_tokenizer_through_prepare_data(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    tok_path = train_hf_tokenizer(tmp_path / "tokenizer.json")
    ref = Tokenizer.from_file(str(tok_path))
    eos = ref.token_to_id("</s>")
    docs = ["the cat sat", "a dog ran far"]
    out = prepare_data(write_docs(tmp_path, docs), tmp_path / "hf", tokenizer_spec=str(tok_path))
    meta = read_meta(out)
    assert meta["eos_id"] == eos
    assert meta["vocab_size"] == ref.get_vocab_size()
    assert meta["tokenizer"] == "tokenizer.json"  # the copy inside the data directory
    assert (out / "tokenizer.json").read_bytes() == tok_path.read_bytes()
    expected = []
    for d in docs:
        expected += ref.encode(d, add_special_tokens=False).ids + [eos]
    assert stream(out).tolist() == expected
    assert len(set(expected)) > 4  # real word ids, not all <unk>


def test_hf_tokenizer_eos_lookup_errors(tmp_path: Path) -> None:
    tok_path = train_hf_tokenizer(tmp_path / "tokenizer.json", with_eos=False)
    with pytest.raises(DataError, match="--eos-token"):
        load_tokenizer(str(tok_path))
    tok = load_tokenizer(str(tok_path), eos_token="cat")  # any vocabulary entry may be named
    assert tok.eos_id == tok.encode("cat")[0]
    with pytest.raises(DataError, match="not in the vocabulary"):
        load_tokenizer(str(tok_path), eos_token="<|nope|>")


def test_hf_tokenizer_missing_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(DataError, match="pip install tokenizers"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))


# ----------------------------------------------------------------------------------------------
# prepare_data


def test_prepare_data_format_and_eos(small_dir: Path) -> None:
    meta = read_meta(small_dir)
    docs = [b"hello world", "héllo".encode(), b"abcdefghijklmnopqrstuvwxyz"]
    expected = []
    for d in docs:
        expected += list(d) + [256]
    assert meta["num_tokens"] == len(expected) == 46
    assert meta["documents"] == 3
    assert meta["dtype"] == "uint16"
    assert [s["num_tokens"] for s in meta["shards"]] == [9, 9, 9, 9, 9, 1]
    assert [s["file"] for s in meta["shards"]] == [f"shard_{i:05d}.npy" for i in range(6)]
    for s in meta["shards"]:
        arr = np.load(small_dir / s["file"], allow_pickle=False)
        assert arr.dtype == np.uint16  # self-describing in the .npy header
    tokens = stream(small_dir)
    assert tokens.tolist() == expected
    assert np.flatnonzero(tokens == 256).tolist() == [11, 18, 45]


def test_prepare_data_missing_input_and_refusals(tmp_path: Path) -> None:
    good = write_docs(tmp_path, ["some text"])
    with pytest.raises(DataError, match="not found"):
        prepare_data(good + [tmp_path / "nope.txt"], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # checked before anything was written

    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9")
    with pytest.raises(DataError, match="UTF-8"):
        prepare_data([bad], tmp_path / "out2")
    assert not list((tmp_path / "out2").glob("*"))  # partial shards removed

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="refusing"):
        prepare_data(good, foreign)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_prepare_data_overwrites_previous_data_dir(tmp_path: Path) -> None:
    out = tmp_path / "data"
    prepare_data(write_docs(tmp_path, ["x" * 50]), out, shard_tokens=10)
    assert len(read_meta(out)["shards"]) == 6
    (tmp_path / "new").mkdir()
    prepare_data(write_docs(tmp_path / "new", ["yz"]), out)
    assert stream(out).tolist() == [ord("y"), ord("z"), 256]
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "shard_00000.npy"]


def test_prepare_data_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = write_docs(tmp_path, ["abc", "de"])
    rc = prepare_data_main([str(f) for f in files] + ["--out", str(tmp_path / "d"), "--shard-tokens", "4"])
    assert rc == 0
    assert "7 tokens from 2 documents in 2 shard(s)" in capsys.readouterr().out
    rc = prepare_data_main([str(tmp_path / "missing.txt"), "--out", str(tmp_path / "e")])
    assert rc == 2
    assert "not found" in capsys.readouterr().err
    assert prepare_data_main(["--out", str(tmp_path / "f")]) == 2  # usage error: no files


# ----------------------------------------------------------------------------------------------
# TokenDataset


def test_dataset_windows_cross_shards(small_dir: Path) -> None:
    ds = TokenDataset(small_dir, seq_len=5)
    tokens = stream(small_dir)
    assert ds.num_tokens == 46
    assert len(ds) == (46 - 1) // 5 == 9
    assert (ds.vocab_size, ds.eos_id) == (257, 256)
    for i in range(len(ds)):
        s = ds.sample(i)
        assert s.dtype == np.int64
        assert s.tolist() == tokens[i * 5 : i * 5 + 6].tolist()
    # sample 1 is tokens 5..10, spanning shards 0 (0..8) and 1 (9..17)
    assert ds.sample(1).tolist() == list(b" world") and 5 < 9 <= 10
    # a window crossing two shard boundaries at once (shard of 9 tokens, window of 21)
    wide = TokenDataset(small_dir, seq_len=20)
    assert wide.sample(0).tolist() == tokens[:21].tolist()
    assert wide.sample(1).tolist() == tokens[20:41].tolist()
    assert ds.sample(8).tolist() == tokens[40:46].tolist()  # ends in the 1-token last shard
    with pytest.raises(IndexError):
        ds.sample(9)


def test_dataset_errors(small_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="meta.json is missing"):
        TokenDataset(tmp_path / "nowhere", seq_len=4)
    with pytest.raises(DataError, match="corpus has 46 tokens, too few for seq_len 46"):
        TokenDataset(small_dir, seq_len=46)
    assert len(TokenDataset(small_dir, seq_len=45)) == 1

    shard = small_dir / "shard_00001.npy"
    original = shard.read_bytes()
    np.save(shard, np.load(shard).astype(np.uint32))
    with pytest.raises(DataError, match="dtype uint32"):
        TokenDataset(small_dir, seq_len=4)
    np.save(shard, np.arange(8, dtype=np.uint16))
    with pytest.raises(DataError, match="holds 8 tokens"):
        TokenDataset(small_dir, seq_len=4)
    shard.write_bytes(original[:-3])  # truncated file
    with pytest.raises(DataError, match="shard"):
        TokenDataset(small_dir, seq_len=4)
    shard.unlink()
    with pytest.raises(DataError, match="missing"):
        TokenDataset(small_dir, seq_len=4)
    shard.write_bytes(original)
    TokenDataset(small_dir, seq_len=4, verify_hashes=True)  # restored: valid again

    meta_path = small_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["version"] = 2
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="version"):
        TokenDataset(small_dir, seq_len=4)
    meta["version"], meta["format"] = 1, "other"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="format"):
        TokenDataset(small_dir, seq_len=4)
    meta["format"] = "truestep-tokens"
    meta["shards"][0]["file"] = "../shard_00000.npy"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="not a shard"):
        TokenDataset(small_dir, seq_len=4)


def test_dataset_hash_verification(small_dir: Path) -> None:
    shard = small_dir / "shard_00000.npy"
    arr = np.load(shard)
    arr[0] += 1  # same dtype and length: only the hash can tell
    np.save(shard, arr)
    TokenDataset(small_dir, seq_len=4)  # the default skips hashing
    with pytest.raises(DataError, match="sha256"):
        TokenDataset(small_dir, seq_len=4, verify_hashes=True)


# ----------------------------------------------------------------------------------------------
# GlobalSampler


def test_sampler_is_pure_and_pinned() -> None:
    a, b = GlobalSampler(10, 4, 1234), GlobalSampler(10, 4, 1234)
    got = [a.batch_indices(i).tolist() for i in range(3)]
    assert got == [b.batch_indices(i).tolist() for i in (2, 1, 0)][::-1]  # order of calls is irrelevant
    perm0 = np.random.default_rng([1234, 0]).permutation(10).tolist()
    perm1 = np.random.default_rng([1234, 1]).permutation(10).tolist()
    assert got == [perm0[:4], perm0[4:8], perm0[8:] + perm1[:2]]
    # Pinned values: if numpy ever changes its Generator stream, resumed jobs would see a new order.
    assert got == [[8, 9, 5, 0], [2, 6, 4, 7], [1, 3, 1, 4]]
    assert GlobalSampler(10, 4, 1235).batch_indices(0).tolist() != got[0]


def test_sampler_rank_slices_union_is_global_batch() -> None:
    s = GlobalSampler(37, 8, 7)
    for b in (0, 1, 4, 9, 100):
        full = s.batch_indices(b).tolist()
        for dp in (1, 2, 4):
            parts = [s.rank_indices(b, r, dp).tolist() for r in range(dp)]
            assert all(len(p) == 8 // dp for p in parts)
            assert sum(parts, []) == full
    with pytest.raises(DataError, match="not divisible"):
        s.rank_indices(0, 0, 3)
    with pytest.raises(DataError, match="dp_rank"):
        s.rank_indices(0, 2, 2)


def test_sampler_epochs_cover_every_sample_once() -> None:
    n, g = 12, 5  # batches straddle epoch boundaries
    s = GlobalSampler(n, g, 3)
    flat = np.concatenate([s.batch_indices(b) for b in range(12)])  # 60 positions = 5 epochs
    epochs = flat.reshape(5, n)
    for e in range(5):
        assert sorted(epochs[e].tolist()) == list(range(n))
    assert len({tuple(row) for row in epochs.tolist()}) == 5  # each epoch reshuffled
    # a batch larger than the corpus spans several epochs
    big = GlobalSampler(3, 7, 0).batch_indices(0)
    assert sorted(big[:3].tolist()) == sorted(big[3:6].tolist()) == [0, 1, 2]


def test_sampler_state_seek_and_mismatch() -> None:
    a = GlobalSampler(50, 4, 9)
    for _ in range(17):
        a.next()
    state = a.state_dict()
    assert state == {"next_batch": 17, "data_seed": 9, "global_batch_size": 4, "num_samples": 50}
    assert json.loads(json.dumps(state)) == state
    b = GlobalSampler(50, 4, 9)
    b.load_state_dict(state)
    assert b.next_batch == 17
    assert [b.next().tolist() for _ in range(3)] == [a.next().tolist() for _ in range(3)]
    b.load_state_dict({**state, "next_batch": 10**12})  # O(1): no replay of a trillion batches
    assert b.next().tolist() == GlobalSampler(50, 4, 9).batch_indices(10**12).tolist()

    for key, value in (("data_seed", 8), ("global_batch_size", 8), ("num_samples", 51)):
        with pytest.raises(DataError, match=f"{key}={value}"):
            GlobalSampler(50, 4, 9).load_state_dict({**state, key: value})
    with pytest.raises(DataError, match="missing next_batch"):
        GlobalSampler(50, 4, 9).load_state_dict({k: v for k, v in state.items() if k != "next_batch"})


# ----------------------------------------------------------------------------------------------
# BatchLoader


def test_loader_micro_batches_and_resume(small_dir: Path) -> None:
    ds = TokenDataset(small_dir, seq_len=3)  # 15 samples
    tokens = stream(small_dir)

    def make(rank: int, dp: int, mb: int) -> BatchLoader:
        return BatchLoader(ds, GlobalSampler(len(ds), 8, 5), rank, dp, mb)

    loader = make(1, 2, 2)
    mbs = loader.next()
    assert loader.next_batch == 1
    assert len(mbs) == 2
    idx = GlobalSampler(len(ds), 8, 5).batch_indices(0)[4:8]
    for m, (x, y) in enumerate(mbs):
        assert x.dtype == torch.int64 and x.shape == (2, 3) and y.shape == (2, 3)
        for row in range(2):
            i = int(idx[2 * m + row])
            assert x[row].tolist() == tokens[i * 3 : i * 3 + 3].tolist()
            assert y[row].tolist() == tokens[i * 3 + 1 : i * 3 + 4].tolist()

    # dp=1 with one micro-batch sees the same global batch as the union of the dp=2 ranks
    whole = make(0, 1, 8).batch_for(3)[0][0]
    halves = torch.cat([mb[0] for r in range(2) for mb in make(r, 2, 2).batch_for(3)])
    assert torch.equal(whole, halves)

    advanced = make(0, 2, 2)
    for _ in range(5):
        advanced.next()
    restored = make(0, 2, 2)
    restored.load_state_dict(advanced.state_dict())
    assert restored.next_batch == 5
    for _ in range(3):
        for (xa, ya), (xb, yb) in zip(advanced.next(), restored.next(), strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)

    other_seed = BatchLoader(ds, GlobalSampler(len(ds), 8, 6), 0, 2, 2)
    with pytest.raises(DataError, match="data_seed=5"):
        other_seed.load_state_dict(advanced.state_dict())
    with pytest.raises(DataError, match="micro_batch_size 3"):
        make(0, 2, 3)


def test_build_loader_with_path(small_dir: Path) -> None:
    cfg = DataConfig(path=str(small_dir), seq_len=4, data_seed=11)
    loader = build_loader(cfg, global_batch_size=4, micro_batch_size=2, dp_rank=1, dp_size=2)
    assert loader.micro_batch_size == 2 and loader.num_micro_batches == 1
    x, _ = loader.next()[0]
    expected = GlobalSampler(11, 4, 11).rank_indices(0, 1, 2)
    assert x[:, 0].tolist() == [int(stream(small_dir)[i * 4]) for i in expected]


# ----------------------------------------------------------------------------------------------
# demo corpus


def test_demo_corpus_deterministic_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = demo_corpus_files()
    assert files == sorted(files, key=lambda p: p.name) and len(files) > 20
    assert sum(f.stat().st_size for f in files) <= 4 * 1024 * 1024

    a = ensure_demo_data(tmp_path / "a")
    b = ensure_demo_data(tmp_path / "b")
    meta_a, meta_b = read_meta(a), read_meta(b)
    assert [s["sha256"] for s in meta_a["shards"]] == [s["sha256"] for s in meta_b["shards"]]
    assert meta_a["num_tokens"] > 500_000
    assert meta_a["documents"] == len(files)

    mtime = (a / "meta.json").stat().st_mtime_ns
    assert ensure_demo_data(a) == a
    assert (a / "meta.json").stat().st_mtime_ns == mtime  # reused, not rebuilt

    # a corrupted cache is rebuilt rather than trusted
    shard = a / meta_a["shards"][0]["file"]
    arr = np.load(shard)
    arr[100] = 0
    np.save(shard, arr)
    ensure_demo_data(a)
    assert read_meta(a)["shards"][0]["sha256"] == meta_b["shards"][0]["sha256"]
    assert np.load(shard)[100] != 0

    # the default location honours TRUESTEP_CACHE, and build_loader uses it for an empty path
    monkeypatch.setenv("TRUESTEP_CACHE", str(tmp_path / "cache"))
    loader = build_loader(DataConfig(path="", seq_len=64, data_seed=1), 4, 2, 0, 1)
    assert loader.dataset.data_dir.parent == tmp_path / "cache"
    assert loader.dataset.data_dir.name.startswith("demo-")
    assert loader.next()[0][0].shape == (2, 64)


def test_demo_concurrent_callers(tmp_path: Path) -> None:
    target = tmp_path / "shared"
    results: list[Path] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            results.append(ensure_demo_data(target))
        except BaseException as e:  # surfaced by the assert below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [target] * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared", "shared.lock"]  # no temp dirs left
    assert read_meta(target)["num_tokens"] > 500_000


def test_demo_refuses_foreign_dir(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(DataError, match="not a truestep data directory"):
        ensure_demo_data(tmp_path / "mine")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"
