"""Orchestration of measurement runs (reference, floor, faulted, ablation) through the supervisor."""
