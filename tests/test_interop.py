"""Interop: `truestep export --to hf|torch`, `truestep import-hf`, and `load_init_weights` (init_from).

Checkpoints come from real training runs (one process, FSDP2 and TP across two processes). Parity with
Hugging Face is checked against transformers' own LlamaForCausalLM, loaded from the exported directory,
on the same tokens (fp32). Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from harness import TINY, launch, truestep_env
from truestep.checkpoint.layout import step_dir_name
from truestep.checkpoint.manifest import verify
from truestep.cli.interop import interop_main
from truestep.interop import (
    InteropError,
    load_init_weights,
    load_model_tensors,
    model_config_from_hf,
    read_model_config,
)
from truestep.interop.hf import ffn_rule_for, hf_config, parse_size
from truestep.model.llama import Transformer, ffn_hidden_dim

STEPS = 3
COMMON = [f"--train.max_steps={STEPS}", "--checkpoint.interval=0", "--schedule.warmup_steps=1"]
LAYOUTS = {
    "single": (1, []),
    "fsdp2": (2, []),
    "tp2": (2, ["--parallel.tp=2"]),
    "tied-fsdp2": (2, ["--model.tie_embeddings=true"]),
}

needs_safetensors = pytest.mark.skipif(
    importlib.util.find_spec("safetensors") is None,
    reason="safetensors is not installed (pip install 'truestep[hf]')",
)


def transformers_or_skip():
    return pytest.importorskip(
        "transformers",
        reason="transformers is not installed (pip install 'truestep[dev]'); parity not checked",
    )


@pytest.fixture(scope="module", autouse=True)
def offline():
    """Never reach the network: every model here is local."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """layout name -> the final checkpoint directory of a short real run at that layout."""
    found = {}
    for name, (nproc, extra) in LAYOUTS.items():
        run = tmp_path_factory.mktemp(f"interop-{name}")
        launch(run, *COMMON, *extra, nproc=nproc)
        found[name] = run / "checkpoints" / step_dir_name(STEPS)
    return found


@pytest.fixture(scope="module")
def ckpt(runs) -> Path:
    return runs["single"]


def cli(*argv: object) -> tuple[int, str, str]:
    """interop_main in process (a subprocess per call costs seconds of torch import)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = interop_main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


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


def tokens(vocab: int, seq: int = 48) -> torch.Tensor:
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(7))


def truestep_model(ckpt_dir: Path) -> Transformer:
    model = Transformer(read_model_config(ckpt_dir))
    facts = load_init_weights(model, ckpt_dir)
    assert facts["config_differences"] == []
    return model.eval()


def hf_logits(hf_dir: Path, toks: torch.Tensor) -> torch.Tensor:
    transformers = transformers_or_skip()
    model, info = transformers.LlamaForCausalLM.from_pretrained(
        str(hf_dir), dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info
    with torch.no_grad():
        return model.eval()(toks).logits


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype == torch.float32, key
        assert a[key].shape == b[key].shape, key
        assert torch.equal(a[key].view(torch.int32), b[key].view(torch.int32)), key


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------------------------
# export --to hf: logits parity with transformers, for every layout the checkpoint was saved at


@needs_safetensors
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_export_hf_matches_transformers_logits(layout: str, runs, tmp_path: Path) -> None:
    ckpt_dir = runs[layout]
    saved = json.loads((ckpt_dir / "rank00000.json").read_text())["layout"]
    assert saved["world_size"] == LAYOUTS[layout][0]
    out = tmp_path / "hf"
    rc, stdout, err = cli("export", ckpt_dir, "--to", "hf", out)
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]

    cfg = read_model_config(ckpt_dir)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    expected = {
        "hidden_size": cfg.dim,
        "intermediate_size": ffn_hidden_dim(cfg),
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }
    assert {k: config[k] for k in expected} == expected
    assert cfg.n_kv_heads < cfg.n_heads  # the tiny model exercises grouped-query attention
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())  # noqa: SIM118 - not a mapping
    assert ("lm_head.weight" in names) is not cfg.tie_embeddings  # transformers re-ties it on load
    assert len(names) == 2 + 9 * cfg.n_layers + (0 if cfg.tie_embeddings else 1)

    toks = tokens(cfg.vocab_size)
    ours = truestep_model(ckpt_dir)(toks)
    theirs = hf_logits(out, toks)
    assert theirs.shape == ours.shape
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)


@needs_safetensors
def test_layouts_export_the_same_consolidated_tensors(runs, tmp_path: Path) -> None:
    """The same 3 steps at three layouts: consolidation reassembles full tensors from any sharding."""
    tensors = {name: load_model_tensors(runs[name]) for name in ("single", "fsdp2", "tp2")}
    for name in ("fsdp2", "tp2"):
        assert tensors[name].keys() == tensors["single"].keys()
        for key, value in tensors["single"].items():
            torch.testing.assert_close(tensors[name][key], value, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------
# round trip truestep -> HF -> truestep


@needs_safetensors
@pytest.mark.parametrize("layout", ["single", "fsdp2", "tied-fsdp2"])
def test_round_trip_is_bitwise(layout: str, runs, tmp_path: Path) -> None:
    ckpt_dir = runs[layout]
    assert interop_main(["export", str(ckpt_dir), "--to", "hf", str(tmp_path / "hf")]) == 0
    rc, out, err = cli("import-hf", tmp_path / "hf", "--out", tmp_path / "imported")
    assert rc == 0, err
    assert "--checkpoint.init_from=" in out and "--model.dim=64" in out
    step_dir = tmp_path / "imported" / step_dir_name(0)
    verify(step_dir, checksums=True)  # a committed checkpoint: manifest + COMMITTED
    info = json.loads((step_dir / "interop.json").read_text())
    assert info["format"] == "truestep-interop" and info["source"]["type"] == "huggingface"

    original, imported = load_model_tensors(ckpt_dir), load_model_tensors(step_dir)
    bitwise_equal(original, imported)

    # The recorded model config builds the same shapes (the FFN rule may be spelled differently).
    a, b = read_model_config(ckpt_dir), read_model_config(step_dir)
    assert ffn_hidden_dim(a) == ffn_hidden_dim(b)
    for key in ("dim", "n_layers", "n_heads", "vocab_size", "norm_eps", "rope_theta", "max_seq_len"):
        assert getattr(a, key) == getattr(b, key), key
    assert (a.n_kv_heads or a.n_heads) == (b.n_kv_heads or b.n_heads)

    # init_from: the imported checkpoint (given as the root) initializes a fresh model exactly.
    model = Transformer(a)
    model.init_weights(seed=123)
    facts = load_init_weights(model, tmp_path / "imported")
    assert facts["step"] == 0 and facts["path"] == str(step_dir)
    bitwise_equal(dict(model.state_dict()), original)


@needs_safetensors
def test_import_refuses_an_existing_destination(ckpt, tmp_path: Path) -> None:
    (tmp_path / "out" / step_dir_name(0)).mkdir(parents=True)
    (tmp_path / "out" / step_dir_name(0) / "something").write_text("x")
    assert interop_main(["export", str(ckpt), "--to", "hf", str(tmp_path / "hf")]) == 0
    rc, _, err = cli("import-hf", tmp_path / "hf", "--out", tmp_path / "out")
    assert rc == 1 and "refusing to overwrite" in err
    rc, _, err = cli("export", ckpt, "--to", "hf", tmp_path / "hf")
    assert rc == 1 and "refusing to overwrite" in err


# ----------------------------------------------------------------------------------------------
# sharded safetensors


@needs_safetensors
def test_sharded_export_has_an_index_that_transformers_loads(runs, tmp_path: Path) -> None:
    ckpt_dir = runs["fsdp2"]
    out = tmp_path / "hf"
    rc, stdout, err = cli("export", ckpt_dir, "--to", "hf", out, "--max-shard-size", "100KB")
    assert rc == 0, err
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and not (out / "model.safetensors").exists()
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert sorted(set(index["weight_map"].values())) == files
    assert len(index["weight_map"]) == 21  # 2 layers x 9 + embed, norm, lm_head
    assert all(name.startswith(("model.", "lm_head.")) for name in index["weight_map"])
    assert index["metadata"]["total_size"] == sum(
        t.numel() * 4 for t in load_model_tensors(ckpt_dir).values()
    )

    toks = tokens(512)
    torch.testing.assert_close(hf_logits(out, toks), truestep_model(ckpt_dir)(toks), atol=1e-5, rtol=0)

    # ... and imports back, bitwise.
    assert interop_main(["import-hf", str(out), "--out", str(tmp_path / "imported")]) == 0
    bitwise_equal(load_model_tensors(tmp_path / "imported" / step_dir_name(0)), load_model_tensors(ckpt_dir))


def test_parse_size() -> None:
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("100KB") == 100_000
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("1.5MB") == 1_500_000
    assert parse_size("4096") == 4096
    for bad in ("five", "5XB", "0", "-1GB"):
        with pytest.raises(InteropError):
            parse_size(bad)


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
        assert rc == 1, err
        assert "does not verify" in err and "refusing" in err
        assert not dest.exists()
    with pytest.raises(InteropError, match="does not verify"):
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
    assert rc == 1 and "no such checkpoint directory" in err


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
        ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "only LlamaForCausalLM"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "rope_parameters": _DROP},
            "rope_scaling is set ('llama3')",
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}},
            "rope_type='yarn' (RoPE scaling) is not supported",
        ),
        ({"attention_bias": True}, "biases are not supported"),
        ({"mlp_bias": True}, "biases are not supported"),
        ({"head_dim": 32}, "head_dim=32 != hidden_size/num_attention_heads=16"),
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
    assert rc == 1, err
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
    assert rc == 1 and "biases are not supported" in err and "q_proj.bias" in err

    (hf_dir / "model.safetensors").unlink()
    torch.save({}, hf_dir / "pytorch_model.bin")
    rc, _, err = cli("import-hf", hf_dir, "--out", tmp_path / "out")
    assert rc == 1 and "only safetensors are imported" in err


def test_import_refuses_a_directory_without_config(tmp_path: Path) -> None:
    rc, _, err = cli("import-hf", tmp_path, "--out", tmp_path / "out")
    assert rc == 1 and "no config.json" in err


# ----------------------------------------------------------------------------------------------
# load_init_weights


def test_load_init_weights_names_the_mismatching_key(ckpt) -> None:
    cfg = read_model_config(ckpt)
    wider_kv = Transformer(type(cfg)(**{**asdict(cfg), "n_kv_heads": cfg.n_heads}))
    with pytest.raises(InteropError) as err:
        load_init_weights(wider_kv, ckpt)
    text = str(err.value)
    assert "layers.0.attention.wk.weight: checkpoint has [32, 64], model expects [64, 64]" in text
    assert "--model.n_kv_heads=2" in text  # says what the checkpoint needs

    deeper = Transformer(type(cfg)(**{**asdict(cfg), "n_layers": cfg.n_layers + 1}))
    with pytest.raises(InteropError, match=r"layers\.2\.attention\.wq\.weight: missing from the checkpoint"):
        load_init_weights(deeper, ckpt)


SHARDED_INIT = """
import sys

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from truestep.config.load import load_config
from truestep.interop import load_init_weights, load_model_tensors
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


# ----------------------------------------------------------------------------------------------
# config translation (pure)


@pytest.mark.parametrize(
    ("dim", "intermediate"),
    [(4096, 11008), (4096, 14336), (8192, 28672), (5120, 13824), (64, 192), (48, 100)],
)
def test_ffn_rule_reproduces_any_intermediate_size(dim: int, intermediate: int) -> None:
    from truestep.config.schema import ModelConfig

    multiple_of, multiplier = ffn_rule_for(dim, intermediate)
    assert (
        ffn_hidden_dim(ModelConfig(dim=dim, multiple_of=multiple_of, ffn_dim_multiplier=multiplier))
        == intermediate
    )


def test_llama3_8b_preset_config_round_trips() -> None:
    from truestep.config.load import load_config

    cfg = load_config("llama3-8b").model
    back = model_config_from_hf(hf_config(cfg))
    assert ffn_hidden_dim(back) == ffn_hidden_dim(cfg) == 14336
    assert (back.multiple_of, back.ffn_dim_multiplier) == (1024, 1.3)
    for key in ("dim", "n_layers", "n_heads", "vocab_size", "norm_eps", "rope_theta", "max_seq_len"):
        assert getattr(back, key) == getattr(cfg, key), key
