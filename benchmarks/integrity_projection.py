"""A projection, not a measurement: what integrity costs at 8B, 70B and 405B parameters under the old
protocol (rank 0 re-reads and hashes every file at the commit and again before every resume) and the new
one (each rank hashes the bytes it writes while writing them and the bytes it loads while loading them),
from per-byte rates measured by `integrity_scale.py` / `checkpoint_cost.py` on the machine at hand.

Assumptions, all stated in the table's caption: a checkpoint holds fp32 weights and two fp32 AdamW
moments (12 bytes per parameter); the ranks hold equal shares; one SHA-256 stream per process at the
measured single-core rate; rank 0 reads at the measured cold-read rate; the manifest grows like DCP's
`.metadata`, one entry per storage item (each rank writes one item per state tensor).

    python benchmarks/integrity_projection.py --sha-gbps 1.75 --read-gbps 1.2 [--item-bytes 120]
"""

from __future__ import annotations

import argparse

MODELS = (
    # name, parameters, layers, GPUs (a typical world for the size)
    ("Llama 3.1 8B", 8.0e9, 32, 64),
    ("Llama 3.1 70B", 70.6e9, 80, 512),
    ("Llama 3.1 405B", 405.9e9, 126, 16384),
)
BYTES_PER_PARAM = 12  # fp32 weights + AdamW exp_avg + exp_avg_sq
TENSORS_PER_LAYER = 9  # wq wk wv wo w1 w2 w3 + two norms


def fmt_s(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds:,.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sha-gbps", type=float, required=True, help="measured SHA-256 GB/s on one core")
    parser.add_argument("--read-gbps", type=float, required=True, help="measured cold sequential read GB/s")
    parser.add_argument("--item-bytes", type=float, default=120.0, help="manifest bytes per storage item")
    args = parser.parse_args()
    old_rate = min(args.sha_gbps, args.read_gbps) * 1e9  # rank 0 reads and hashes: the slower of the two
    print(
        "| model | checkpoint | GPUs | per rank | old: commit on rank 0 | old: verify before resume | "
        "new: hashing per rank (in the write/read stream) | new: manifest entries (size) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, params, layers, world in MODELS:
        total = params * BYTES_PER_PARAM
        per_rank = total / world
        items = world * (layers * TENSORS_PER_LAYER + 3) * 3  # every rank: a shard of each state tensor
        print(
            f"| {name} | {total / 1e12:.2f} TB | {world:,} | {per_rank / 1e9:.2f} GB | "
            f"{fmt_s(total / old_rate)} | {fmt_s(total / old_rate)} | "
            f"{fmt_s(per_rank / (args.sha_gbps * 1e9))} | {items / 1e6:.2f} M ({items * args.item_bytes / 1e9:.2f} GB) |"
        )


if __name__ == "__main__":
    main()
