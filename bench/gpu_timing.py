"""Timing of single GPU calls for the bench scripts: the median of repeated calls, each between two
CUDA events (after one warm-up call)."""

from __future__ import annotations

import statistics


def median_ms(fn, reps: int = 20) -> float:
    """fn()'s time on the GPU in ms: the median of `reps` calls, each timed alone."""
    import cupy as cp

    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)
