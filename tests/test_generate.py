"""`truestep generate`: greedy output equals transformers' `generate()` on the exported model, token for
token; it stops at the checkpoint's eos ids; it works on training, imported and run-directory paths.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import truestep_env
from interop_cases import cli, transformers_or_skip
from tokenizer_cases import write_tiny_tokenizer
from truestep.checkpoint.catalog import step_dir_name
from truestep.cli.generate import generate_main

pytestmark = pytest.mark.usefixtures("offline")


def run_generate(*argv: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = generate_main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def hf_greedy(hf_dir: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    transformers = transformers_or_skip()
    model = transformers.LlamaForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False, top_p=None, top_k=None
        )
    return out[0, len(prompt_ids) :].tolist()


@pytest.fixture(scope="module")
def llama32(tmp_path_factory) -> Path:
    """An HF directory of a tiny Llama 3.2-style model (tied, llama3 RoPE scaling, head_dim != dim/heads)
    with a tokenizer, written by transformers."""
    transformers = transformers_or_skip()
    hf_dir = tmp_path_factory.mktemp("llama32") / "hf"
    write_tiny_tokenizer(hf_dir)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=0.2,  # far from uniform logits: no near-ties for argmax
        bos_token_id=1,
        eos_token_id=2,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(hf_dir))
    return hf_dir


def _import(hf_dir: Path, out: Path) -> Path:
    rc, _, err = cli("import-hf", hf_dir, "--out", out)
    assert rc == 0, err
    return out / step_dir_name(0)


def test_greedy_equals_transformers_on_an_imported_llama32(llama32: Path, tmp_path: Path) -> None:
    step_dir = _import(llama32, tmp_path / "ckpt")
    prompt = "the cat sat on a mat and"
    rc, out, err = run_generate(step_dir, "--prompt", prompt, "--max-new-tokens", 40, "--json")
    assert rc == 0, err
    record = json.loads(out)
    transformers = transformers_or_skip()
    assert record["prompt_ids"] == transformers.AutoTokenizer.from_pretrained(str(llama32))(prompt).input_ids
    # 8 prompt tokens + 40 new ones reach well past the original context of 16 positions.
    theirs = hf_greedy(llama32, record["prompt_ids"], 40)
    assert record["new_ids"] == theirs[: len(record["new_ids"])]
    assert len(set(theirs)) > 5  # a varied continuation, not one repeated token
    if record["stop_reason"] == "length":
        assert len(record["new_ids"]) == 40 and 2 not in record["new_ids"]
    else:
        assert record["new_ids"][-1] == 2 and theirs[len(record["new_ids"]) - 1] == 2


def test_generation_stops_at_any_eos_id(llama32: Path, tmp_path: Path) -> None:
    """Declare the 7th greedy token an eos id (as instruct models list several): both stop right there."""
    step_dir = _import(llama32, tmp_path / "first")
    rc, out, _ = run_generate(step_dir, "--prompt-ids", "1,4,5", "--max-new-tokens", 20, "--json")
    free = json.loads(out)["new_ids"]
    eos = free[6]
    stop_at = free.index(eos)
    edited = tmp_path / "hf"
    edited.mkdir()
    for item in llama32.iterdir():
        (edited / item.name).write_bytes(item.read_bytes())
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "eos_token_id": [2, eos]}))
    (edited / "generation_config.json").unlink()
    step_dir = _import(edited, tmp_path / "second")
    rc, out, err = run_generate(step_dir, "--prompt-ids", "1 4 5", "--max-new-tokens", 20, "--json")
    assert rc == 0, err
    record = json.loads(out)
    assert record["stop_reason"] == "eos" and record["new_ids"] == free[: stop_at + 1]
    transformers = transformers_or_skip()
    model = transformers.LlamaForCausalLM.from_pretrained(str(edited), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model.generate(torch.tensor([[1, 4, 5]]), max_new_tokens=20, do_sample=False)[0, 3:].tolist()
    assert theirs == record["new_ids"]


@pytest.mark.multiprocess
def test_greedy_equals_transformers_on_an_exported_training_checkpoint(ckpt: Path, tmp_path: Path) -> None:
    """A truestep run (byte tokenizer): the real CLI in a subprocess, then transformers on the export."""
    prompt = "import os\ndef "
    proc = subprocess.run(
        [sys.executable, "-m", "truestep", "generate", str(ckpt.parent.parent), "--prompt", prompt]
        + ["--max-new-tokens", "24", "--json"],
        env=truestep_env({"HF_HUB_OFFLINE": "1"}),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["checkpoint"] == str(ckpt)  # the run directory resolved to its newest verified step
    assert record["prompt_ids"] == list(prompt.encode())
    rc, _, err = cli("export", ckpt, "--to", "hf", tmp_path / "hf")
    assert rc == 0, err
    transformers = transformers_or_skip()
    assert (
        transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))(prompt).input_ids
        == record["prompt_ids"]
    )
    assert record["new_ids"] == hf_greedy(tmp_path / "hf", record["prompt_ids"], 24)[: len(record["new_ids"])]
    shown = record["new_ids"][:-1] if record["stop_reason"] == "eos" else record["new_ids"]
    assert record["text"] == bytes(i for i in shown if i < 256).decode("utf-8", errors="replace")


@pytest.mark.multiprocess
def test_sampling_flags_reproduce_per_seed(ckpt: Path) -> None:
    args = [ckpt, "--prompt", "x = ", "--max-new-tokens", 16, "--temperature", 1.0, "--top-p", 0.9, "--json"]
    first = json.loads(run_generate(*args, "--seed", 1)[1])["new_ids"]
    assert first == json.loads(run_generate(*args, "--seed", 1)[1])["new_ids"]
    assert first != json.loads(run_generate(*args, "--seed", 2)[1])["new_ids"]


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--prompt", "x", "--temperature", "-1"], 2, "temperature must be >= 0"),
        (["--prompt", "x" * 60, "--max-new-tokens", "10"], 3, "lower --max-new-tokens"),  # max_seq_len 64
        (["--prompt-ids", "1,x"], 2, "not a list of integers"),
        (["--prompt-ids", "600"], 3, "prompt ids must be in [0, 512)"),
        ([], 2, "one of the arguments --prompt --prompt-ids is required"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(argv: list[str], code: int, message: str, ckpt: Path) -> None:
    rc, _, err = run_generate(ckpt, *argv)
    assert rc == code and message in err, err
    assert "Traceback" not in err


def test_an_imported_model_without_tokenizer_needs_ids(llama32: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((llama32 / name).read_bytes())
    step_dir = _import(bare, tmp_path / "ckpt")
    rc, _, err = run_generate(step_dir, "--prompt", "the cat")
    assert rc == 3 and "has no tokenizer files; give token ids with --prompt-ids" in err
    rc, out, err = run_generate(step_dir, "--prompt-ids", "1,4,5", "--max-new-tokens", 5)
    assert rc == 0, err
    assert len(out.split()) <= 5 and all(part.isdigit() for part in out.split())
