"""An ordered parallel map with a bounded window: results come back in input order, whatever N is.

At most `window` items are in flight, so memory stays bounded however long the input is. Workers are
spawned (not forked: the parent may hold tokenizer thread pools or torch), and a worker that dies (a
native abort, an out-of-memory kill) makes the map fail loudly instead of hanging: one line naming the
item it was working on (DataError, exit 3), not a BrokenProcessPool traceback. Workers die with the
process that started them (core/parent_death.py): a SIGKILLed `prepare-data` leaves none behind.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from truestep.core.parent_death import die_with_parent
from truestep.data.errors import DataError

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(
    func: Callable[[T], R],
    items: Iterable[T],
    workers: int,
    initializer: Callable[..., None],
    initargs: tuple[Any, ...],
    describe: Callable[[T], str] = str,
) -> Iterator[R]:
    """`func(item)` for every item, in order, computed by `workers` processes (1: in this process).
    DataError naming `describe(item)` when a worker died on it."""
    if workers <= 1:
        initializer(*initargs, in_subprocess=False)
        for item in items:
            yield func(item)
        return
    window = 2 * workers + 2  # enough to keep every worker busy while the consumer writes
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        workers, mp_context=context, initializer=_worker_start, initargs=(os.getpid(), initializer, initargs)
    )
    pending: deque[tuple[Future[R], T]] = deque()

    def result() -> R:
        future, item = pending.popleft()
        try:
            return future.result()
        except BrokenProcessPool:
            raise DataError(
                f"{describe(item)}: a worker process died (a native abort, or killed: out of memory?) "
                "while working on it"
            ) from None

    try:
        for item in items:
            pending.append((pool.submit(func, item), item))
            if len(pending) >= window:
                yield result()
        while pending:
            yield result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _worker_start(parent: int, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
    """A worker's first act: die with the process that started the pool (if that one is gone already,
    exit now: nobody will ever read this worker's results), then the pool's own initializer."""
    if not die_with_parent(parent):
        print(f"truestep: worker {os.getpid()}: its parent {parent} is gone; exiting", file=sys.stderr)
        os._exit(1)
    initializer(*initargs)
