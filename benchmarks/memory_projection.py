"""A projection, not a measurement: recovery from peers' memory vs from disk at 8B, 70B and 405B.

Per rank the state is its equal share of fp32 weights and two fp32 AdamW moments (12 bytes per
parameter). A snapshot's capture copies the shard to host memory at `--host-gbps` (device -> host) and
hashes it with SHA-256 at `--sha-gbps` (one core) as it writes, the two in turn, as truestep does; the
optimizer waits for it unless forward and backward hide it. Its replica crosses the network at
`--net-gbps` to a buddy on another node, in the background. A memory restore is bounded by the replaced
rank: the replica's transfer, then its SHA-256 check, then the load back to the device. A disk restore
reads every shard at `--read-gbps-rank` per rank, `--read-gbps-total` for the whole job, whichever binds,
hashing beside the reads (the slower of the two). Every other phase of a recovery is the paper's
(detect 30 + teardown 10 + relaunch 50 + start-up 100 = 190 s; its restore took 27-45 s, 217-235 s in
all): truestep restarts every rank, so the memory path saves the restore and the lost work, not the
restart.

    python benchmarks/memory_projection.py [--host-gbps 25] [--net-gbps 25] [--sha-gbps 1.8]
"""

from __future__ import annotations

import argparse

MODELS = (
    # name, parameters, GPUs (a typical world for the size; as integrity_projection.py)
    ("Llama 3.1 8B", 8.0e9, 64),
    ("Llama 3.1 70B", 70.6e9, 512),
    ("Llama 3.1 405B", 405.9e9, 16384),
)
BYTES_PER_PARAM = 12
PAPER_OTHER_S = 30 + 10 + 50 + 100
"""The paper's recovery without its restore: detect, teardown, relaunch, start-up (seconds)."""
PAPER_RESTORE_S = (27, 45)


def fmt_s(seconds: float) -> str:
    return f"{seconds / 60:,.1f} min" if seconds >= 1000 else f"{seconds:,.2f} s"


def project_table(
    host_gbps: float = 25.0,
    net_gbps: float = 25.0,
    sha_gbps: float = 1.8,
    read_gbps_rank: float = 4.0,
    read_gbps_total: float = 2000.0,
) -> str:
    lines = [
        f"Assumed: host copy {host_gbps:g} GB/s per GPU, network {net_gbps:g} GB/s per GPU, SHA-256 "
        f"{sha_gbps:g} GB/s (one core), disk read {read_gbps_rank:g} GB/s per rank and {read_gbps_total:g} "
        f"GB/s in all, 12 B/param; other recovery phases the paper's {PAPER_OTHER_S} s.",
        "",
        "| model | GPUs | shard per rank | snapshot capture (copy + SHA-256) | replica transfer (network) | "
        "restore from memory | restore from disk | MTTR from memory | MTTR from disk | paper's MTTR |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, params, world in MODELS:
        total = params * BYTES_PER_PARAM
        shard = total / world
        copy = shard / (host_gbps * 1e9)
        transfer = shard / (net_gbps * 1e9)
        sha = shard / (sha_gbps * 1e9)
        memory = transfer + sha + copy
        disk = max(shard / (read_gbps_rank * 1e9), total / (read_gbps_total * 1e9), sha)
        lines.append(
            f"| {name} | {world:,} | {shard / 1e9:.2f} GB | {fmt_s(copy + sha)} | {fmt_s(transfer)} | "
            f"{fmt_s(memory)} | {fmt_s(disk)} | {fmt_s(PAPER_OTHER_S + memory)} | "
            f"{fmt_s(PAPER_OTHER_S + disk)} | {PAPER_OTHER_S + PAPER_RESTORE_S[0]}-"
            f"{PAPER_OTHER_S + PAPER_RESTORE_S[1]} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host-gbps", type=float, default=25.0)
    parser.add_argument("--net-gbps", type=float, default=25.0)
    parser.add_argument("--sha-gbps", type=float, default=1.8)
    parser.add_argument("--read-gbps-rank", type=float, default=4.0)
    parser.add_argument("--read-gbps-total", type=float, default=2000.0)
    a = parser.parse_args()
    print(project_table(a.host_gbps, a.net_gbps, a.sha_gbps, a.read_gbps_rank, a.read_gbps_total))


if __name__ == "__main__":
    main()
