"""The fp8 mode's kernels (andrea/kernels/fp8.cu), checked against andrea/fp8.py and timed.

    python3 dev/cuda/fp8.py [--quick]

fp8_cast     a matrix cast to e4m3 or e5m2 at a scale: its bytes, its transpose's bytes, the amax
             recorded and the overflow/underflow counts, all exactly as andrea/fp8.py casts
             (ml_dtypes rounds to nearest even after the reference clips to ±max). The inputs of
             the model's products: the LayerNorm output (bf16 -> e4m3), a gradient (bf16 -> e5m2,
             and its transpose), the weights (fp32 -> e4m3 and the transpose), and a = gelu(h)
             (bf16 h -> gelu in bf16 -> e4m3), whose reference is the host cast of the `a` that the
             backward pass recomputes (gelu_bwd_recompute_h16x8): the two casts must agree bit for bit
             and the MLP backward's one pass over h and a's gradient (fp8_gelu_bwd_cast): h's
             gradient to e5m2 and transposed, a again to e4m3 transposed (run_gelu_bwd)
             The weights of a layer in one launch (fp8_cast_f32_e4m3_jobs, run_weight_jobs); the
             LayerNorm that casts its own output for an fp8 product and the LayerNorm backward that
             casts the branch's gradient (add_layernorm_fp8, layernorm_bwd_fused_fp8: run_layernorm),
             against the host cast of production's bf16 kernels' 16-bit outputs, bit for bit.
             The same two over the 16-bit residual stream of the bf16 and fp8 modes
             (add_layernorm_fp8_r16, layernorm_bwd_fused_fp8_r16: run_layernorm_r16): the residual
             sum stored is the host's (x + f in fp32, rounded once to bf16), bit for bit, and its
             LayerNorm is checked as above on that sum (also with no residual: x the sum); the
             backward's 16-bit dx is the fp32 dx of production's bf16 backward on the same values
             rounded once to bf16 (within u·|dx|), its e5m2 bytes the host cast of that 16-bit dx
fp8_update   the delayed scales: each site's amax joins its history (the oldest leaves), the scale is
             the largest power of two that keeps the history's largest amax within the format
             (andrea/fp8.py DelayedScale), and a site's first scale from its own amax
"""

from __future__ import annotations

import common
import numpy as np

from andrea.fp8 import DelayedScale, formats

SRC = "fp8.cu"
V = common.Version
LN_NV = (1, 2, 3, 4, 6, 8, 12)  # float4s per lane of the LayerNorm row kernels (the backward's fp8 one: up to 8)
LN_FP8_ROWS = 32  # rows a block of add_layernorm_fp8 (fp8.cu)
BF = ("bf16",)
VERSIONS = [
    V("fp8_cast", "x bf16 -> e4m3", ("fp8_cast_h16_e4m3",), SRC, BF),
    V("fp8_cast", "dy bf16 -> e5m2 + transpose", ("fp8_cast_h16_e5m2",), SRC, BF),
    V("fp8_cast", "W fp32 -> e4m3 + transpose", ("fp8_cast_f32_e4m3",), SRC, BF),
    V("fp8_cast", "gelu(h) bf16 -> e4m3", ("fp8_cast_h16_e4m3_gelu", "gelu_bwd_recompute_h16x8"), SRC, BF),
    V("fp8_update", "update + first scale", ("fp8_update", "fp8_scale_from_now"), SRC, BF),
    V("fp8_cast", "gelu bwd: dh -> e5m2 + transpose, a -> e4m3 transpose, a tile a block",
      ("fp8_gelu_bwd_cast", "gelu_bwd_recompute_h16x8"), SRC, BF, production=False),
    V("fp8_cast", "gelu bwd, 4 tiles a block", ("fp8_gelu_bwd_cast_tiles", "gelu_bwd_recompute_h16x8"), SRC, BF),
    V("fp8_cast", "weights of a layer fp32 -> e4m3 + transpose, one launch", ("fp8_cast_f32_e4m3_jobs",), SRC, BF),
    V("fp8_cast", "residual add + LayerNorm -> e4m3 + transpose",
      (*(f"add_layernorm_fp8_{nv}" for nv in LN_NV), "add_h16_layernorm_fwd_vec_h16"), SRC, BF),
    V("fp8_cast", "LayerNorm backward, branch gradient -> e5m2 + transpose",
      (*(f"layernorm_bwd_fused_fp8_{nv}" for nv in LN_NV[:-1]), *(f"layernorm_bwd_fused_h16_{nv}" for nv in LN_NV[:-1])),
      SRC, BF),
    # the same over a 16-bit residual stream (x, res and dx in bf16: andrea/engine/cupy residual_from_env)
    V("fp8_cast", "residual add + LayerNorm -> e4m3 + transpose, 16-bit residual stream",
      (*(f"add_layernorm_fp8_r16_{nv}" for nv in LN_NV), "add_h16_layernorm_fwd_vec_h16"), SRC, BF),
    V("fp8_cast", "LayerNorm backward, branch gradient -> e5m2 + transpose, 16-bit residual stream",
      (*(f"layernorm_bwd_fused_fp8_r16_{nv}" for nv in LN_NV[:-1]), *(f"layernorm_bwd_fused_h16_{nv}" for nv in LN_NV[:-1])),
      SRC, BF),
]
HISTORY = 16
CAST_COLS = 4 * 64  # columns per block of fp8_cast_* (fp8.cu: FP8_TILES tiles of 64; andrea/engine/cupy/fp8.py)


def cast_reference(x, scale, fmt):
    """(bytes, overflows, underflows) of x·scale in the format, as andrea/fp8.py casts."""
    f = formats()[fmt]
    x32 = np.asarray(x, np.float32)
    scaled = x32 * np.float32(scale)
    over = int((np.abs(scaled) > f.max).sum())
    q = np.clip(scaled, -f.max, f.max).astype(f.dtype)
    under = int(((q.astype(np.float32) == 0) & (x32 != 0)).sum())
    return q.view(np.uint8), over, under


def scale_reference(history, fmt, amax_now=None):
    """The scale andrea/fp8.py's DelayedScale takes from a history (a first cast: from its own amax)."""
    ds = DelayedScale(formats()[fmt], HISTORY)
    ds.amaxes = [float(a) for a in history if a > 0]
    return ds.scale(amax_now if amax_now is not None else 0.0)


REFERENCES = {"fp8_cast": cast_reference, "fp8_update": scale_reference}
EDGE = [common.Shape("edge B=3 T=24 C=40", 3, 24, 40, 2, 301)]  # rows, cols not multiples of the 64 x 64 tiles


def run_cast(cp, report, shape, rng, reps):
    N, C = shape.B * shape.T, shape.C
    cases = [  # (version, rows, cols, input, format, plain, transposed)
        (VERSIONS[0], N, C, "bf16", "e4m3", True, False),
        (VERSIONS[1], N, 3 * C, "bf16", "e5m2", True, True),
        (VERSIONS[2], C, 4 * C, "fp32", "e4m3", True, True),
        (VERSIONS[3], N, 4 * C, "bf16", "e4m3", True, False),
    ]
    for ver, rows, cols, src, fmt, plain, trans in cases:
        esz = 4 if src == "fp32" else 2
        x = rng.standard_normal((rows, cols)) * (0.02 if src == "fp32" else 1.0)
        amax_typ = float(np.abs(x).max())
        x.flat[5] = 50 * amax_typ  # saturates at the scale of the typical values
        x.flat[7] = 1e-30  # underflows
        x.flat[9] = 0.0
        scale = scale_reference([amax_typ], fmt)
        if src == "bf16":
            bits = common.to_h16(x, "bf16")
            xv = common.from_h16(bits, "bf16").astype(np.float32)
            d_x = cp.asarray(bits)
        else:
            xv = x.astype(np.float32)
            d_x = cp.asarray(xv)
        k = common.build(cp, ver, "bf16")
        gelu = ver.name.startswith("gelu")
        d_q = cp.zeros((rows, cols), cp.uint8) if plain else None
        d_qt = cp.zeros((cols, rows), cp.uint8) if trans else None
        d_scale = cp.full(1, scale, cp.float32)
        d_amax = cp.full(1, -1.0, cp.float32)
        d_counts = cp.zeros(3, cp.uint64)
        grid = (-(-cols // CAST_COLS), -(-rows // 64))
        args = (d_x, np.int64(cols), 0 if d_q is None else d_q, np.int64(cols), 0 if d_qt is None else d_qt,
                np.int64(rows), np.int32(rows), np.int32(cols),
                np.int32(0), d_scale, d_amax, d_counts, np.int32(1), np.int32(1))
        run = lambda k=k, ver=ver, grid=grid, args=args: k[ver.kernels[0]](grid, (256,), args)  # noqa: E731

        def case(run=run, xv=xv, d_x=d_x, d_q=d_q, d_qt=d_qt, d_amax=d_amax, d_counts=d_counts, fmt=fmt, scale=scale,
                 gelu=gelu, k=k, rows=rows, cols=cols, ver=ver, esz=esz):
            run()
            want_x = xv
            if gelu:  # the backward's a = gelu(h), recomputed in bf16 by production's kernel
                d_a, d_da = cp.zeros_like(d_x), cp.zeros_like(d_x)
                n8 = rows * cols // 8
                k[ver.kernels[1]]((common.blocks(n8),), (256,), (d_x, d_da, d_a, np.int64(n8)))
                want_x = common.from_h16(d_a.get(), "bf16").astype(np.float32).reshape(rows, cols)
            want, over, under = cast_reference(want_x, scale, fmt)
            err = common.exact(np.array([float(d_amax.get()[0])]), np.array([float(np.abs(want_x).max())]), what="amax")
            if d_q is not None:
                err = err.worst(common.exact(d_q.get(), want, what="bytes"))
            if d_qt is not None:
                err = err.worst(common.exact(d_qt.get(), np.ascontiguousarray(want.T), what="transposed bytes"))
            err = err.worst(common.exact(d_counts.get().astype(np.int64), np.array([rows * cols, over, under]),
                                         what="counts (values, overflow, underflow)"))
            ms = common.bench(cp, run, reps)
            nbytes = rows * cols * (esz + (d_q is not None) + (d_qt is not None))
            return err, ms, common.gbps(nbytes, ms)

        report.attempt(ver.op, ver.name, "bf16", shape, case, ver.production)


def run_gelu_bwd(cp, report, shape, rng, reps):
    """The MLP backward's one pass: dh = da·gelu'(h) to e5m2 (and transposed), a = gelu(h) to e4m3
    transposed. a's bytes: exactly the host cast of the a that gelu_bwd_recompute_h16x8 computes
    (the forward cast's values, fp8_cast's gelu version), and a's counts (count_a: where the forward's
    cast was a product's epilogue) exactly the host cast's; dh: the bf16 path's dh (the same kernel)
    to within one e5m2 rounding (2^-3 relative) and bf16's, since dh goes to fp8 from fp32."""
    for ver, tiles in ((VERSIONS[5], 1), (VERSIONS[6], CAST_COLS // 64)):
        _gelu_bwd_case(cp, report, shape, rng, reps, ver, tiles)


def _gelu_bwd_case(cp, report, shape, rng, reps, ver, tiles):
    rows, cols = shape.B * shape.T, 4 * shape.C
    k = common.build(cp, ver, "bf16")
    h = cp.asarray(common.to_h16(rng.standard_normal((rows, cols)) * 1.5, "bf16"))
    g = cp.asarray(common.to_h16(rng.standard_normal((rows, cols)) * 1e-3, "bf16"))
    a, dh = cp.zeros_like(h), g.copy()
    n8 = rows * cols // 8
    k[ver.kernels[1]]((common.blocks(n8),), (256,), (h, dh, a, np.int64(n8)))
    a_ref = common.from_h16(a.get(), "bf16").astype(np.float32)
    dh_ref = common.from_h16(dh.get(), "bf16").astype(np.float64)
    s_a, s_d = scale_reference([float(np.abs(a_ref).max())], "e4m3"), scale_reference([float(np.abs(dh_ref).max())], "e5m2")
    scale = cp.asarray(np.array([s_d, s_a], np.float32))
    amax, counts = cp.full(2, -1.0, cp.float32), cp.zeros(6, cp.uint64)
    dq, dqt, aqt = cp.zeros((rows, cols), cp.uint8), cp.zeros((cols, rows), cp.uint8), cp.zeros((cols, rows), cp.uint8)
    args = (g, h, np.int32(rows), np.int32(cols), dq, dqt, np.int32(0), aqt, np.int32(1), scale, amax, counts,
            np.int32(1), np.int32(1), np.int32(1))
    run = lambda: k[ver.kernels[0]]((-(-cols // (64 * tiles)), (rows + 63) // 64), (256,), args)  # noqa: E731

    def case():
        counts.fill(0)
        run()
        want_a, over_a, under_a = cast_reference(a_ref, s_a, "e4m3")
        err = common.exact(aqt.get(), np.ascontiguousarray(want_a.T), what="a, transposed")
        err = err.worst(common.exact(counts.get()[3:].astype(np.int64), np.array([a_ref.size, over_a, under_a]),
                                     what="a's counts"))
        err = err.worst(common.exact(dqt.get(), np.ascontiguousarray(dq.get().T), what="dh transposed"))
        got = dq.get().view(formats()["e5m2"].dtype).astype(np.float64) / s_d
        err = err.worst(common.compare(got, dh_ref, rtol=2.0**-3 + 2.0**-7, atol=2.0**-17 / s_d, what="dh"))
        ms = common.bench(cp, run, reps)
        return err, ms, common.gbps(rows * cols * (2 + 2 + 3), ms)

    report.attempt(ver.op, ver.name, "bf16", shape, case, ver.production)


def _ln_nv(C: int) -> int:
    return next(nv for nv in LN_NV if 128 * nv >= C)


def run_weight_jobs(cp, report, shape, rng, reps):
    """A layer's weights cast in one launch (fp8_cast_f32_e4m3_jobs): W_Q, W_K, W_V side by side at one
    site, W_O, W_1, W_2 at their own; each copy and its transpose exactly the host cast's, each
    site's amax and counts."""
    ver = VERSIONS[7]
    C = shape.C
    k = common.build(cp, ver, "bf16")
    shapes = [(C, C)] * 3 + [(C, C), (C, 4 * C), (4 * C, C)]
    sites = [0, 0, 0, 1, 2, 3]
    ws = [(rng.standard_normal(sh) * 0.02).astype(np.float32) for sh in shapes]
    scales = [scale_reference([max(float(np.abs(w).max()) for w, s_ in zip(ws, sites) if s_ == s)], "e4m3") for s in range(4)]
    d_w = [cp.asarray(w) for w in ws]
    wt = [cp.zeros((3 * C, C), cp.uint8)] + [cp.zeros((sh[1], sh[0]), cp.uint8) for sh in shapes[3:]]  # Wᵀ per site
    wp = [cp.zeros((C, 3 * C), cp.uint8)] + [cp.zeros(sh, cp.uint8) for sh in shapes[3:]]  # W per site
    ptrs, ints, first = [], [], 0
    for i, (w, site) in enumerate(zip(d_w, sites)):
        rows, cols = w.shape
        at = i * C if site == 0 else 0
        q, qt = wp[site][:, at:at + cols], wt[site][at:at + cols]
        ptrs.append([w.data.ptr, cols, q.data.ptr, q.strides[0], qt.data.ptr, qt.strides[0]])
        bx = -(-cols // CAST_COLS)
        ints.append([rows, cols, site, first, bx])
        first += bx * -(-rows // 64)
    d_ptrs, d_ints = cp.asarray(np.array(ptrs, np.int64)), cp.asarray(np.array(ints, np.int32))
    d_scale = cp.asarray(np.array(scales, np.float32))
    d_amax, d_counts = cp.full(4, -1.0, cp.float32), cp.zeros((4, 3), cp.uint64)
    run = lambda: k[ver.kernels[0]]((first,), (256,), (d_ptrs, d_ints, np.int32(len(ints)), d_scale, d_amax, d_counts))  # noqa: E731

    def case():
        d_amax.fill(-1.0)
        d_counts.fill(0)
        run()
        err = None
        for site in range(4):
            members = [w for w, s_ in zip(ws, sites) if s_ == site]
            full = np.concatenate(members, axis=1)
            want, over, under = cast_reference(full, scales[site], "e4m3")
            e = common.exact(wp[site].get(), want, what="bytes").worst(
                common.exact(wt[site].get(), np.ascontiguousarray(want.T), what="transposed bytes"))
            e = e.worst(common.exact(np.array([float(d_amax.get()[site])]), np.array([float(np.abs(full).max())]), what="amax"))
            e = e.worst(common.exact(d_counts.get()[site].astype(np.int64), np.array([full.size, over, under]), what="counts"))
            err = e if err is None else err.worst(e)
        ms = common.bench(cp, run, reps)
        return err, ms, common.gbps(sum(w.size for w in ws) * (4 + 2), ms)

    report.attempt(ver.op, ver.name, "bf16", shape, case, ver.production)


def run_layernorm(cp, report, shape, rng, reps):
    """The LayerNorm that feeds an fp8 product (add_layernorm_fp8): its operand and transpose exactly
    the host cast of the 16-bit output of production's bf16 LayerNorm (add_h16_layernorm_fwd_vec_h16),
    the same residual sum, mean and rstd, the amax and counts of that cast. And the LayerNorm
    backward that casts the branch's gradient (layernorm_bwd_fused_fp8): the host e5m2 cast of the
    16-bit copy of production's bf16 one-pass backward, the same dx and partial sums."""
    N, C = shape.B * shape.T, shape.C
    if C % 4 or C > 128 * LN_NV[-1]:
        return
    nv = _ln_nv(C)
    ver = VERSIONS[8]
    k = common.build(cp, ver, "bf16")
    x = cp.asarray(rng.standard_normal((N, C)).astype(np.float32) * 2)
    f = cp.asarray(common.to_h16(rng.standard_normal((N, C)), "bf16"))
    g, b = cp.asarray(rng.standard_normal(C).astype(np.float32)), cp.asarray(rng.standard_normal(C).astype(np.float32) * 0.1)
    res, mean, rstd = cp.zeros((N, C), cp.float32), cp.zeros(N, cp.float32), cp.zeros(N, cp.float32)
    out16 = cp.zeros((N, C), cp.uint16)
    k["add_h16_layernorm_fwd_vec_h16"]((common.blocks(N, 8),), (256,), (x, f, res, g, b, out16, mean, rstd, np.int32(N),
                                                                          np.int32(C), np.float32(1e-5)))
    o = common.from_h16(out16.get(), "bf16").astype(np.float32)
    want_stats = [res.get(), mean.get(), rstd.get()]
    s_x = scale_reference([float(np.abs(o).max())], "e4m3")
    q, qt = cp.zeros((N, C), cp.uint8), cp.zeros((C, N), cp.uint8)
    d_scale, d_amax, d_counts = cp.full(1, s_x, cp.float32), cp.full(1, -1.0, cp.float32), cp.zeros(3, cp.uint64)
    fn = k[f"add_layernorm_fp8_{nv}"]
    smem = LN_FP8_ROWS * (C + 4)
    fn.max_dynamic_shared_size_bytes = max(fn.max_dynamic_shared_size_bytes, smem)
    run = lambda: fn((-(-N // LN_FP8_ROWS),), (256,), (x, f, res, g, b, q, qt, mean, rstd, np.int32(N), np.int32(C),  # noqa: E731
                                                       np.float32(1e-5), np.int32(0), d_scale, d_amax, d_counts,
                                                       np.int32(1), np.int32(1)), shared_mem=smem)

    def case():
        for a in (res, mean, rstd, q, qt, d_counts):
            a.fill(0)
        d_amax.fill(-1.0)
        run()
        want, over, under = cast_reference(o, s_x, "e4m3")
        err = common.exact(q.get(), want, what="bytes").worst(common.exact(qt.get(), np.ascontiguousarray(want.T), what="transposed bytes"))
        for got, w, what in zip((res, mean, rstd), want_stats, ("residual sum", "mean", "rstd")):
            err = err.worst(common.exact(got.get(), w, what=what))
        err = err.worst(common.exact(np.array([float(d_amax.get()[0])]), np.array([float(np.abs(o).max())]), what="amax"))
        err = err.worst(common.exact(d_counts.get().astype(np.int64), np.array([o.size, over, under]), what="counts"))
        ms = common.bench(cp, run, reps)
        return err, ms, common.gbps(N * C * (4 + 2 + 4 + 1 + 1), ms)

    report.attempt(ver.op, ver.name, "bf16", shape, case, ver.production)
    if nv > 8:
        return  # the backward's tile does not fit beside its sums (production keeps the 16-bit copy there)
    _layernorm_bwd(cp, report, shape, rng, reps, N, C, nv, x, mean, rstd, g)


def _bwd_fp8_launch(cp, fn, args, part, s_d, N, C, rows, sums):
    """A launch of a layernorm_bwd_fused_fp8_* kernel fn over args (dout, x, mean, rstd, g, dx) at site 0
    (scale s_d), recorded and counted, with its outputs: (run, q, qt, amax, counts)."""
    q, qt = cp.zeros((N, C), cp.uint8), cp.zeros((C, N), cp.uint8)
    d_scale, d_amax, d_counts = cp.full(1, s_d, cp.float32), cp.full(1, -1.0, cp.float32), cp.zeros(3, cp.uint64)
    smem = sums + rows * (C + 4)
    fn.max_dynamic_shared_size_bytes = max(fn.max_dynamic_shared_size_bytes, smem)

    def run():
        fn((-(-N // rows),), (256,), (*args, q, qt, part, np.int32(N), np.int32(C), np.int32(rows), np.int32(0), d_scale,
                                      d_amax, d_counts, np.int32(1), np.int32(1)), shared_mem=smem)

    return run, q, qt, d_amax, d_counts


def _layernorm_bwd(cp, report, shape, rng, reps, N, C, nv, x, mean, rstd, g):
    ver = VERSIONS[9]
    k = common.build(cp, ver, "bf16")
    rows = max(8, min(64, N // 256 // 8 * 8))  # andrea/engine/cupy/layernorm.py ln_fused_rows
    chunks = -(-N // rows)
    sums = 8 * 2 * C * 4  # ln_fused_smem
    dout = cp.asarray(common.to_h16(rng.standard_normal((N, C)) * 1e-3, "bf16"))
    dx0 = cp.asarray(rng.standard_normal((N, C)).astype(np.float32) * 1e-3)
    dx, copy16, part = dx0.copy(), cp.zeros((N, C), cp.uint16), cp.zeros((chunks, 2 * C), cp.float32)
    ref = k[f"layernorm_bwd_fused_h16_{nv}"]
    ref.max_dynamic_shared_size_bytes = max(ref.max_dynamic_shared_size_bytes, sums)
    ref((chunks,), (256,), (dout, x, mean, rstd, g, dx, copy16, part, np.int32(N), np.int32(C), np.int32(rows)), shared_mem=sums)
    want_dx, want_part = dx.get(), part.get()
    c16 = common.from_h16(copy16.get(), "bf16").astype(np.float32)
    s_d = scale_reference([float(np.abs(c16).max())], "e5m2")
    run, q, qt, d_amax, d_counts = _bwd_fp8_launch(cp, k[f"layernorm_bwd_fused_fp8_{nv}"], (dout, x, mean, rstd, g, dx),
                                                   part, s_d, N, C, rows, sums)

    def case():
        dx[...] = dx0
        d_amax.fill(-1.0)
        d_counts.fill(0)
        run()
        want, over, under = cast_reference(c16, s_d, "e5m2")
        err = common.exact(q.get(), want, what="bytes").worst(common.exact(qt.get(), np.ascontiguousarray(want.T), what="transposed bytes"))
        err = err.worst(common.exact(dx.get(), want_dx, what="dx")).worst(common.exact(part.get(), want_part, what="dγ, dβ partials"))
        err = err.worst(common.exact(np.array([float(d_amax.get()[0])]), np.array([float(np.abs(c16).max())]), what="amax"))
        err = err.worst(common.exact(d_counts.get().astype(np.int64), np.array([c16.size, over, under]), what="counts"))
        ms = common.bench(cp, run, reps)  # dx keeps adding: the same work
        return err, ms, common.gbps(N * C * (2 + 4 + 4 + 4 + 2), ms)

    report.attempt(ver.op, ver.name, "bf16", shape, case, ver.production)


def run_layernorm_r16(cp, report, shape, rng, reps):
    """run_layernorm over a 16-bit residual stream (add_layernorm_fp8_r16, layernorm_bwd_fused_fp8_r16).
    The residual sum on the host: float32(x) + float32(f) in fp32, rounded to bf16, as the kernel
    forms it (the same IEEE operations: bit for bit); it is stored into res bit for bit and its
    LayerNorm is what is normalised: the reference is production's bf16 LayerNorm
    (add_h16_layernorm_fwd_vec_h16, no residual) on that sum as fp32, its 16-bit output cast on the
    host, bit for bit, with its mean and rstd; the kernel with no residual (f and res null, x that
    sum) the same. The backward: production's bf16 one-pass backward (layernorm_bwd_fused_h16) on
    the same values in fp32 (x the sum, dx0 rounded to bf16) is the reference; the kernel's 16-bit
    dx is its fp32 dx rounded once to 16 bits (u·|dx| + the subnormal half step), the partial sums
    the same bits, and the e5m2 bytes, transposed bytes, amax and counts the host cast of the
    kernel's 16-bit dx (the value it stores is the value it casts)."""
    N, C = shape.B * shape.T, shape.C
    if C % 4 or C > 128 * LN_NV[-1]:
        return
    nv = _ln_nv(C)
    ver = VERSIONS[10]
    k = common.build(cp, ver, "bf16")
    x_h = common.to_h16(rng.standard_normal((N, C)) * 2, "bf16")
    f_h = common.to_h16(rng.standard_normal((N, C)), "bf16")
    s32 = common.from_h16(x_h, "bf16").astype(np.float32) + common.from_h16(f_h, "bf16").astype(np.float32)
    res_h = common.to_h16(s32, "bf16")  # the residual sum as the kernel forms and stores it
    g, b = cp.asarray(rng.standard_normal(C).astype(np.float32)), cp.asarray(rng.standard_normal(C).astype(np.float32) * 0.1)
    # the reference: production's bf16 LayerNorm of that sum (x = the sum in fp32, no residual)
    d_res32 = cp.asarray(common.from_h16(res_h, "bf16").astype(np.float32))
    mean_ref, rstd_ref, out16 = cp.zeros(N, cp.float32), cp.zeros(N, cp.float32), cp.zeros((N, C), cp.uint16)
    k["add_h16_layernorm_fwd_vec_h16"]((common.blocks(N, 8),), (256,), (d_res32, 0, 0, g, b, out16, mean_ref, rstd_ref,
                                                                          np.int32(N), np.int32(C), np.float32(1e-5)))
    o = common.from_h16(out16.get(), "bf16").astype(np.float32)
    want_mean, want_rstd = mean_ref.get(), rstd_ref.get()
    s_x = scale_reference([float(np.abs(o).max())], "e4m3")
    want, over, under = cast_reference(o, s_x, "e4m3")
    want_t = np.ascontiguousarray(want.T)
    d_x, d_f, d_res16 = cp.asarray(x_h), cp.asarray(f_h), cp.asarray(res_h)
    res, mean, rstd = cp.zeros((N, C), cp.uint16), cp.zeros(N, cp.float32), cp.zeros(N, cp.float32)
    q, qt = cp.zeros((N, C), cp.uint8), cp.zeros((C, N), cp.uint8)
    d_scale, d_amax, d_counts = cp.full(1, s_x, cp.float32), cp.full(1, -1.0, cp.float32), cp.zeros(3, cp.uint64)
    fn = k[f"add_layernorm_fp8_r16_{nv}"]
    smem = LN_FP8_ROWS * (C + 4)
    fn.max_dynamic_shared_size_bytes = max(fn.max_dynamic_shared_size_bytes, smem)

    def launch(xx, ff, rr):
        fn((-(-N // LN_FP8_ROWS),), (256,), (xx, ff, rr, g, b, q, qt, mean, rstd, np.int32(N), np.int32(C), np.float32(1e-5),
                                             np.int32(0), d_scale, d_amax, d_counts, np.int32(1), np.int32(1)), shared_mem=smem)

    run = lambda: launch(d_x, d_f, res)  # noqa: E731

    def case():
        err = None
        # with the residual add (res stored), then with none (x the sum itself, f and res null)
        for xx, ff, rr, tag in ((d_x, d_f, res, ""), (d_res16, 0, 0, "no residual: ")):
            for a in (res, mean, rstd, q, qt, d_counts):
                a.fill(0)
            d_amax.fill(-1.0)
            launch(xx, ff, rr)
            e = common.exact(q.get(), want, what=tag + "bytes").worst(common.exact(qt.get(), want_t, what=tag + "transposed bytes"))
            if tag == "":
                e = e.worst(common.exact(res.get(), res_h, what="residual sum (16-bit)"))
            e = e.worst(common.exact(mean.get(), want_mean, what=tag + "mean")).worst(common.exact(rstd.get(), want_rstd, what=tag + "rstd"))
            e = e.worst(common.exact(np.array([float(d_amax.get()[0])]), np.array([float(np.abs(o).max())]), what=tag + "amax"))
            e = e.worst(common.exact(d_counts.get().astype(np.int64), np.array([o.size, over, under]), what=tag + "counts"))
            err = e if err is None else err.worst(e)
        ms = common.bench(cp, run, reps)
        return err, ms, common.gbps(N * C * (2 + 2 + 2 + 1 + 1), ms)

    report.attempt(ver.op, ver.name, "bf16", shape, case, ver.production)
    if nv > 8:
        return  # the backward's tile does not fit beside its sums (production keeps the 16-bit copy there)
    _layernorm_bwd_r16(cp, report, shape, rng, reps, N, C, nv, d_res16, res_h, mean_ref, rstd_ref, g)


def _layernorm_bwd_r16(cp, report, shape, rng, reps, N, C, nv, x16, x_h, mean, rstd, g):
    ver = VERSIONS[11]
    k = common.build(cp, ver, "bf16")
    u16, tiny16 = common.u("bf16"), common.tiny("bf16")
    rows = max(8, min(64, N // 256 // 8 * 8))  # andrea/engine/cupy/layernorm.py ln_fused_rows
    chunks = -(-N // rows)
    sums = 8 * 2 * C * 4  # ln_fused_smem
    dout = cp.asarray(common.to_h16(rng.standard_normal((N, C)) * 1e-3, "bf16"))
    dx0_h = common.to_h16(rng.standard_normal((N, C)) * 1e-3, "bf16")
    # the reference: production's bf16 one-pass backward on the same values, x and dx in fp32
    x32 = cp.asarray(common.from_h16(x_h, "bf16").astype(np.float32))
    dx32 = cp.asarray(common.from_h16(dx0_h, "bf16").astype(np.float32))
    copy16, part = cp.zeros((N, C), cp.uint16), cp.zeros((chunks, 2 * C), cp.float32)
    ref = k[f"layernorm_bwd_fused_h16_{nv}"]
    ref.max_dynamic_shared_size_bytes = max(ref.max_dynamic_shared_size_bytes, sums)
    ref((chunks,), (256,), (dout, x32, mean, rstd, g, dx32, copy16, part, np.int32(N), np.int32(C), np.int32(rows)), shared_mem=sums)
    want_dx, want_part = dx32.get().astype(np.float64), part.get()
    c16_ref = common.from_h16(copy16.get(), "bf16").astype(np.float32)
    s_d = scale_reference([float(np.abs(c16_ref).max())], "e5m2")
    d_dx0 = cp.asarray(dx0_h)
    dx = d_dx0.copy()
    run, q, qt, d_amax, d_counts = _bwd_fp8_launch(cp, k[f"layernorm_bwd_fused_fp8_r16_{nv}"],
                                                   (dout, x16, mean, rstd, g, dx), part, s_d, N, C, rows, sums)

    def case():
        dx[...] = d_dx0
        part.fill(0)
        d_amax.fill(-1.0)
        d_counts.fill(0)
        run()
        got = common.from_h16(dx.get(), "bf16")
        # the reference's fp32 dx rounded once to 16 bits (a few fp32 ulps for a differently contracted sum)
        err = common.compare(got, want_dx, rtol=u16 + 4 * common.u("fp32"), atol=tiny16, what="dx (16-bit)")
        c16 = got.astype(np.float32)  # the kernel's 16-bit dx: the value it casts
        want, over, under = cast_reference(c16, s_d, "e5m2")
        err = err.worst(common.exact(q.get(), want, what="bytes")).worst(common.exact(qt.get(), np.ascontiguousarray(want.T), what="transposed bytes"))
        err = err.worst(common.exact(part.get(), want_part, what="dγ, dβ partials"))
        err = err.worst(common.exact(np.array([float(d_amax.get()[0])]), np.array([float(np.abs(c16).max())]), what="amax"))
        err = err.worst(common.exact(d_counts.get().astype(np.int64), np.array([c16.size, over, under]), what="counts"))
        ms = common.bench(cp, run, reps)  # dx keeps adding: the same work
        return err, ms, common.gbps(N * C * (2 + 2 + 2 + 2 + 1 + 1), ms)

    report.attempt(ver.op, ver.name, "bf16", shape, case, ver.production)


def run_update(cp, report, shape, rng, reps):
    if shape is not EDGE[0]:
        return  # one size: the sites of a model (16 per layer)
    ver = VERSIONS[4]
    k = common.build(cp, ver, "bf16")
    n = 1000
    fmts = ["e4m3" if i % 3 else "e5m2" for i in range(n)]
    fmax = np.array([formats()[f].max for f in fmts], np.float32)
    hist = (np.abs(rng.standard_normal((n, HISTORY))) * 10.0 ** rng.integers(-6, 3, (n, 1))).astype(np.float32)
    hist[:50, :-3] = 0  # young sites: a few amaxes so far
    now = np.abs(rng.standard_normal(n)).astype(np.float32) * 3
    now[::7] = -1  # not cast since the last update
    d = {name: cp.asarray(a) for name, a in (("now", now), ("hist", hist), ("fmax", fmax))}
    d_scale, d_inv = cp.zeros(n, cp.float32), cp.zeros((n, 4), cp.float32)  # inv 16 bytes apart (FP8_INV_STRIDE)
    # a product's amax (lt[s, 1, 0], the GELU epilogue's) joins amax_now's: larger at some sites, the only one at others
    lt = np.zeros((n, 2, 4), np.float32)
    lt[:, 1, 0] = -1
    lt[1::5, 1, 0] = now[1::5] * 2
    lt[::7, 1, 0] = 0.25  # sites not cast since the last update, but a product wrote an amax
    both = np.maximum(now, lt[:, 1, 0])
    cast = both >= 0
    want_hist = hist.copy()
    want_hist[cast] = np.concatenate([hist[cast, 1:], both[cast, None]], axis=1)
    want_scale = np.array([scale_reference(want_hist[i], fmts[i]) for i in range(n)], np.float32)
    d["lt"] = cp.asarray(lt)

    def case():
        k["fp8_update"](((n + 127) // 128,), (128,), (d["now"], d["hist"], d_scale, d_inv, d["lt"], d["fmax"], np.int32(n)))
        err = common.exact(d["hist"].get(), want_hist, what="history")
        err = err.worst(common.exact(d_scale.get(), want_scale, what="scale"))
        err = err.worst(common.exact(d_inv.get()[:, 0], (1 / want_scale).astype(np.float32), what="1/scale"))
        err = err.worst(common.exact(d["lt"].get()[:, 0, 0], want_scale, what="scale for cuBLASLt"))
        err = err.worst(common.exact(d["now"].get(), np.full(n, -1, np.float32), what="amax_now reset"))
        err = err.worst(common.exact(d["lt"].get()[:, 1, 0], np.full(n, -1, np.float32), what="product amax reset"))
        # a first cast: the scale from its own amax
        first = cp.asarray(np.array([0.37], np.float32))
        one_scale, one_inv, one_lt = cp.zeros(1, cp.float32), cp.zeros(4, cp.float32), cp.zeros(8, cp.float32)
        k["fp8_scale_from_now"]((1,), (1,), (first, one_scale, one_inv, one_lt, cp.asarray(np.float32([448.0])),
                                            np.int32(0)))
        err = err.worst(common.exact(one_scale.get(), np.float32([scale_reference([], "e4m3", 0.37)]), what="first scale"))
        err = err.worst(common.exact(one_lt.get()[:1], one_scale.get(), what="first scale for cuBLASLt"))
        return err, None, ""

    report.attempt(ver.op, ver.name, "bf16", shape, case, ver.production)


def main(argv=None) -> int:
    return common.run_script(__doc__, "fp8", EDGE, [run_cast, run_gelu_bwd, run_weight_jobs, run_layernorm,
                                                      run_layernorm_r16, run_update], argv)


if __name__ == "__main__":
    raise SystemExit(main())
