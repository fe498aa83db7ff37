"""The elementwise and optimizer kernels (kernels/elementwise.cu): GELU and its derivative, the cast of
the residual branch's gradient to 16 bits, the gradient norm, the gradient scale, the step's control
values and AdamW. `be`: the CupyBackend whose kernels and buffers run them."""

from __future__ import annotations

import cupy as cp
import numpy as np

from andrea.engine.cupy.kernels import blocks
from andrea.engine.cupy.weights import is_16bit


def gelu(be, h, out) -> None:
    """out = gelu(h) (tanh approximation)."""
    if is_16bit(out) and out.size % 8 == 0:  # 8 elements per thread, tanh on the SFU
        be.kernel("elementwise", "gelu_fwd_h16x8")((blocks(h.size // 8),), (256,), (h, out, np.int64(h.size // 8)))
        return
    be.kernel("elementwise", "gelu_fwd_h16" if is_16bit(out) else "gelu_fwd")((blocks(h.size),), (256,),
                                                                               (h, out, np.int64(h.size)))


def gelu_bwd(be, h, da, a) -> None:
    """da *= gelu'(h) in place (the MLP backward's pass after a's gradient), writing a = gelu(h) again
    where be.recomputes_gelu (the 16-bit modes that do not keep a for dW2)."""
    fast = is_16bit(h)
    n8 = (blocks(da.size // 8),), (256,)
    if fast and da.size % 8 == 0 and be.recomputes_gelu:
        be.kernel("elementwise", "gelu_bwd_recompute_h16x8")(*n8, (h, da, a, np.int64(da.size // 8)))
    elif fast and da.size % 8 == 0:
        be.kernel("elementwise", "gelu_bwd_h16x8")(*n8, (h, da, np.int64(da.size // 8)))
    else:
        if fast and be.recomputes_gelu:
            be.gelu(h, a)
        be.kernel("elementwise", "gelu_bwd_h16" if fast else "gelu_bwd")((blocks(da.size),), (256,),
                                                                        (h, da, np.int64(da.size)))


def residual_add_bwd(be, dout, df) -> None:
    """df = dout: the residual branch's gradient, cast to 16 bits when df is (the operand of its
    matrix products). The engine gets this fused into layernorm_bwd(branch=...)."""
    if df.dtype == np.uint8:
        raise ValueError("an fp8 branch gradient (bytes) is written by layernorm_bwd(branch=..., feeds=...)")
    if is_16bit(df) and not is_16bit(dout):
        be.kernel("elementwise", "cast_h16")((blocks(df.size),), (256,), (dout, df, np.int64(df.size)))
    else:
        df[...] = dout


def grad_norm_partial(be, grads, partial, block=1 << 16) -> None:
    be.kernel("elementwise", "grad_norm_partial")((partial.size,), (256,), (grads, partial, np.int64(grads.size),
                                                                             np.int64(block)))


def grad_norm_final(be, partial) -> float:
    out = be.scratch("norm_out", (1,), cp.float64)
    be.kernel("elementwise", "grad_norm_final")((1,), (1,), (partial, np.int32(partial.size), out))
    return float(out[0])


def grad_scale(be, grads, scale) -> None:
    be.kernel("elementwise", "grad_scale")((blocks(grads.size),), (256,), (grads, np.float32(scale), np.int64(grads.size)))


def step_control(be, partial, ctrl, clip, scale, beta1, beta2) -> None:
    """Backend.step_control in one thread on the device (the same sum as grad_norm_final)."""
    f = np.float64
    be.kernel("elementwise", "step_control")((1,), (1,), (partial, np.int32(partial.size), ctrl, f(clip), f(scale),
                                                             f(beta1), f(beta2)))


def adamw(be, w, g, m, v, decay, lr, beta1, beta2, eps, weight_decay, step, gscale=1.0, ctrl=None) -> None:
    be.weights.copies.clear()  # the weights change: copies not kept by the kernel below are stale
    if decay.dtype != np.uint8:
        decay = (decay != 0).astype(np.uint8)
    shift = 0  # decay: one byte per 2^shift parameters (decay_buffer), or per parameter
    while (w.size + (1 << shift) - 1) >> shift > decay.size:
        shift += 1
    if (w.size + (1 << shift) - 1) >> shift != decay.size:
        raise ValueError(f"a weight-decay mask of {decay.size} entries fits no granule of {w.size} parameters")
    bc1 = 1 - beta1**step
    bc2 = 1 - beta2**step
    f = np.float32
    hyper = (f(lr), f(beta1), f(beta2), f(eps), f(weight_decay), f(bc1), f(bc2), np.int64(w.size),
             np.uint64(0) if ctrl is None else ctrl,  # ctrl: the kernels take gscale, bc1, bc2 from it
             np.int32(shift))
    mirror = be.weights.mirror_of(w)
    if mirror is not None:  # update and refresh the 16-bit copy in one pass
        mirror.stale = False
        be.kernel("elementwise", "adamw_h16")((blocks(w.size),), (256,), (w, g, m, v, decay, mirror.copy,
                                                                           np.int64(mirror.gap_at), np.int64(mirror.gap),
                                                                           np.int64(mirror.lo), np.int64(mirror.hi),
                                                                           f(gscale), *hyper))
    else:
        be.kernel("elementwise", "adamw")((blocks(w.size),), (256,), (w, g, m, v, decay, f(gscale), *hyper))
