"""How much memory one rank will need, estimated before anything is allocated, and how much it used.

The estimate (`estimate`) is arithmetic on the config and the layout, term by term, for the rank's peak:

- **parameters**: this rank's shards in fp32 (linear and embedding weights split by tp, everything
  split by dp); under FSDP (dp > 1) also the gathered copies in the compute dtype: the root's embedding
  and output projection (kept gathered through forward and backward) and two blocks (the one computing
  and the one prefetched);
- **gradients**: as many fp32 elements as the shards; under FSDP also one gathered block's and the
  root's unsharded gradients before their reduce-scatter;
- **optimizer state**: AdamW's two fp32 moments per shard element;
- **activations**: what autograd keeps for the backward of one micro-batch, derived tensor by tensor
  from the model's forward (tests/test_memory.py checks each mode against the bytes autograd actually
  saves): per block and token `2 x norm + attention + SwiGLU`, the blocks that recompute
  (`train.activation_checkpointing`) keeping only their input, plus the one block recomputed during
  the backward; plus the logits, which stay alive through the backward with two gradients of their size;
- **optimizer temporaries**: the foreach AdamW update allocates one shard-sized fp32 tensor (with
  `optim.foreach=false`, one parameter's);
- **runtime**: what the process already holds when the estimate is made (torch, its libraries, the
  interpreter: the resident set measured then; 0 on CUDA, where only tensors count).

The peak is runtime + parameters + optimizer state + the larger of the two moments a step has: the
backward's start (activations, the gathered copies, the gradients of accumulated micro-batches) and the
optimizer update (gradients and the temporaries). benchmarks/memory.py compares it with measured peaks.
"""

from __future__ import annotations

import ctypes
import resource
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from truestep.config.schema import JobConfig, ModelConfig
from truestep.model.llama import ffn_hidden_dim
from truestep.model.recompute import recomputed_blocks
from truestep.model.rope import head_dim
from truestep.parallel.parallelize import uses_mixed_precision

GIB = 1 << 30


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one rank needs at its peak, by term (see the module docstring)."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    optimizer_temporaries: int
    runtime: int
    peak: int
    ranks_per_host: int
    device: str

    def line(self) -> str:
        """One console line: the peak and its terms, in GiB."""
        terms = (
            f"parameters {gib(self.parameters)}, gradients {gib(self.gradients)}, optimizer state "
            f"{gib(self.optimizer_state)}, activations {gib(self.activations)}, runtime {gib(self.runtime)}"
        )
        return f"memory estimate: {gib(self.peak)} per rank ({terms})"

    def as_fields(self) -> dict[str, int | str]:
        return {
            f"{k}_bytes" if isinstance(v, int) and k != "ranks_per_host" else k: v
            for k, v in asdict(self).items()
        }


def gib(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


def _parameter_split(m: ModelConfig) -> tuple[int, int, int, int]:
    """(elements split by tp, elements never split by tp, one block's elements, the root's elements)."""
    hd, kv = head_dim(m), (m.n_kv_heads or m.n_heads)
    hidden = ffn_hidden_dim(m)
    block_linear = m.dim * hd * (2 * m.n_heads + 2 * kv) + 3 * m.dim * hidden
    embed = m.vocab_size * m.dim * (1 if m.tie_embeddings else 2)
    norms = (2 * m.n_layers + 1) * m.dim
    return m.n_layers * block_linear + embed, norms, block_linear + 2 * m.dim, embed + m.dim


def _largest_parameter(m: ModelConfig) -> int:
    hd, kv = head_dim(m), (m.n_kv_heads or m.n_heads)
    return max(m.vocab_size * m.dim, m.dim * hd * m.n_heads, m.dim * hd * kv, m.dim * ffn_hidden_dim(m))


def activation_bytes_per_token(cfg: JobConfig, tp: int, act_bytes: int) -> tuple[int, int, int]:
    """(saved by one block that keeps everything, saved by one block that recomputes, saved outside the
    blocks), in bytes per token of one rank. The norm computes in fp32 whatever the dtype, so it keeps
    an fp32 copy of its input; the attention keeps q, k, v (after RoPE), its output and one fp32
    log-sum-exp per head; the SwiGLU keeps w1's and w3's outputs, the SiLU and the product."""
    m = cfg.model
    hd, kv = head_dim(m), (m.n_kv_heads or m.n_heads)
    heads, kv_heads, hidden = m.n_heads // tp, kv // tp, ffn_hidden_dim(m) // tp
    norm = 4 * m.dim + 4 + 2 * act_bytes * m.dim  # fp32 input copy, rsqrt, normalized, times the gain
    attention = act_bytes * (2 * heads * hd + 2 * kv_heads * hd) + 4 * heads
    ffn = 4 * act_bytes * hidden
    dropout = 2 * act_bytes * m.dim if m.dropout > 0 else 0  # the two residual dropout masks (input dtype)
    full = 2 * norm + attention + ffn + dropout
    # Outside the blocks: the token ids, the final norm, log-softmax (fp32) and the targets.
    outside = 8 + norm + 4 * m.vocab_size + 8
    return full, act_bytes * m.dim, outside


def estimate(
    cfg: JobConfig, dp: int, tp: int, device: str, ranks_per_host: int = 1, runtime: int | None = None
) -> MemoryEstimate:
    """The peak bytes of one rank of this job at layout (dp, tp) on `device` ("cpu" or "cuda")."""
    m, t = cfg.model, cfg.train
    fsdp = dp > 1
    mixed = fsdp and uses_mixed_precision(cfg, device)
    act_bytes = 2 if mixed else 4
    split, unsplit, block, root = _parameter_split(m)
    shard = split // (tp * dp) + unsplit // dp
    params = 4 * shard
    gathered = act_bytes * (root // tp + 2 * block // tp) if fsdp else 0
    grads = 4 * shard
    grads_gathered = 4 * (root // tp + block // tp) if fsdp else 0
    optim = 2 * 4 * shard
    # foreach AdamW: one temporary as large as the shards; per parameter: as large as the largest one.
    temporaries = 4 * shard if cfg.optim.foreach else 4 * _largest_parameter(m) // (tp * dp)

    tokens = t.micro_batch(dp) * cfg.data.seq_len
    full, recomputing, outside = activation_bytes_per_token(cfg, tp, act_bytes)
    n_recompute = len(recomputed_blocks(t.activation_checkpointing, m.n_layers))
    saved = (m.n_layers - n_recompute) * full + n_recompute * recomputing + outside
    # The logits (fp32) stay alive through the backward, next to the gradients of log-softmax and of
    # the logits; a recomputing block rebuilds its intermediates during its own backward.
    transient = 3 * 4 * m.vocab_size + (full if n_recompute else 0)
    activations = tokens * (saved + transient)
    accumulating = t.micro_batch(dp) * dp < t.global_batch_size  # earlier micro-batches' gradients live on
    backward = activations + gathered + grads_gathered + (grads if accumulating else 0)
    update = grads + temporaries
    base = (resident_bytes() if device == "cpu" else 0) if runtime is None else runtime
    peak = base + params + optim + max(backward, update)
    return MemoryEstimate(
        parameters=params + gathered,
        gradients=grads + grads_gathered,
        optimizer_state=optim,
        activations=activations,
        optimizer_temporaries=temporaries,
        runtime=base,
        peak=peak,
        ranks_per_host=ranks_per_host,
        device=device,
    )


# --- the CPU allocator ----------------------------------------------------------------------------------

M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter (malloc.h)."""
MMAP_THRESHOLD = 128 * 1024
"""Allocations from this size on get their own mapping (glibc's initial threshold, kept fixed)."""


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold at 128 KiB (parallel.cpu_return_freed_memory), so every tensor-sized
    allocation is its own mapping and goes back to the OS when freed. glibc otherwise raises the
    threshold after each freed mapping (up to 32 MiB), serves activations from its heap, and keeps
    what they leave as fragments: the resident set grew step after step, 20 % above the live tensors
    at step 3 (benchmarks/README.md, "Memory"). True when applied (glibc); False elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


# --- what the machine has, and what this process used --------------------------------------------------


def _status_kib(field: str, path: str = "/proc/self/status") -> int | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_bytes() -> int:
    """This process's resident set now (VmRSS); 0 where /proc is not there."""
    kib = _status_kib("VmRSS")
    return 1024 * kib if kib is not None else 0


def available_bytes(device: torch.device) -> int | None:
    """What this host (CPU: MemAvailable) or this rank's GPU (free memory) can still give; None: unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    kib = _status_kib("MemAvailable", "/proc/meminfo")
    return 1024 * kib if kib is not None else None


def peak_bytes(device: torch.device) -> int:
    """This rank's peak so far: the most memory CUDA's allocator held for tensors, or on CPU the
    process's high-water resident set (VmHWM; ru_maxrss where /proc is not there)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    kib = _status_kib("VmHWM")
    if kib is None:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kib = rss // 1024 if sys.platform == "darwin" else rss  # bytes on macOS, KiB on Linux
    return 1024 * kib
