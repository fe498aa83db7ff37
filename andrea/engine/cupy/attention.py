"""Causal self-attention (q, k, v → y, and its backward): one implementation per path.

- fp32: the CUDA-core flash kernels of kernels/attention.cu (any head size), on the
  [3, B, H, T, D] q/k/v buffer; y and dy [B, T, H·D].
- bf16/fp16: on one [B, T, 3, H, D] 16-bit buffer written by the q/k/v projection; y and dy
  [B, T, H·D] 16-bit; dq, dk, dv written into a buffer shaped like qkv. On Hopper (sm_90a, head sizes
  16/32/64): kernels/attention_wgmma.cu, the warp-specialized forward (attention_wgmma.py: TMA, wgmma,
  ping-pong warp groups, persistent CTAs) and the two-kernel wgmma backward (dQ, then dK/dV, cp.async
  tiles); elsewhere the tensor-core flash kernels of kernels/attention_mma.cu (attention_mma.py:
  cp.async double-buffered tiles, mma.sync). `be.attention == "mma"` (ANDREA_ATTENTION=mma) runs
  mma.sync's kernels on Hopper too.
Both save the log-sum-exp of each score row (lse [B, H, T], fp32) and recompute the probabilities
in the backward pass; no T × T matrix exists. Every sum runs in a fixed order: deterministic.
"""

from __future__ import annotations

import math

import cupy as cp
import numpy as np

from andrea.engine.cupy import attention_mma, attention_wgmma
from andrea.engine.cupy.kernels import blocks
from andrea.engine.cupy.weights import is_16bit

ROWS = 64  # kernels/attention.cu: query (or key) rows per block of 64 threads, one row each


def qkv_heads(qkv):
    """q, k, v of a 16-bit [B, T, 3, H, D] buffer as [B, H, T, D] views."""
    return tuple(qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))


def wgmma_fwd(be, qkv) -> bool:
    """Whether attn_fwd runs attention_wgmma's forward on this 16-bit buffer."""
    return getattr(be, "attention", "flash") != "mma" and attention_wgmma.fwd_takes(qkv)


def attn_fwd(be, qkv, y, lse) -> None:
    """y = causal softmax(q·kᵀ/√D)·v per head; lse saved. `be`: the CupyBackend whose kernels and
    scratch buffers run it."""
    if is_16bit(qkv):
        wgmma = wgmma_fwd(be, qkv)
        if wgmma:
            attention_wgmma.flash_fwd(be, qkv, y, lse, attention_wgmma.PRODUCTION_FWD)
        else:
            attention_mma.flash_fwd(be, qkv, y, lse)
        ran = getattr(be, "forwards_ran", None)
        if ran is not None:  # for the plan line
            ran.add("wgmma" if wgmma else "mma.sync")
        return
    _, B, H, T, D = qkv.shape
    q, k, v = qkv[0], qkv[1], qkv[2]
    be.kernel("attention", "attn_fwd", D)(((T + ROWS - 1) // ROWS, B * H), (ROWS,),
                                          (q, k, v, y, lse, np.int32(H), np.int32(T), np.float32(1.0 / math.sqrt(D))))


def wgmma_bwd(be, qkv, y, lse, dy, dqkv) -> bool:
    """Whether attn_bwd runs attention_wgmma's backward on these 16-bit buffers."""
    return getattr(be, "attention", "flash") != "mma" and attention_wgmma.bwd_takes(qkv, y, lse, dy, dqkv)


def attn_bwd(be, dy, qkv, y, lse, dqkv) -> None:
    """dq, dk, dv into dqkv (overwritten) from dy, recomputing the probabilities from lse."""
    if is_16bit(qkv):
        wgmma = wgmma_bwd(be, qkv, y, lse, dy, dqkv)
        if wgmma:
            attention_wgmma.flash_bwd(be, dy, qkv, y, lse, dqkv, attention_wgmma.PRODUCTION_BWD)
        else:
            attention_mma.flash_bwd(be, dy, qkv, y, lse, dqkv)
        ran = getattr(be, "backwards_ran", None)
        if ran is not None:  # for the plan line
            ran.add("wgmma" if wgmma else "mma.sync")
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
