"""prepare-data's inputs are someone else's files (a cloned tokenizer repository, an unpacked dataset
archive), and what it reads travels on into the shards, the data directory and every export of a model
trained on it. Each input is confined to the directory it was named in (data/inputs.py,
data/tokenizer_read.py): a corpus file, a directory a walk or a `**` glob enters, a tokenizer companion
that resolves outside is refused with its name (exit 3) and nothing of it is read; a link that stays
inside (or into a Hugging Face cache's blobs) is fine. Deep or 16 GiB companions and state.json are one
line. A forged resume journal is checked against what it claims and not used (the run starts over and
writes the reference's shards)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from corpora_cases import DOCS, write_jsonl
from hostile_cases import one_line, run_cli, within
from tokenizer_cases import write_tiny_tokenizer
from truestep.cli.prepare_data import prepare_data_main
from truestep.data import prepare_data, read_meta
from truestep.data import readers as readers_module
from truestep.data.meta import JOURNAL_NAME

SECRET = "the contents of ~/.ssh/id_rsa"
WORDS = [" ".join(["the cat sat on a mat"] * (1 + i % 7)) for i in range(200)]


def _secret(tmp_path: Path) -> Path:
    outside = tmp_path / "home"
    outside.mkdir(exist_ok=True)
    (outside / "id_rsa.jsonl").write_text(json.dumps({"text": SECRET}) + "\n")
    return outside


def _refused(*argv: object, why: str, code: int = 3) -> str:
    rc, _, err = within(60, lambda: run_cli(prepare_data_main, *argv, "--no-progress", "--workers", "1"))
    assert rc == code, err
    line = one_line(err)
    assert why in line, line
    return line


def _shards_hold_no_secret(out: Path) -> None:
    for path in out.rglob("*") if out.exists() else []:
        assert SECRET.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("how", ["named", "walked", "glob", "walked-dir"])
def test_a_corpus_input_linking_outside_its_directory_is_refused(tmp_path: Path, how: str) -> None:
    outside = _secret(tmp_path)
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    write_jsonl(corpus / "a.jsonl", DOCS[:3])
    if how == "walked-dir":  # a subdirectory a walk (or `**`) would enter
        (corpus / "sub" / "elsewhere").symlink_to(outside)
        spec: object = corpus
    else:
        (corpus / "sub" / "b.jsonl").symlink_to(outside / "id_rsa.jsonl")
        spec = {"named": corpus / "sub" / "b.jsonl", "walked": corpus, "glob": f"{corpus}/**/*.jsonl"}[how]
    out = tmp_path / "out"
    line = _refused(spec, "--out", out, why="outside")
    assert "resolves through a symlink to" in line and str(outside) in line, line
    _shards_hold_no_secret(out)


def test_links_that_stay_inside_are_read(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "real.jsonl.data", DOCS[:5])  # not an input name itself
    (corpus / "a.jsonl").symlink_to("real.jsonl.data")
    out = prepare_data([str(corpus)], tmp_path / "out")
    assert read_meta(out)["documents"] == 5


@pytest.mark.parametrize(
    "name",
    ["tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json"],
)
def test_a_tokenizer_companion_linking_outside_is_refused_not_copied(tmp_path: Path, name: str) -> None:
    outside = _secret(tmp_path)
    tokenizer = write_tiny_tokenizer(tmp_path / "tok")
    (tokenizer.parent / name).unlink(missing_ok=True)
    (tokenizer.parent / name).symlink_to(outside / "id_rsa.jsonl")
    corpus = write_jsonl(tmp_path / "c.jsonl", WORDS)
    out = tmp_path / "out"
    line = _refused(corpus, "--out", out, "--tokenizer", tokenizer, why=f"{tokenizer.parent / name} resolves")
    assert "outside" in line
    _shards_hold_no_secret(out)


def test_a_tokenizer_in_a_hugging_face_cache_snapshot_links_into_its_blobs(tmp_path: Path) -> None:
    """The cache's own layout: snapshots/<commit>/tokenizer.json -> ../../blobs/<hash>."""
    made = write_tiny_tokenizer(tmp_path / "made")
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / ("a" * 40), repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for index, name in enumerate(("tokenizer.json", "tokenizer_config.json")):
        (blobs / f"blob{index}").write_bytes((made.parent / name).read_bytes())
        (snapshot / name).symlink_to(f"../../blobs/blob{index}")
    out = prepare_data(
        [str(write_jsonl(tmp_path / "c.jsonl", WORDS))], tmp_path / "out", snapshot / "tokenizer.json"
    )
    assert read_meta(out)["tokenizer_files"] == ["tokenizer.json", "tokenizer_config.json"]


def _sparse(path: Path, size: int = 16 << 30) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


@pytest.mark.parametrize(
    "name,content,why",
    [
        ("tokenizer_config.json", "[" * 100_000, "not valid JSON: RecursionError"),
        ("tokenizer_config.json", None, "more than the 67108864 a file of its kind may have"),
        ("chat_template.jinja", None, "more than the 67108864 a file of its kind may have"),
        ("special_tokens_map.json", '{"n": ' + "9" * 5000 + "}", "not valid JSON: ValueError"),
        ("generation_config.json", '{"temperature": NaN}', "NaN is not a JSON number"),
        ("tokenizer_config.json", "[1, 2]", "is not a JSON object"),
    ],
)
def test_a_hostile_tokenizer_companion_is_one_line(
    tmp_path: Path, name: str, content: str | None, why: str
) -> None:
    tokenizer = write_tiny_tokenizer(tmp_path / "tok")
    if content is None:
        _sparse(tokenizer.parent / name)  # 16 GiB
    else:
        (tokenizer.parent / name).write_text(content)
    corpus = write_jsonl(tmp_path / "c.jsonl", WORDS)
    _refused(corpus, "--out", tmp_path / "out", "--tokenizer", tokenizer, why=why)


@pytest.mark.parametrize(
    "content,why",
    [
        ("[" * 100_000, "RecursionError"),
        (None, "more than the 16777216"),
        ('{"_data_files": 7}', "not a readable `datasets` save_to_disk state"),
    ],
)
def test_a_hostile_state_json_is_one_line(tmp_path: Path, content: str | None, why: str) -> None:
    dataset = tmp_path / "ds"
    dataset.mkdir()
    if content is None:
        _sparse(dataset / "state.json")
    else:
        (dataset / "state.json").write_text(content)
    _refused(dataset, "--out", tmp_path / "out", why=why)


# ------------------------------------------------------------------------------------ the journal


CORPUS_DOCS = DOCS * 2
SHARD = 4000


@pytest.fixture(scope="module")
def journaled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(corpus, the reference's data directory, an interrupted run's directory: shards and the journal
    saying where they end, at a chunk inside the corpus). Small chunks, so the corpus is many."""
    base = tmp_path_factory.mktemp("journal")
    corpus = write_jsonl(base / "c.jsonl", CORPUS_DOCS)
    saved = readers_module.CHUNK_BYTES
    readers_module.CHUNK_BYTES = 2000
    try:
        reference = prepare_data([str(corpus)], base / "ref", shard_tokens=SHARD)
        calls: list[object] = []

        def stop(progress: object) -> None:
            calls.append(progress)
            if len(calls) == 12:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            prepare_data([str(corpus)], base / "out", shard_tokens=SHARD, progress=stop)
    finally:
        readers_module.CHUNK_BYTES = saved
    return corpus, reference, base / "out"


def _resume(
    journaled: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit
) -> list[str]:  # type: ignore[no-untyped-def]
    """Copy the interrupted run, apply `edit` to its journal, run the same command again: what it said.
    The result must be the reference's shards whatever the journal says."""
    corpus, reference, interrupted = journaled
    out = tmp_path / "out"
    shutil.copytree(interrupted, out)
    journal = json.loads((out / JOURNAL_NAME).read_text())
    edit(journal, corpus)
    (out / JOURNAL_NAME).write_text(json.dumps(journal))
    monkeypatch.setattr(readers_module, "CHUNK_BYTES", 2000)
    said: list[str] = []
    prepare_data([str(corpus)], out, shard_tokens=SHARD, log=said.append)
    assert read_meta(out)["shards"] == read_meta(reference)["shards"]
    assert read_meta(out)["documents"] == read_meta(reference)["documents"]
    return said


def _cursor_ahead(j: dict, corpus: Path) -> None:
    """The forger moves the cursor to a later line start (a real chunk start): the tokens between were
    never written, yet would be counted as done (a silently short dataset, exit 0, before)."""
    lines = corpus.read_bytes().split(b"\n")
    line = j["cursor"]["line"] + 40
    j["cursor"].update(offset=sum(len(x) + 1 for x in lines[: line - 1]), line=line)


def _shards_dropped(j: dict, corpus: Path) -> None:
    j["shards"] = j["shards"][:1]  # the shards after it listed as if never written, the cursor kept
    j["counters"]["documents"] = 0  # and a count that the first shard's EOS tokens allow


def _set(where: str, **values: object):  # type: ignore[no-untyped-def]
    def edit(j: dict, corpus: Path) -> None:
        (j if where == "" else j[where] if where != "shard0" else j["shards"][0]).update(values)

    return edit


@pytest.mark.parametrize(
    "edit,why",
    [
        (_cursor_ahead, "do not end with the tokens at its cursor"),
        (_shards_dropped, "do not end with the tokens at its cursor"),
        (_set("shard0", file="shard_00009.npy"), "names 'shard_00009.npy', not shard_00000.npy"),
        (_set("cursor", input="0"), "the cursor's input is '0'"),
        (_set("", skip_tokens=[1]), "skip_tokens is '[1]'"),
        (_set("counters", documents=10**9), "counts 1000000000 documents"),
        (_set("shard0", num_tokens=SHARD - 1), f"not a full shard's {SHARD}"),
        (_set("", cursor=None), "cursor is not an input, an offset and a line"),
    ],
)
def test_a_forged_journal_is_not_trusted_and_the_run_starts_over(  # type: ignore[no-untyped-def]
    journaled: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit, why: str
) -> None:
    said = _resume(journaled, tmp_path, monkeypatch, edit)
    assert len(said) == 1 and "cannot be resumed" in said[0] and why in said[0], said


def test_an_honest_journal_still_resumes(
    journaled: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = _resume(journaled, tmp_path, monkeypatch, lambda j, corpus: None)
    assert said and said[0].startswith(
        f"resuming the interrupted prepare-data in {tmp_path / 'out'} after"
    ), said
    assert not (tmp_path / "out" / JOURNAL_NAME).exists()
