"""fp32 attention kernels (andrea/kernels/attention.cu, the fp32 mode's attention), and strip
attention (dev/cuda/attention_strip.cu, no longer in production), checked against
andrea/engine/numpy_backend.attn_fwd / attn_bwd and timed, next to PyTorch's fp32
scaled_dot_product_attention when torch is importable.

    python3 dev/cuda/attention.py [--quick]

flash (attention.cu)  CUDA-core flash attention: one thread per query (or key) row, tiles in
                      shared memory, online softmax; attn_fwd, attn_delta, attn_bwd_dq/dk/dv
strip (dev only)      the scores of 128 queries against the keys before them as batched GEMMs
                      (cupy.matmul, fp32), the causal softmax and its gradient as row kernels
Layouts as in production: q, k, v [B, H, T, D] slices of qkv [3, B, H, T, D]; y, dy [B, T, H·D];
lse, delta [B, H, T]. Large shapes are checked on the first and last sequence of the batch (heads
are independent; the reference holds B·H·T² float64 scores otherwise).
"""

from __future__ import annotations

import math

import common
import numpy as np

from andrea.engine import numpy_backend as nb


def delta_reference(dy, y, H):
    """delta[b, h, i] = Σ_d dy·y: the `delta` line of numpy_backend.attn_bwd (not exposed there)."""
    return (common.heads(dy, H) * common.heads(y, H)).sum(-1)


SCRIPT = "attention"
REFERENCES = {"attn_fwd": nb.attn_fwd, "attn_delta": delta_reference, "attn_bwd_dq": nb.attn_bwd,
              "attn_bwd_dk": nb.attn_bwd, "attn_bwd_dv": nb.attn_bwd, "attn_bwd": nb.attn_bwd}
V = common.Version
STRIP_SRC = "dev/cuda/attention_strip.cu"
VERSIONS = [
    V("attn_fwd", "flash", ("attn_fwd",), "attention.cu"),
    V("attn_fwd", "strip", ("strip_softmax_fwd",), STRIP_SRC, production=False),
    V("attn_delta", "attn_delta", ("attn_delta",), "attention.cu"),
    V("attn_bwd_dq", "flash", ("attn_bwd_dq",), "attention.cu"),
    V("attn_bwd_dk", "flash", ("attn_bwd_dk",), "attention.cu"),
    V("attn_bwd_dv", "flash", ("attn_bwd_dv",), "attention.cu"),
    V("attn_bwd", "flash", ("attn_delta", "attn_bwd_dq", "attn_bwd_dk", "attn_bwd_dv"), "attention.cu"),
    V("attn_bwd", "strip", ("strip_probs", "strip_dsoftmax"), STRIP_SRC, production=False),
]
BQ = 64  # attention.cu: queries (and keys) per block
STRIP = 128  # queries per strip
EDGE = [common.Shape("edge B=2 T=200 D=32", 2, 200, 96, 3, 301),  # T not a multiple of the tiles
        common.Shape("edge B=2 T=200 D=64", 2, 200, 192, 3, 301)]


def strip_fwd(cp, kern, q, k, v, y, lse, B, H, T, D):
    """Strip attention forward; q, k, v [B·H, T, D] fp32."""
    BH, sq, scale = B * H, min(STRIP, T), np.float32(1.0 / math.sqrt(D))
    S = cp.zeros((BH, sq, T), cp.float32)  # the kernels read rows of T columns: zeros, never garbage
    out = cp.empty((BH, T, D), cp.float32)
    for i0 in range(0, T, sq):
        rows, keys = min(sq, T - i0), min(T, i0 + sq)
        S[:, :rows, :keys] = cp.matmul(q[:, i0:i0 + rows], k[:, :keys].transpose(0, 2, 1))
        kern((rows, BH), (128,), (S, lse, np.int32(sq), np.int32(T), np.int32(T), np.int32(i0), scale))
        out[:, i0:i0 + rows] = cp.matmul(S[:, :rows, :keys], v[:, :keys])
    y[...] = out.reshape(B, H, T, D).transpose(0, 2, 1, 3).reshape(B, T, H * D)


def strip_bwd(cp, kerns, delta_kernel, dy, q, k, v, y, lse, dq, dk, dv, B, H, T, D):
    """Strip attention backward into dq, dk, dv [B·H, T, D]."""
    BH, sq, scale = B * H, min(STRIP, T), np.float32(1.0 / math.sqrt(D))
    delta = cp.empty((B, H, T), cp.float32)
    delta_kernel((common.blocks(B * H * T),), (256,), (dy, y, delta, np.int32(B), np.int32(H), np.int32(T)))
    do = cp.ascontiguousarray(dy.reshape(B, T, H, D).transpose(0, 2, 1, 3)).reshape(BH, T, D)
    S = cp.zeros((BH, sq, T), cp.float32)
    dP = cp.zeros((BH, sq, T), cp.float32)
    dk[...] = 0
    dv[...] = 0
    for i0 in range(0, T, sq):
        rows, keys = min(sq, T - i0), min(T, i0 + sq)
        grid, tail = (rows, BH), (np.int32(sq), np.int32(T), np.int32(T), np.int32(i0), scale)
        qs, dos = q[:, i0:i0 + rows], do[:, i0:i0 + rows]
        S[:, :rows, :keys] = cp.matmul(qs, k[:, :keys].transpose(0, 2, 1))
        kerns["strip_probs"](grid, (128,), (S, lse) + tail)
        P = S[:, :rows, :keys]
        dv[:, :keys] += cp.matmul(P.transpose(0, 2, 1), dos)
        dP[:, :rows, :keys] = cp.matmul(dos, v[:, :keys].transpose(0, 2, 1))
        kerns["strip_dsoftmax"](grid, (128,), (dP, S, delta) + tail)
        dS = dP[:, :rows, :keys]
        dq[:, i0:i0 + rows] = cp.matmul(dS, k[:, :keys])
        dk[:, :keys] += cp.matmul(dS.transpose(0, 2, 1), qs)


def run_shape(cp, report, shape, rng, reps):
    B, T, H, D, C = shape.B, shape.T, shape.H, shape.D, shape.C
    BH, scale = B * H, 1.0 / math.sqrt(D)
    u = common.u("fp32")
    sub = sorted({0, B - 1})  # the sequences the reference covers
    qkv = rng.standard_normal((3, B, H, T, D)).astype(np.float32)
    dy = rng.standard_normal((B, T, C)).astype(np.float32)
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    qkv_s, dy_s = f64(qkv[:, sub]), f64(dy[sub])

    y_ref, lse_ref = np.empty((len(sub), T, C)), np.empty((len(sub), H, T))
    nb.attn_fwd(qkv_s, y_ref, lse_ref)
    s_err = common.score_error(qkv_s[0], qkv_s[1], scale)
    # y = Σ P v / Σ P: each P off by ≤ 2·s_err relative (scores, and the max/lse through them), T-term sums
    c_fwd = 2 * s_err + (T + 10) * u
    y_abs = common.attention_abs(qkv_s[0], qkv_s[1], qkv_s[2], lse_ref, scale)["y"]

    def check_fwd(y, lse):
        err = common.compare(common.heads(y.get()[sub], H), common.heads(y_ref, H), rtol=0, atol=c_fwd * y_abs, what="y")
        return err.worst(common.compare(lse.get()[sub], lse_ref, rtol=u, atol=c_fwd, what="lse"))  # log of a T-term sum

    flops = 2 * BH * T * T * D  # causal: q·kᵀ and P·v over half of the T × T scores
    d_qkv, d_dy = cp.asarray(qkv), cp.asarray(dy)
    q, k, v = d_qkv[0], d_qkv[1], d_qkv[2]
    y, lse = cp.zeros((B, T, C), cp.float32), cp.zeros((B, H, T), cp.float32)
    kf = common.build(cp, VERSIONS[0], head_dim=D)["attn_fwd"]
    grid = ((T + BQ - 1) // BQ, BH)
    sc = np.float32(scale)
    flash_fwd = lambda: kf(grid, (BQ,), (q, k, v, y, lse, np.int32(H), np.int32(T), sc))  # noqa: E731

    def case_flash_fwd():
        flash_fwd()
        err = check_fwd(y, lse)
        ms = common.bench(cp, flash_fwd, reps)
        return err, ms, common.tflops(flops, ms)

    report.attempt("attn_fwd", "flash", "fp32", shape, case_flash_fwd)

    ks = common.build(cp, VERSIONS[1])["strip_softmax_fwd"]
    q3, k3, v3 = (a.reshape(BH, T, D) for a in (q, k, v))
    y2, lse2 = cp.zeros_like(y), cp.zeros_like(lse)
    strip = lambda: strip_fwd(cp, ks, q3, k3, v3, y2, lse2, B, H, T, D)  # noqa: E731

    def case_strip_fwd():
        strip()
        # the GEMMs are fp32 (cuBLAS without TF32): the same error terms as the flash kernel
        err = check_fwd(y2, lse2)
        ms = common.bench(cp, strip, reps)
        return err, ms, common.tflops(flops, ms)

    report.attempt("attn_fwd", "strip", "fp32", shape, case_strip_fwd, production=False)

    # backward, from the production forward's y and lse (the reference is given the same values)
    flash_fwd()
    y_in, lse_in = f64(y.get()[sub]), f64(lse.get()[sub])
    dqkv_ref = np.empty_like(qkv_s)
    nb.attn_bwd(dy_s, qkv_s, y_in, lse_in, dqkv_ref)
    delta_ref = delta_reference(dy_s, y_in, H)
    terms = common.attention_abs(qkv_s[0], qkv_s[1], qkv_s[2], lse_in, scale, common.heads(dy_s, H), delta_ref)
    # P recomputed (2·s_err), dP and delta sums of D terms, the outputs sums of ≤ T terms
    c_bwd = 2 * s_err + (T + 2 * D + 10) * u
    kd = common.build(cp, VERSIONS[2], head_dim=D)["attn_delta"]
    delta = cp.zeros((B, H, T), cp.float32)
    run_delta = lambda: kd((common.blocks(BH * T),), (256,), (d_dy, y, delta, np.int32(B), np.int32(H), np.int32(T)))  # noqa: E731

    def case_delta():
        run_delta()
        dabs = (np.abs(common.heads(dy_s, H)) * np.abs(common.heads(y_in, H))).sum(-1)
        err = common.compare(delta.get()[sub], delta_ref, rtol=0, atol=(D + 1) * u * dabs)  # a D-term sum
        ms = common.bench(cp, run_delta, reps)
        return err, ms, common.gbps(2 * B * T * C * 4 + BH * T * 4, ms)

    report.attempt("attn_delta", "attn_delta", "fp32", shape, case_delta)
    run_delta()

    kb = common.build(cp, VERSIONS[6], head_dim=D)
    dq, dk, dv = (cp.zeros((B, H, T, D), cp.float32) for _ in range(3))
    common_args = (q, k, v, d_dy, lse, delta)
    tail = (np.int32(H), np.int32(T), sc)
    launches = {
        "dq": (lambda: kb["attn_bwd_dq"](grid, (BQ,), common_args + (dq,) + tail), dq, 3),
        "dk": (lambda: kb["attn_bwd_dk"](grid, (BQ,), common_args + (dk,) + tail), dk, 3),
        "dv": (lambda: kb["attn_bwd_dv"](grid, (BQ,), (q, k, d_dy, lse, delta, dv) + tail), dv, 2),
    }
    index = {"dq": 0, "dk": 1, "dv": 2}

    def check_bwd(name, got):
        return common.compare(got.get()[sub], dqkv_ref[index[name]], rtol=0, atol=c_bwd * terms[name], what=name)

    for name, (launch, out, products) in launches.items():
        def case(launch=launch, out=out, products=products, name=name):
            launch()
            ms = common.bench(cp, launch, reps)
            return check_bwd(name, out), ms, common.tflops(products * BH * T * T * D, ms)  # causal: half of T² per product

        report.attempt(f"attn_bwd_{name}", "flash", "fp32", shape, case)

    def flash_bwd():
        run_delta()
        for launch, _, _ in launches.values():
            launch()

    def case_flash_bwd():
        flash_bwd()
        err = check_bwd("dq", dq).worst(check_bwd("dk", dk)).worst(check_bwd("dv", dv))
        ms = common.bench(cp, flash_bwd, reps)
        return err, ms, common.tflops(2.5 * flops, ms)  # the backward's useful products: 2.5 × the forward's

    report.attempt("attn_bwd", "flash", "fp32", shape, case_flash_bwd)

    kst = common.build(cp, VERSIONS[7])
    sdq, sdk, sdv = (cp.zeros((BH, T, D), cp.float32) for _ in range(3))
    strip_b = lambda: strip_bwd(cp, kst, kd, d_dy, q3, k3, v3, y, lse, sdq, sdk, sdv, B, H, T, D)  # noqa: E731

    def case_strip_bwd():
        strip_b()
        err = common.Err()
        for name, got in (("dq", sdq), ("dk", sdk), ("dv", sdv)):
            err = err.worst(check_bwd(name, got.reshape(B, H, T, D)))
        ms = common.bench(cp, strip_b, reps)
        return err, ms, common.tflops(2.5 * flops, ms)

    report.attempt("attn_bwd", "strip", "fp32", shape, case_strip_bwd, production=False)

    got = common.torch_sdpa(*(f64(a) for a in (qkv[0], qkv[1], qkv[2])), common.heads(f64(dy), H), "fp32", reps)
    if got is not None:  # a yardstick: its error is shown, not held to our tolerance
        (ty, tdq, tdk, tdv), fwd_ms, bwd_ms = got
        err = common.compare(ty[sub], common.heads(y_ref, H), rtol=0, atol=c_fwd * y_abs)
        report.add("attn_fwd", "torch sdpa", "fp32", shape, ms=fwd_ms, rate=common.tflops(flops, fwd_ms), production=False,
                   note=f"yardstick, max err {err.max_err:.2e}")
        report.add("attn_bwd", "torch sdpa", "fp32", shape, ms=bwd_ms, rate=common.tflops(2.5 * flops, bwd_ms),
                   production=False, note="yardstick")


def main(argv=None) -> int:
    return common.run_script(__doc__, SCRIPT, EDGE, [run_shape], argv)


if __name__ == "__main__":
    raise SystemExit(main())
