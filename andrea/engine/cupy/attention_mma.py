"""Causal self-attention on the tensor cores for the bf16/fp16 modes (kernels/attention_mma.cu):
cp.async double-buffered tiles and mma.sync, on one [B, T, 3, H, D] 16-bit buffer written by the q/k/v
projection; y and dy [B, T, H·D] 16-bit; dq, dk, dv written into a buffer shaped like qkv. The log-sum-exp
of each score row is saved (lse [B, H, T], fp32) and the backward recomputes the probabilities from it;
every sum runs in a fixed order. attention.py dispatches here (its fp32 kernels: attention.cu)."""

from __future__ import annotations

import math

import cupy as cp
import numpy as np

from andrea.engine.cupy.kernels import blocks

TILE = 64  # kernels/attention_mma.cu: query (or key) rows per block of 4 warps in the backward kernels
FWD_WARPS = 4  # kernels/attention_mma.cu: the forward's warps per block (16 query rows each)


def flash_fwd(be, qkv, y, lse) -> None:
    """y = causal softmax(q·kᵀ/√D)·v per head, lse saved; qkv [B, T, 3, H, D] 16-bit."""
    B, T, H, D, (q, k, v), strides = _mma_args(qkv)
    rows = 16 * FWD_WARPS
    grid = ((T + rows - 1) // rows, B * H)
    be.kernel("attention_mma", "flash_fwd", D)(grid, (32 * FWD_WARPS,), (q, k, v, y, lse, np.int32(H), np.int32(T), *strides,
                                                              np.float32(1.0 / math.sqrt(D))))


def flash_bwd(be, dy, qkv, y, lse, dqkv) -> None:
    """dq, dk, dv into dqkv (overwritten) from dy, recomputing the probabilities from lse."""
    B, T, H, D, (q, k, v), strides = _mma_args(qkv)
    dq, dk, dv = _mma_args(dqkv)[4]
    delta = be.scratch("flash_delta", (B, H, T), cp.float32)
    rows = B * T * H
    be.kernel("attention_mma", "flash_delta", D)((blocks(rows, 8),), (256,), (dy, y, delta, np.int32(B), np.int32(H),
                                                                              np.int32(T)))
    grid = ((T + TILE - 1) // TILE, B * H)
    scale = np.float32(1.0 / math.sqrt(D))
    be.kernel("attention_mma", "flash_bwd_dq", D)(grid, (128,), (q, k, v, dy, lse, delta, dq, np.int32(H), np.int32(T),
                                                                 *strides, scale))
    be.kernel("attention_mma", "flash_bwd_dkdv", D)(grid, (128,), (q, k, v, dy, lse, delta, dk, dv, np.int32(H),
                                                                   np.int32(T), *strides, scale))


def flash_takes(D: int) -> bool:
    """The head sizes the tensor-core kernels take (_mma_args)."""
    return D % 16 == 0 and D <= 64


def _mma_args(qkv):
    """Shape, the q, k, v base pointers and the element strides (sB, sT, sH) of a [B, T, 3, H, D] buffer."""
    B, T, three, H, D = qkv.shape
    if not flash_takes(D):
        raise ValueError(f"head_dim {D}: the tensor-core attention needs a multiple of 16, at most 64")
    flat = qkv.reshape(-1)
    st = 3 * H * D
    return B, T, H, D, (flat, flat[H * D:], flat[2 * H * D:]), (np.int64(T * st), np.int64(st), np.int64(D))
