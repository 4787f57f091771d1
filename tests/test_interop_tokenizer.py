"""The tokenizer travels with the data and the model; `export --dtype`.

- `prepare-data` copies tokenizer.json (+ tokenizer_config.json) into the data directory and records
  names relative to it, and the bos/eos/pad ids;
- `export --to hf` writes the tokenizer files, the ids in config.json and a generation_config.json, for
  a run on HF-tokenized data, a byte-tokenized run (with a note) and an imported model;
- `--dtype bf16|fp16|fp32` for both export formats.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from harness import launch
from interop_cases import cli, transformers_or_skip
from tokenizer_cases import write_corpus, write_tiny_tokenizer
from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.integrity import verify
from truestep.checkpoint.weights import load_model_tensors
from truestep.checkpoint.weights_only import write_weights_checkpoint
from truestep.cli.prepare_data import prepare_data_main
from truestep.data import ByteTokenizer, DataError, read_meta
from truestep.data.tokenizer_files import byte_tokenizer_json, data_tokenizer
from truestep.interop import InteropError

pytestmark = pytest.mark.usefixtures("offline")


@pytest.fixture(scope="module")
def hf_data(tmp_path_factory) -> Path:
    """A data directory prepared, from another working directory, with a relative tokenizer path."""
    base = tmp_path_factory.mktemp("hfdata")
    write_tiny_tokenizer(base / "tok")
    texts = write_corpus(base / "text")
    cwd = os.getcwd()
    os.chdir(base)
    try:
        assert (
            prepare_data_main(
                [
                    *(str(p.relative_to(base)) for p in texts),
                    "--out",
                    "data",
                    "--tokenizer",
                    "tok/tokenizer.json",
                ]
            )
            == 0
        )
    finally:
        os.chdir(cwd)
    return base / "data"


@pytest.fixture(scope="module")
def hf_run(hf_data, tmp_path_factory) -> Path:
    """The final checkpoint of a 2-step run on `hf_data`."""
    run = tmp_path_factory.mktemp("hfrun") / "run"
    launch(
        run,
        f"--data.path={hf_data}",
        "--train.max_steps=2",
        "--checkpoint.interval=0",
        "--schedule.warmup_steps=1",
    )
    return run / "checkpoints" / step_dir_name(2)


def test_prepare_data_bundles_the_tokenizer(hf_data: Path, tmp_path: Path) -> None:
    meta = read_meta(hf_data)
    assert meta["tokenizer"] == "tokenizer.json"  # relative to the data directory, not as typed
    assert meta["tokenizer_files"] == ["tokenizer.json", "tokenizer_config.json"]
    assert (meta["bos_id"], meta["eos_id"], meta["pad_id"]) == (1, 2, 3)  # named by tokenizer_config.json
    source = hf_data.parent / "tok"
    for name in meta["tokenizer_files"]:
        assert (hf_data / name).read_bytes() == (source / name).read_bytes()
    # The directory is self-contained: moved elsewhere, with the source tokenizer gone, it still loads.
    moved = Path(shutil.copytree(hf_data, tmp_path / "moved"))
    tok = data_tokenizer(moved, read_meta(moved)).load()
    assert tok.encode("the cat") == [4, 5] and tok.eos_id == 2


def test_prepare_data_again_with_its_own_tokenizer_copy(hf_data: Path, tmp_path: Path) -> None:
    """The copy inside a data directory can tokenize new text into that same directory; a directory that
    holds only somebody's tokenizer is not a data directory and is left alone."""
    data = Path(shutil.copytree(hf_data, tmp_path / "data"))
    texts = write_corpus(tmp_path / "more", documents=2)
    args = [*map(str, texts), "--out", str(data), "--tokenizer", str(data / "tokenizer.json")]
    assert prepare_data_main(args) == 0
    assert read_meta(data)["documents"] == 2
    assert (data / "tokenizer.json").read_bytes() == (hf_data / "tokenizer.json").read_bytes()
    mine = tmp_path / "mine"
    write_tiny_tokenizer(mine)
    before = (mine / "tokenizer.json").read_bytes()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert prepare_data_main([*map(str, texts), "--out", str(mine), "--tokenizer", "byte"]) == 2
    assert "not a truestep data directory" in err.getvalue()
    assert (mine / "tokenizer.json").read_bytes() == before


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"tokenizer_files": ["../tokenizer.json"]}, "tokenizer_files must list"),
        ({"tokenizer_files": ["tokenizer_config.json"]}, "tokenizer_files must list"),
        ({"tokenizer_files": None}, "was not copied into the data directory"),
        ({"bos_id": 10**6}, "bos_id must be null or an id below vocab_size"),
    ],
)
def test_data_tokenizer_refuses_what_a_crafted_meta_names(
    edit: dict, message: str, hf_data, tmp_path
) -> None:
    copy = Path(shutil.copytree(hf_data, tmp_path / "copy"))
    meta = {**read_meta(copy), **edit}
    if edit.get("tokenizer_files", ...) is None:
        del meta["tokenizer_files"]
    with pytest.raises(DataError, match=message):
        data_tokenizer(copy, meta)


def test_data_tokenizer_does_not_follow_a_symlink(hf_data, tmp_path) -> None:
    copy = Path(shutil.copytree(hf_data, tmp_path / "copy"))
    (copy / "tokenizer.json").unlink()
    (copy / "tokenizer.json").symlink_to(hf_data / "tokenizer.json")
    with pytest.raises(DataError, match="missing \\(or a symlink\\)"):
        data_tokenizer(copy, read_meta(copy))


@pytest.mark.multiprocess
def test_export_of_a_run_writes_its_tokenizer_and_ids(hf_run: Path, hf_data: Path, tmp_path: Path) -> None:
    transformers = transformers_or_skip()
    out = tmp_path / "hf"
    rc, stdout, err = cli("export", hf_run, "--to", "hf", out)
    assert rc == 0, err
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 3)
    generation = transformers.GenerationConfig.from_pretrained(str(out))
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (1, 2, 3)
    assert (out / "tokenizer.json").read_bytes() == (hf_data / "tokenizer.json").read_bytes()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer("the cat sat").input_ids == [1, 4, 5, 6]  # BOS from the post-processor
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 3)


@pytest.mark.multiprocess
def test_export_without_the_data_directory_says_what_to_do(
    hf_run: Path, hf_data: Path, tmp_path: Path
) -> None:
    moved = hf_data.with_name("data-moved")
    hf_data.rename(moved)
    try:
        rc, _, err = cli("export", hf_run, "--to", "hf", tmp_path / "a")
        assert rc == 3 and "--data DIR" in err and "--no-tokenizer" in err and str(hf_data) in err
        assert len(err.strip().splitlines()) == 1
        assert not (tmp_path / "a").exists()
        rc, _, err = cli("export", hf_run, "--to", "hf", tmp_path / "b", "--data", moved)
        assert rc == 0, err
        assert (tmp_path / "b" / "tokenizer.json").is_file()
        rc, _, err = cli("export", hf_run, "--to", "hf", tmp_path / "c", "--no-tokenizer")
        assert rc == 0, err
        assert not (tmp_path / "c" / "tokenizer.json").exists()
        assert json.loads((tmp_path / "c" / "config.json").read_text())["eos_token_id"] is None
    finally:
        moved.rename(hf_data)
    # A data directory whose tokenizer does not fit the model is refused, not exported.
    big = tmp_path / "big"
    shutil.copytree(hf_data, big)
    meta = json.loads((big / "meta.json").read_text())
    (big / "meta.json").write_text(json.dumps({**meta, "vocab_size": 1000, "dtype": "uint16"}))
    rc, _, err = cli("export", hf_run, "--to", "hf", tmp_path / "d", "--data", big)
    assert rc == 3 and "beyond model.vocab_size=512" in err


@pytest.mark.multiprocess
def test_byte_tokenizer_export_is_exact_and_says_what_it_is(ckpt: Path, tmp_path: Path) -> None:
    transformers = transformers_or_skip()
    out = tmp_path / "hf"
    rc, _, err = cli("export", ckpt, "--to", "hf", out)
    assert rc == 0, err
    assert "byte tokenizer" in (out / "TOKENIZER.md").read_text()
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (None, 256, None)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    # Every byte that valid UTF-8 can contain: all of U+0000..U+07FF, then every 3- and 4-byte lead.
    leads = [0x800, *(k << 12 for k in range(1, 16)), *(max(k << 18, 0x10000) for k in range(5))]
    text = "".join(map(chr, range(0x800))) + "".join(map(chr, leads)) + " 日本語 ✓"
    byte = ByteTokenizer()
    assert set(byte.encode(text)) == set(range(0xF5)) - {0xC0, 0xC1}
    assert tokenizer(text).input_ids == byte.encode(text)
    assert tokenizer.decode(byte.encode(text) + [256]) == text + "<|end_of_text|>"
    assert tokenizer.eos_token_id == 256
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_str(byte_tokenizer_json().decode()).get_vocab()
    assert sorted(vocab.values()) == list(range(257))  # one id per byte value, then EOS


def test_import_keeps_the_tokenizer_and_ids_through_a_round_trip(tmp_path: Path) -> None:
    transformers = transformers_or_skip()
    hf_dir = tmp_path / "hf"
    write_tiny_tokenizer(hf_dir)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=[2, 3],
        pad_token_id=None,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(str(hf_dir))
    rc, out, err = cli("import-hf", hf_dir, "--out", tmp_path / "ckpt")
    assert rc == 0, err
    step_dir = tmp_path / "ckpt" / step_dir_name(0)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(manifest["files"])  # verified with the weights
    verify(step_dir, checksums=True)
    rc, _, err = cli("export", step_dir, "--to", "hf", tmp_path / "again")
    assert rc == 0, err
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert (again["bos_token_id"], again["eos_token_id"], again["pad_token_id"]) == (1, [2, 3], None)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (hf_dir / name).read_bytes()


# ----------------------------------------------------------------------------------------------
# export --dtype


@pytest.mark.multiprocess
@pytest.mark.parametrize(("name", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_export_dtype(name: str, dtype: torch.dtype, ckpt: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    rc, _, err = cli("export", ckpt, "--to", "hf", tmp_path / "fp32", "--no-tokenizer")
    assert rc == 0, err
    rc, stdout, err = cli("export", ckpt, "--to", "hf", tmp_path / name, "--dtype", name, "--no-tokenizer")
    assert rc == 0, err
    config = json.loads((tmp_path / name / "config.json").read_text())
    assert config["torch_dtype"] == str(dtype).removeprefix("torch.")
    full = load_file(str(tmp_path / "fp32" / "model.safetensors"))
    half = load_file(str(tmp_path / name / "model.safetensors"))
    for key, value in full.items():  # exactly the rounded fp32 weights
        assert half[key].dtype == dtype and torch.equal(half[key], value.to(dtype)), key
    ratio = (tmp_path / name / "model.safetensors").stat().st_size / (
        tmp_path / "fp32" / "model.safetensors"
    ).stat().st_size
    assert 0.49 < ratio < 0.51, ratio
    rc, _, err = cli("export", ckpt, "--to", "torch", tmp_path / "w.pt", "--dtype", name)
    assert rc == 0, err
    state = torch.load(tmp_path / "w.pt", weights_only=True)
    original = load_model_tensors(ckpt)
    assert all(state[k].dtype == dtype and torch.equal(state[k], original[k].to(dtype)) for k in original)


@pytest.mark.multiprocess
def test_fp16_export_refuses_weights_beyond_its_range(ckpt: Path, tmp_path: Path) -> None:
    from truestep.checkpoint.weights import read_model_config

    tensors = {k: v.clone() for k, v in load_model_tensors(ckpt).items()}
    tensors["norm.weight"][0] = 1e6
    step_dir = write_weights_checkpoint(tmp_path / "ckpt", tensors, read_model_config(ckpt), {"type": "test"})
    rc, _, err = cli("export", step_dir, "--to", "torch", tmp_path / "w.pt", "--dtype", "fp16")
    assert rc == 3 and "norm.weight: values beyond the range of float16" in err
    assert not (tmp_path / "w.pt").exists()
    with pytest.raises(InteropError, match="older truestep"):  # an import without a tokenizer record
        from truestep.interop.tokenizer_export import checkpoint_tokenizer

        checkpoint_tokenizer(step_dir)
    rc, _, err = cli("export", step_dir, "--to", "torch", tmp_path / "w.pt", "--dtype", "bf16")
    assert rc == 0, err
