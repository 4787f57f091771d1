"""Parsers of outside bytes are bounded in memory and time and end in one line (data/readers.py,
data/pipeline.py, data/tokenizer_guard.py): a compressed file that expands without end (a zstd frame of
gigabytes from kilobytes; gzip of one endless line), a text file of 16 GiB, a crafted Arrow file whose
offsets run backwards, a worker process that dies, and a tokenizer.json whose normalizer doubles a
character forty times (the library aborts the process, SIGABRT, no message) -- each is exit 3 with one
line naming the file, never a hang, a MemoryError, a traceback or a native abort."""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from corpora_cases import DOCS, write_jsonl
from hostile_cases import one_line, run_cli, within
from tokenizer_cases import write_tiny_tokenizer
from truestep.cli.prepare_data import prepare_data_main
from truestep.data import DataError, prepare_data, read_meta
from truestep.data import readers as readers_module
from truestep.data.inputs import JSONL_ZST
from truestep.data.pipeline import ordered_map
from truestep.data.readers import MAX_RECORD_BYTES, RATIO_FLOOR, ZSTD_PIECE, _Decompressed
from truestep.data.tokenizer import HFTokenizer
from truestep.data.tokenizer_guard import GROWTH_LIMIT, check_tokenizer_definition
from truestep.interop.errors import InteropError
from truestep.interop.tokenizer_export import CheckpointTokenizer


def _prepare(*argv: object, workers: int = 1) -> tuple[int, str]:
    rc, _, err = within(120, lambda: run_cli(prepare_data_main, *argv, "--no-progress", "--workers", workers))
    return rc, err


def test_a_zstd_bomb_is_decompressed_a_bounded_piece_at_a_time_and_cut_at_its_bound(tmp_path: Path) -> None:
    """128 MiB of JSON lines in a few KiB: never more than a piece's worth decompressed at once (the old
    reader expanded a whole read, gigabytes, in one call), and cut once past RATIO_FLOOR."""
    zstandard = pytest.importorskip("zstandard")
    bomb = tmp_path / "bomb.jsonl.zst"
    line = b'{"text": "a"}\n' * (1 << 16)
    with open(bomb, "wb") as f, zstandard.ZstdCompressor(level=3).stream_writer(f) as w:
        for _ in range((128 << 20) // len(line)):
            w.write(line)
    assert bomb.stat().st_size < 1 << 20
    with open(bomb, "rb") as raw:
        stream = _Decompressed(raw, JSONL_ZST)
        total, kind = 0, ""
        while True:
            try:
                block = stream.read(1 << 20)
            except EOFError:
                kind = stream.kind
                break
            assert len(stream.buf) < ZSTD_PIECE * 40_000, "one feed expanded without bound"
            total += len(block)
            assert block, "the bound was never reached"
    assert kind == "decompression_bound" and RATIO_FLOOR <= total < RATIO_FLOOR + (64 << 20), (kind, total)


SMALL_RECORD = 1 << 20
"""The record bound these tests set (MAX_RECORD_BYTES is 64 MiB): the rule, at a size quick to write."""


def test_a_gzip_file_of_one_endless_line_is_one_line_not_a_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit's case: a small .gz of one line (still running at 300 s and past 1.4 GB before: the
    line was held whole, and copied once per chunk)."""
    monkeypatch.setattr(readers_module, "MAX_RECORD_BYTES", SMALL_RECORD)
    bomb = tmp_path / "line.jsonl.gz"
    with gzip.open(bomb, "wb", compresslevel=1) as f:
        f.write(b'{"text": "')
        for _ in range(8):
            f.write(b"a" * SMALL_RECORD)
        f.write(b'"}\n')
    rc, err = _prepare(bomb, "--out", tmp_path / "out")
    assert rc == 3 and f"{bomb}:1: a line longer than {SMALL_RECORD} bytes" in one_line(err), err


@pytest.mark.parametrize("extra", [10, 5 * SMALL_RECORD])
def test_with_skip_bad_an_over_long_line_is_read_past_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: int
) -> None:
    """Ending just past the bound (in the chunk that also ends it) or far past it (read past, unheld)."""
    monkeypatch.setattr(readers_module, "MAX_RECORD_BYTES", SMALL_RECORD)
    source = tmp_path / "c.jsonl"
    long_line = json.dumps({"text": "b" * (SMALL_RECORD + extra)}).encode()
    source.write_bytes(b'{"text": "first"}\n' + long_line + b'\n{"text": "last"}\n')
    out = prepare_data([str(source)], tmp_path / "out", skip_bad=True)
    meta = read_meta(out)
    assert meta["documents"] == 2 and meta["skipped"] == {"too_long": 1}, meta


def test_a_16_gib_text_file_is_refused_not_read_whole(tmp_path: Path) -> None:
    text = tmp_path / "book.txt"
    with open(text, "wb") as f:
        f.truncate(16 << 30)
    rc, err = _prepare(text, "--out", tmp_path / "out")
    assert rc == 3 and f"a text file is one document of at most {MAX_RECORD_BYTES} bytes" in one_line(err), (
        err
    )


def _crafted_dataset(directory: Path) -> Path:
    """A save_to_disk directory whose Arrow file's string offsets run backwards (0, 9, 3): read unchecked,
    a negative length reaches the string decoder (a SystemError traceback; from a worker, a broken pool)."""
    pa = pytest.importorskip("pyarrow")
    batch = pa.RecordBatch.from_arrays([pa.array(["abc", "defghij"])], names=["text"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    raw = bytearray(sink.getvalue().to_pybytes())
    at = raw.find(struct.pack("<3i", 0, 3, 10))
    raw[at : at + 12] = struct.pack("<3i", 0, 9, 3)
    directory.mkdir()
    (directory / "data-00000-of-00001.arrow").write_bytes(raw)
    (directory / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    return directory


def test_a_crafted_arrow_file_is_validated_and_refused_in_one_line(tmp_path: Path) -> None:
    """Validated where it is read (the main process), before any worker sees a value of it."""
    dataset = _crafted_dataset(tmp_path / "ds")
    rc, err = _prepare(dataset, "--out", tmp_path / "out")
    line = one_line(err)
    assert rc == 3 and "data-00000-of-00001.arrow: unreadable" in line and "non-monotonic offset" in line, err


def test_a_worker_that_dies_is_one_line_naming_its_item() -> None:
    with pytest.raises(DataError) as caught:
        list(ordered_map(os._exit, [7], 2, int, (), describe=lambda item: f"item {item}"))
    assert str(caught.value).startswith("item 7: a worker process died"), caught.value


# ------------------------------------------------------------------------------ tokenizer bombs


def _definition(**pipelines: object) -> dict:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    tok = Tokenizer(WordLevel({"a": 0, "<unk>": 1, "<|endoftext|>": 2}, unk_token="<unk>"))
    return {**json.loads(tok.to_str()), **pipelines}


def _replace(find: str, content: str, times: int = 40) -> dict:
    return {
        "type": "Sequence",
        "normalizers": [{"type": "Replace", "pattern": {"String": find}, "content": content}] * times,
    }


BOMBS = {
    "normalizer": {"normalizer": _replace("a", "aa")},
    "regex normalizer": {"normalizer": {"type": "Replace", "pattern": {"Regex": ""}, "content": "a" * 2000}},
    "pre_tokenizer": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}] * 40}},
    "decoder": {"decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}] * 40}},
    "nested": {"normalizer": {"type": "Sequence", "normalizers": [{"type": "Sequence", "normalizers": []}] * 300}},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_a_tokenizer_bomb_is_refused_before_it_is_loaded(tmp_path: Path, case: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_definition(**BOMBS[case])))
    with pytest.raises(DataError) as caught:
        HFTokenizer(path)
    assert str(caught.value).startswith(f"{path}: refusing its ") and "\n" not in str(caught.value)
    generate = CheckpointTokenizer("hf", (path,), {}, "an imported checkpoint")  # what `generate` loads
    with pytest.raises(InteropError, match="refusing its"):
        generate.load()


def test_real_pipelines_are_within_the_bound(tmp_path: Path) -> None:
    """Llama 2's normalizer (prepend, replace spaces), BERT's, a SentencePiece charsmap whose longest
    replacement is 18 characters, a byte-level pre-tokenizer and decoder: all load."""
    llama2 = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, _replace(" ", "▁", 1)]}
    charsmap = (0).to_bytes(4, "little") + "\0".join(["x" * 18, "ab"]).encode() + b"\0"
    import base64

    precompiled = {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode()}
    for pipelines in (
        {
            "normalizer": llama2,
            "decoder": {"type": "Sequence", "decoders": [_replace("▁", " ", 1)["normalizers"][0]]},
        },
        {"normalizer": {"type": "BertNormalizer"}, "pre_tokenizer": {"type": "BertPreTokenizer"}},
        {"normalizer": {"type": "Sequence", "normalizers": [precompiled, {"type": "Lowercase"}]}},
        {"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}},
    ):
        assert check_tokenizer_definition(json.dumps(_definition(**pipelines)), "t") is not None
    assert HFTokenizer(write_tiny_tokenizer(tmp_path / "tiny")).vocab_size > 0
    big = {
        "type": "Precompiled",
        "precompiled_charsmap": base64.b64encode(b"\0\0\0\0" + b"y" * 2000).decode(),
    }
    with pytest.raises(DataError, match=f"more than {GROWTH_LIMIT}"):
        check_tokenizer_definition(json.dumps(_definition(normalizer=big)), "t")


def test_prepare_data_with_a_tokenizer_bomb_ends_in_one_line_not_sigabrt(tmp_path: Path) -> None:
    """As a real process (the abort, without the guard, would take the test process with it)."""
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_definition(**BOMBS["normalizer"])))
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS[:20])
    proc = subprocess.run(
        [sys.executable, "-m", "truestep", "prepare-data", str(corpus), "--out", str(tmp_path / "out"),
         "--tokenizer", str(path), "--eos-token", "<|endoftext|>", "--workers", "2", "--no-progress"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])
    assert "refusing its normalizer" in one_line(proc.stderr)
