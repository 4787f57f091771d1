"""Memory you can see and lower: activation checkpointing, the estimate before the first step and its
refusal, peak memory in the logs, and bf16 mixed precision on CPU.

In-process and fast: the activation term of the estimate is checked against the bytes autograd really
keeps for the backward (every mode, fp32 and bf16), recomputation against the plain backward bit for
bit, and a stop-and-resume with checkpointing on against the plain reference run. The multi-process
FSDP check (mixed precision and checkpointing on, resumed bit for bit) is tests/test_memory_fsdp.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness import INPROCESS_JOB, events, loss_bits_by_step, metrics, run_in_process
from truestep.config.load import load_config
from truestep.config.schema import JobConfig, ModelConfig
from truestep.core.errors import ExitCode
from truestep.model.llama import Transformer
from truestep.model.recompute import recomputed_blocks, set_activation_checkpointing
from truestep.parallel import memory
from truestep.parallel.memory import activation_bytes_per_token, estimate

SHAPE = ModelConfig(
    dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=32, max_seq_len=64
)
BATCH, SEQ = 2, 32


def _model(mode: str, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> Transformer:
    shape = ModelConfig(**{**SHAPE.__dict__, "dropout": dropout})
    model = Transformer(shape)
    model.init_weights(0)
    set_activation_checkpointing(model, mode)
    return model.to(dtype)


def _saved_bytes(model: Transformer) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of one micro-batch's loss (the
    parameters and RoPE tables excluded: they exist anyway)."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(0, SHAPE.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    return sum(kept.values())


@pytest.mark.parametrize("mode", ["none", "full", "selective"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_activation_term_is_what_autograd_keeps(mode: str, dtype: torch.dtype) -> None:
    cfg = JobConfig(model=SHAPE)
    full, recomputing, outside = activation_bytes_per_token(cfg, 1, 4 if dtype == torch.float32 else 2)
    n = len(recomputed_blocks(mode, SHAPE.n_layers))
    predicted = BATCH * SEQ * ((SHAPE.n_layers - n) * full + n * recomputing + outside)
    measured = _saved_bytes(_model(mode, dtype))
    assert abs(predicted - measured) <= 0.01 * measured, (mode, dtype, predicted, measured)


def test_checkpointing_lowers_what_is_kept_and_dropout_masks_count() -> None:
    kept = {mode: _saved_bytes(_model(mode)) for mode in ("none", "selective", "full")}
    assert kept["full"] < kept["selective"] < kept["none"], kept
    assert kept["none"] > 4 * kept["full"], kept  # the blocks dominate a 4-block model's activations
    cfg = JobConfig(model=ModelConfig(**{**SHAPE.__dict__, "dropout": 0.1}))
    full, _, outside = activation_bytes_per_token(cfg, 1, 4)
    predicted = BATCH * SEQ * (SHAPE.n_layers * full + outside)
    measured = _saved_bytes(_model("none", dropout=0.1))
    assert abs(predicted - measured) <= 0.01 * measured, (predicted, measured)


def test_selective_recomputes_every_other_block() -> None:
    assert recomputed_blocks("selective", 5) == [0, 2, 4]
    assert recomputed_blocks("full", 3) == [0, 1, 2] and recomputed_blocks("none", 3) == []
    model = _model("selective")
    assert [block.recompute for block in model.layers.values()] == [True, False, True, False]


def _grads(mode: str, dropout: float) -> list[torch.Tensor]:
    model = _model(mode, dropout=dropout)
    model.train()
    torch.manual_seed(3)  # dropout draws from the global stream: recomputation must replay it
    tokens = torch.randint(0, SHAPE.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recomputation_gives_the_same_gradients_bit_for_bit(mode: str) -> None:
    for dropout in (0.0, 0.2):
        plain, recomputed = _grads("none", dropout), _grads(mode, dropout)
        assert all(torch.equal(a, b) for a, b in zip(plain, recomputed, strict=True)), (mode, dropout)


def test_a_run_with_checkpointing_resumes_onto_the_plain_reference_bit_for_bit(
    inprocess_reference: Path, tmp_path: Path
) -> None:
    """Full checkpointing, stopped at step 4 and resumed with selective checkpointing: every loss bit
    and the final parameters equal those of the plain run (harness.INPROCESS_JOB)."""
    full = "--train.activation_checkpointing=full"
    assert run_in_process(tmp_path, *INPROCESS_JOB, full, "--train.stop_at_step=4") == 0
    assert run_in_process(tmp_path, *INPROCESS_JOB, "--train.activation_checkpointing=selective") == 0
    assert events(tmp_path, "checkpoint_restore")[-1]["step"] == 4
    assert loss_bits_by_step(tmp_path) == loss_bits_by_step(inprocess_reference)
    assert (
        events(tmp_path, "run_end")[-1]["param_digest"]
        == events(inprocess_reference, "run_end")[-1]["param_digest"]
    )
    estimates = events(tmp_path, "memory_estimate")
    assert [e["activation_checkpointing"] for e in estimates] == ["full", "selective"]
    assert estimates[0]["activations_bytes"] < estimates[1]["activations_bytes"]


def test_peak_memory_is_in_every_step_line_and_at_the_end(inprocess_reference: Path) -> None:
    lines = metrics(inprocess_reference)
    peaks = [m["peak_mem_bytes"] for m in lines]
    assert all(isinstance(p, int) and p > 50 * 2**20 for p in peaks), peaks  # torch alone is more
    assert peaks == sorted(peaks), "a high-water mark never goes down"
    end = events(inprocess_reference, "run_end")[-1]
    assert len(end["peak_mem_bytes_per_rank"]) == 1 and end["peak_mem_bytes_per_rank"][0] >= peaks[-1]
    est = events(inprocess_reference, "memory_estimate")[0]
    assert est["fits"] and est["peak_bytes"] == est["runtime_bytes"] + est["parameters_bytes"] + est[
        "optimizer_state_bytes"
    ] + max(est["activations_bytes"], est["gradients_bytes"] + est["optimizer_temporaries_bytes"])


def test_a_job_that_does_not_fit_is_refused_before_the_model_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The host's available memory is the one thing faked: 1 MiB, which no run fits."""
    monkeypatch.setattr("truestep.train.memory_check.available_bytes", lambda device: 2**20)
    built: list[int] = []
    monkeypatch.setattr("truestep.train.trainer.build_model", lambda *a: built.append(1))
    assert run_in_process(tmp_path / "refused", "--train.max_steps=2") == ExitCode.USAGE
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "not enough memory" in line]
    assert len(lines) == 1 and "train.activation_checkpointing=full" in lines[0], err
    assert "Traceback" not in err and not built
    refused = events(tmp_path / "refused", "memory_estimate")
    assert refused and refused[0]["fits"] is False and refused[0]["available_bytes"] == 2**20
    monkeypatch.undo()
    monkeypatch.setattr("truestep.train.memory_check.available_bytes", lambda device: 2**20)
    assert run_in_process(tmp_path / "anyway", "--train.max_steps=2", "--train.memory_check=false") == 0
    assert events(tmp_path / "anyway", "memory_estimate")[0]["enforced"] is False


def test_the_estimate_follows_the_layout_and_the_options() -> None:
    cfg = load_config("tiny", ["--model.dim=512", "--model.n_layers=8", "--data.seq_len=256"])
    one = estimate(cfg, 1, 1, "cpu", runtime=0)
    sharded = estimate(cfg, 4, 1, "cpu", runtime=0)
    assert sharded.optimizer_state * 4 == pytest.approx(one.optimizer_state, rel=0.01)
    assert estimate(cfg, 1, 2, "cpu", runtime=0).optimizer_state < one.optimizer_state
    cfg.train.activation_checkpointing = "full"
    assert estimate(cfg, 1, 1, "cpu", runtime=0).activations < one.activations / 2
    cfg.train.activation_checkpointing = "none"
    cfg.parallel.mixed_precision_cpu = True
    bf16, fp32 = (
        estimate(cfg, 2, 1, "cpu", runtime=0),
        estimate(JobConfig(model=cfg.model, data=cfg.data), 2, 1, "cpu", runtime=0),
    )
    assert bf16.activations < fp32.activations


def test_peak_and_available_read_the_process_and_the_host() -> None:
    cpu = torch.device("cpu")
    assert memory.peak_bytes(cpu) >= memory.resident_bytes() > 0
    available = memory.available_bytes(cpu)
    assert available is not None and available > 0


def test_mixed_precision_on_cpu_needs_fsdp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_in_process(tmp_path, "--parallel.mixed_precision_cpu=true") == ExitCode.USAGE
    assert "needs FSDP (dp > 1" in capsys.readouterr().err
    with pytest.raises(Exception, match="needs parallel.mixed_precision=true"):
        load_config("tiny", ["--parallel.mixed_precision=false", "--parallel.mixed_precision_cpu=true"])


_FRAGMENT = """
import sys, torch
from truestep.parallel.memory import resident_bytes, return_freed_memory
if sys.argv[1] == "on":
    assert return_freed_memory()
torch.empty(8 << 20, dtype=torch.uint8)  # one big free: glibc raises its mmap threshold to 8 MiB
kept = [torch.ones(2 << 20, dtype=torch.uint8) for _ in range(100)]  # 200 MiB of 2 MiB tensors
before = resident_bytes()
del kept[::2]  # free every other one: holes in a heap, whole mappings otherwise
print(before - resident_bytes())
"""


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
@pytest.mark.parametrize("switch", ["on", "off"])
def test_freed_activations_go_back_to_the_os_only_with_the_fixed_threshold(switch: str) -> None:
    """parallel.cpu_return_freed_memory: 100 MiB freed in 2 MiB pieces between live ones is returned to
    the OS with the threshold fixed, and kept as heap fragments with glibc's default (a fresh process
    each: the setting is process-wide)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _FRAGMENT, switch], capture_output=True, text=True, check=True, timeout=120
    )
    released = int(out.stdout.split()[-1])
    if switch == "on":
        assert released > 90 * 2**20, released
    else:
        assert released < 10 * 2**20, released
