"""The loss on the GPU: the output head's product and the fused softmax cross-entropy of
kernels/classifier.cu, forward and backward (16-bit logits with the loss scale read on the device, or
fp32). `be`: the CupyBackend whose kernels, products and buffers run them."""

from __future__ import annotations

import cupy as cp
import numpy as np

from andrea.engine.cupy.kernels import XENT_NV, xent_threads
from andrea.engine.cupy.weights import is_16bit


def loss_fwd(be, x, w, targets, probs, losses):
    d = x.shape[-1]
    V = w.shape[0]
    N = x.size // d
    if is_16bit(probs):  # 16-bit logits, then loss and (softmax - onehot) · loss scale in place, one kernel
        logits = probs.reshape(N, -1)
        wp = be.weights.view(w, padded=True)
        if wp is not None and wp.shape[0] == logits.shape[1]:  # padded head: zero logits past V
            be.gemm(be._operand(x.reshape(-1, d)), wp, logits, tb=True)
        else:
            be.gemm(be._operand(x.reshape(-1, d)), be._operand(w, weight=True), logits[:, :V], tb=True)
        ld = logits.shape[1]
        # the row in registers, 16 bytes a load; rows too long for a block of them (its registers
        # allow fewer threads than xent_threads asks: ld past ~57,000 in bf16) take 2-byte loads, three reads
        threads = xent_threads(ld)
        fn = None if threads is None else _kernel(be, "softmax_xent_h16_rows")
        if fn is None or threads > fn.max_threads_per_block:
            fn, threads = _kernel(be, "softmax_xent_h16"), 256
        fn((N,), (threads,), (logits, targets, losses, be._loss_scale_buffer(), np.int32(V), np.int32(ld)))
        return None if cp.cuda.get_current_stream().is_capturing() else float(losses.mean())
    be.gemm(be._operand(x.reshape(-1, d)), be._operand(w, weight=True), probs.reshape(-1, V), tb=True)
    _kernel(be, "softmax_xent_fwd")((N,), (256,), (probs, targets, losses, np.int32(V)))
    return float(losses.mean())


def _kernel(be, function: str):
    """A loss kernel of classifier.cu, one module for all of them: built with XENT_NV, the vectors a
    thread of softmax_xent_h16_rows holds (kernels.py sizes its blocks by the same number)."""
    return be.kernel("classifier", function, extra_defines=(f"XENT_NV={XENT_NV}",))


def loss_bwd(be, x, w, targets, probs, dx, dw, dloss=1.0) -> None:
    d = x.shape[-1]
    V = w.shape[0]
    N = x.size // d
    if is_16bit(probs):  # probs holds softmax - onehot (loss_fwd); the 1/N and dloss go into alpha
        dl = probs.reshape(N, -1)
        wp = be.weights.view(w, padded=True)
        if wp is not None and wp.shape[0] == dl.shape[1]:  # aligned K; the padded columns hold zeros
            be.gemm(dl, wp, dx.reshape(-1, d), alpha=dloss / N)
        else:
            be.gemm(dl[:, :V], be._operand(w, weight=True), dx.reshape(-1, d), alpha=dloss / N)
        # dW = dlᵀ · x. The vocabulary (256 bytes + segments + BOS) is one past a multiple of 64, and cuBLASLt takes
        # such a row count to an sm80 kernel at half the speed (ANDREA-120M B=32: 1.01 ms): the
        # rows up to a multiple of 64 as one product, the rest as another
        x2 = be._operand(x.reshape(-1, d))
        main = V // 64 * 64 if V > 64 else V
        be.gemm(dl[:, :main], x2, dw[:main], ta=True, accumulate=True, alpha=dloss / N)
        if main < V:
            be.gemm(dl[:, main:V], x2, dw[main:], ta=True, accumulate=True, alpha=dloss / N)
        return
    _kernel(be, "softmax_xent_bwd")((N,), (256,), (probs, targets, np.float32(dloss / N), np.int32(V)))
    dl = be._operand(probs.reshape(-1, V))
    be.gemm(dl, be._operand(w, weight=True), dx.reshape(-1, d))
    be.gemm(dl, be._operand(x.reshape(-1, d)), dw, ta=True, accumulate=True)
