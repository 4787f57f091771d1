"""Where `import-hf` reads from (issues 28 and 27): a Hugging Face cache folder or repo id picks its
snapshot offline (refs/main, --revision, the only or newest one; ambiguity refused in one line), and no
symlink is followed out of the source directory (a git clone can carry one to any file)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from hostile_cases import one_line, run_cli
from interop_cases import needs_safetensors
from tokenizer_cases import write_tiny_tokenizer
from truestep.cli.interop import interop_main
from truestep.config.schema import ModelConfig
from truestep.interop.hf import hf_config
from truestep.interop.names import to_hf
from truestep.model.llama import Transformer

pytestmark = needs_safetensors

CFG = ModelConfig(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=32, multiple_of=16, max_seq_len=64)
A, B = "a" * 40, "b" * 40


def write_model(directory: Path, seed: int = 0) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = Transformer(CFG)
    model.init_weights(seed)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(hf_config(CFG)))
    save_file(
        {to_hf(k): v.detach().contiguous() for k, v in model.state_dict().items()},
        str(directory / "model.safetensors"),
    )
    write_tiny_tokenizer(directory)


def cache_repo(root: Path, repo_id: str, snapshots: dict[str, int], main: str | None) -> Path:
    """models--org--name with one snapshot per commit (files as links into blobs/), refs/main -> main."""
    folder = root / ("models--" + repo_id.replace("/", "--"))
    (folder / "blobs").mkdir(parents=True)
    for commit, seed in snapshots.items():
        staging = root / f"staging-{commit}"
        write_model(staging, seed)
        snap = folder / "snapshots" / commit
        snap.mkdir(parents=True)
        for file in staging.iterdir():
            blob = f"{commit[:4]}-{file.name}"
            file.rename(folder / "blobs" / blob)
            os.symlink(f"../../blobs/{blob}", snap / file.name)
        shutil.rmtree(staging)
    if main is not None:
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(main)
    return folder


def imported(*argv: object) -> str:
    rc, out, err = run_cli(interop_main, "import-hf", *argv)
    assert rc == 0, err
    return out


def refused(why: str, *argv: object) -> None:
    rc, _, err = run_cli(interop_main, "import-hf", *argv)
    assert rc == 3, err
    assert why in one_line(err), err


def weights_source(out: Path) -> str:
    info = json.loads((out / "step_00000000" / "interop.json").read_text())
    return info["source"]["path"]


def test_a_cache_folder_imports_the_snapshot_refs_main_names(tmp_path: Path) -> None:
    folder = cache_repo(tmp_path / "hub", "org/tiny", {A: 0, B: 1}, main=B)
    out = imported(folder, "--out", tmp_path / "c1")
    assert f"refs/main: snapshot {B}" in out
    assert weights_source(tmp_path / "c1").endswith(B)
    imported(folder, "--out", tmp_path / "c2", "--revision", A)
    assert weights_source(tmp_path / "c2").endswith(A)


def test_a_repo_id_is_looked_up_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache_repo(tmp_path / "hub", "org/tiny", {A: 0}, main=None)
    imported("org/tiny", "--cache-dir", tmp_path / "hub", "--out", tmp_path / "c1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert "the only snapshot" in imported("org/tiny", "--out", tmp_path / "c2")
    refused("not in the Hugging Face cache", "org/other", "--out", tmp_path / "c3")


def test_two_snapshots_without_refs_main(tmp_path: Path) -> None:
    folder = cache_repo(tmp_path / "hub", "org/tiny", {A: 0, B: 1}, main=None)
    os.utime(folder / "snapshots" / A, (1000, 1000))
    os.utime(folder / "snapshots" / B, (2000, 2000))
    assert f"the newest of 2 snapshots: {B}" in imported(folder, "--out", tmp_path / "c1")
    os.utime(folder / "snapshots" / A, (2000, 2000))
    refused("choose one with --revision", folder, "--out", tmp_path / "c2")
    refused("no snapshot for revision 'v9'", folder, "--revision", "v9", "--out", tmp_path / "c3")


def test_a_cache_root_or_a_bad_ref_is_one_line(tmp_path: Path) -> None:
    folder = cache_repo(tmp_path / "hub", "org/tiny", {A: 0}, main=None)
    refused("looks like a Hugging Face cache (models--org--tiny)", tmp_path / "hub", "--out", tmp_path / "c")
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("../../../etc/passwd")
    refused("not a commit hash", folder, "--out", tmp_path / "c")
    refused(
        "--revision applies to a Hugging Face cache",
        folder / "snapshots" / A,
        "--revision",
        "x",
        "--out",
        tmp_path / "c",
    )


@pytest.mark.parametrize(
    "name",
    [
        "config.json",
        "special_tokens_map.json",
        "tokenizer_config.json",
        "tokenizer.json",
        "model.safetensors",
    ],
)
def test_no_symlink_is_followed_out_of_the_source_directory(name: str, tmp_path: Path) -> None:
    src = tmp_path / "clone"
    write_model(src)
    if name == "special_tokens_map.json":
        (src / name).write_text(json.dumps({"eos_token": "</s>"}))
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    (src / name).rename(outside)
    os.symlink(outside, src / name)
    refused("outside", src, "--out", tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


def test_a_symlink_within_the_directory_is_followed(tmp_path: Path) -> None:
    src = tmp_path / "clone"
    write_model(src)
    (src / "model.safetensors").rename(src / "real.safetensors")
    os.symlink("real.safetensors", src / "model.safetensors")
    imported(src, "--out", tmp_path / "ckpt")
