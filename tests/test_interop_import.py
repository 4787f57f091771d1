"""Interop: `truestep import-hf`, refusals, `load_init_weights` (init_from), `export --to torch`.

Checkpoints come from real training runs (one process, FSDP2 and TP across two processes). Parity with
Hugging Face is checked against transformers' own LlamaForCausalLM, loaded from the exported directory,
on the same tokens (fp32). Nothing is downloaded.

The `runs`/`ckpt` checkpoints and the `offline` fixture live in conftest.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from harness import TINY, truestep_env
from interop_cases import (
    bitwise_equal,
    cli,
    flip_byte,
    hf_logits,
    needs_safetensors,
    tokens,
    transformers_or_skip,
    truestep_model,
)
from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.init_from import load_init_weights
from truestep.checkpoint.weights import load_model_tensors, read_model_config
from truestep.cli.interop import interop_main
from truestep.core.errors import RefusedError
from truestep.model.llama import Transformer, ffn_hidden_dim

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.usefixtures("offline"),
]  # never reach the network (fixture in conftest.py)


def test_module_entry_point(ckpt, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "truestep.cli.interop",
            "export",
            str(ckpt),
            "--to",
            "torch",
            str(tmp_path / "w.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "w.pt").is_file() and "exported" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "truestep.cli.interop", "import-hf"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 2 and "--out" in proc.stderr


# ----------------------------------------------------------------------------------------------
# export --to torch


def test_export_torch_loads_strictly(runs, tmp_path: Path) -> None:
    ckpt_dir = runs["tp2"]
    file = tmp_path / "weights.pt"
    rc, stdout, err = cli("export", ckpt_dir, "--to", "torch", file)
    assert rc == 0, err
    state = torch.load(file, weights_only=True)
    assert all(t.dtype == torch.float32 for t in state.values())
    model = Transformer(read_model_config(ckpt_dir))
    model.load_state_dict(state, strict=True)
    assert state.keys() == model.state_dict().keys()
    assert "layers.0.attention.wq.weight" in state and not any(k.startswith("model.") for k in state)
    bitwise_equal(state, load_model_tensors(ckpt_dir))


# ----------------------------------------------------------------------------------------------
# refusals


@pytest.mark.parametrize("damage", ["flip-shard-byte", "no-marker", "no-manifest"])
def test_export_refuses_an_unverified_checkpoint(damage: str, ckpt, tmp_path: Path) -> None:
    broken = Path(shutil.copytree(ckpt, tmp_path / ckpt.name))
    if damage == "flip-shard-byte":
        flip_byte(broken / "__0_0.distcp")
    elif damage == "no-marker":
        (broken / "COMMITTED").unlink()
    else:
        (broken / "manifest.json").unlink()
    for fmt, dest in (("hf", tmp_path / "hf"), ("torch", tmp_path / "w.pt")):
        rc, _, err = cli("export", broken, "--to", fmt, dest)
        assert rc == 3, err
        assert "does not verify" in err and "refusing" in err
        assert not dest.exists()
    with pytest.raises(RefusedError, match="does not verify"):
        load_init_weights(Transformer(read_model_config(ckpt)), broken)


def test_export_of_a_run_directory_picks_the_newest_verified(ckpt, tmp_path: Path) -> None:
    run = ckpt.parent.parent
    rc, out, err = cli("export", run, "--to", "torch", tmp_path / "w.pt")
    assert rc == 0, err
    assert str(ckpt) in out


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert interop_main([]) == 2
    assert interop_main(["export", str(tmp_path)]) == 2  # --to and dest missing
    assert interop_main(["export", str(tmp_path), "--to", "onnx", str(tmp_path / "x")]) == 2
    assert interop_main(["import-hf", str(tmp_path)]) == 2  # --out missing
    rc, _, err = cli("export", tmp_path / "nope", "--to", "torch", tmp_path / "w.pt")
    assert rc == 3 and "no such checkpoint directory" in err


def _hf_dir(ckpt: Path, tmp_path: Path, name: str = "hf") -> Path:
    out = tmp_path / name
    assert interop_main(["export", str(ckpt), "--to", "hf", str(out)]) == 0
    return out


def _edit_config(hf_dir: Path, **changes: object) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    for key, value in changes.items():
        if value is _DROP:
            config.pop(key, None)
        else:
            config[key] = value
    (hf_dir / "config.json").write_text(json.dumps(config))


_DROP = object()


@needs_safetensors
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"},
            "unsupported architecture GPT2LMHeadModel",
        ),
        (  # Mistral v0.1: a sliding window shorter than the context
            {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 16},
            "sliding-window attention is not supported",
        ),
        (
            {"architectures": ["MistralForCausalLM"], "model_type": "llama"},
            "unsupported architecture Mistral",
        ),
        (  # llama3 scaling is supported, but only with all four of its parameters
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "rope_parameters": _DROP},
            "llama3 RoPE scaling needs numeric low_freq_factor, high_freq_factor",
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}},
            "rope_type='yarn' is not supported",
        ),
        ({"attention_bias": True}, "biases are not supported"),
        ({"mlp_bias": True}, "biases are not supported"),
        # A decoupled head_dim is supported: this one does not fit the stored q_proj.
        ({"head_dim": 32}, "q_proj.weight: safetensors has [64, 64], config.json implies [128, 64]"),
        ({"head_dim": 15}, "head size 15 is odd"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads=3"),
        (
            {"intermediate_size": 256},
            "model.layers.0.mlp.gate_proj.weight: safetensors has [192, 64], config.json implies [256, 64]",
        ),
        ({"vocab_size": 1024}, "model.embed_tokens.weight: safetensors has [512, 64]"),
        ({"hidden_size": _DROP}, "missing or invalid hidden_size"),
    ],
)
def test_import_refuses_unsupported_configs(changes: dict, message: str, ckpt, tmp_path: Path) -> None:
    hf_dir = _hf_dir(ckpt, tmp_path)
    _edit_config(hf_dir, **changes)
    rc, _, err = cli("import-hf", hf_dir, "--out", tmp_path / "out")
    assert rc == 3, err
    assert message in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@needs_safetensors
def test_import_refuses_biases_and_pickles(ckpt, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    hf_dir = _hf_dir(ckpt, tmp_path)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(tensors, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    rc, _, err = cli("import-hf", hf_dir, "--out", tmp_path / "out")
    assert rc == 3 and "biases are not supported" in err and "q_proj.bias" in err

    (hf_dir / "model.safetensors").unlink()
    torch.save({}, hf_dir / "pytorch_model.bin")
    rc, _, err = cli("import-hf", hf_dir, "--out", tmp_path / "out")
    assert rc == 3 and "only safetensors are imported" in err


def test_import_refuses_a_directory_without_config(tmp_path: Path) -> None:
    rc, _, err = cli("import-hf", tmp_path, "--out", tmp_path / "out")
    assert rc == 3 and "no config.json" in err


# ----------------------------------------------------------------------------------------------
# load_init_weights


def test_load_init_weights_names_the_mismatching_key(ckpt) -> None:
    cfg = read_model_config(ckpt)
    wider_kv = Transformer(type(cfg)(**{**asdict(cfg), "n_kv_heads": cfg.n_heads}))
    with pytest.raises(RefusedError) as err:
        load_init_weights(wider_kv, ckpt)
    text = str(err.value)
    assert "layers.0.attention.wk.weight: checkpoint has [32, 64], model expects [64, 64]" in text
    assert "--model.n_kv_heads=2" in text  # says what the checkpoint needs

    deeper = Transformer(type(cfg)(**{**asdict(cfg), "n_layers": cfg.n_layers + 1}))
    with pytest.raises(RefusedError, match=r"layers\.2\.attention\.wq\.weight: missing from the checkpoint"):
        load_init_weights(deeper, ckpt)


SHARDED_INIT = """
import sys

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from truestep.config.load import load_config
from truestep.checkpoint.init_from import load_init_weights
from truestep.checkpoint.weights import load_model_tensors
from truestep.model.llama import Transformer
from truestep.parallel.dist import init_distributed, shutdown
from truestep.parallel.parallelize import parallelize

ckpt, overrides = sys.argv[1], sys.argv[2:]
cfg = load_config("tiny", overrides)
ctx = init_distributed(cfg)
model = Transformer(cfg.model)
model.init_weights(seed=99)
model = parallelize(model, ctx, cfg)
facts = load_init_weights(model, ckpt)
assert facts["sharded"] is True, facts
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if ctx.is_main:
    want = load_model_tensors(ckpt)
    assert full.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(full[key], value), key
    print("INIT-OK", flush=True)
shutdown(ctx)
"""


@pytest.mark.parametrize("extra", [[], ["--parallel.tp=2"]], ids=["fsdp2", "tp2"])
def test_load_init_weights_into_a_parallelized_model(extra: list[str], ckpt, tmp_path: Path) -> None:
    """Collective path: a model already sharded by FSDP2 or TP reads its shards of a 1-process checkpoint."""
    script = tmp_path / "init_sharded.py"
    script.write_text(SHARDED_INIT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    proc = subprocess.run(
        [*cmd, str(ckpt), *TINY, *extra], env=truestep_env(), capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "INIT-OK" in proc.stdout


def test_load_init_weights_reports_numeric_config_differences(ckpt) -> None:
    cfg = read_model_config(ckpt)
    model = Transformer(type(cfg)(**{**asdict(cfg), "rope_theta": 500000.0}))
    facts = load_init_weights(model, ckpt)
    assert facts["config_differences"] == ["model.rope_theta: 10000.0 (checkpoint) -> 500000.0 (configured)"]
    bitwise_equal(dict(model.state_dict()), load_model_tensors(ckpt))


# ----------------------------------------------------------------------------------------------
# import of a directory written by transformers itself (tied embeddings, v5 config format)


@pytest.mark.parametrize("tied", [True, False])
def test_import_of_a_transformers_written_model(tied: bool, tmp_path: Path) -> None:
    transformers = transformers_or_skip()
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=48,
        intermediate_size=136,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=50000.0,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    hf_model = transformers.LlamaForCausalLM(config).eval()
    hf_model.save_pretrained(str(tmp_path / "hf"))
    rc, _, err = cli("import-hf", tmp_path / "hf", "--out", tmp_path / "ckpts")
    assert rc == 0, err
    step_dir = tmp_path / "ckpts" / step_dir_name(0)
    cfg = read_model_config(step_dir)
    assert (cfg.dim, cfg.n_heads, cfg.n_kv_heads, ffn_hidden_dim(cfg)) == (48, 6, 2, 136)
    assert (cfg.rope_theta, cfg.norm_eps, cfg.tie_embeddings) == (50000.0, 1e-6, tied)

    toks = tokens(256, seq=64)
    with torch.no_grad():
        theirs = hf_model(toks).logits
    ours = truestep_model(step_dir)
    if tied:
        assert ours.output.weight is ours.tok_embeddings.weight
    torch.testing.assert_close(ours(toks), theirs, atol=1e-5, rtol=0)

    # ... and back out again: still the same function for transformers.
    out = tmp_path / "again"
    assert interop_main(["export", str(step_dir), "--to", "hf", str(out)]) == 0
    torch.testing.assert_close(hf_logits(out, toks), theirs, atol=1e-5, rtol=0)


@needs_safetensors
def test_import_writes_a_ready_train_config(ckpt, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`import-hf` writes <out>/train.toml (the model section and init_from) instead of printing flags
    to paste; training from it loads the imported weights with no config difference."""
    from harness import events
    from truestep.config.load import load_config
    from truestep.core.launch import Launch
    from truestep.train.rank import run_rank

    out = tmp_path / "imported"
    assert interop_main(["import-hf", str(_hf_dir(ckpt, tmp_path)), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    toml = out / "train.toml"
    assert f"truestep train {toml} --data.path=DIR" in said and "--model." not in said, said
    run = tmp_path / "run"
    cfg = load_config(
        str(toml),
        [f"--run.dir={run}", "--train.max_steps=1", "--schedule.warmup_steps=0", "--data.seq_len=32"],
    )
    assert cfg.checkpoint.init_from == str(out.resolve())
    assert asdict(cfg.model) == {**asdict(read_model_config(Path(events_free_step(out)))), "dropout": 0.0}
    assert run_rank(cfg, Launch()) == 0
    (loaded,) = events(run, "init_from")
    assert loaded["tensors"] > 0 and loaded["config_differences"] == []


def events_free_step(root: Path) -> Path:
    """The one step directory `import-hf` wrote under `root`."""
    (step,) = [p for p in root.iterdir() if p.name.startswith("step_")]
    return step
