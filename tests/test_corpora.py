"""prepare-data on real corpus formats: same tokens from every format, same shards for any number of
workers, every bad-input class named by file and line/row (or skipped and counted), resume after a kill."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from corpora_cases import (
    DOCS,
    expected_stream,
    stream,
    write_gz,
    write_hf_dataset,
    write_jsonl,
    write_parquet,
    write_txt,
    write_zst,
)
from truestep.cli.prepare_data import prepare_data_main
from truestep.data import DataError, prepare_data, read_meta
from truestep.data import readers as readers_module
from truestep.data.meta import JOURNAL_NAME


def shard_files(data_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(data_dir.glob("shard_*.npy"))}


# ----------------------------------------------------------------------------------------------
# every format, the same tokens


def test_every_format_yields_the_same_tokens(tmp_path: Path) -> None:
    want = expected_stream(DOCS)
    corpora = {
        "txt": [*map(str, write_txt(tmp_path / "txt", DOCS))],
        "jsonl": [str(write_jsonl(tmp_path / "c.jsonl", DOCS))],
        "jsonl.gz": [str(write_gz(tmp_path / "c.jsonl.gz", DOCS))],
        "jsonl.zst": [str(write_zst(tmp_path / "c.jsonl.zst", DOCS))],
        "parquet": [str(write_parquet(tmp_path / "c.parquet", DOCS))],
        "save_to_disk": [str(write_hf_dataset(tmp_path / "hf", DOCS))],
        "directory": [str(tmp_path / "txt")],
    }
    # A FineWeb-style tree: parquet files split over sub-directories, read in sorted path order.
    tree = tmp_path / "tree"
    (tree / "b").mkdir(parents=True)
    (tree / "a").mkdir()
    write_parquet(tree / "a" / "000.parquet", DOCS[:50])
    write_parquet(tree / "a" / "001.parquet", DOCS[50:90])
    write_parquet(tree / "b" / "000.parquet", DOCS[90:])
    (tree / "README.md").write_text("not an input: a directory is walked for the known formats only")
    corpora["parquet tree"] = [str(tree)]
    corpora["glob"] = [str(tree / "**" / "*.parquet")]
    # Mixed formats in one stream, in the order given.
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    corpora["mixed"] = [
        str(write_jsonl(mixed / "1.jsonl", DOCS[:30])),
        str(write_gz(mixed / "2.jsonl.gz", DOCS[30:60])),
        str(write_parquet(mixed / "3.parquet", DOCS[60:100])),
        str(write_zst(mixed / "4.jsonl.zst", DOCS[100:])),
    ]
    for name, inputs in corpora.items():
        out = prepare_data(inputs, tmp_path / f"out-{name}", shard_tokens=997)
        assert stream(out).tolist() == want, name
        meta = read_meta(out)
        assert meta["documents"] == len(DOCS), name
        assert meta["skipped"] == {}, name


def test_text_field_and_hf_tokenizer(tmp_path: Path) -> None:
    from test_data import train_hf_tokenizer

    tok = train_hf_tokenizer(tmp_path / "tokenizer.json")
    docs = ["the cat sat", "a dog ran far", "the the cat"]
    jsonl = write_jsonl(tmp_path / "c.jsonl", docs, field="content")
    parquet = write_parquet(tmp_path / "c.parquet", docs, field="content")
    a = prepare_data([jsonl], tmp_path / "a", str(tok), text_field="content")
    b = prepare_data([parquet], tmp_path / "b", str(tok), text_field="content", workers=2)
    c = prepare_data(write_txt(tmp_path / "txt", docs), tmp_path / "c", str(tok))
    assert stream(a).tolist() == stream(b).tolist() == stream(c).tolist()
    assert len(stream(a)) == 10 + 3  # WordLevel: one id per word, EOS after each document
    assert read_meta(a)["text_field"] == "content"


# ----------------------------------------------------------------------------------------------
# workers


@pytest.mark.slow  # over ~1.5 s here: the whole suite, not the fast tier
def test_n_workers_write_the_same_shards_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Small chunks so that many are in flight and the pool really reorders completions.
    monkeypatch.setattr(readers_module, "CHUNK_BYTES", 300)
    docs = DOCS * 4
    inputs = [
        write_jsonl(tmp_path / "a.jsonl", docs),
        write_parquet(tmp_path / "b.parquet", docs),
        write_gz(tmp_path / "c.jsonl.gz", docs),
    ]
    one = prepare_data(inputs, tmp_path / "one", shard_tokens=1000, workers=1)
    three = prepare_data(inputs, tmp_path / "three", shard_tokens=1000, workers=3)
    assert len(shard_files(one)) > 10
    assert shard_files(one) == shard_files(three)
    assert read_meta(one)["shards"] == read_meta(three)["shards"]
    assert stream(one).tolist() == expected_stream(docs * 3)


def test_progress_reports_docs_tokens_and_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers_module, "CHUNK_BYTES", 500)
    path = write_jsonl(tmp_path / "a.jsonl", DOCS)
    seen = []
    prepare_data([path], tmp_path / "out", progress=seen.append)
    assert len(seen) > 5
    assert [p.done_bytes for p in seen] == sorted(p.done_bytes for p in seen)
    assert seen[-1].done_bytes == seen[-1].total_bytes == path.stat().st_size
    assert seen[-1].documents == len(DOCS)
    assert seen[-1].tokens == len(expected_stream(DOCS))


# ----------------------------------------------------------------------------------------------
# bad input


def _bad_cases(tmp_path: Path) -> dict[str, tuple[list[Path], str, str, int]]:
    """name -> (inputs, message fragment naming file and line/row, skipped class, good documents)."""
    good = [json.dumps({"text": d}).encode() for d in ("one", "two", "three")]

    def jsonl(name: str, bad: bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(b"\n".join([good[0], good[1], bad, good[2]]) + b"\n")
        return path

    gz = tmp_path / "trunc.jsonl.gz"
    full = gzip.compress(b"\n".join(good * 2000) + b"\n")
    gz.write_bytes(full[: len(full) // 2])
    import zstandard

    zst = tmp_path / "trunc.jsonl.zst"
    zfull = zstandard.ZstdCompressor().compress(b"\n".join(good * 30000) + b"\n")
    zst.write_bytes(zfull[: len(zfull) // 2])
    (tmp_path / "empty.jsonl.gz").write_bytes(b"")
    (tmp_path / "empty.jsonl.zst").write_bytes(b"")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(b"caf\xe9")
    write_parquet(tmp_path / "nocol.parquet", ["a", "b"], field="body")
    write_hf_dataset(tmp_path / "hf", ["x"], field="body")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["ok", None, "fine"]}), tmp_path / "null.parquet")
    pq.write_table(pa.table({"text": [b"ok", b"caf\xe9"]}), tmp_path / "binary.parquet")
    return {
        "malformed json": ([jsonl("m.jsonl", b'{"text": "unterminated')], "m.jsonl:3: malformed JSON", "malformed_json", 3),
        "not an object": ([jsonl("o.jsonl", b'["text"]')], "o.jsonl:3: the line is an array", "malformed_json", 3),
        "missing field": ([jsonl("f.jsonl", b'{"body": "x"}')], "f.jsonl:3: no 'text' field", "missing_field", 3),
        "number field": ([jsonl("n.jsonl", b'{"text": 5}')], "n.jsonl:3: 'text' is a number", "not_a_string", 3),
        "null field": ([jsonl("z.jsonl", b'{"text": null}')], "z.jsonl:3: 'text' is null", "not_a_string", 3),
        "invalid utf-8 line": ([jsonl("u.jsonl", b'{"text": "caf\xe9"}')], "u.jsonl:3: invalid UTF-8", "invalid_utf8", 3),
        "lone surrogate": ([jsonl("s.jsonl", b'{"text": "\\ud800"}')], "s.jsonl:3: 'text' holds a lone surrogate", "invalid_utf8", 3),
        "invalid utf-8 text file": ([latin], "latin1.txt: not valid UTF-8", "invalid_utf8", 0),
        "truncated gz": ([gz], "trunc.jsonl.gz: the compressed file is truncated", "truncated", -1),
        "truncated zst": ([zst], "trunc.jsonl.zst: the compressed file is truncated", "truncated", -1),
        "empty gz": ([tmp_path / "empty.jsonl.gz"], "empty.jsonl.gz: empty compressed file", "empty_compressed", 0),
        "empty zst": ([tmp_path / "empty.jsonl.zst"], "empty.jsonl.zst: empty compressed file", "empty_compressed", 0),
        "parquet without column": ([tmp_path / "nocol.parquet"], "nocol.parquet: no column 'text' (columns: id, body, url)", "missing_column", 0),
        "dataset without column": ([tmp_path / "hf"], "no column 'text' (columns: body, id)", "missing_column", 0),
        "null parquet value": ([tmp_path / "null.parquet"], "null.parquet: row 1: 'text' is null", "not_a_string", 2),
        "invalid utf-8 parquet": ([tmp_path / "binary.parquet"], "binary.parquet: row 1: not valid UTF-8", "invalid_utf8", 1),
    }  # fmt: skip


def test_every_bad_input_class_is_named_and_leaves_nothing(tmp_path: Path) -> None:
    ok = write_jsonl(tmp_path / "ok.jsonl", ["before the bad file"])
    for name, (inputs, fragment, kind, good_docs) in _bad_cases(tmp_path).items():
        out = tmp_path / f"out-{name.replace(' ', '-')}"
        with pytest.raises(DataError) as err:
            prepare_data([ok, *inputs], out, shard_tokens=1000)
        message = str(err.value)
        assert fragment in message, (name, message)
        assert "\n" not in message, name
        assert list(out.iterdir()) == [], (name, sorted(p.name for p in out.iterdir()))

        skipped = prepare_data([ok, *inputs], out, shard_tokens=1000, skip_bad=True)
        meta = read_meta(skipped)
        assert meta["skipped"] == {kind: 1}, (name, meta["skipped"])
        assert fragment in meta["skipped_examples"][0], name
        if good_docs >= 0:  # a truncated file keeps the whole lines before the cut
            assert meta["documents"] == 1 + good_docs, (name, meta["documents"])
        else:
            assert meta["documents"] > 1 + 1000, name


def test_bad_input_cli_prints_one_line_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    out = tmp_path / "out"
    assert prepare_data_main([str(bad), "--out", str(out), "--workers", "2"]) == 3
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert f"{bad}:2: malformed JSON" in err
    assert not (out / "meta.json").exists()
    assert prepare_data_main([str(bad), "--out", str(out), "--skip-bad", "--no-progress"]) == 0
    assert "skipped 1 bad record(s): {'malformed_json': 1}" in capsys.readouterr().out


def test_input_discovery_refusals(tmp_path: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["a"]}),
            "test": datasets.Dataset.from_dict({"text": ["b"]}),
        }
    ).save_to_disk(str(tmp_path / "dd"))
    cases = {
        "DatasetDict; name one split directory": [tmp_path / "dd"],
        "no input matches": [str(tmp_path / "nothing*.jsonl")],
        "unsupported kind": [tmp_path / "x.json.gz"],
        "named more than once": [tmp_path / "a.jsonl", str(tmp_path / "*.jsonl")],
        "holds no input": [tmp_path / "emptydir"],
    }
    (tmp_path / "x.json.gz").write_bytes(gzip.compress(b"{}"))
    write_jsonl(tmp_path / "a.jsonl", ["a"])
    (tmp_path / "emptydir").mkdir()
    for fragment, inputs in cases.items():
        with pytest.raises(DataError, match=fragment) as err:
            prepare_data(inputs, tmp_path / "out")
        assert err.value.exit_code == 2, fragment
    assert prepare_data_main([str(tmp_path / "dd"), "--out", str(tmp_path / "o")]) == 2


# ----------------------------------------------------------------------------------------------
# BOS


def _tokenizer_with_bos(directory: Path, add_bos_token: bool | None) -> Path:
    from tokenizers import Tokenizer, processors
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    directory.mkdir(parents=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "the": 3, "cat": 4}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(directory / "tokenizer.json"))
    if add_bos_token is not None:
        config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": add_bos_token}
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory / "tokenizer.json"


def test_bos_follows_the_tokenizer_config_or_the_flag(tmp_path: Path) -> None:
    docs = write_jsonl(tmp_path / "d.jsonl", ["the cat", "cat"])
    with_bos, without = [1, 3, 4, 2, 1, 4, 2], [3, 4, 2, 4, 2]
    says_yes = _tokenizer_with_bos(tmp_path / "yes", True)
    says_no = _tokenizer_with_bos(tmp_path / "no", False)
    silent = _tokenizer_with_bos(tmp_path / "silent", None)  # the post-processor adds <s>, as Llama 3's does
    for tok, bos, want in [
        (says_yes, "auto", with_bos),
        (says_no, "auto", without),
        (silent, "auto", with_bos),
        (says_no, "always", with_bos),
        (says_yes, "never", without),
    ]:
        out = prepare_data([docs], tmp_path / f"out-{tok.parent.name}-{bos}", str(tok), bos=bos)
        assert stream(out).tolist() == want, (tok.parent.name, bos)
        assert read_meta(out)["add_bos"] is (want == with_bos)
    byte = prepare_data([docs], tmp_path / "byte")  # auto: the byte tokenizer has no BOS
    assert read_meta(byte)["add_bos"] is False and stream(byte).tolist() == expected_stream(
        ["the cat", "cat"]
    )
    with pytest.raises(DataError, match="byte tokenizer has no BOS"):
        prepare_data([docs], tmp_path / "byte-always", bos="always")


# ----------------------------------------------------------------------------------------------
# interruption: resume, and nothing half-written visible


KILLER = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys
    from truestep.data import prepare_data
    from truestep.data import readers
    readers.CHUNK_BYTES = 400
    calls = []
    def progress(p):
        calls.append(p)
        if len(calls) == int(sys.argv[3]):
            with open(sys.argv[5], "w") as f:  # the workers, for the test to see them die with us
                f.write(" ".join(str(c.pid) for c in multiprocessing.active_children()))
            os.kill(os.getpid(), signal.SIGKILL)  # a real kill, between two chunks
    prepare_data([sys.argv[1]], sys.argv[2], shard_tokens=500, workers=int(sys.argv[4]), progress=progress)
    """
)


def assert_gone(pids: list[int], within_s: float = 30.0) -> None:
    """Every pid is gone (a zombie nobody reaps counts as gone: it runs nothing and holds no memory)."""
    deadline = time.monotonic() + within_s
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.1)
    assert not alive, f"processes {alive} outlived the prepare-data that started them"


def _running(pid: int) -> bool:
    if not Path("/proc/self/stat").exists():  # no /proc here: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("workers", [1, 2])
def test_killed_prepare_data_resumes_to_the_same_shards(tmp_path: Path, workers: int) -> None:
    source = write_jsonl(tmp_path / "c.jsonl", DOCS * 3)
    reference = prepare_data([source], tmp_path / "ref", shard_tokens=500)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    pids = tmp_path / "workers"
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, str(source), str(out), "12", str(workers), str(pids)],
        env=env,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL
    workers_left = [int(p) for p in pids.read_text().split()]
    assert len(workers_left) == (workers if workers > 1 else 0)
    assert_gone(workers_left)  # they died with prepare-data, not blocked on its queue forever
    assert not (out / "meta.json").exists()  # never looks complete
    journal = json.loads((out / JOURNAL_NAME).read_text())
    assert len(journal["shards"]) >= 3
    visible = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    # Every visible shard is whole: it loads and is the reference's shard of that name.
    assert all(shard_files(out)[n] == shard_files(reference)[n] for n in visible if n.startswith("shard_"))

    logs: list[str] = []
    prepare_data([source], out, shard_tokens=500, workers=workers, log=logs.append)
    assert logs and "resuming" in logs[0] and f"after {len(journal['shards'])} shard(s)" in logs[0]
    assert shard_files(out) == shard_files(reference)
    assert read_meta(out)["documents"] == read_meta(reference)["documents"]
    assert read_meta(out)["shards"] == read_meta(reference)["shards"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())


def test_interrupted_run_with_other_settings_starts_over(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "c.jsonl", DOCS * 3)

    def stop_after(n: int):
        calls = []

        def progress(p: object) -> None:
            calls.append(p)
            if len(calls) == n:
                raise KeyboardInterrupt

        return progress

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prepare_data([source], out, shard_tokens=300, progress=stop_after(1))
    assert (out / JOURNAL_NAME).exists() and not (out / "meta.json").exists()
    logs: list[str] = []
    prepare_data([source], out, shard_tokens=400, log=logs.append)  # another shard size: not resumable
    assert "cannot be resumed" in logs[0] and "starting over" in logs[0]
    assert stream(out).tolist() == expected_stream(DOCS * 3)
    assert not (out / JOURNAL_NAME).exists()


def test_resumed_counts_match(tmp_path: Path) -> None:
    """Skipped-record counters and documents survive a resume that starts inside a chunk."""
    lines = [json.dumps({"text": d}) for d in DOCS] + ["not json"] + [json.dumps({"text": d}) for d in DOCS]
    source = tmp_path / "c.jsonl"
    source.write_text("\n".join(lines) + "\n")
    reference = read_meta(prepare_data([source], tmp_path / "ref", shard_tokens=700, skip_bad=True))
    out = tmp_path / "out"
    calls = []

    def progress(p: object) -> None:
        calls.append(p)
        if len(calls) == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_data([source], out, shard_tokens=700, skip_bad=True, progress=progress)
    resumed = read_meta(prepare_data([source], out, shard_tokens=700, skip_bad=True))
    for key in ("documents", "skipped", "shards", "num_tokens"):
        assert resumed[key] == reference[key], key
    assert np.array_equal(stream(out), stream(tmp_path / "ref"))
