"""CuPy backend: the same forward/backward pairs as andrea/engine/numpy_backend.py, on an NVIDIA
GPU, with hand-written CUDA kernels (kernels/*.cu, loaded with cupy.RawModule) for everything but
the large matrix products, which go to cuBLAS through CuPy.

Precision: weights, gradients, Adam state and activations are float32; in "bf16" mode the
operands of every matrix product are cast to bfloat16 (fp32 accumulation in cuBLAS), the rest
stays fp32. Every reduction runs in a fixed order (no atomics), so results are deterministic.

Attention: "strip" (scores of 128-query strips as tensor-core GEMMs, softmax in row kernels) or
"flash" (tiled online-softmax kernels on CUDA cores); neither stores the T × T matrix.
Not yet here (see BENCHMARKS.md): a fused tensor-core flash kernel, CUDA-graph capture of the
step, fp16 with loss scaling.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import cupy as cp
import numpy as np

xp = cp
INDEX_DTYPE = np.int32
KERNELS = Path(os.environ.get("ANDREA_KERNELS", Path(__file__).resolve().parents[2] / "kernels"))
PRECISION = "fp32"
try:  # CuPy 14 computes on bfloat16 arrays whose dtype comes from ml_dtypes
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the CuPy build
    BF16 = getattr(cp, "bfloat16", None)


def set_precision(precision: str) -> None:
    global PRECISION
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision {precision!r}: the CuPy backend supports fp32 and bf16")
    if precision == "bf16" and BF16 is None:
        raise RuntimeError("bf16 needs ml_dtypes (pip install ml_dtypes) with CuPy >= 14")
    _weights_bf16.clear()
    PRECISION = precision


def to_host(a):
    return cp.asnumpy(a)


@functools.lru_cache(maxsize=None)
def _module(name: str, head_dim: int | None = None) -> cp.RawModule:
    path = KERNELS / f"{name}.cu"
    if not path.exists():
        raise FileNotFoundError(f"{path}: CUDA sources not found (set ANDREA_KERNELS to the kernels/ folder of a checkout)")
    opts = ("-std=c++17", f"-I{KERNELS}", "-lineinfo")
    if head_dim is not None:
        opts += (f"-DHEAD_DIM={head_dim}",)
    return cp.RawModule(code=path.read_text(), options=opts)


def _k(module: str, kernel: str, head_dim: int | None = None):
    return _module(module, head_dim).get_function(kernel)


@functools.lru_cache(maxsize=None)
def _scratch(key: str, shape: tuple, dtype) -> cp.ndarray:
    """Buffers the kernels need besides the engine's, allocated once per shape."""
    return cp.zeros(shape, dtype=dtype)


def _blocks(n: int, threads: int = 256) -> int:
    return (n + threads - 1) // threads


_CUDA_R_32F, _CUDA_R_16BF, _COMPUTE_32F, _GEMM_DEFAULT = 0, 14, 68, -1
_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)
_weights_bf16: dict = {}  # bf16 copies of weights, made once per optimizer step


def invalidate_weight_cache() -> None:
    """Forget the bf16 weight copies (after the weights change outside AdamW, e.g. a load)."""
    _weights_bf16.clear()


def _operand(x, weight: bool = False):
    """A matrix-product operand in the compute precision (contiguous). In bf16 mode weights are
    cast once per optimizer step, activations at each use."""
    if PRECISION != "bf16":
        return cp.ascontiguousarray(x)
    if weight:
        key = (x.data.ptr, x.shape)
        cached = _weights_bf16.get(key)
        if cached is None:
            cached = _weights_bf16[key] = cp.ascontiguousarray(x).astype(BF16)
        return cached
    return cp.ascontiguousarray(x).astype(BF16)


def gemm(a, b, c, ta: bool = False, tb: bool = False, accumulate: bool = False) -> None:
    """c (fp32, row-major [m, n]) = op(a) · op(b), or += with `accumulate`, through cublasGemmEx:
    operands in fp32 or bf16, fp32 output and accumulation, so no output casts and no separate
    pass for gradient accumulation. Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ."""
    m, n = c.shape
    k = a.shape[0] if ta else a.shape[1]
    dtype = _CUDA_R_16BF if a.dtype == BF16 else _CUDA_R_32F
    cp.cuda.cublas.gemmEx(
        cp.cuda.device.get_cublas_handle(),
        cp.cuda.cublas.CUBLAS_OP_T if tb else cp.cuda.cublas.CUBLAS_OP_N,
        cp.cuda.cublas.CUBLAS_OP_T if ta else cp.cuda.cublas.CUBLAS_OP_N,
        n, m, k,
        (_ONE).ctypes.data,
        b.data.ptr, dtype, b.shape[1],
        a.data.ptr, dtype, a.shape[1],
        (_ONE if accumulate else _ZERO).ctypes.data,
        c.data.ptr, _CUDA_R_32F, n,
        _COMPUTE_32F, _GEMM_DEFAULT,
    )


def _mm(a, b):
    out = cp.empty((a.shape[0], b.shape[1]), dtype=cp.float32)
    gemm(_operand(a), _operand(b, weight=True), out)
    return out


# ----------------------------------------------------------------------------- embedding


def embed_fwd(tokens, wte, wpe, out):
    B, T = tokens.shape
    C = wte.shape[1]
    n = B * T * C
    _k("elementwise", "embed_fwd")((_blocks(n),), (256,), (tokens, wte, wpe, out, np.int32(B * T), np.int32(T), np.int32(C)))


def embed_bwd(dout, tokens, dwte, dwpe):
    B, T, C = dout.shape
    dwpe[:T] += dout.sum(axis=0)
    flat = tokens.reshape(-1).astype(cp.int64)
    order = cp.argsort(flat)  # thrust's stable sort: equal tokens keep their positions' order
    st = flat[order]
    first = cp.concatenate([cp.ones(1, dtype=bool), st[1:] != st[:-1]])
    starts = cp.nonzero(first)[0]
    uniq = st[starts]
    bounds = cp.concatenate([starts, cp.array([st.size], dtype=starts.dtype)]).astype(cp.int64)
    n = int(uniq.size) * C
    _k("elementwise", "embed_bwd_wte")((_blocks(n),), (256,), (dout, order, uniq.astype(cp.int64), bounds, dwte, np.int32(uniq.size), np.int32(C)))


# ----------------------------------------------------------------------------- layernorm


def layernorm_fwd(x, g, b, out, mean, rstd, eps=1e-5):
    C = x.shape[-1]
    N = x.size // C
    _k("layernorm", "layernorm_fwd")((_blocks(N, 8),), (256,), (x, g, b, out, mean, rstd, np.int32(N), np.int32(C), np.float32(eps)))


def _colsum_add(a2, out):
    """out += a2.sum(axis=0), deterministically."""
    N, C = a2.shape
    rows = 64
    chunks = (N + rows - 1) // rows
    partial = _scratch("colsum", (chunks, C), cp.float32)
    _k("layernorm", "colsum_partial")((_blocks(C), chunks), (256,), (a2, partial, np.int32(N), np.int32(C), np.int32(rows)))
    _k("layernorm", "colsum_final_add")((_blocks(C),), (256,), (partial, out, np.int32(chunks), np.int32(C)))


def layernorm_bwd(dout, x, mean, rstd, g, dx, dg, db):
    C = x.shape[-1]
    N = x.size // C
    dgx = _scratch("ln_dgx", (N, C), cp.float32)
    _k("layernorm", "layernorm_bwd")((_blocks(N, 8),), (256,), (dout, x, mean, rstd, g, dx, dgx, np.int32(N), np.int32(C)))
    _colsum_add(dgx, dg)
    _colsum_add(dout.reshape(N, C), db)


# ----------------------------------------------------------------------------- attention


def attn_qkv_fwd(x, wq, wk, wv, qkv, n_head):
    B, T, d = x.shape
    D = d // n_head
    x2 = x.reshape(-1, d)
    for i, w in enumerate((wq, wk, wv)):
        qkv[i] = _mm(x2, w).reshape(B, T, n_head, D).transpose(0, 2, 1, 3)


def attn_qkv_bwd(dqkv, x, wq, wk, wv, dx, dwq, dwk, dwv):
    B, T, d = x.shape
    x2 = _operand(x.reshape(-1, d))
    dx2 = dx.reshape(-1, d)
    for i, (w, dw) in enumerate(((wq, dwq), (wk, dwk), (wv, dwv))):
        g = _operand(dqkv[i].transpose(0, 2, 1, 3).reshape(-1, d))
        gemm(g, _operand(w, weight=True), dx2, tb=True, accumulate=i > 0)
        gemm(x2, g, dw, ta=True, accumulate=True)


def _use_strip(head_dim: int) -> bool:
    return ATTENTION == "strip" or (ATTENTION == "auto" and head_dim >= 64)


def attn_fwd(qkv, y, lse):
    if _use_strip(qkv.shape[-1]):
        return _strip_fwd(qkv, y, lse)
    _, B, H, T, D = qkv.shape
    q, k, v = qkv[0], qkv[1], qkv[2]
    _k("attention", "attn_fwd", D)(((T + 63) // 64, B * H), (64,), (q, k, v, y, lse, np.int32(H), np.int32(T), np.float32(1.0 / math.sqrt(D))))


def attn_bwd(dy, qkv, y, lse, dqkv):
    if _use_strip(qkv.shape[-1]):
        return _strip_bwd(dy, qkv, y, lse, dqkv)
    _, B, H, T, D = qkv.shape
    q, k, v = qkv[0], qkv[1], qkv[2]
    scale = np.float32(1.0 / math.sqrt(D))
    delta = _scratch("attn_delta", (B, H, T), cp.float32)
    _k("attention", "attn_delta", D)((_blocks(B * H * T),), (256,), (dy, y, delta, np.int32(B), np.int32(H), np.int32(T)))
    grid = ((T + 63) // 64, B * H)
    _k("attention", "attn_bwd_dq", D)(grid, (64,), (q, k, v, dy, lse, delta, dqkv[0], np.int32(H), np.int32(T), scale))
    _k("attention", "attn_bwd_dk", D)(grid, (64,), (q, k, v, dy, lse, delta, dqkv[1], np.int32(H), np.int32(T), scale))
    _k("attention", "attn_bwd_dv", D)(grid, (64,), (q, k, dy, lse, delta, dqkv[2], np.int32(H), np.int32(T), scale))


# Strip attention: the scores of a strip of STRIP queries against the keys before it are tensor-core
# GEMMs (cublasGemmStridedBatchedEx over the B·H heads); the causal softmax and its gradient are
# row kernels (kernels/attention_strip.cu). At most one STRIP × T slab of scores per head exists at
# a time, never the T × T matrix; strips run in order, so sums are deterministic.
# "strip" (tensor cores), "flash" (CUDA cores) or "auto": strip for head_dim >= 64, where it measured
# faster (ANDREA-120M: 113K vs 82K tokens/s at B=8), flash below (ANDREA-12M, head_dim 32: 326K vs 290K)
ATTENTION = os.environ.get("ANDREA_ATTENTION", "auto")
STRIP = 128


def bgemm(a, b, c, m, n, k, lda, ldb, ldc, sa, sb, sc, batch, ta=False, tb=False, accumulate=False):
    """Row-major batched C[i] (m×n, ldc) = op(A[i]) · op(B[i]) (+= with accumulate), fp32 output."""
    dtype = _CUDA_R_16BF if a.dtype == BF16 else _CUDA_R_32F
    cp.cuda.cublas.gemmStridedBatchedEx(
        cp.cuda.device.get_cublas_handle(),
        cp.cuda.cublas.CUBLAS_OP_T if tb else cp.cuda.cublas.CUBLAS_OP_N,
        cp.cuda.cublas.CUBLAS_OP_T if ta else cp.cuda.cublas.CUBLAS_OP_N,
        n, m, k, _ONE.ctypes.data,
        b.data.ptr, dtype, ldb, sb,
        a.data.ptr, dtype, lda, sa,
        (_ONE if accumulate else _ZERO).ctypes.data,
        c.data.ptr, _CUDA_R_32F, ldc, sc,
        batch, _COMPUTE_32F, _GEMM_DEFAULT,
    )


def _heads(x, B, T, H, D):
    """[B, T, H·D] -> contiguous [B·H, T, D]."""
    return cp.ascontiguousarray(x.reshape(B, T, H, D).transpose(0, 2, 1, 3)).reshape(B * H, T, D)


def _strip_fwd(qkv, y, lse):
    _, B, H, T, D = qkv.shape
    BH, sq = B * H, min(STRIP, T)
    q, k, v = (_operand(qkv[i].reshape(BH, T, D)) for i in range(3))
    S = _scratch("strip_S", (BH, sq, T), cp.float32)
    O = _scratch("strip_O", (BH, T, D), cp.float32)
    scale = np.float32(1.0 / math.sqrt(D))
    for i0 in range(0, T, sq):
        rows, keys = min(sq, T - i0), min(T, i0 + sq)
        bgemm(q[:, i0:], k, S, rows, keys, D, D, D, T, T * D, T * D, sq * T, BH, tb=True)
        _k("attention_strip", "strip_softmax_fwd")((rows, BH), (128,), (S, lse, np.int32(sq), np.int32(T), np.int32(T), np.int32(i0), scale))
        P = _operand(S)
        bgemm(P, v, O[:, i0:], rows, D, keys, T, D, D, sq * T, T * D, T * D, BH)
    y[...] = O.reshape(B, H, T, D).transpose(0, 2, 1, 3).reshape(B, T, H * D)


def _strip_bwd(dy, qkv, y, lse, dqkv):
    _, B, H, T, D = qkv.shape
    BH, sq = B * H, min(STRIP, T)
    q, k, v = (_operand(qkv[i].reshape(BH, T, D)) for i in range(3))
    scale = np.float32(1.0 / math.sqrt(D))
    delta = _scratch("attn_delta", (B, H, T), cp.float32)
    _k("attention", "attn_delta", D)((_blocks(B * H * T),), (256,), (dy, y, delta, np.int32(B), np.int32(H), np.int32(T)))
    do = _operand(_heads(dy, B, T, H, D))
    S = _scratch("strip_S", (BH, sq, T), cp.float32)
    dP = _scratch("strip_dP", (BH, sq, T), cp.float32)
    dq, dk, dv = (dqkv[i].reshape(BH, T, D) for i in range(3))
    dk[...] = 0
    dv[...] = 0
    for i0 in range(0, T, sq):
        rows, keys = min(sq, T - i0), min(T, i0 + sq)
        grid = (rows, BH)
        bgemm(q[:, i0:], k, S, rows, keys, D, D, D, T, T * D, T * D, sq * T, BH, tb=True)
        _k("attention_strip", "strip_probs")(grid, (128,), (S, lse, np.int32(sq), np.int32(T), np.int32(T), np.int32(i0), scale))
        P = _operand(S)
        bgemm(P, do[:, i0:], dv, keys, D, rows, T, D, D, sq * T, T * D, T * D, BH, ta=True, accumulate=True)
        bgemm(do[:, i0:], v, dP, rows, keys, D, D, D, T, T * D, T * D, sq * T, BH, tb=True)
        _k("attention_strip", "strip_dsoftmax")(grid, (128,), (dP, S, delta, np.int32(sq), np.int32(T), np.int32(T), np.int32(i0), scale))
        dS = _operand(dP)
        bgemm(dS, k, dq[:, i0:], rows, D, keys, T, D, D, sq * T, T * D, T * D, BH)
        bgemm(dS, q[:, i0:], dk, keys, D, rows, T, D, D, sq * T, T * D, T * D, BH, ta=True, accumulate=True)


def attn_out_fwd(y, wo, out):
    d = y.shape[-1]
    gemm(_operand(y.reshape(-1, d)), _operand(wo, weight=True), out.reshape(-1, out.shape[-1]))


def attn_out_bwd(dout, y, wo, dy, dwo):
    d = y.shape[-1]
    g = _operand(dout.reshape(-1, dout.shape[-1]))
    gemm(g, _operand(wo, weight=True), dy.reshape(-1, d), tb=True)
    gemm(_operand(y.reshape(-1, d)), g, dwo, ta=True, accumulate=True)


# ----------------------------------------------------------------------------- MLP


def gelu(h, out):
    _k("elementwise", "gelu_fwd")((_blocks(h.size),), (256,), (h, out, np.int64(h.size)))


def mlp_fwd(x, w1, w2, h, a, out):
    d = x.shape[-1]
    M = h.shape[-1]
    gemm(_operand(x.reshape(-1, d)), _operand(w1, weight=True), h.reshape(-1, M))
    gelu(h, a)
    gemm(_operand(a.reshape(-1, M)), _operand(w2, weight=True), out.reshape(-1, d))


def mlp_bwd(dout, x, h, a, w1, w2, dx, dw1, dw2):
    d = x.shape[-1]
    M = h.shape[-1]
    g = _operand(dout.reshape(-1, d))
    gemm(_operand(a.reshape(-1, M)), g, dw2, ta=True, accumulate=True)
    da = _scratch("mlp_da", (g.shape[0], M), cp.float32)
    gemm(g, _operand(w2, weight=True), da, tb=True)
    _k("elementwise", "gelu_bwd")((_blocks(da.size),), (256,), (h, da, np.int64(da.size)))
    dap = _operand(da)
    gemm(_operand(x.reshape(-1, d)), dap, dw1, ta=True, accumulate=True)
    gemm(dap, _operand(w1, weight=True), dx.reshape(-1, d), tb=True)


# ----------------------------------------------------------------------------- residual


def residual_add(x, f, out):
    cp.add(x, f, out=out)


def residual_add_bwd(dout, df):
    df[...] = dout


# ----------------------------------------------------------------------------- loss


def loss_fwd(x, w, targets, probs, losses):
    d = x.shape[-1]
    V = w.shape[0]
    N = x.size // d
    gemm(_operand(x.reshape(-1, d)), _operand(w, weight=True), probs.reshape(-1, V), tb=True)
    _k("classifier", "softmax_xent_fwd")((N,), (256,), (probs, targets, losses, np.int32(V)))
    return float(losses.mean())


def loss_bwd(x, w, targets, probs, dx, dw, dloss=1.0):
    d = x.shape[-1]
    V = w.shape[0]
    N = x.size // d
    _k("classifier", "softmax_xent_bwd")((N,), (256,), (probs, targets, np.float32(dloss / N), np.int32(V)))
    dl = _operand(probs.reshape(-1, V))
    gemm(dl, _operand(w, weight=True), dx.reshape(-1, d))
    gemm(dl, _operand(x.reshape(-1, d)), dw, ta=True, accumulate=True)


# ----------------------------------------------------------------------------- optimizer


def grad_norm_partial(grads, partial, block=1 << 16):
    _k("elementwise", "grad_norm_partial")((partial.size,), (256,), (grads, partial, np.int64(grads.size), np.int64(block)))


def grad_norm_final(partial) -> float:
    out = _scratch("norm_out", (1,), cp.float64)
    _k("elementwise", "grad_norm_final")((1,), (1,), (partial, np.int32(partial.size), out))
    return float(out[0])


def grad_scale(grads, scale):
    _k("elementwise", "grad_scale")((_blocks(grads.size),), (256,), (grads, np.float32(scale), np.int64(grads.size)))


def adamw(w, g, m, v, decay, lr, beta1, beta2, eps, weight_decay, step):
    invalidate_weight_cache()  # the weights change: their bf16 copies are stale
    bc1 = 1 - beta1**step
    bc2 = 1 - beta2**step
    f = np.float32
    _k("elementwise", "adamw")(
        (_blocks(w.size),), (256,),
        (w, g, m, v, decay, f(lr), f(beta1), f(beta2), f(eps), f(weight_decay), f(bc1), f(bc2), np.int64(w.size)),
    )
