"""Hopper warp-group (wgmma) flash attention (andrea/kernels/attention_wgmma.cu, sm_90a only), every
variant checked against andrea/engine/numpy_backend.attn_fwd and timed beside the production mma.sync
kernel (attention_mma's flash_fwd), cuDNN's fused attention (andrea/engine/cupy/cudnn_attention.py,
where the frontend is installed) and PyTorch's scaled_dot_product_attention (when torch is importable).

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
mma.sync         attention_mma.flash_fwd, production today (a yardstick row: timed, and checked as well)
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
REFERENCES = {"flash_fwd": nb.attn_fwd}
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

    if D not in wg.HEAD_DIMS:
        raise ValueError(f"{shape.name}: head size {D}; attention_wgmma takes {wg.HEAD_DIMS}")
    for ver in VERSIONS:
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

    got = common.torch_sdpa(*(qkv.transpose(2, 0, 3, 1, 4)), np.zeros((B, H, T, D)), prec, reps)
    if got is not None:  # a yardstick: its error is shown, not held to our tolerance
        (ty, *_), fwd_ms, _ = got
        err = common.compare(ty[sub], common.heads(y_ref, H), rtol=u16, atol=c_fwd * y_abs + common.tiny(prec))
        report.add("flash_fwd", "torch sdpa", prec, shape, ms=fwd_ms, rate=common.tflops(flops, fwd_ms), production=False,
                   note=f"yardstick, max err {err.max_err:.2e}")


def main(argv=None) -> int:
    runs = [lambda cp, report, shape, rng, reps, prec=prec: run_shape(cp, report, shape, rng, reps, prec) for prec in H16]
    return common.run_script(__doc__, SCRIPT, EDGE, runs, argv)


if __name__ == "__main__":
    raise SystemExit(main())
