"""Timing of GPU calls for the bench scripts: the median of repeated calls, each between two CUDA
events, or the mean of a run of calls between one pair (after one warm-up call)."""

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


def mean_ms(fn, reps: int = 20, warm: bool = True) -> float:
    """fn()'s time on the GPU in ms: `reps` calls back to back between two events, averaged (as the
    cuBLASLt tuner times an algorithm); `warm`: one untimed call first."""
    import cupy as cp

    if warm:
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / reps
