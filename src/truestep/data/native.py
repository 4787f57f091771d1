"""Calls into the `tokenizers` Rust library, with its panics made ordinary refusals.

A Rust panic inside `tokenizers` (e.g. a tokenizer.json whose regex exceeds the regex engine's retry
limit on some text) reaches Python as pyo3's `PanicException`, a `BaseException`: `except Exception`
misses it, it ends the program with a traceback, and from a worker process it cannot even be pickled
back. Inside `native_calls` it becomes a `DataError` (one line, picklable), and the panic hook's own
lines, which Rust writes straight to file descriptor 2, are held back: replayed when nothing panicked,
dropped when the refusal says it in one line.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from truestep.data.errors import DataError


def is_native_panic(err: BaseException) -> bool:
    """pyo3's PanicException (module `pyo3_runtime`, created at run time, so not importable by name)."""
    return type(err).__name__ == "PanicException"


@contextmanager
def native_calls(what: str) -> Iterator[None]:
    """Run tokenizer calls; a panic is a DataError naming `what` and the panic's first line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        panicked = False
        try:
            yield
        except BaseException as err:
            if not is_native_panic(err):
                raise
            panicked = True
            reason = (str(err).strip().splitlines() or ["no message"])[0]
            raise DataError(
                f"{what}: the tokenizer failed inside its native code (Rust panic: {reason})"
            ) from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not panicked:  # whatever the library printed while it worked still reaches stderr
                held.seek(0)
                data = held.read()
                if data:
                    os.write(2, data)
