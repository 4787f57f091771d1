"""An ordered parallel map with a bounded window: results come back in input order, whatever N is.

At most `window` items are in flight, so memory stays bounded however long the input is. Workers are
spawned (not forked: the parent may hold tokenizer thread pools or torch), and a worker that dies makes
the map fail loudly (BrokenProcessPool) instead of hanging. Workers die with the process that started
them (core/parent_death.py): a SIGKILLed `prepare-data` leaves none behind, blocked on its queue.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, TypeVar

from truestep.core.parent_death import die_with_parent

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(
    func: Callable[[T], R],
    items: Iterable[T],
    workers: int,
    initializer: Callable[..., None],
    initargs: tuple[Any, ...],
) -> Iterator[R]:
    """`func(item)` for every item, in order, computed by `workers` processes (1: in this process)."""
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
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(func, item))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _worker_start(parent: int, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
    """A worker's first act: die with the process that started the pool (if that one is gone already,
    exit now: nobody will ever read this worker's results), then the pool's own initializer."""
    if not die_with_parent(parent):
        print(f"truestep: worker {os.getpid()}: its parent {parent} is gone; exiting", file=sys.stderr)
        os._exit(1)
    initializer(*initargs)
