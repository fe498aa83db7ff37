"""Hopper warp-group (wgmma) flash attention (andrea/kernels/attention_wgmma.cu, sm_90a only), every
variant checked against andrea/engine/numpy_backend.attn_fwd / attn_bwd and timed beside the production
mma.sync kernels (attention_mma's flash_fwd and flash_bwd), cuDNN's fused attention
(andrea/engine/cupy/cudnn_attention.py, where the frontend is installed) and PyTorch's
scaled_dot_product_attention (when torch is importable).

    python3 dev/cuda/attention_wgmma.py [--quick]

The kernels are built by the launcher's own loader (andrea/engine/cupy/attention_wgmma.py: NVRTC with
-arch=sm_90a, the cubin loaded by cupy.cuda.function.Module), not by common.build (CuPy's RawModule
cannot target sm_90a). Not dispatched by the engine yet, so every version is marked (dev):

wgmma            the defaults: 2 consumer warp groups (128 query rows a CTA), 64-key tiles, 3 stages,
                 intra-warpgroup overlap (S_j = Q·K_jᵀ issued before P_{j-1}·V_{j-1}; the softmax of
                 S_j while that runs); registers held for 2 CTAs per SM
wgmma no overlap -DFWD_OVERLAP=0: each tile's P·V after its own softmax
wgmma bn128      -DFWD_BN=128: 128-key tiles (twice the scores in registers: 1 CTA per SM)
wgmma 3wg        -DFWD_WG=3: 192 query rows a CTA (as FlashAttention-3 at head size 64)
wgmma 1wg        -DFWD_WG=1: 64 query rows a CTA
wgmma 4 stages   -DFWD_STAGES=4: each K/V tile fetched two iterations ahead
backward (flash_bwd_dq, flash_bwd_dkdv, and flash_bwd: delta by attention_mma's flash_delta, then both):
wgmma            the defaults: dQ with 2 warp groups (128 query rows a CTA) over 64-key tiles, dK/dV with 2
                 warp groups (128 keys a CTA) over 64-query tiles, 3 stages each
wgmma 1wg        -DDQ_WG=1 -DKV_WG=1: 64 rows (keys) a CTA, more CTAs per SM
wgmma bn128      -DDQ_BN=128 -DKV_BM=128: 128-wide streamed tiles
wgmma 4 stages   -DDQ_STAGES=4 -DKV_STAGES=4
The backward is run twice and must give the same bytes (deterministic: no atomics).
mma.sync         attention_mma.flash_fwd / flash_bwd, production today (a yardstick row: timed, and
                 checked as well)
cudnn            cuDNN's fused forward on the same buffers (a yardstick: its error is shown)
torch sdpa       PyTorch's flash backend (a yardstick: its error is shown)
Inputs bf16 or fp16 (the fp16 build has -DANDREA_FP16): q, k, v in one [B, T, 3, H, D] buffer as the
QKV projection writes it; y [B, T, H·D]; lse [B, H, T] fp32. y and lse are allocated with a guard
band after them that must stay untouched. Large shapes are checked on the first and last sequence.
On a GPU other than compute capability 9.0 (sm_90a code runs nowhere else) each shape gets one row
that says so, and nothing is checked.
"""

from __future__ import annotations

import math

import common
import numpy as np

from andrea.engine import numpy_backend as nb

SCRIPT = "attention_wgmma"
REFERENCES = {"flash_fwd": nb.attn_fwd, "flash_bwd_dq": nb.attn_bwd, "flash_bwd_dkdv": nb.attn_bwd, "flash_bwd": nb.attn_bwd}
V = common.Version
H16 = ("bf16", "fp16")
SRC = "attention_wgmma.cu"
DEV = False  # not dispatched by the engine yet: every version is a dev version
VERSIONS = [
    V("flash_fwd", "wgmma", ("flash_fwd",), SRC, H16, production=DEV),
    V("flash_fwd", "wgmma no overlap", ("flash_fwd",), SRC, H16, ("FWD_OVERLAP=0",), production=DEV),
    V("flash_fwd", "wgmma bn128", ("flash_fwd",), SRC, H16, ("FWD_BN=128",), production=DEV),
    V("flash_fwd", "wgmma 3wg", ("flash_fwd",), SRC, H16, ("FWD_WG=3",), production=DEV),
    V("flash_fwd", "wgmma 1wg", ("flash_fwd",), SRC, H16, ("FWD_WG=1",), production=DEV),
    V("flash_fwd", "wgmma 4 stages", ("flash_fwd",), SRC, H16, ("FWD_STAGES=4",), production=DEV),
]
BWD_VARIANTS = [("wgmma", ()), ("wgmma 1wg", ("DQ_WG=1", "KV_WG=1")), ("wgmma bn128", ("DQ_BN=128", "KV_BM=128")),
                ("wgmma 4 stages", ("DQ_STAGES=4", "KV_STAGES=4"))]
BWD_KERNELS = {"flash_bwd_dq": ("flash_bwd_dq",), "flash_bwd_dkdv": ("flash_bwd_dkdv",),
               "flash_bwd": ("flash_bwd_dq", "flash_bwd_dkdv")}  # flash_bwd: after attention_mma's flash_delta
VERSIONS += [V(op, name, kernels, SRC, H16, defines, production=DEV) for name, defines in BWD_VARIANTS
             for op, kernels in BWD_KERNELS.items()]
EDGE = [common.Shape("edge B=2 T=200 D=64", 2, 200, 192, 3, 301),  # T not a multiple of any tile
        common.Shape("edge B=2 T=129 D=32", 2, 129, 96, 3, 301),  # one row past a 128-row CTA
        common.Shape("edge B=1 T=37 D=16", 1, 37, 16, 1, 301),  # the smallest head, one partial tile
        common.Shape("edge B=1 T=1 D=64", 1, 1, 64, 1, 301)]  # a single query and key
GUARD = 4096  # elements after y and lse that the kernels must leave alone
GUARD_BITS, GUARD_LSE = 0xABCD, -7.0  # what the guard bands hold (0xABCD: a finite bf16 and fp16)


def guard_intact(whole, fill, what):
    tail = whole[-GUARD:].get()
    bad = int(np.count_nonzero(tail != np.asarray(fill, tail.dtype)))
    return common.Err(float(bad), 0.0 if bad == 0 else math.inf, True, f"{what}: {bad} guard elements overwritten" if bad else "")


def run_shape(cp, report, shape, rng, reps, prec):
    from andrea.engine.cupy import attention_mma, cudnn_attention
    from andrea.engine.cupy import attention_wgmma as wg
    from andrea.engine.cupy.backend import CupyBackend

    B, T, H, D, C = shape.B, shape.T, shape.H, shape.D, shape.C
    cc = cp.cuda.Device().compute_capability
    if cc != wg.CAPABILITY:  # a row that says so (ok, nothing checked): run_all counts a script without rows as broken
        report.add("flash_fwd", "wgmma", prec, shape, production=False,
                   note=f"skipped: compute capability {cc}, sm_90a code runs only on 9.0 (H100/H200)")
        return
    BH, scale = B * H, 1.0 / math.sqrt(D)
    u32, u16 = common.u("fp32"), common.u(prec)
    sub = sorted({0, B - 1})
    qkv = common.rounded(rng.standard_normal((B, T, 3, H, D)), prec)  # the values the kernels see
    qkv_s = qkv[sub].transpose(2, 0, 3, 1, 4)  # [3, b, H, T, D], the reference's layout

    y_ref, lse_ref = np.empty((len(sub), T, C)), np.empty((len(sub), H, T))
    nb.attn_fwd(qkv_s, y_ref, lse_ref)
    # as dev/cuda/attention_mma.py: scores are fp32 sums of exact products of 16-bit values (2·s_err for
    # the tensor cores' truncating accumulation); P as the A operand of P·v rounded to 16 bits (u16), the
    # row sum not (another u16); T-term fp32 sums; the output rounded once
    s_err = 2 * common.score_error(qkv_s[0], qkv_s[1], scale)
    c_fwd = 2 * s_err + 2 * u16 + (T + 10) * u32
    y_abs = common.attention_abs(qkv_s[0], qkv_s[1], qkv_s[2], lse_ref, scale)["y"]
    flops = 2 * BH * T * T * D  # causal: q·kᵀ and P·v over half of the T × T scores

    be = CupyBackend(prec)
    d_qkv = cp.asarray(common.to_h16(qkv, prec)).view(be.half)
    y_whole = cp.full(B * T * C + GUARD, GUARD_BITS, cp.uint16)  # 16-bit bits; the kernels see be.half
    lse_whole = cp.full(B * H * T + GUARD, GUARD_LSE, cp.float32)
    y16 = y_whole[:B * T * C].reshape(B, T, C)
    y, lse = y16.view(be.half), lse_whole[:B * H * T].reshape(B, H, T)

    def check():
        got = common.heads(common.from_h16(y16.get()[sub], prec), H)
        err = common.compare(got, common.heads(y_ref, H), rtol=u16, atol=c_fwd * y_abs + common.tiny(prec), what="y")
        err = err.worst(common.compare(lse.get()[sub], lse_ref, rtol=u32, atol=c_fwd, what="lse"))
        return err.worst(guard_intact(y_whole, GUARD_BITS, "y")).worst(guard_intact(lse_whole, GUARD_LSE, "lse"))

    def timed(run):
        y16.fill(0)
        lse.fill(0)
        run()
        err = check()
        ms = common.bench(cp, run, reps)
        return err, ms, common.tflops(flops, ms)

    if D not in wg.HEAD_DIMS:  # EDGE and the models' shapes are all 16, 32 or 64
        raise ValueError(f"{shape.name}: head size {D}; attention_wgmma takes {wg.HEAD_DIMS}")
    for ver in [v for v in VERSIONS if v.op == "flash_fwd"]:
        report.attempt(ver.op, ver.name, prec, shape, lambda ver=ver: timed(lambda: wg.flash_fwd(be, d_qkv, y, lse, ver.defines)),
                       ver.production)
    report.attempt("flash_fwd", "mma.sync", prec, shape, lambda: timed(lambda: attention_mma.flash_fwd(be, d_qkv, y, lse)),
                   production=True)

    if cudnn_attention._cudnn() is not None and cudnn_attention.takes(d_qkv, y, lse):
        cudnn = cudnn_attention.CudnnAttention()
        y16.fill(0)
        if cudnn.fwd(be, d_qkv, y, lse):  # a yardstick: its error is shown, not held to our tolerance
            err = check()
            ms = common.bench(cp, lambda: cudnn.fwd(be, d_qkv, y, lse), reps)
            report.add("flash_fwd", "cudnn", prec, shape, ms=ms, rate=common.tflops(flops, ms), production=False,
                       note=f"yardstick, max err {err.max_err:.2e}, err/tol {err.ratio:.3f}")
        else:
            report.add("flash_fwd", "cudnn", prec, shape, production=False, note="yardstick: cuDNN refused the shape")

    run_backward(cp, report, shape, prec, reps, be, qkv, sub, d_qkv, y, lse, s_err, rng, y_ref)


def run_backward(cp, report, shape, prec, reps, be, qkv, sub, d_qkv, y, lse, s_err, rng, y_ref):
    """dQ, dK/dV and the whole backward of every variant, from the default forward's y and lse (the
    reference is given the same values); the mma.sync, cuDNN and PyTorch backwards beside them."""
    from andrea.engine.cupy import attention_mma, cudnn_attention
    from andrea.engine.cupy import attention_wgmma as wg

    B, T, H, D, C = shape.B, shape.T, shape.H, shape.D, shape.C
    BH, scale = B * H, 1.0 / math.sqrt(D)
    u32, u16 = common.u("fp32"), common.u(prec)
    qkv_s = qkv[sub].transpose(2, 0, 3, 1, 4)
    dy = common.rounded(rng.standard_normal((B, T, C)), prec)
    d_dy = cp.asarray(common.to_h16(dy, prec)).view(be.half)
    wg.flash_fwd(be, d_qkv, y, lse)
    y_in = common.from_h16(y.view(cp.uint16).get()[sub], prec)
    lse_in = lse.get()[sub].astype(np.float64)
    dqkv_ref = np.empty_like(qkv_s)
    nb.attn_bwd(dy[sub], qkv_s, y_in, lse_in, dqkv_ref)
    delta_ref = (common.heads(dy[sub], H) * common.heads(y_in, H)).sum(-1)
    terms = common.attention_abs(qkv_s[0], qkv_s[1], qkv_s[2], lse_in, scale, common.heads(dy[sub], H), delta_ref)
    # as dev/cuda/attention_mma.py: P recomputed (2·s_err); dS (or P) rounded to 16 bits as an operand
    # (u16); dP and delta D-term fp32 sums; the outputs T-term fp32 sums rounded once (rtol u16)
    c_bwd = 2 * s_err + 2 * u16 + (T + 2 * D + 10) * u32
    dqkv16 = cp.zeros((B, T, 3, H, D), cp.uint16)
    dqkv = dqkv16.view(be.half)
    index = {"dq": 0, "dk": 1, "dv": 2}
    outputs = {"flash_bwd_dq": ("dq",), "flash_bwd_dkdv": ("dk", "dv"), "flash_bwd": ("dq", "dk", "dv")}
    products = {"flash_bwd_dq": 3, "flash_bwd_dkdv": 4, "flash_bwd": 5}  # causal: half of T² per product

    def check(names):
        err = common.Err()
        for name in names:
            got = common.from_h16(dqkv16.get()[sub][:, :, index[name]], prec).transpose(0, 2, 1, 3)
            err = err.worst(common.compare(got, dqkv_ref[index[name]], rtol=u16, atol=c_bwd * terms[name] + common.tiny(prec),
                                           what=name))
        return err

    def case(run, names, flops):
        dqkv16.fill(0)
        run()
        err = check(names)
        first = dqkv16.get()
        dqkv16.fill(0)
        run()  # deterministic: the very same bytes
        err = err.worst(common.exact(dqkv16.get(), first, what="bytes of a second run"))
        ms = common.bench(cp, run, reps)
        return err, ms, common.tflops(flops, ms)

    def one(kernel_name, defines):
        """One backward kernel alone, after the delta of the whole (flash_bwd writes it first)."""
        rows, threads, smem = wg.launch(kernel_name, D, defines + tuple(be.defines))
        f = wg.kernel("attention_wgmma", kernel_name, D, defines + tuple(be.defines), smem)
        flat, dflat = d_qkv.reshape(-1), dqkv.reshape(-1)
        q, k, v = flat, flat[H * D:], flat[2 * H * D:]
        delta = be.scratch("flash_delta", (B, H, T), cp.float32)
        outs = (dflat,) if kernel_name == "flash_bwd_dq" else (dflat[H * D:], dflat[2 * H * D:])
        strides = (np.int64(T * 3 * C), np.int64(3 * C), np.int64(D))
        args = (q, k, v, d_dy, lse, delta) + outs + (np.int32(H), np.int32(T)) + strides + (np.float32(scale),)
        return lambda: f(((T + rows - 1) // rows, BH), (threads,), args, shared_mem=smem)

    for name, defines in BWD_VARIANTS:
        for op, kernels in BWD_KERNELS.items():
            if op == "flash_bwd":
                run = lambda defines=defines: wg.flash_bwd(be, d_dy, d_qkv, y, lse, dqkv, defines)  # noqa: E731
            else:
                wg.flash_bwd(be, d_dy, d_qkv, y, lse, dqkv, defines)  # delta, and compiled
                run = one(kernels[0], defines)
            report.attempt(op, name, prec, shape, lambda run=run, op=op: case(run, outputs[op], products[op] * BH * T * T * D),
                           DEV)
    report.attempt("flash_bwd", "mma.sync", prec, shape,
                   lambda: case(lambda: attention_mma.flash_bwd(be, d_dy, d_qkv, y, lse, dqkv), outputs["flash_bwd"],
                                products["flash_bwd"] * BH * T * T * D), production=True)

    if cudnn_attention._cudnn() is not None and cudnn_attention.takes(d_qkv, y, lse, d_dy, dqkv):
        cudnn = cudnn_attention.CudnnAttention()
        dqkv16.fill(0)
        if cudnn.bwd(be, d_dy, d_qkv, y, lse, dqkv):  # a yardstick: its error is shown, not held to our tolerance
            err = check(outputs["flash_bwd"])
            ms = common.bench(cp, lambda: cudnn.bwd(be, d_dy, d_qkv, y, lse, dqkv), reps)
            report.add("flash_bwd", "cudnn", prec, shape, ms=ms, rate=common.tflops(5 * BH * T * T * D, ms), production=False,
                       note=f"yardstick, max err {err.max_err:.2e}, err/tol {err.ratio:.3f}")
        else:
            report.add("flash_bwd", "cudnn", prec, shape, production=False,
                       note="yardstick not run: cuDNN refused the shape, or production runs ours here (cudnn_attention.bwd)")

    flops = 2 * BH * T * T * D
    got = common.torch_sdpa(*(qkv.transpose(2, 0, 3, 1, 4)), common.heads(dy, H), prec, reps)
    if got is not None:  # a yardstick: its error is shown, not held to our tolerance
        (ty, *_), fwd_ms, bwd_ms = got
        max_err = float(np.abs(ty[sub] - common.heads(y_ref, H)).max())
        report.add("flash_fwd", "torch sdpa", prec, shape, ms=fwd_ms, rate=common.tflops(flops, fwd_ms), production=False,
                   note=f"yardstick, max err {max_err:.2e}")
        report.add("flash_bwd", "torch sdpa", prec, shape, ms=bwd_ms, rate=common.tflops(2.5 * flops, bwd_ms),
                   production=False, note="yardstick")


def main(argv=None) -> int:
    runs = [lambda cp, report, shape, rng, reps, prec=prec: run_shape(cp, report, shape, rng, reps, prec) for prec in H16]
    return common.run_script(__doc__, SCRIPT, EDGE, runs, argv)


if __name__ == "__main__":
    raise SystemExit(main())
