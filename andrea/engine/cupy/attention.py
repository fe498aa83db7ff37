"""Causal self-attention (q, k, v → y, and its backward): one implementation per path.

- fp32: the CUDA-core flash kernels of kernels/attention.cu (any head size), on the
  [3, B, H, T, D] q/k/v buffer; y and dy [B, T, H·D].
- bf16/fp16: the tensor-core flash kernels of kernels/attention_mma.cu (cp.async double-buffered
  tiles, mma.sync), on one [B, T, 3, H, D] 16-bit buffer written by the q/k/v projection; y and dy
  [B, T, H·D] 16-bit; dq, dk, dv written into a buffer shaped like qkv.
Both save the log-sum-exp of each score row (lse [B, H, T], fp32) and recompute the probabilities
in the backward pass; no T × T matrix exists. Every sum runs in a fixed order: deterministic.
"""

from __future__ import annotations

import math

import cupy as cp
import numpy as np

from andrea.engine.cupy.kernels import blocks
from andrea.engine.cupy.weights import is_16bit

ROWS = 64  # kernels/attention.cu: query (or key) rows per block of 64 threads, one row each
TILE = 64  # kernels/attention_mma.cu: query (or key) rows per block of 4 warps in the backward kernels
FWD_WARPS = 4  # kernels/attention_mma.cu: the forward's warps per block (16 query rows each)


def qkv_heads(qkv):
    """q, k, v of a 16-bit [B, T, 3, H, D] buffer as [B, H, T, D] views."""
    return tuple(qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))


def attn_fwd(be, qkv, y, lse) -> None:
    """y = causal softmax(q·kᵀ/√D)·v per head; lse saved. `be`: the CupyBackend whose kernels and
    scratch buffers run it."""
    if is_16bit(qkv):
        B, T, H, D, (q, k, v), strides = _mma_args(qkv)
        rows = 16 * FWD_WARPS
        grid = ((T + rows - 1) // rows, B * H)
        be.kernel("attention_mma", "flash_fwd", D)(grid, (32 * FWD_WARPS,), (q, k, v, y, lse, np.int32(H), np.int32(T), *strides,
                                                                  np.float32(1.0 / math.sqrt(D))))
        return
    _, B, H, T, D = qkv.shape
    q, k, v = qkv[0], qkv[1], qkv[2]
    be.kernel("attention", "attn_fwd", D)(((T + ROWS - 1) // ROWS, B * H), (ROWS,),
                                          (q, k, v, y, lse, np.int32(H), np.int32(T), np.float32(1.0 / math.sqrt(D))))


def attn_bwd(be, dy, qkv, y, lse, dqkv) -> None:
    """dq, dk, dv into dqkv (overwritten) from dy, recomputing the probabilities from lse."""
    if is_16bit(qkv):
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
        return
    _, B, H, T, D = qkv.shape
    q, k, v = qkv[0], qkv[1], qkv[2]
    scale = np.float32(1.0 / math.sqrt(D))
    delta = be.scratch("attn_delta", (B, H, T), cp.float32)
    be.kernel("attention", "attn_delta", D)((blocks(B * H * T),), (256,), (dy, y, delta, np.int32(B), np.int32(H), np.int32(T)))
    grid = ((T + ROWS - 1) // ROWS, B * H)
    be.kernel("attention", "attn_bwd_dq", D)(grid, (ROWS,), (q, k, v, dy, lse, delta, dqkv[0], np.int32(H), np.int32(T), scale))
    be.kernel("attention", "attn_bwd_dk", D)(grid, (ROWS,), (q, k, v, dy, lse, delta, dqkv[1], np.int32(H), np.int32(T), scale))
    be.kernel("attention", "attn_bwd_dv", D)(grid, (ROWS,), (q, k, dy, lse, delta, dqkv[2], np.int32(H), np.int32(T), scale))


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
