"""Fidelity, same-seed floor, correct goodput and badput, MTTR, ablation summaries and the report.

Reads run directories only; never touches a live run.
"""
