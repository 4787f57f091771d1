"""A tokenizer whose regex makes the Rust library panic (issue 27): `prepare-data` (in process and in
spawned workers, which cannot pickle the panic back) and `generate` refuse in one line, exit 3, with no
traceback and none of the panic hook's own lines; invalid sampling arguments are one-line usage errors.
Real processes (forked by the tests' server): the panic hook writes straight to file descriptor 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from forkserver import forks
from harness import truestep_env
from interop_cases import needs_safetensors
from truestep.config.schema import ModelConfig
from truestep.interop.hf import hf_config
from truestep.interop.names import to_hf
from truestep.model.llama import Transformer

PANIC_TEXT = "x" * 5000  # (x+x+)+y backtracks past the regex engine's retry limit on this


def panicking_tokenizer(directory: Path) -> Path:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "</s>": 1, "x": 2, "hello": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(x+x+)+y"), behavior="isolated")
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory / "tokenizer.json"


def truestep(*argv: object) -> subprocess.CompletedProcess[str]:
    """`python -m truestep ARGV` as a process forked by the tests' server (forkserver.py: a real
    process, its own file descriptor 2, without importing torch again)."""
    env = truestep_env({"RUST_BACKTRACE": "1"})  # the panic hook at its most verbose
    return forks().run([*map(str, argv)], env, timeout=300)


def refused_in_one_line(proc: subprocess.CompletedProcess[str], code: int, why: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert why in lines[0], proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_prepare_data_refuses_a_panicking_tokenizer(workers: int, tmp_path: Path) -> None:
    tok = panicking_tokenizer(tmp_path / "tok")
    corpus = tmp_path / "docs.txt"
    corpus.write_text("hello\n" + PANIC_TEXT + "\n")
    proc = truestep("prepare-data", corpus, "--tokenizer", tok, "--out", tmp_path / "d", "--workers", workers)
    refused_in_one_line(proc, 3, "Rust panic: Onig: Regex search error: retry-limit-in-match over")


@pytest.mark.slow
@needs_safetensors
def test_generate_refuses_a_panicking_tokenizer_and_bad_sampling(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    cfg = ModelConfig(
        dim=16, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=8, multiple_of=16, max_seq_len=64
    )
    model = Transformer(cfg)
    model.init_weights(0)
    src = tmp_path / "hf"
    panicking_tokenizer(src)
    (src / "config.json").write_text(json.dumps(hf_config(cfg)))
    save_file(
        {to_hf(k): v.detach().contiguous() for k, v in model.state_dict().items()},
        str(src / "model.safetensors"),
    )
    assert truestep("import-hf", src, "--out", tmp_path / "ckpt").returncode == 0
    ok = truestep("generate", tmp_path / "ckpt", "--prompt", "hello", "--max-new-tokens", "2")
    assert ok.returncode == 0, ok.stderr  # the tokenizer works on ordinary text
    proc = truestep("generate", tmp_path / "ckpt", "--prompt", PANIC_TEXT, "--max-new-tokens", "2")
    refused_in_one_line(proc, 3, "Rust panic")
    for flag, value, why in [
        ("--temperature", "nan", "temperature must be >= 0 and finite"),
        ("--temperature", "inf", "temperature must be >= 0 and finite"),
        ("--top-p", "nan", "top_p must be in (0, 1]"),
        ("--seed", str(2**64), "seed must be in [0, 2**63)"),
        ("--max-new-tokens", "0", "max_new_tokens must be >= 1"),
    ]:
        proc = truestep("generate", tmp_path / "ckpt", "--prompt-ids", "1", flag, value)
        refused_in_one_line(proc, 2, why)


def test_sampling_check_refuses_non_finite_values() -> None:
    from truestep.model.generate import Sampling

    for bad in (Sampling(temperature=float("nan")), Sampling(temperature=float("inf")), Sampling(seed=-1)):
        with pytest.raises(ValueError):
            bad.check()
    Sampling(temperature=0.7, top_p=0.9, seed=2**63 - 1).check()
