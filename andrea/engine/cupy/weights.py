"""Precision dtypes, the 16-bit copy of the weights that the matrix products read in the bf16 and
fp16 modes (in fp8: of the output head alone), and the casting of matrix-product operands to the
compute precision."""

from __future__ import annotations

import cupy as cp
import numpy as np

from andrea.engine.cupy.kernels import blocks, kernel

FP16 = np.dtype(np.float16)
try:  # CuPy 14 computes on bfloat16 arrays whose dtype comes from ml_dtypes
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the CuPy build
    BF16 = getattr(cp, "bfloat16", None)

VOCAB_PAD = 64  # logits rows and the head's 16-bit copy padded to this many vocabulary entries


def half_dtype(precision: str):
    """The 16-bit storage type of a 16-bit mode."""
    return FP16 if precision == "fp16" else BF16


def defines(precision: str) -> tuple:
    """The kernels' preprocessor defines for a mode: its 16-bit type (bf16 unless -DANDREA_FP16)."""
    return ("ANDREA_FP16",) if precision == "fp16" else ()


def is_16bit(a) -> bool:
    """On the 16-bit fast path (a buffer planned in the bf16 or fp16 mode)?"""
    return a.dtype == BF16 or a.dtype == FP16


def leading_dim(x):
    """Leading dimension (in elements) of a row-major 2-D view with unit column stride, else None."""
    if x.ndim != 2 or (x.shape[1] > 1 and x.strides[1] != x.itemsize) or x.strides[0] % x.itemsize:
        return None
    return max(x.strides[0] // x.itemsize, x.shape[1], 1)


class Mirror:
    """The 16-bit copy of a flat fp32 weight buffer (or of its stretch w[lo:hi], `span`) that the
    matrix products read, refreshed by the AdamW kernel as it updates the weights. The output head's
    rows are followed by zero rows up to a multiple of VOCAB_PAD (a gap in the copy: later weights sit
    `gap` elements further on), so the vocabulary-sized products run on aligned shapes: with V = 8449
    cuBLAS ran them at ~100 TFLOP/s."""

    def __init__(self, w, head, precision: str, span=None):
        self.w = w
        self.defines = defines(precision)
        self.lo, self.hi = span if span is not None else (0, w.size)
        self.gap_at, self.gap = self.hi - self.lo, 0  # counted from lo
        self.head = None
        if head is not None:  # (offset, rows, cols) of the head within w
            off, rows, cols = head
            if not (self.lo <= off and off + rows * cols <= self.hi):
                raise ValueError(f"the head w[{off}:{off + rows * cols}] is outside the mirrored w[{self.lo}:{self.hi}]")
            padded = -(-rows // VOCAB_PAD) * VOCAB_PAD
            self.head = (off, rows, cols, padded)
            self.gap_at, self.gap = off + rows * cols - self.lo, (padded - rows) * cols
        self.copy = cp.zeros(self.hi - self.lo + self.gap, dtype=half_dtype(precision))  # the gap stays zero
        self.stale = True

    def refresh(self) -> None:
        if self.stale:
            n = self.hi - self.lo
            kernel("elementwise", "cast_h16_gap", defines=self.defines)(
                (blocks(n),), (256,), (self.w[self.lo:self.hi], self.copy, np.int64(n), np.int64(self.gap_at),
                                       np.int64(self.gap)))
            self.stale = False

    def view(self, x, padded: bool = False):
        """x's 16-bit copy (x a view into the mirrored stretch of w), or None; with `padded`, the head
        with its zero rows."""
        off = (x.data.ptr - self.w.data.ptr) // 4
        if not (self.lo <= off and off + x.size <= self.hi and x.dtype == self.w.dtype):
            return None
        self.refresh()
        at = off - self.lo
        if padded:
            if self.head is None or off != self.head[0]:
                return None
            _, _, cols, rows = self.head
            return self.copy[at:at + rows * cols].reshape(rows, cols)
        start = at + (self.gap if at >= self.gap_at else 0)
        return self.copy[start:start + x.size].reshape(x.shape)


class Weights:
    """One backend's 16-bit weights: the Mirror of the flat weight buffer its engine registered, and
    16-bit copies of weights outside it (made once per optimizer step). fp32 keeps none."""

    def __init__(self, precision: str):
        self.precision = precision
        self.mirror: Mirror | None = None
        self.copies: dict = {}  # (pointer, shape) -> 16-bit copy; dropped by every optimizer step

    def register(self, w, head=None, head_only: bool = False) -> None:
        """Keep a 16-bit copy of the flat weight buffer `w` that AdamW refreshes as it updates w; `head`
        (a view into w: the output head, [V, d]) gets zero rows up to a multiple of VOCAB_PAD.
        `head_only`: the copy holds the head alone (fp8, where every other product reads 8-bit
        copies of the fp32 weights: 2 bytes a parameter less)."""
        if self.precision == "fp32":
            return
        spec = span = None
        if head is not None:
            spec = ((head.data.ptr - w.data.ptr) // 4, head.shape[0], head.shape[1])
            if head_only:
                span = (spec[0], spec[0] + head.size)
        self.mirror = Mirror(w, spec, self.precision, span)

    def invalidate(self) -> None:
        """The weights changed outside AdamW (e.g. a load): every 16-bit copy is stale."""
        self.copies.clear()
        if self.mirror is not None:
            self.mirror.stale = True

    def refresh(self) -> None:
        if self.mirror is not None:
            self.mirror.refresh()

    def clear(self) -> None:
        self.mirror = None
        self.copies.clear()

    def view(self, x, padded: bool = False):
        """x's 16-bit copy from the registered buffer, or None (see Mirror.view)."""
        return None if self.mirror is None else self.mirror.view(x, padded)

    def mirror_of(self, w):
        """The Mirror of the flat buffer w, when w is the registered one."""
        return self.mirror if self.mirror is not None and self.mirror.w is w else None

    def operand(self, x, weight: bool = False):
        """A matrix-product operand in the compute precision. 16-bit arrays pass through; in the 16-bit
        modes weights come from their 16-bit copy, other fp32 arrays are cast (not on the fast path)."""
        if self.precision == "fp32" or is_16bit(x):
            return x if leading_dim(x) is not None else cp.ascontiguousarray(x)
        half = half_dtype(self.precision)
        if weight:
            mirrored = self.view(x)
            if mirrored is not None:
                return mirrored
            if cp.cuda.get_current_stream().is_capturing():
                # its copy (made now or by the eager pass before the capture) is dropped by the next
                # AdamW, and the graph would read freed memory holding old weights
                raise RuntimeError(f"a {x.shape} weight outside the registered 16-bit copy is read while a CUDA "
                                   "graph is captured: a graph can read only the registered copy")
            key = (x.data.ptr, x.shape)
            cached = self.copies.get(key)
            if cached is None:
                cached = self.copies[key] = cp.ascontiguousarray(x).astype(half)
            return cached
        return cp.ascontiguousarray(x).astype(half)
