"""Tensor-core flash attention (andrea/kernels/attention_mma.cu, the bf16 and fp16 modes'
attention), every variant checked against andrea/engine/numpy_backend.attn_fwd / attn_bwd and
timed, next to PyTorch's scaled_dot_product_attention (flash) when torch is importable.

    python3 dev/cuda/attention_mma.py [--quick]

async        production: tiles double-buffered with cp.async, B fragments through ldmatrix,
             ex2.approx, masks on edge tiles only (flash_fwd, flash_bwd_dq, flash_bwd_dkdv)
async minb4  the same compiled with -DFLASH_MINB=4: the forward held to 128 registers so that four
             blocks share an SM (dev only)
async 8 warps minb2  the forward with 128 query rows per block of 8 warps (-DFWD_WARPS=8), each
             key tile serving twice the rows, held to 128 registers (two blocks per SM); slower
             than 4 warps on the H200 (120M B=8: 0.092 against 0.084 ms)
async whole  the backward kernels scoring whole 64-wide tiles at once, no register cap
             (-DDQ_SPLIT=1 -DDQ_MINB=1 -DDKDV_SPLIT=1 -DDKDV_MINB=1: production before 2026-11-30
             night; 213 and 244 registers, two blocks per SM at D = 64)
async split2 dQ in two 32-column parts too, three blocks per SM (dev only; production: dQ in four
             parts at four blocks per SM, dK/dV in two at D = 64 and four at D = 32, three blocks)
sync         synchronous tile loads (dev/cuda/attention_mma_sync.cu, dev only; was production
             "variant 1")
flash_delta  delta = Σ_d dy·y per row, the backward's first kernel
Inputs bf16 or fp16 (the fp16 build has -DANDREA_FP16): q, k, v in one [B, T, 3, H, D] buffer as
the QKV projection writes it; y, dy [B, T, H·D]; lse, delta [B, H, T] fp32. The backward is also
run twice and must give the same bytes (deterministic: no atomics). Large shapes are checked on
the first and last sequence of the batch.
"""

from __future__ import annotations

import math

import common
import numpy as np

from andrea.engine import numpy_backend as nb


def delta_reference(dy, y, H):
    """delta[b, h, i] = Σ_d dy·y: the `delta` line of numpy_backend.attn_bwd (not exposed there)."""
    return (common.heads(dy, H) * common.heads(y, H)).sum(-1)


SCRIPT = "attention_mma"
REFERENCES = {"flash_delta": delta_reference, "flash_fwd": nb.attn_fwd, "flash_bwd_dq": nb.attn_bwd,
              "flash_bwd_dkdv": nb.attn_bwd, "flash_bwd": nb.attn_bwd}
V = common.Version
H16 = ("bf16", "fp16")
SRC, SYNC = "attention_mma.cu", "dev/cuda/attention_mma_sync.cu"
MINB4 = ("FLASH_MINB=4",)
WHOLE = ("DQ_SPLIT=1", "DQ_MINB=1", "DKDV_SPLIT=1", "DKDV_MINB=1")
SPLIT2 = ("DQ_SPLIT=2", "DQ_MINB=3", "DKDV_SPLIT=2", "DKDV_MINB=3")
VERSIONS = [
    V("flash_delta", "flash_delta", ("flash_delta",), SRC, H16),
    V("flash_fwd", "sync", ("flash_fwd_sync",), SYNC, H16, production=False),
    V("flash_fwd", "async", ("flash_fwd",), SRC, H16),
    V("flash_fwd", "async minb4", ("flash_fwd",), SRC, H16, MINB4, production=False),
    V("flash_fwd", "async 8 warps minb2", ("flash_fwd",), SRC, H16, ("FWD_WARPS=8", "FLASH_MINB=2"), production=False),
    V("flash_bwd_dq", "sync", ("flash_bwd_dq_sync",), SYNC, H16, production=False),
    V("flash_bwd_dq", "async", ("flash_bwd_dq",), SRC, H16),
    V("flash_bwd_dq", "async whole", ("flash_bwd_dq",), SRC, H16, WHOLE, production=False),
    V("flash_bwd_dq", "async split2", ("flash_bwd_dq",), SRC, H16, SPLIT2, production=False),
    V("flash_bwd_dkdv", "sync", ("flash_bwd_dkdv_sync",), SYNC, H16, production=False),
    V("flash_bwd_dkdv", "async", ("flash_bwd_dkdv",), SRC, H16),
    V("flash_bwd_dkdv", "async whole", ("flash_bwd_dkdv",), SRC, H16, WHOLE, production=False),
    V("flash_bwd_dkdv", "async split2", ("flash_bwd_dkdv",), SRC, H16, SPLIT2, production=False),
    # the whole backward (delta, dQ, dK/dV) per variant, for the comparison with PyTorch
    V("flash_bwd", "sync", ("flash_delta", "flash_bwd_dq_sync", "flash_bwd_dkdv_sync"), SYNC, H16, production=False),
    V("flash_bwd", "async", ("flash_delta", "flash_bwd_dq", "flash_bwd_dkdv"), SRC, H16),
    V("flash_bwd", "async whole", ("flash_delta", "flash_bwd_dq", "flash_bwd_dkdv"), SRC, H16, WHOLE, production=False),
    V("flash_bwd", "async split2", ("flash_delta", "flash_bwd_dq", "flash_bwd_dkdv"), SRC, H16, SPLIT2, production=False),
]
TILE = 64
FWD_WARPS = 4  # attention_mma.cu's default (andrea.engine.cupy.attention_mma.FWD_WARPS)
EDGE = [common.Shape("edge B=2 T=200 D=64", 2, 200, 192, 3, 301),  # T not a multiple of the tiles
        common.Shape("edge B=2 T=200 D=32", 2, 200, 96, 3, 301),
        common.Shape("edge B=1 T=37 D=16", 1, 37, 16, 1, 301)]  # the smallest head and a partial tile


def fwd_warps(v) -> int:
    """Warps per block of a version's forward kernel (-DFWD_WARPS, else the source's default)."""
    return next((int(d.split("=")[1]) for d in v.defines if d.startswith("FWD_WARPS=")), FWD_WARPS)


def kernels(cp, v, prec, D):
    """{declared name: kernel} for version v built for precision prec and head width D."""
    built = common.build(cp, v, prec, head_dim=D)
    return dict(zip(v.kernels, built.values()))


def run_shape(cp, report, shape, rng, reps, prec):
    B, T, H, D, C = shape.B, shape.T, shape.H, shape.D, shape.C
    BH, scale = B * H, 1.0 / math.sqrt(D)
    u32, u16 = common.u("fp32"), common.u(prec)
    sub = sorted({0, B - 1})
    qkv = common.rounded(rng.standard_normal((B, T, 3, H, D)), prec)  # the values the kernels see
    dy = common.rounded(rng.standard_normal((B, T, C)), prec)
    qkv_s = qkv[sub].transpose(2, 0, 3, 1, 4)  # [3, b, H, T, D], the reference's layout
    dy_s = dy[sub]

    y_ref, lse_ref = np.empty((len(sub), T, C)), np.empty((len(sub), H, T))
    nb.attn_fwd(qkv_s, y_ref, lse_ref)
    # scores are fp32 sums of exact products of 16-bit values: 2·s_err allows for the tensor cores'
    # truncating accumulation; P as the A operand of P·v is rounded to 16 bits (u16), the row sum
    # is not (another u16 between numerator and denominator), T-term fp32 sums; the output rounded once
    s_err = 2 * common.score_error(qkv_s[0], qkv_s[1], scale)
    c_fwd = 2 * s_err + 2 * u16 + (T + 10) * u32
    y_abs = common.attention_abs(qkv_s[0], qkv_s[1], qkv_s[2], lse_ref, scale)["y"]
    flops = 2 * BH * T * T * D  # causal: q·kᵀ and P·v over half of the T × T scores

    d_qkv = cp.asarray(common.to_h16(qkv, prec))
    flat = d_qkv.reshape(-1)
    q, k, v = flat, flat[H * D:], flat[2 * H * D:]
    strides = (np.int64(T * 3 * C), np.int64(3 * C), np.int64(D))
    d_dy = cp.asarray(common.to_h16(dy, prec))
    grid, sc, hT = ((T + TILE - 1) // TILE, BH), np.float32(scale), (np.int32(H), np.int32(T))
    y = cp.zeros((B, T, C), cp.uint16)
    lse = cp.zeros((B, H, T), cp.float32)

    def check_fwd():
        got = common.heads(common.from_h16(y.get()[sub], prec), H)
        err = common.compare(got, common.heads(y_ref, H), rtol=u16, atol=c_fwd * y_abs + common.tiny(prec), what="y")
        return err.worst(common.compare(lse.get()[sub], lse_ref, rtol=u32, atol=c_fwd, what="lse"))

    for ver in [v for v in VERSIONS if v.op == "flash_fwd"]:
        def case(ver=ver):
            kf = kernels(cp, ver, prec, D)[ver.kernels[0]]
            warps = fwd_warps(ver)
            g = ((T + 16 * warps - 1) // (16 * warps), BH)
            run = lambda: kf(g, (32 * warps,), (q, k, v, y, lse) + hT + strides + (sc,))  # noqa: E731
            y.fill(0)
            run()
            err = check_fwd()
            ms = common.bench(cp, run, reps)
            return err, ms, common.tflops(flops, ms)

        report.attempt(ver.op, ver.name, prec, shape, case, ver.production)

    # backward, from the production forward's y and lse (the reference is given the same values)
    kernels(cp, VERSIONS[2], prec, D)["flash_fwd"](((T + 16 * FWD_WARPS - 1) // (16 * FWD_WARPS), BH), (32 * FWD_WARPS,),
                                                   (q, k, v, y, lse) + hT + strides + (sc,))
    y_in, lse_in = common.from_h16(y.get()[sub], prec), lse.get()[sub].astype(np.float64)
    dqkv_ref = np.empty_like(qkv_s)
    nb.attn_bwd(dy_s, qkv_s, y_in, lse_in, dqkv_ref)
    delta_ref = delta_reference(dy_s, y_in, H)
    terms = common.attention_abs(qkv_s[0], qkv_s[1], qkv_s[2], lse_in, scale, common.heads(dy_s, H), delta_ref)
    # P recomputed (2·s_err); dS (or P) rounded to 16 bits as an operand (u16), dP and delta D-term
    # fp32 sums, the outputs T-term fp32 sums rounded once to 16 bits (rtol u16)
    c_bwd = 2 * s_err + 2 * u16 + (T + 2 * D + 10) * u32
    delta = cp.zeros((B, H, T), cp.float32)
    rows = B * T * H
    kd = kernels(cp, VERSIONS[0], prec, D)["flash_delta"]
    run_delta = lambda: kd((common.blocks(rows, 8),), (256,), (d_dy, y, delta, np.int32(B), np.int32(H), np.int32(T)))  # noqa: E731

    def case_delta():
        run_delta()
        dabs = (np.abs(common.heads(dy_s, H)) * np.abs(common.heads(y_in, H))).sum(-1)
        err = common.compare(delta.get()[sub], delta_ref, rtol=0, atol=(D + 1) * u32 * dabs)  # D exact products, fp32 sum
        ms = common.bench(cp, run_delta, reps)
        return err, ms, common.gbps(2 * B * T * C * 2 + BH * T * 4, ms)

    report.attempt("flash_delta", "flash_delta", prec, shape, case_delta)
    run_delta()

    index = {"dq": 0, "dk": 1, "dv": 2}

    def check_bwd(name, buf):
        got = common.from_h16(buf.get()[sub][:, :, index[name]], prec).transpose(0, 2, 1, 3)
        return common.compare(got, dqkv_ref[index[name]], rtol=u16, atol=c_bwd * terms[name] + common.tiny(prec), what=name)

    def deterministic(run, buf):
        """Run again into a zeroed buffer: the very same bytes."""
        first = buf.get()
        buf.fill(0)
        run()
        return common.exact(buf.get(), first, what="bytes of a second run")

    dqkv = cp.zeros_like(d_qkv)
    dflat = dqkv.reshape(-1)
    dq, dk, dv = dflat, dflat[H * D:], dflat[2 * H * D:]
    bwd_args = (q, k, v, d_dy, lse, delta)

    def launcher(ver):
        kb = kernels(cp, ver, prec, D)
        runs = []
        for name in ver.kernels:
            if name.startswith("flash_delta"):
                runs.append(run_delta)
            elif name.startswith("flash_bwd_dq"):
                runs.append(lambda f=kb[name]: f(grid, (128,), bwd_args + (dq,) + hT + strides + (sc,)))
            else:
                runs.append(lambda f=kb[name]: f(grid, (128,), bwd_args + (dk, dv) + hT + strides + (sc,)))
        return lambda: [r() for r in runs]

    products = {"flash_bwd_dq": 3, "flash_bwd_dkdv": 4, "flash_bwd": 5}  # causal: half of T² per product
    outputs = {"flash_bwd_dq": ("dq",), "flash_bwd_dkdv": ("dk", "dv"), "flash_bwd": ("dq", "dk", "dv")}
    for ver in [v for v in VERSIONS if v.op.startswith("flash_bwd")]:
        def case(ver=ver):
            run = launcher(ver)
            dqkv.fill(0)
            run()
            err = common.Err()
            for name in outputs[ver.op]:
                err = err.worst(check_bwd(name, dqkv))
            err = err.worst(deterministic(run, dqkv))
            ms = common.bench(cp, run, reps)
            return err, ms, common.tflops(products[ver.op] * BH * T * T * D, ms)

        report.attempt(ver.op, ver.name, prec, shape, case, ver.production)

    got = common.torch_sdpa(*(qkv.transpose(2, 0, 3, 1, 4)), common.heads(dy, H), prec, reps)
    if got is not None:  # a yardstick: its error is shown, not held to our tolerance
        (ty, *_), fwd_ms, bwd_ms = got
        err = common.compare(ty[sub], common.heads(y_ref, H), rtol=u16, atol=c_fwd * y_abs + common.tiny(prec))
        report.add("flash_fwd", "torch sdpa", prec, shape, ms=fwd_ms, rate=common.tflops(flops, fwd_ms), production=False,
                   note=f"yardstick, max err {err.max_err:.2e}")
        report.add("flash_bwd", "torch sdpa", prec, shape, ms=bwd_ms, rate=common.tflops(2.5 * flops, bwd_ms),
                   production=False, note="yardstick")


def once(cp, shape, prec="bf16"):
    """One forward and backward of the production kernels, nothing else (for a profiler)."""
    B, T, H, D, C = shape.B, shape.T, shape.H, shape.D, shape.C
    rng = np.random.default_rng(0)
    qkv = cp.asarray(common.to_h16(rng.standard_normal((B, T, 3, H, D)), prec)).reshape(-1)
    dy = cp.asarray(common.to_h16(rng.standard_normal((B, T, C)), prec))
    y, dqkv = cp.zeros((B, T, C), cp.uint16), cp.zeros_like(qkv)
    lse, delta = cp.zeros((B, H, T), cp.float32), cp.zeros((B, H, T), cp.float32)
    fwd = kernels(cp, VERSIONS[2], prec, D)["flash_fwd"]
    bwd = kernels(cp, next(v for v in VERSIONS if v.op == "flash_bwd" and v.production), prec, D)
    grid, hT = ((T + TILE - 1) // TILE, B * H), (np.int32(H), np.int32(T))
    strides, sc = (np.int64(T * 3 * C), np.int64(3 * C), np.int64(D)), np.float32(1 / math.sqrt(D))
    q, k, v = qkv, qkv[H * D:], qkv[2 * H * D:]
    fwd(((T + 16 * FWD_WARPS - 1) // (16 * FWD_WARPS), B * H), (32 * FWD_WARPS,), (q, k, v, y, lse) + hT + strides + (sc,))
    bwd["flash_delta"]((common.blocks(B * T * H, 8),), (256,), (dy, y, delta, np.int32(B)) + hT)
    bwd["flash_bwd_dq"](grid, (128,), (q, k, v, dy, lse, delta, dqkv) + hT + strides + (sc,))
    bwd["flash_bwd_dkdv"](grid, (128,), (q, k, v, dy, lse, delta, dqkv[H * D:], dqkv[2 * H * D:]) + hT + strides + (sc,))
    cp.cuda.Device().synchronize()


def main(argv=None) -> int:
    def profile_once(cp, args):
        if args.once:
            once(cp, common.model_shapes(args.quick)[-1])
            return 0
        return None

    runs = [lambda cp, report, shape, rng, reps, prec=prec: run_shape(cp, report, shape, rng, reps, prec) for prec in H16]
    return common.run_script(__doc__, SCRIPT, EDGE, runs, argv, extra_args=lambda ap: ap.add_argument(
        "--once", action="store_true", help="one forward and backward of the production kernels at the largest "
        "model shape, nothing checked or timed (for a profiler: ncu -k regex:flash python3 dev/cuda/attention_mma.py --once)"),
        before=profile_once)


if __name__ == "__main__":
    raise SystemExit(main())
