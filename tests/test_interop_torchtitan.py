"""`truestep import-torchtitan`: a torchtitan llama3 DCP checkpoint becomes a truestep checkpoint that
computes the same function.

The reference is a re-implementation, here, of torchtitan's llama3 forward: RoPE as a complex product on
interleaved pairs (with torchtitan's default llama3 frequency scaling), in float64. The checkpoints are
real DCP directories written by `dcp.save` with torchtitan's key layouts (flat, or under `model.`) and
the non-model entries a torchtitan checkpoint carries.
"""

from __future__ import annotations

import contextlib
import io
import math
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

from interop_cases import truestep_model
from truestep.checkpoint.catalog import step_dir_name
from truestep.checkpoint.weights import expected_shapes, load_model_tensors, read_model_config
from truestep.cli.main import main
from truestep.config import ModelConfig, load_config
from truestep.interop.torchtitan import interleaved_to_half_split

MODEL = [
    "--model.dim=64",
    "--model.n_layers=2",
    "--model.n_heads=4",
    "--model.n_kv_heads=2",
    "--model.vocab_size=256",
    "--model.multiple_of=32",
    "--model.max_seq_len=128",
    "--data.seq_len=64",
    "--model.rope_theta=500000.0",
    "--model.rope_scaling=llama3",
    "--model.rope_scaling_factor=8.0",
    "--model.rope_original_max_seq_len=16",
]


def _cfg() -> ModelConfig:
    return load_config("tiny", MODEL).model


def _torchtitan_weights(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    weights = {}
    for fqn, shape in expected_shapes(cfg).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        weights[fqn] = 1 + 0.1 * noise if fqn.endswith("norm.weight") else 0.15 * noise
    return weights


def _llama3_inv_freq(width: int, cfg: ModelConfig) -> torch.Tensor:
    """torchtitan's `scaling="llama"` frequencies, written out again in float64."""
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, width, 2, dtype=torch.float64) / width)
    original, low, high = cfg.rope_original_max_seq_len, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    out = []
    for f in inv_freq.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < original / high:
            out.append(f)
        elif wavelen > original / low:
            out.append(f / cfg.rope_scaling_factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / cfg.rope_scaling_factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def torchtitan_logits(w: dict[str, torch.Tensor], cfg: ModelConfig, tokens: torch.Tensor) -> torch.Tensor:
    """torchtitan llama3's forward (complex RoPE on interleaved pairs), float64."""
    w = {k: v.double() for k, v in w.items()}
    bsz, seq = tokens.shape
    width, kv = cfg.dim // cfg.n_heads, cfg.n_kv_heads
    cis = torch.polar(
        torch.ones(seq, width // 2, dtype=torch.float64),
        torch.outer(torch.arange(seq).double(), _llama3_inv_freq(width, cfg)),
    )

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * weight

    def rotate(x: torch.Tensor) -> torch.Tensor:  # (B, S, H, D): pairs (2j, 2j+1) as complex numbers
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(pairs * cis[None, :, None, :]).flatten(3)

    h = w["tok_embeddings.weight"][tokens]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        x = norm(h, w[p + "attention_norm.weight"])
        q = rotate((x @ w[p + "attention.wq.weight"].T).view(bsz, seq, cfg.n_heads, width))
        k = rotate((x @ w[p + "attention.wk.weight"].T).view(bsz, seq, kv, width))
        v = (x @ w[p + "attention.wv.weight"].T).view(bsz, seq, kv, width)
        k, v = (t.repeat_interleave(cfg.n_heads // kv, dim=2).transpose(1, 2) for t in (k, v))
        scores = (q.transpose(1, 2) @ k.transpose(-1, -2)) / math.sqrt(width)
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        h = h + attn.transpose(1, 2).reshape(bsz, seq, -1) @ w[p + "attention.wo.weight"].T
        x = norm(h, w[p + "ffn_norm.weight"])
        gate = F.silu(x @ w[p + "feed_forward.w1.weight"].T) * (x @ w[p + "feed_forward.w3.weight"].T)
        h = h + gate @ w[p + "feed_forward.w2.weight"].T
    return norm(h, w["norm.weight"]) @ w["output.weight"].T


def _save_torchtitan(
    path: Path, weights: dict[str, torch.Tensor], prefixed: bool, dtype: torch.dtype
) -> Path:
    model = {k: v.to(dtype) for k, v in weights.items()}
    cfg = _cfg()
    model["freqs_cis"] = torch.polar(
        torch.ones(cfg.max_seq_len, 8), torch.zeros(cfg.max_seq_len, 8)
    )  # old torchtitan kept it
    state = {
        **({"model": model} if prefixed else model),
        "optimizer": {"state": {"layers.0.attention.wq.weight": {"exp_avg": torch.zeros(4)}}},
        "train_state": {"step": 1000, "ntokens_seen": 123},  # stored pickled: must never be loaded
        "lr_scheduler": {"last_epoch": 1000},
    }
    with warnings.catch_warnings():  # DCP warns that it runs without a process group
        warnings.filterwarnings("ignore", message=r"torch.distributed is disabled")
        dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return path


def _import(dcp_dir: Path, out: Path, *extra: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["import-torchtitan", str(dcp_dir), "--out", str(out), "tiny", *MODEL, *extra])
    return rc, err.getvalue()


def test_permutation_moves_interleaved_pairs_to_halves() -> None:
    rows = torch.arange(2 * 6, dtype=torch.float32)[:, None].expand(12, 3)  # 2 heads of width 6
    out = interleaved_to_half_split(rows, 2, 6)[:, 0].tolist()
    assert out == [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]


@pytest.mark.parametrize(("prefixed", "dtype"), [(False, torch.float32), (True, torch.bfloat16)])
def test_imported_torchtitan_weights_compute_the_same_logits(prefixed: bool, dtype, tmp_path: Path) -> None:
    cfg = _cfg()
    weights = _torchtitan_weights(cfg)
    dcp_dir = _save_torchtitan(tmp_path / "step-1000", weights, prefixed, dtype)
    rc, err = _import(dcp_dir, tmp_path / "ckpt")
    assert rc == 0, err
    step_dir = tmp_path / "ckpt" / step_dir_name(0)
    assert read_model_config(step_dir) == cfg
    stored = {k: v.to(dtype).float() for k, v in weights.items()}  # what torchtitan holds
    tokens = torch.randint(0, cfg.vocab_size, (2, 64), generator=torch.Generator().manual_seed(5))
    reference = torchtitan_logits(stored, cfg, tokens)
    with torch.no_grad():
        ours = truestep_model(step_dir)(tokens)
    torch.testing.assert_close(ours.double(), reference, atol=2e-5, rtol=0)
    # Moving the weights by name alone (no permutation) is a silently different model.
    naive = truestep_model(step_dir)
    naive.load_state_dict(stored)
    with torch.no_grad():
        assert (naive(tokens).double() - reference).abs().max() > 1e-2
    # Only q/k changed; everything else is stored as it was.
    imported = load_model_tensors(step_dir)
    assert torch.equal(imported["layers.1.attention.wv.weight"], stored["layers.1.attention.wv.weight"])
    assert not torch.equal(imported["layers.1.attention.wk.weight"], stored["layers.1.attention.wk.weight"])


def test_refusals(tmp_path: Path) -> None:
    cfg = _cfg()
    dcp_dir = _save_torchtitan(tmp_path / "step-1", _torchtitan_weights(cfg), False, torch.float32)
    rc, err = _import(dcp_dir, tmp_path / "a", "--model.n_kv_heads=4")
    assert rc == 3 and "layers.0.attention.wk.weight: torchtitan checkpoint has [32, 64]" in err
    assert "the configured model expects [64, 64]" in err
    rc, err = _import(tmp_path, tmp_path / "b")
    assert rc == 3 and "no .metadata" in err
    rc, err = _import(dcp_dir, tmp_path / "c", "--model.rope_scaling=bogus")
    assert rc == 2 and "model.rope_scaling must be none|llama3" in err
    # A model key truestep's Llama does not have (e.g. QK-norm) is refused, not dropped.
    extra = {**_torchtitan_weights(cfg), "layers.0.attention.q_norm.weight": torch.ones(16)}
    other = _save_torchtitan(tmp_path / "step-2", extra, False, torch.float32)
    rc, err = _import(other, tmp_path / "d")
    assert (
        rc == 3
        and "layers.0.attention.q_norm.weight: in the torchtitan checkpoint but not a parameter" in err
    )


class _Payload:
    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/truestep-torchtitan-pwned",))


def test_planted_metadata_payload_is_refused(tmp_path: Path) -> None:
    dcp_dir = _save_torchtitan(tmp_path / "step-1", _torchtitan_weights(_cfg()), False, torch.float32)
    (dcp_dir / ".metadata").write_bytes(pickle.dumps(_Payload()))
    marker = Path("/tmp/truestep-torchtitan-pwned")
    marker.unlink(missing_ok=True)
    rc, err = _import(dcp_dir, tmp_path / "ckpt")
    assert rc == 3 and "refused" in err
    assert not marker.exists()
