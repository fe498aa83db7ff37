"""Sampling the next tokens on the GPU (kernels/sampling.cu): one block per row picks a token from
the logits (greedy, or temperature, top-k and top-p from the row's own random stream), with no host
wait, so a captured decoding step can sample and feed its own next token. `be`: the CupyBackend
whose kernels run it."""

from __future__ import annotations

import cupy as cp
import numpy as np

from andrea.engine.numpy_backend import SAMPLE_CANDIDATES

SAMPLE_THREADS = 512  # kernels/sampling.cu: threads per row (its SAMPLE_THREADS)


def sample_tokens(be, logits, seeds, draws, tokens, ring, temperature, top_k, top_p) -> None:
    """kernels/sampling.cu, one block per row: no host wait, so a captured step can sample and
    feed its own next token. `ring` (pinned host memory, device-addressable under unified
    addressing) receives each pick directly."""
    B, V = logits.shape
    greedy = temperature <= 0
    if logits.dtype != cp.float32 or logits.strides[1] != 4 or tokens.dtype != np.int32 or tokens.size != B:
        raise ValueError(f"sample_tokens: fp32 logits with unit column stride and {B} int32 tokens, got "
                         f"{logits.dtype} {logits.strides}, {tokens.dtype} {tokens.shape}")
    if not greedy and not 1 <= top_k <= SAMPLE_CANDIDATES:
        raise ValueError(f"sample_tokens: top_k {top_k} outside 1..{SAMPLE_CANDIDATES}")
    if ring is not None and (not isinstance(ring, np.ndarray) or ring.dtype != np.int32 or ring.ndim != 2
                             or ring.shape[0] != B or not ring.flags.c_contiguous):
        raise ValueError(f"sample_tokens: the ring is a contiguous int32 host_buffer of {B} rows, got {type(ring).__name__} "
                         f"{getattr(ring, 'dtype', '')} {getattr(ring, 'shape', '')}")
    for name, a, dtype in (("seeds", seeds, np.uint64), ("draws", draws, np.int32)):
        if a.dtype != dtype or a.size < B or not a.flags.c_contiguous:
            raise ValueError(f"sample_tokens: {name} is {B} contiguous {np.dtype(dtype)} on the device, got {a.dtype} {a.shape}")
    if not tokens.flags.c_contiguous:
        raise ValueError("sample_tokens: tokens must be contiguous")
    f32 = np.float32
    be.kernel("sampling", "sample_rows")((B,), (SAMPLE_THREADS,), (
        logits, np.int64(logits.strides[0] // 4), np.int32(V), seeds, draws, tokens,
        np.uint64(0 if ring is None else ring.ctypes.data), np.int32(0 if ring is None else ring.shape[1]),
        np.int32(greedy), f32(0.0 if greedy else 1.0 / temperature), np.int32(top_k if not greedy else 1),
        f32(1.0 if top_p is None else top_p)))
