"""CuPy backend: the same forward/backward pairs as andrea/engine/numpy_backend.py, on an NVIDIA
GPU, with hand-written CUDA kernels (kernels/*.cu, loaded with cupy.RawModule) for everything but
the large matrix products, which go to cuBLAS.

Precision:
- "fp32": weights, gradients, Adam state and activations are float32 (the reference mode, checked
  against NumPy to 1e-5). Attention runs the CUDA-core flash kernels (kernels/attention.cu) or
  strip attention (kernels/attention_strip.cu).
- "bf16": fp32 master weights, gradients, m and v, and an fp32 residual stream; every activation
  that feeds a matrix product (LayerNorm outputs, q/k/v, attention output, MLP hidden and GELU
  output, logits and their gradient) is stored in bf16 by the kernel that produces it, so no pass
  casts operands. A bf16 copy of the weights is refreshed by the AdamW kernel.
- "fp16": the same with fp16 for bf16 (the kernels are compiled with -DANDREA_FP16), and the
  loss scaled (set_loss_scale) so that small gradients survive fp16's range; the optimizer step
  unscales (andrea/optim.py: dynamic loss scaling). Attention is the
  fused tensor-core flash kernel (kernels/attention_mma.cu); q, k, v live in one [B, T, 3, H, D]
  buffer written by one strided-batched GEMM. Matrix products accumulate in fp32 and write fp32
  straight into the gradients (beta = 1).
Every reduction runs in a fixed order (no atomics), so results are deterministic.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from pathlib import Path

import cupy as cp
import numpy as np

xp = cp
INDEX_DTYPE = np.int32
# the CUDA sources ship inside the package (andrea/kernels; `kernels/` at the top of a checkout
# links there), so an installed package finds them; ANDREA_KERNELS points elsewhere for development
KERNELS = Path(os.environ.get("ANDREA_KERNELS", Path(__file__).resolve().parents[1] / "kernels"))
PRECISION = "fp32"
FP16 = np.dtype(np.float16)
try:  # CuPy 14 computes on bfloat16 arrays whose dtype comes from ml_dtypes
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the CuPy build
    BF16 = getattr(cp, "bfloat16", None)


def set_precision(precision: str) -> None:
    global PRECISION
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision {precision!r}: the CuPy backend supports fp32, bf16 and fp16")
    if precision == "bf16" and BF16 is None:
        raise RuntimeError("bf16 needs ml_dtypes (pip install ml_dtypes) with CuPy >= 14")
    _weights_h16.clear()
    changed = precision != PRECISION
    PRECISION = precision
    if changed:
        for mirror in _mirrors:  # the 16-bit copies change type with the mode
            mirror.retype()


def _half():
    """The 16-bit activation dtype of the current mode (bf16 unless in fp16 mode)."""
    return FP16 if PRECISION == "fp16" else BF16


def _defines() -> tuple:
    return ("ANDREA_FP16",) if PRECISION == "fp16" else ()


def plan_buffer(name: str, shape: tuple, dtype, n_head: int):
    """The engine's buffer `name` as this backend stores it: (shape, dtype). In the 16-bit modes the
    activations that feed matrix products are 16-bit, q/k/v are one [B, T, 3, H, D] buffer per layer
    (one GEMM writes it, attention reads it in place), and the logits' rows are padded to a
    multiple of VOCAB_PAD entries (aligned shapes for the tensor-core GEMMs)."""
    if PRECISION == "fp32":
        return shape, dtype
    if name in ("qkv", "d_qkv"):  # [..., 3, B, H, T, D] -> [..., B, T, 3, H, D]
        *lead, three, B, H, T, D = shape
        return (*lead, B, T, three, H, D), _half()
    if name == "probs":
        *lead, V = shape
        return (*lead, -(-V // VOCAB_PAD) * VOCAB_PAD), _half()
    if name in H16_BUFFERS:
        return shape, _half()
    return shape, dtype


H16_BUFFERS = {"ln1", "ln2", "lnf", "att_y", "mlp_h", "mlp_a", "d_y", "d_branch"}


def _fast(a) -> bool:
    """On the 16-bit fast path (buffers planned by plan_buffer in the bf16 or fp16 mode)?"""
    return a.dtype == BF16 or a.dtype == FP16


def to_host(a):
    return cp.asnumpy(a)


class Snapshot:
    """A buffer's value now, brought to the host later: a device-side copy (a fraction of a
    millisecond) and an event, so a checkpoint costs the step loop almost nothing; host() runs in
    the writer's thread and transfers on a stream of its own, beside the training kernels."""

    def __init__(self, a):
        self.device_id = a.device.id
        self.copy = a.copy()
        self.ready = cp.cuda.Event(disable_timing=True)
        self.ready.record()

    def host(self) -> np.ndarray:
        with cp.cuda.Device(self.device_id):
            stream = cp.cuda.Stream(non_blocking=True)
            stream.wait_event(self.ready)
            out = self.copy.get(stream=stream)
            stream.synchronize()
        self.copy = None  # the device memory goes back to the pool
        return out


def snapshot(a) -> Snapshot:
    return Snapshot(a)


@functools.lru_cache(maxsize=None)
def _module(name: str, head_dim: int | None = None, defines: tuple = ()) -> cp.RawModule:
    path = KERNELS / f"{name}.cu"
    if not path.exists():
        raise FileNotFoundError(f"{path}: CUDA sources not found (reinstall the package, or set ANDREA_KERNELS to the kernels/ folder of a checkout)")
    opts = ("-std=c++17", f"-I{KERNELS}", "-lineinfo")
    if head_dim is not None:
        opts += (f"-DHEAD_DIM={head_dim}",)
    opts += tuple(f"-D{d}" for d in defines)
    return cp.RawModule(code=path.read_text(), options=opts)


def _k(module: str, kernel: str, head_dim: int | None = None, defines: tuple = ()):
    """A kernel of kernels/<module>.cu, built for the current mode (16-bit type bf16 or fp16)."""
    return _module(module, head_dim, defines + _defines()).get_function(kernel)


_SCRATCH: dict = {}


def _scratch(key: str, shape: tuple, dtype) -> cp.ndarray:
    """Buffers the kernels need besides the engine's, allocated once per shape."""
    k = (key, shape, np.dtype(dtype))
    if k not in _SCRATCH:
        _SCRATCH[k] = cp.zeros(shape, dtype=dtype)
    return _SCRATCH[k]


def clear_caches() -> None:
    """Drop every buffer the backend keeps between calls (scratch, 16-bit weight copies, embedding
    plans), e.g. between engines of different sizes in one process; engines still in use must not
    train on after it (AdamW would no longer refresh their weight copies)."""
    _SCRATCH.clear()
    _weights_h16.clear()
    _mirrors.clear()
    _embed_plans.clear()


def _blocks(n: int, threads: int = 256) -> int:
    return (n + threads - 1) // threads


_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF, _COMPUTE_32F, _GEMM_DEFAULT, _OP_N, _OP_T = 0, 2, 14, 68, -1, 0, 1
_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)
_weights_h16: dict = {}  # 16-bit copies of weights outside a registered buffer, made once per step
_mirrors: list = []  # _Mirror of each weight buffer registered by an engine


def invalidate_weight_cache() -> None:
    """Forget the 16-bit weight copies (after the weights change outside AdamW, e.g. a load)."""
    _weights_h16.clear()
    for mirror in _mirrors:
        mirror.stale = True


VOCAB_PAD = 64  # logits rows and the head's 16-bit copy padded to this many vocabulary entries


class _Mirror:
    """The 16-bit copy of a flat fp32 weight buffer that the matrix products read, refreshed by the
    AdamW kernel as it updates the weights. The output head's rows are followed by zero rows up to a
    multiple of VOCAB_PAD (a gap in the copy: later weights sit `gap` elements further on), so the
    vocabulary-sized products run on aligned shapes: with V = 8449 cuBLAS ran them at ~100 TFLOP/s."""

    def __init__(self, w, head=None):
        self.w = w
        self.gap_at, self.gap = w.size, 0
        self.head = None
        if head is not None:  # (offset, rows, cols) of the head within w
            off, rows, cols = head
            padded = -(-rows // VOCAB_PAD) * VOCAB_PAD
            self.head = (off, rows, cols, padded)
            self.gap_at, self.gap = off + rows * cols, (padded - rows) * cols
        self.retype()

    def retype(self) -> None:
        self.copy = cp.zeros(self.w.size + self.gap, dtype=_half())  # the gap stays zero
        self.stale = True

    def refresh(self) -> None:
        if self.stale:
            n = self.w.size
            _k("elementwise", "cast_h16_gap")((_blocks(n),), (256,), (self.w, self.copy, np.int64(n), np.int64(self.gap_at),
                                                             np.int64(self.gap)))
            self.stale = False

    def view(self, x, padded: bool = False):
        """x's 16-bit copy (x a view into w), or None; with `padded`, the head with its zero rows."""
        off = (x.data.ptr - self.w.data.ptr) // 4
        if not (0 <= off < self.w.size and x.dtype == self.w.dtype):
            return None
        self.refresh()
        if padded:
            if self.head is None or off != self.head[0]:
                return None
            _, _, cols, rows = self.head
            return self.copy[off:off + rows * cols].reshape(rows, cols)
        start = off + (self.gap if off >= self.gap_at else 0)
        return self.copy[start:start + x.size].reshape(x.shape)


def register_weights(w, head=None) -> None:
    """Keep a 16-bit copy of the flat weight buffer `w` that AdamW refreshes as it updates w; `head`
    (a view into w: the output head, [V, d]) gets zero rows up to a multiple of VOCAB_PAD."""
    spec = None
    if head is not None:
        spec = ((head.data.ptr - w.data.ptr) // 4, head.shape[0], head.shape[1])
    # kept until clear_caches(): dropping a live engine's copy would leave its captured graph reading
    # weights that AdamW no longer refreshes
    _mirrors[:] = [m for m in _mirrors if m.w is not w]
    _mirrors.append(_Mirror(w, spec))


def _mirror_of(x, padded: bool = False):
    for mirror in _mirrors:
        got = mirror.view(x, padded)
        if got is not None:
            return got
    return None


def _operand(x, weight: bool = False):
    """A matrix-product operand in the compute precision. 16-bit arrays pass through; in the 16-bit
    modes weights come from their 16-bit copy, other fp32 arrays are cast (not on the fast path)."""
    if PRECISION == "fp32" or _fast(x):
        return x if _ld(x) is not None else cp.ascontiguousarray(x)
    if weight:
        mirrored = _mirror_of(x)
        if mirrored is not None:
            return mirrored
        key = (x.data.ptr, x.shape)
        cached = _weights_h16.get(key)
        if cached is None:
            cached = _weights_h16[key] = cp.ascontiguousarray(x).astype(_half())
        return cached
    return cp.ascontiguousarray(x).astype(_half())


def _ld(x):
    """Leading dimension (in elements) of a row-major 2-D view with unit column stride, else None."""
    if x.ndim != 2 or (x.shape[1] > 1 and x.strides[1] != x.itemsize) or x.strides[0] % x.itemsize:
        return None
    return max(x.strides[0] // x.itemsize, x.shape[1], 1)


def _dtype_code(x):
    return _CUDA_R_16BF if x.dtype == BF16 else _CUDA_R_16F if x.dtype == FP16 else _CUDA_R_32F


class _Cublas:
    """cuBLAS through ctypes, on a handle of our own with its own workspace. CuPy's wrappers re-bind
    their handle to the current stream on every call and refuse to while a stream is being captured;
    this handle is re-bound only when the stream changes, so matrix products can sit in a CUDA graph."""

    def __init__(self):
        cp.cuda.device.get_cublas_handle()  # CuPy loads libcublas; use the very same library
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libcublas.so" in line}
        if not paths:
            raise RuntimeError("libcublas is not loaded in this process")
        self.lib = lib = ctypes.CDLL(paths.pop())
        vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        lib.cublasGemmEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32, i32, i32]
        lib.cublasGemmStridedBatchedEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32, i64,
                                                   vp, vp, i32, i32, i64, i32, i32, i32]
        lib.cublasSetStream_v2.argtypes = [vp, vp]
        lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
        self.handle = vp()
        self.check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self.workspace = cp.empty(32 << 20, dtype=cp.uint8)  # fixed: a captured graph may use it
        self.stream = None

    @staticmethod
    def check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with cuBLAS status {status}")

    def bind(self) -> None:
        ptr = cp.cuda.get_current_stream().ptr
        if ptr != self.stream:
            self.check(self.lib.cublasSetStream_v2(self.handle, ptr), "cublasSetStream")
            # setting the stream resets the workspace to cuBLAS's own pool: give it ours again
            self.check(self.lib.cublasSetWorkspace_v2(self.handle, self.workspace.data.ptr, self.workspace.nbytes),
                       "cublasSetWorkspace")
            self.stream = ptr

    def gemm(self, *args) -> None:
        self.bind()
        self.check(self.lib.cublasGemmEx(self.handle, *args), "cublasGemmEx")

    def gemm_batched(self, *args) -> None:
        self.bind()
        self.check(self.lib.cublasGemmStridedBatchedEx(self.handle, *args), "cublasGemmStridedBatchedEx")


@functools.lru_cache(maxsize=None)
def _blas(device: int) -> _Cublas:
    return _Cublas()


def _gemm_call(*args) -> None:
    _blas(cp.cuda.runtime.getDevice()).gemm(*args)


def gemm(a, b, c, ta: bool = False, tb: bool = False, accumulate: bool = False, alpha: float = 1.0) -> None:
    """c (row-major [m, n], fp32, bf16 or fp16) = alpha · op(a) · op(b), or += with `accumulate`, through
    cublasGemmEx with fp32 accumulation. a, b, c may be strided row views (unit column stride).
    Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ."""
    m, n = c.shape
    k = a.shape[0] if ta else a.shape[1]
    al = _ONE if alpha == 1.0 else np.full(1, alpha, dtype=np.float32)
    _gemm_call(
        _OP_T if tb else _OP_N,
        _OP_T if ta else _OP_N,
        n, m, k,
        al.ctypes.data,
        b.data.ptr, _dtype_code(b), _ld(b),
        a.data.ptr, _dtype_code(a), _ld(a),
        (_ONE if accumulate else _ZERO).ctypes.data,
        c.data.ptr, _dtype_code(c), _ld(c),
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


_embed_plans: dict = {}  # device token buffer -> (packed plan buffer, N), filled by upload_tokens


def plan_tokens(host) -> np.ndarray:
    """Plan the embedding backward on the host from a batch of token IDs: positions sorted stably
    by token, the segment of each distinct token, and their count, packed into one int32 array.
    embed_bwd then needs no device sort and no host sync (so a graph can hold it). Host work only:
    the trainer runs it in a background thread while the previous step runs."""
    flat = np.ascontiguousarray(host).reshape(-1)
    order = np.argsort(flat, kind="stable")
    st = flat[order]
    starts = np.flatnonzero(np.concatenate(([True], st[1:] != st[:-1])))
    n = flat.size
    packed = np.zeros(3 * n + 2, dtype=np.int32)  # order [n] | seg [n + 1] | uniq [n] | count [1]
    packed[:n] = order
    packed[n:n + starts.size] = starts
    packed[n + starts.size] = n
    packed[2 * n + 1:2 * n + 1 + starts.size] = st[starts]
    packed[3 * n + 1] = starts.size
    return packed


def upload_tokens(host, dev, plan=None) -> None:
    """Copy a batch of token IDs into the device buffer `dev`, with its embedding-backward plan
    (plan_tokens) when given: a batch without one only goes forward (validation); the next
    training batch uploads its own plan before any backward reads it."""
    if plan is not None:
        key = (dev.data.ptr, dev.size)
        if key not in _embed_plans:
            _embed_plans[key] = cp.zeros(plan.size, dtype=cp.int32)
        _embed_plans[key].set(plan)
    dev.set(np.ascontiguousarray(host, dtype=dev.dtype).reshape(dev.shape))


def embed_bwd(dout, tokens, dwte, dwpe):
    B, T, C = dout.shape
    _k("elementwise", "embed_bwd_wpe")((_blocks(T * C),), (256,), (dout, dwpe, np.int32(B), np.int32(T), np.int32(C)))
    plan = _embed_plans.get((tokens.data.ptr, tokens.size))
    if plan is None:  # tokens not uploaded through upload_tokens: plan on the host now
        host = cp.asnumpy(tokens)
        upload_tokens(host, tokens, plan=plan_tokens(host))
        plan = _embed_plans[(tokens.data.ptr, tokens.size)]
    n = tokens.size
    _k("elementwise", "embed_bwd_planned")((n,), (256,), (dout, plan[:n], plan[n:2 * n + 1], plan[2 * n + 1:3 * n + 1],
                                                          plan[3 * n + 1:], dwte, np.int32(C)))


# ----------------------------------------------------------------------------- layernorm


LN_MAXV = 12  # kernels/layernorm.cu: float4s per lane in the vectorised row kernels


def _ln_vec(C: int) -> bool:
    """The vectorised row kernels apply: rows of float4s that fit a warp's registers."""
    return C % 4 == 0 and C <= 4 * 32 * LN_MAXV


def layernorm_fwd(x, g, b, out, mean, rstd, eps=1e-5):
    C = x.shape[-1]
    N = x.size // C
    if _ln_vec(C):
        _k("layernorm", "add_layernorm_fwd_vec_h16" if _fast(out) else "add_layernorm_fwd_vec")(
            (_blocks(N, 8),), (256,), (x, np.uint64(0), np.uint64(0), g, b, out, mean, rstd, np.int32(N), np.int32(C), np.float32(eps)))
        return
    _k("layernorm", "layernorm_fwd_h16" if _fast(out) else "layernorm_fwd")((_blocks(N, 8),), (256,), (x, g, b, out, mean, rstd, np.int32(N), np.int32(C), np.float32(eps)))


def add_layernorm_fwd(x, f, res, g, b, out, mean, rstd, eps=1e-5):
    """res = x + f and out = LayerNorm(res) in one kernel."""
    C = x.shape[-1]
    N = x.size // C
    vec = "_vec" if _ln_vec(C) else ""
    _k("layernorm", f"add_layernorm_fwd{vec}_h16" if _fast(out) else f"add_layernorm_fwd{vec}")(
        (_blocks(N, 8),), (256,), (x, f, res, g, b, out, mean, rstd, np.int32(N), np.int32(C), np.float32(eps)))


LN_ROWS = 64  # rows per partial sum of the LayerNorm parameter gradients


def layernorm_bwd(dout, x, mean, rstd, g, dx, dg, db, branch=None):
    """dx += the input gradient (one warp per row); dγ and dβ += their gradients (per-chunk column
    partials, then one ordered sum); with `branch`, the updated dx is also written there (in the
    same kernel when it is 16-bit)."""
    C = x.shape[-1]
    N = x.size // C
    fused_copy = branch is not None and _fast(branch)
    _k("layernorm", "layernorm_bwd_dx_vec" if _ln_vec(C) else "layernorm_bwd_dx")((_blocks(N, 8),), (256,), (dout, x, mean, rstd, g, dx, branch if fused_copy else np.uint64(0),
                                                                   np.int32(N), np.int32(C)))
    chunks = (N + LN_ROWS - 1) // LN_ROWS
    partial = _scratch("ln_partial", (chunks, 2 * C), cp.float32)
    _k("layernorm", "layernorm_bwd_params")((_blocks(C, 128), chunks), (128,), (dout, x, mean, rstd, partial, np.int32(N),
                                                                                np.int32(C), np.int32(LN_ROWS)))
    _k("layernorm", "ln_partials_final")((_blocks(2 * C),), (256,), (partial, dg, db, np.int32(chunks), np.int32(C)))
    if branch is not None and not fused_copy:
        branch[...] = dx


# ----------------------------------------------------------------------------- attention


def _consecutive(mats) -> bool:
    """Equal-shaped matrices back to back in memory (W_Q, W_K, W_V in the flat buffers)?"""
    step = mats[0].size * mats[0].itemsize
    return all(b.data.ptr - a.data.ptr == step for a, b in zip(mats, mats[1:]))


def attn_qkv_fwd(x, wq, wk, wv, qkv, n_head):
    if _fast(qkv):  # one strided-batched GEMM: q, k, v = x·W_Q, x·W_K, x·W_V into [B·T, 3, d]
        B, T, _, H, D = qkv.shape
        d = H * D
        ws = [_operand(w, weight=True) for w in (wq, wk, wv)]
        x2 = _operand(x.reshape(-1, d))
        if _consecutive(ws):
            bgemm(x2, ws[0], qkv, B * T, d, d, d, d, 3 * d, 0, d * d, d, 3)
        else:
            q2 = qkv.reshape(B * T, 3 * d)
            for i, w in enumerate(ws):
                gemm(x2, w, q2[:, i * d:(i + 1) * d])
        return
    B, T, d = x.shape
    D = d // n_head
    x2 = x.reshape(-1, d)
    for i, w in enumerate((wq, wk, wv)):
        qkv[i] = _mm(x2, w).reshape(B, T, n_head, D).transpose(0, 2, 1, 3)


def attn_qkv_bwd(dqkv, x, wq, wk, wv, dx, dwq, dwk, dwv):
    if _fast(dqkv):
        B, T, _, H, D = dqkv.shape
        d = H * D
        g2 = dqkv.reshape(B * T, 3 * d)
        x2 = _operand(x.reshape(-1, d))
        dx2 = dx.reshape(-1, d)
        for i, w in enumerate((wq, wk, wv)):
            gemm(g2[:, i * d:(i + 1) * d], _operand(w, weight=True), dx2, tb=True, accumulate=i > 0)
        if _consecutive([dwq, dwk, dwv]):  # dW_i += xᵀ · dqkv_i, one strided-batched GEMM
            bgemm(x2, g2, dwq, d, d, B * T, d, 3 * d, d, 0, d, d * d, 3, ta=True, accumulate=True)
        else:
            for i, dw in enumerate((dwq, dwk, dwv)):
                gemm(x2, g2[:, i * d:(i + 1) * d], dw, ta=True, accumulate=True)
        return
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
    if _fast(qkv):
        return flash_attention_fwd(qkv, y, lse)
    if _use_strip(qkv.shape[-1]):
        return _strip_fwd(qkv, y, lse)
    _, B, H, T, D = qkv.shape
    q, k, v = qkv[0], qkv[1], qkv[2]
    _k("attention", "attn_fwd", D)(((T + 63) // 64, B * H), (64,), (q, k, v, y, lse, np.int32(H), np.int32(T), np.float32(1.0 / math.sqrt(D))))


def attn_bwd(dy, qkv, y, lse, dqkv):
    if _fast(qkv):
        return flash_attention_bwd(dy, qkv, y, lse, dqkv)
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


# Tensor-core flash attention (16-bit modes): q, k, v in one [B, T, 3, H, D] 16-bit buffer, y and
# dy [B, T, H·D] 16-bit, lse [B, H, T] fp32; dq, dk, dv written into a buffer shaped like qkv.
FLASH_TILE = 64
# "2": tiles double-buffered with cp.async (the default); "1": synchronous tile loads; "3": as 2,
# with the forward and dQ kernels held to 128 registers so that four blocks share an SM
FLASH_VARIANT = os.environ.get("ANDREA_FLASH_VARIANT", "2")


def _flash_args(qkv):
    B, T, three, H, D = qkv.shape
    if D % 16 or D > 64:
        raise ValueError(f"head_dim {D}: the tensor-core attention needs a multiple of 16, at most 64")
    flat = qkv.reshape(-1)
    st = 3 * H * D
    return B, T, H, D, (flat, flat[H * D:], flat[2 * H * D:]), (np.int64(T * st), np.int64(st), np.int64(D))


def _flash(kernel: str, D: int):
    if FLASH_VARIANT == "1":
        return _k("attention_mma", kernel, D)
    return _k("attention_mma", kernel + "2", D, ("FLASH_MINB=4",) if FLASH_VARIANT == "3" else ())


def flash_attention_fwd(qkv, y, lse):
    B, T, H, D, (q, k, v), strides = _flash_args(qkv)
    grid = ((T + FLASH_TILE - 1) // FLASH_TILE, B * H)
    _flash("flash_fwd", D)(grid, (128,), (q, k, v, y, lse, np.int32(H), np.int32(T), *strides,
                                                       np.float32(1.0 / math.sqrt(D))))


def flash_attention_bwd(dy, qkv, y, lse, dqkv):
    B, T, H, D, (q, k, v), strides = _flash_args(qkv)
    dq, dk, dv = _flash_args(dqkv)[4]
    delta = _scratch("flash_delta", (B, H, T), cp.float32)
    rows = B * T * H
    _k("attention_mma", "flash_delta", D)((_blocks(rows, 8),), (256,), (dy, y, delta, np.int32(B), np.int32(H), np.int32(T)))
    grid = ((T + FLASH_TILE - 1) // FLASH_TILE, B * H)
    scale = np.float32(1.0 / math.sqrt(D))
    _flash("flash_bwd_dq", D)(grid, (128,), (q, k, v, dy, lse, delta, dq, np.int32(H), np.int32(T), *strides, scale))
    _flash("flash_bwd_dkdv", D)(grid, (128,), (q, k, v, dy, lse, delta, dk, dv, np.int32(H), np.int32(T),
                                                            *strides, scale))


# Strip attention: the scores of a strip of STRIP queries against the keys before it are tensor-core
# GEMMs (cublasGemmStridedBatchedEx over the B·H heads); the causal softmax and its gradient are
# row kernels (kernels/attention_strip.cu). At most one STRIP × T slab of scores per head exists at
# a time, never the T × T matrix; strips run in order, so sums are deterministic.
# "strip" (tensor cores), "flash" (CUDA cores) or "auto": strip for head_dim >= 64, where it measured
# faster (ANDREA-120M: 113K vs 82K tokens/s at B=8), flash below (ANDREA-12M, head_dim 32: 326K vs 290K)
ATTENTION = os.environ.get("ANDREA_ATTENTION", "auto")
STRIP = 128


def bgemm(a, b, c, m, n, k, lda, ldb, ldc, sa, sb, sc, batch, ta=False, tb=False, accumulate=False):
    """Row-major batched C[i] (m×n, ldc) = op(A[i]) · op(B[i]) (+= with accumulate); element strides
    sa, sb, sc between the batch's matrices (0 repeats one matrix); fp32 accumulation."""
    dtype = _dtype_code(a)
    _blas(cp.cuda.runtime.getDevice()).gemm_batched(
        _OP_T if tb else _OP_N,
        _OP_T if ta else _OP_N,
        n, m, k, _ONE.ctypes.data,
        b.data.ptr, dtype, ldb, sb,
        a.data.ptr, dtype, lda, sa,
        (_ONE if accumulate else _ZERO).ctypes.data,
        c.data.ptr, _dtype_code(c), ldc, sc,
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
    if _fast(out) and out.size % 8 == 0:  # 8 elements per thread, tanh on the SFU
        _k("elementwise", "gelu_fwd_h16x8")((_blocks(h.size // 8),), (256,), (h, out, np.int64(h.size // 8)))
        return
    _k("elementwise", "gelu_fwd_h16" if _fast(out) else "gelu_fwd")((_blocks(h.size),), (256,), (h, out, np.int64(h.size)))


def mlp_fwd(x, w1, w2, h, a, out):
    d = x.shape[-1]
    M = h.shape[-1]
    gemm(_operand(x.reshape(-1, d)), _operand(w1, weight=True), h.reshape(-1, M))
    gelu(h, a)
    gemm(_operand(a.reshape(-1, M)), _operand(w2, weight=True), out.reshape(-1, d))


def recomputes_gelu() -> bool:
    """The 16-bit modes keep only the MLP's pre-activation h: mlp_bwd recomputes a = gelu(h) into the
    buffer it is given (the engine then allocates one, not one per layer: less memory than PyTorch)."""
    return PRECISION != "fp32"


def mlp_bwd(dout, x, h, a, w1, w2, dx, dw1, dw2):
    d = x.shape[-1]
    M = h.shape[-1]
    fast = _fast(h)
    if fast:
        gelu(h, a)
    g = _operand(dout.reshape(-1, d))
    gemm(_operand(a.reshape(-1, M)), g, dw2, ta=True, accumulate=True)
    da = _scratch("mlp_da", (g.shape[0], M), h.dtype if fast else cp.float32)
    gemm(g, _operand(w2, weight=True), da, tb=True)
    if fast and da.size % 8 == 0:
        _k("elementwise", "gelu_bwd_h16x8")((_blocks(da.size // 8),), (256,), (h, da, np.int64(da.size // 8)))
    else:
        _k("elementwise", "gelu_bwd_h16" if fast else "gelu_bwd")((_blocks(da.size),), (256,), (h, da, np.int64(da.size)))
    dap = _operand(da)
    gemm(_operand(x.reshape(-1, d)), dap, dw1, ta=True, accumulate=True)
    gemm(dap, _operand(w1, weight=True), dx.reshape(-1, d), tb=True)


# ----------------------------------------------------------------------------- residual


def residual_add(x, f, out):
    cp.add(x, f, out=out)


def residual_add_bwd(dout, df):
    if _fast(df):  # the branch's gradient as the 16-bit operand of its matrix products
        _k("elementwise", "cast_h16")((_blocks(df.size),), (256,), (dout, df, np.int64(df.size)))
    else:
        df[...] = dout


# ----------------------------------------------------------------------------- loss


def loss_fwd(x, w, targets, probs, losses):
    d = x.shape[-1]
    V = w.shape[0]
    N = x.size // d
    if _fast(probs):  # 16-bit logits, then loss and (softmax - onehot) · loss scale in place, one kernel
        logits = probs.reshape(N, -1)
        wp = _mirror_of(w, padded=True)
        if wp is not None and wp.shape[0] == logits.shape[1]:  # padded head: zero logits past V
            gemm(_operand(x.reshape(-1, d)), wp, logits, tb=True)
        else:
            gemm(_operand(x.reshape(-1, d)), _operand(w, weight=True), logits[:, :V], tb=True)
        _k("classifier", "softmax_xent_h16")((N,), (256,), (logits, targets, losses, _loss_scale_buffer(), np.int32(V),
                                                            np.int32(logits.shape[1])))
        return None if cp.cuda.get_current_stream().is_capturing() else float(losses.mean())
    gemm(_operand(x.reshape(-1, d)), _operand(w, weight=True), probs.reshape(-1, V), tb=True)
    _k("classifier", "softmax_xent_fwd")((N,), (256,), (probs, targets, losses, np.int32(V)))
    return float(losses.mean())


@functools.lru_cache(maxsize=None)
def _loss_scale_device(device: int):
    return cp.ones(1, dtype=cp.float32)


def _loss_scale_buffer():
    """The loss scale on the device (read by the classifier kernel, so a captured graph follows
    changes of the scale without being captured again)."""
    return _loss_scale_device(cp.cuda.runtime.getDevice())


_loss_scale_now = [1.0]


def set_loss_scale(scale: float) -> None:
    """Gradients of the 16-bit fast path come out multiplied by `scale` (fp16 loss scaling)."""
    if scale != _loss_scale_now[0]:
        _loss_scale_buffer().fill(scale)
        _loss_scale_now[0] = scale


def loss_bwd(x, w, targets, probs, dx, dw, dloss=1.0):
    d = x.shape[-1]
    V = w.shape[0]
    N = x.size // d
    if _fast(probs):  # probs holds softmax - onehot (loss_fwd); the 1/N and dloss go into alpha
        dl = probs.reshape(N, -1)
        wp = _mirror_of(w, padded=True)
        if wp is not None and wp.shape[0] == dl.shape[1]:  # aligned K; the padded columns hold zeros
            gemm(dl, wp, dx.reshape(-1, d), alpha=dloss / N)
        else:
            gemm(dl[:, :V], _operand(w, weight=True), dx.reshape(-1, d), alpha=dloss / N)
        gemm(dl[:, :V], _operand(x.reshape(-1, d)), dw, ta=True, accumulate=True, alpha=dloss / N)
        return
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


DECAY_DTYPE = np.uint8  # the weight-decay mask as bytes (a quarter of an fp32 mask's memory)


def adamw(w, g, m, v, decay, lr, beta1, beta2, eps, weight_decay, step, gscale=1.0):
    _weights_h16.clear()  # the weights change: copies not kept by the kernel below are stale
    if decay.dtype != np.uint8:
        decay = (decay != 0).astype(np.uint8)
    bc1 = 1 - beta1**step
    bc2 = 1 - beta2**step
    f = np.float32
    hyper = (f(lr), f(beta1), f(beta2), f(eps), f(weight_decay), f(bc1), f(bc2), np.int64(w.size))
    mirror = next((mm for mm in _mirrors if mm.w is w), None)
    if mirror is not None:  # update and refresh the 16-bit copy in one pass
        mirror.stale = False
        _k("elementwise", "adamw_h16")((_blocks(w.size),), (256,), (w, g, m, v, decay, mirror.copy, np.int64(mirror.gap_at),
                                                                     np.int64(mirror.gap), f(gscale), *hyper))
    else:
        _k("elementwise", "adamw")((_blocks(w.size),), (256,), (w, g, m, v, decay, f(gscale), *hyper))


# ----------------------------------------------------------------------------- CUDA graphs


class CapturedPass:
    """A function of the engine's fixed buffers (forward + backward of one micro-batch) recorded
    once as a CUDA graph and replayed with one launch: no Python and no per-kernel launch cost in
    the hot loop. Everything it runs must be allocation-free and host-sync-free once warm (the 16-bit
    fast path is); the first call runs it eagerly to warm up (kernels compiled, scratch allocated),
    then captures it on a side stream. Replays go to the current stream, after the token upload."""

    def __init__(self, fn):
        self.fn = fn
        self.graph = None

    def __call__(self) -> None:
        for mirror in _mirrors:  # weights loaded since the last optimizer step: refresh their 16-bit copy
            mirror.refresh()
        if self.graph is None:
            self.fn()  # warm-up, eager
            cp.cuda.get_current_stream().synchronize()
            self.graph = self._capture()
            return
        self.graph.launch(cp.cuda.get_current_stream())

    def _capture(self):
        pool = cp.get_default_memory_pool()
        used = pool.used_bytes()
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                self.fn()
            finally:
                graph = stream.end_capture()  # also after a failure: never leave the stream capturing
        if pool.used_bytes() != used:
            raise RuntimeError("the captured pass allocated GPU memory; it cannot be replayed safely")
        # the graph writes into these: keep them alive as long as it lives (even past clear_caches)
        self.keep = (list(_SCRATCH.values()), list(_mirrors), list(_embed_plans.values()), _loss_scale_buffer())
        return graph


def capture(fn) -> CapturedPass:
    if PRECISION == "fp32":
        raise ValueError("CUDA-graph capture needs the 16-bit fast path (the fp32 path allocates temporaries)")
    return CapturedPass(fn)
