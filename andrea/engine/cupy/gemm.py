"""Matrix products through cuBLAS (cublasGemmEx, cublasGemmStridedBatchedEx) called with ctypes,
on a handle and workspace of the backend's own.

CuPy's wrappers re-bind their handle to the current stream on every call and refuse to while a
stream is being captured; this handle is re-bound only when the stream changes, so matrix products
can sit in a CUDA graph. Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so every
call swaps the operands. Accumulation is fp32 whatever the storage type (fp32, bf16 or fp16).
"""

from __future__ import annotations

import ctypes
import functools

import cupy as cp
import numpy as np

from andrea.engine.cupy.weights import BF16, FP16, leading_dim

_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF, _COMPUTE_32F, _GEMM_DEFAULT, _OP_N, _OP_T = 0, 2, 14, 68, -1, 0, 1
_ONE = np.ones(1, dtype=np.float32)  # host scalars for alpha and beta (read-only)
_ZERO = np.zeros(1, dtype=np.float32)
WORKSPACE_BYTES = 32 << 20


def dtype_code(x) -> int:
    """cuBLAS's data type code of an fp32, bf16 or fp16 array."""
    return _CUDA_R_16BF if x.dtype == BF16 else _CUDA_R_16F if x.dtype == FP16 else _CUDA_R_32F


def loaded_library(stem: str) -> ctypes.CDLL:
    """The shared library `stem` ("libcublas", "libcublasLt": it comes with libcublas) that CuPy
    loaded, the very same one (one library per process; handles are per backend)."""
    cp.cuda.device.get_cublas_handle()  # CuPy loads libcublas
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if f"/{stem}.so" in line}
    if not paths:
        raise RuntimeError(f"{stem} is not loaded in this process")
    return ctypes.CDLL(paths.pop())


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    """libcublas with the argument types of the calls made here."""
    lib = loaded_library("libcublas")
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.cublasGemmEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32, i32, i32]
    lib.cublasGemmStridedBatchedEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32, i64,
                                               vp, vp, i32, i32, i64, i32, i32, i32]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    lib.cublasDestroy_v2.argtypes = [vp]
    return lib


def check_status(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


class Cublas:
    """A cuBLAS handle with its own workspace, on the current device."""

    def __init__(self):
        self.lib = lib = _library()
        self.handle = ctypes.c_void_p()
        check_status(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)  # fixed: a captured graph may use it
        self.stream = None

    def close(self) -> None:
        """Destroy the handle (the workspace goes back to CuPy's pool once no graph holds it). Explicit
        only (the backend's release()), never from a finaliser: cublasDestroy synchronises the
        device, which would break a CUDA-graph capture that a garbage collection happened to
        interrupt."""
        if self.handle:
            check_status(self.lib.cublasDestroy_v2(self.handle), "cublasDestroy")
            self.handle = ctypes.c_void_p()
        self.workspace = None

    def _bind(self) -> None:
        ptr = cp.cuda.get_current_stream().ptr
        if ptr != self.stream:
            check_status(self.lib.cublasSetStream_v2(self.handle, ptr), "cublasSetStream")
            # setting the stream resets the workspace to cuBLAS's own pool: give it ours again
            check_status(self.lib.cublasSetWorkspace_v2(self.handle, self.workspace.data.ptr, self.workspace.nbytes),
                   "cublasSetWorkspace")
            self.stream = ptr

    def gemm(self, a, b, c, ta: bool = False, tb: bool = False, accumulate: bool = False, alpha: float = 1.0) -> None:
        """c (row-major [m, n], fp32, bf16 or fp16) = alpha · op(a) · op(b), or += with `accumulate`,
        with fp32 accumulation. a, b, c may be strided row views (unit column stride)."""
        m, n = c.shape
        k = a.shape[0] if ta else a.shape[1]
        al = _ONE if alpha == 1.0 else np.full(1, alpha, dtype=np.float32)
        self._bind()
        check_status(self.lib.cublasGemmEx(
            self.handle,
            _OP_T if tb else _OP_N,
            _OP_T if ta else _OP_N,
            n, m, k,
            al.ctypes.data,
            b.data.ptr, dtype_code(b), leading_dim(b),
            a.data.ptr, dtype_code(a), leading_dim(a),
            (_ONE if accumulate else _ZERO).ctypes.data,
            c.data.ptr, dtype_code(c), leading_dim(c),
            _COMPUTE_32F, _GEMM_DEFAULT,
        ), "cublasGemmEx")

    def bgemm(self, a, b, c, m, n, k, lda, ldb, ldc, sa, sb, sc, batch, ta=False, tb=False, accumulate=False) -> None:
        """Row-major batched C[i] (m×n, ldc) = op(A[i]) · op(B[i]) (+= with accumulate); element strides
        sa, sb, sc between the batch's matrices (0 repeats one matrix); fp32 accumulation."""
        dtype = dtype_code(a)
        self._bind()
        check_status(self.lib.cublasGemmStridedBatchedEx(
            self.handle,
            _OP_T if tb else _OP_N,
            _OP_T if ta else _OP_N,
            n, m, k, _ONE.ctypes.data,
            b.data.ptr, dtype, ldb, sb,
            a.data.ptr, dtype, lda, sa,
            (_ONE if accumulate else _ZERO).ctypes.data,
            c.data.ptr, dtype_code(c), ldc, sc,
            batch, _COMPUTE_32F, _GEMM_DEFAULT,
        ), "cublasGemmStridedBatchedEx")
