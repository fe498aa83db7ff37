"""Order-preserving parallel map over an iterator, with bounded memory and no hangs.

`concurrent.futures` rather than `multiprocessing.Pool`: a worker that dies raises
BrokenProcessPool instead of being respawned forever, and only a few batches are in flight at
once, so a stage's memory stays bounded however long its input is.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, Iterator


def ordered_map(
    fn: Callable,
    items: Iterable,
    workers: int = 1,
    initializer: Callable | None = None,
    initargs: tuple = (),
    in_flight: int | None = None,
) -> Iterator:
    """Yield fn(item) for each item, in order, computed in `workers` processes (in this process
    when workers <= 1)."""
    if workers <= 1:
        if initializer:
            initializer(*initargs)
        yield from map(fn, items)
        return
    in_flight = in_flight or 2 * workers
    ctx = multiprocessing.get_context("spawn")  # fork + pyarrow's threads can deadlock
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=initializer, initargs=initargs) as ex:
        pending: deque = deque()
        for item in items:
            pending.append(ex.submit(fn, item))
            if len(pending) >= in_flight:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
