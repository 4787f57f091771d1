"""A projection, not a measurement: the cold restart of issue 37 (a resume through the disk) at 8B, 70B and
405B parameters, from per-rank rates measured by `cold_restart.py` / `integrity_scale.py` on the machine
at hand, beside the Llama 3 paper's setting (MTTR 217-235 s = detect 30 + teardown 10 + relaunch 50 +
start-up 100 + restore 27-45 s: 177-195 s of relaunch, start-up and restore).

Per rank, every phase of the cold path is O(this rank's shard) or constant: process start and import
(constant), the resume's Trainer build (allocation only: flat in the model size at a fixed shard size),
rank 0's structural verify (O(files) = O(ranks): `--verify-ms-per-file`), the load (this rank's bytes at
the measured per-rank rate: read, hash, deserialize, copy). The fresh start's init is O(shard) too
(blockwise); the old "full" init drew every parameter on every rank at every build, resumes included.

Assumptions, stated in the caption: 12 bytes per parameter (fp32 weights + two AdamW moments), equal
shares per rank, one process per GPU reading at the rate measured here for one process (a parallel file
system's aggregate bandwidth, divided by the ranks reading at once, bounds it at scale: --fs-gbps),
three files per rank (shard, rank state, manifest shard).

    python benchmarks/cold_projection.py --process-s 0.5 --import-s 2.0 --build-s 0.3 --load-gbps 0.8 \\
        --init-mvals 80 [--verify-ms-per-file 0.01] [--fs-gbps 1000]
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
FILES_PER_RANK = 3
PAPER = "177-195 s (of MTTR 217-235 s)"


def fmt_s(seconds: float) -> str:
    return f"{seconds / 60:,.1f} min" if seconds >= 120 else f"{seconds:,.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--process-s", type=float, required=True, help="measured: spawn to truestep imported")
    parser.add_argument("--import-s", type=float, required=True, help="measured: torch and truestep imports")
    parser.add_argument("--build-s", type=float, required=True, help="measured: a resume's Trainer build")
    parser.add_argument(
        "--load-gbps", type=float, required=True, help="measured: one rank's verified load GB/s"
    )
    parser.add_argument("--init-mvals", type=float, required=True, help="measured: init M values/s per rank")
    parser.add_argument("--verify-ms-per-file", type=float, default=0.01)
    parser.add_argument(
        "--fs-gbps", type=float, default=0.0, help="aggregate file-system GB/s (0: unbounded)"
    )
    args = parser.parse_args()
    print(
        "| model | GPUs | per rank | fresh init, full (old, every build) | fresh init, blockwise | "
        "resume: process + import + build | verify (rank 0) | load | cold resume, projected | paper |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, params, world in MODELS:
        per_rank = params * BYTES_PER_PARAM / world
        rate = args.load_gbps * 1e9
        if args.fs_gbps:
            rate = min(rate, args.fs_gbps * 1e9 / world)
        load_s = per_rank / rate
        verify_s = world * FILES_PER_RANK * args.verify_ms_per_file / 1e3
        fixed = args.process_s + args.import_s + args.build_s
        total = fixed + verify_s + load_s
        print(
            f"| {name} | {world:,} | {per_rank / 1e9:.2f} GB | {fmt_s(params / (args.init_mvals * 1e6))} | "
            f"{fmt_s(params / world / (args.init_mvals * 1e6))} | {fmt_s(fixed)} | {fmt_s(verify_s)} | "
            f"{fmt_s(load_s)} | {fmt_s(total)} | {PAPER} |"
        )


if __name__ == "__main__":
    main()
