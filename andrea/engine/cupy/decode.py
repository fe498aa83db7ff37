"""Generation with a KV cache on the GPU (kernels/decode.cu). The position comes from a device
int32 that the step advances itself, so the one-token step of the 16-bit modes is one CUDA graph
replayed per token (andrea/sampling.py): the embedding, the cache store, the attention of one new
query over the cache, and the position's advance. A prompt (n tokens from an empty cache) runs
the training attention kernels over the chunk and stores its keys and values."""

from __future__ import annotations

import math

import numpy as np

from andrea.engine.cupy.kernels import blocks
from andrea.engine.cupy.weights import is_16bit

THREADS = 256  # attn_decode: threads per (row, head) block
DEC_WARPS = 16  # kernels/decode.cu: attn_decode_store's warps per (row, head) block
WARPS_E = {32: 1, 64: 2, 128: 4}  # head size -> elements per lane of attn_decode_store_e<E>


def embed_at(be, tokens, wte, wpe, pos_dev, out) -> None:
    B, T = tokens.shape
    C = wte.shape[1]
    be.kernel("decode", "embed_at_h16" if is_16bit(out) else "embed_at")(  # the residual stream: 16-bit or fp32
        (blocks(B * T * C),), (256,), (tokens, wte, wpe, pos_dev, out, np.int32(B * T), np.int32(T), np.int32(C)))


def kv_store(be, qkv, k_cache, v_cache, pos_dev) -> None:
    """The chunk's keys and values (qkv [B, n, 3, H, D]) into the caches ([B, H, T_max, D]) from pos_dev on."""
    B, n, _, H, D = qkv.shape
    be.kernel("decode", "kv_store")((blocks(B * n * H * D),), (256,), (qkv, k_cache, v_cache, pos_dev, np.int32(B),
                                                                       np.int32(n), np.int32(H), np.int32(D),
                                                                       np.int32(k_cache.shape[2])))


def _launch_shape(D: int, T_max: int) -> tuple[int, int, int]:
    """attn_decode's (parts, threads, dynamic shared-memory bytes) for head size D and a cache of T_max."""
    parts = max(1, THREADS // D)
    threads = max(THREADS, -(-D * parts // 32) * 32)
    return parts, threads, (D + T_max + parts * D) * 4


def warps_take(D: int) -> bool:
    """Whether attn_decode_store (keys split across warps, the cache store fused) takes head size D."""
    return D in WARPS_E


def fits(D: int, T_max: int) -> bool:
    """Whether a decode kernel takes this shape: attn_decode_store (head sizes 32, 64, 128, any
    context), else attn_decode: 16-byte loads of a key (D a multiple of 8), one block of at most
    1024 threads, the scores in the default 48 KiB of shared memory (contexts up to ~11k)."""
    return warps_take(D) or _attn_decode_fits(D, T_max)


def _attn_decode_fits(D: int, T_max: int) -> bool:
    _, threads, shared = _launch_shape(D, T_max)
    return D % 8 == 0 and threads <= 1024 and shared <= 48 * 1024


def attn_decode(be, qkv, k_cache, v_cache, pos_dev, y) -> None:
    """y = the attention of each row's one new query (at pos_dev, its key already stored) over the cache."""
    B, n, _, H, D = qkv.shape
    T_max = k_cache.shape[2]
    if n != 1 or not _attn_decode_fits(D, T_max):
        raise ValueError(f"attn_decode takes one new position per row, a head size that is a multiple of 8 and "
                         f"scores that fit in shared memory; got n={n}, D={D}, a cache of {T_max}")
    parts, threads, shared = _launch_shape(D, T_max)
    be.kernel("decode", "attn_decode")((B * H,), (threads,), (qkv, k_cache, v_cache, y, pos_dev, np.int32(H), np.int32(D),
                                                              np.int32(T_max), np.int32(parts),
                                                              np.float32(1.0 / math.sqrt(D))), shared_mem=shared)


def advance(be, pos_dev, n: int) -> None:
    be.kernel("decode", "advance")((1,), (32,), (pos_dev, np.int32(n)))


def attn_decode_store(be, qkv, k_cache, v_cache, pos_dev, y) -> None:
    """attn_decode with kv_store fused in: the new key and value (read from qkv) go into the caches
    at pos_dev, and y = each row's new query attending over the cache 0..pos_dev. Head size 32, 64
    or 128 (warps_take)."""
    B, n, _, H, D = qkv.shape
    if n != 1 or not warps_take(D):
        raise ValueError(f"attn_decode_store takes one new position per row and a head size of 32, 64 or 128; got n={n}, D={D}")
    be.kernel("decode", f"attn_decode_store_e{WARPS_E[D]}")((B * H,), (32 * DEC_WARPS,), (
        qkv, k_cache, v_cache, y, pos_dev, np.int32(H), np.int32(k_cache.shape[2]), np.float32(1.0 / math.sqrt(D))))
