"""The report's view of a run as a training job: memory per rank (estimated before the first step,
measured at the end) and the held-out evaluations."""

from __future__ import annotations

from truestep.analysis.report.blocks import Block, Heading, Para, Table, kv_table
from truestep.analysis.summary import RunAnalysis

GIB = 2**30
SHOWN_EVALS = 8
"""The last evaluations shown (every one is in events.jsonl)."""


def training_blocks(run: RunAnalysis) -> list[Block]:
    blocks: list[Block] = []
    if run.peak_mem_bytes_per_rank or run.memory_estimate_bytes is not None:
        rows = []
        if run.memory_estimate_bytes is not None:
            rows.append(
                (
                    "estimated peak per rank (before the first step)",
                    f"{run.memory_estimate_bytes / GIB:.2f} GiB",
                )
            )
        for rank, peak in enumerate(run.peak_mem_bytes_per_rank):
            rows.append((f"measured peak, rank {rank}", f"{peak / GIB:.2f} GiB"))
        blocks += [Heading(4, "Memory"), kv_table(rows)]
    if run.evals:
        shown = run.evals[-SHOWN_EVALS:]
        blocks += [
            Heading(4, "Held-out evaluation"),
            Para(f"{len(run.evals)} evaluation(s); the last {len(shown)} shown."),
            Table(
                ["step", "loss", "perplexity"],
                [[str(s), f"{loss:.4f}", f"{ppl:.2f}"] for s, loss, ppl in shown],
            ),
        ]
    return blocks
