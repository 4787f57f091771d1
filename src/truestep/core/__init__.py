"""The vocabulary every room shares: run-directory names and environment variables (`names`), exit
codes and the error types that carry them (`errors`), what a rank is doing and why a run stopped
(`status`), and durable, symlink-refusing file I/O (`fsio`).

This package imports nothing from truestep and nothing heavier than the standard library, so the
supervisor and a rank's first seconds (before torch is imported) can use it.
"""
