"""LayerNorm kernels (andrea/kernels/layernorm.cu), checked against
andrea/engine/numpy_backend.layernorm_fwd / add_layernorm_fwd / layernorm_bwd and timed.

    python3 dev/cuda/layernorm.py [--quick]

layernorm_fwd      plain: one warp per row, the row read three times (layernorm_fwd[_h16]);
                   vec: the row held in registers as float4s, read once (add_layernorm_fwd_vec[_h16]
                   with no residual: what production runs when C % 4 == 0 and C <= 1536)
add_layernorm_fwd  res = x + f and LayerNorm(res) in one pass; plain and vec
layernorm_bwd_dx   dx += input gradient, optionally also written in 16 bits (bf16/fp16 rows); plain, vec
layernorm_bwd_params  dγ, dβ += column sums: per-64-row partials, then one ordered sum of the partials
layernorm_bwd      fused (production when the vec kernels apply): dx and the partials of dγ, dβ per
                   block of up to 64 rows in one pass (layernorm_bwd_fused_<NV>, the warps' running sums
                   in dynamic shared memory), then ln_partials_final;
                   "16-bit dout": the same reading the output gradient in bf16/fp16 (the 16-bit modes)
add_layernorm_fwd  "vec, 16-bit branch": the residual add reading the branch in bf16/fp16 (the 16-bit modes);
                   "block per row, 16-bit branch": the same with a block per row and γ and β loaded
                   with it (up to 64 rows: generation's step); both timed on the shape's first row
                   too ("N=1": a decoding step's latency)
"16-bit stream"    the bf16 mode's residual stream in 16 bits: x (and res) read and written in bf16, the
                   sum rounded before it is normalised (the first LayerNorm, the residual add, the
                   block per row); the backward reading x and updating dx in bf16, dx being the
                   branch's gradient too (layernorm_bwd_fused_h16_r16_<NV>); at NV = 12 (C = 1536,
                   ANDREA-480M: --models ANDREA-480M:8) and 6 (C = 768) also dev versions keeping the row
                   compact (its 16-bit values as loaded: at NV = 12 128 registers a thread instead of 231
                   in NVRTC's build, two blocks an SM instead of one), checked bit for bit against it
Outputs in fp32, or bf16/fp16 (the *_h16 kernels; the fp16 build has -DANDREA_FP16).
"""

from __future__ import annotations

import common
import numpy as np

from andrea.engine import numpy_backend as nb

SCRIPT = "layernorm"
REFERENCES = {"layernorm_fwd": nb.layernorm_fwd, "add_layernorm_fwd": nb.add_layernorm_fwd,
              "layernorm_bwd_dx": nb.layernorm_bwd, "layernorm_bwd_params": nb.layernorm_bwd,
              "layernorm_bwd": nb.layernorm_bwd}
V = common.Version
H16 = ("bf16", "fp16")
REG_NV = (3, 6, 12)  # layernorm.cu's layernorm_bwd_fused_reg_h16_<NV>
VERSIONS = [
    V("layernorm_fwd", "plain", ("layernorm_fwd",), "layernorm.cu"),
    V("layernorm_fwd", "vec", ("add_layernorm_fwd_vec",), "layernorm.cu"),
    V("layernorm_fwd", "plain", ("layernorm_fwd_h16",), "layernorm.cu", H16),
    V("layernorm_fwd", "vec", ("add_layernorm_fwd_vec_h16",), "layernorm.cu", H16),
    V("add_layernorm_fwd", "plain", ("add_layernorm_fwd",), "layernorm.cu"),
    V("add_layernorm_fwd", "vec", ("add_layernorm_fwd_vec",), "layernorm.cu"),
    V("add_layernorm_fwd", "plain", ("add_layernorm_fwd_h16",), "layernorm.cu", H16),
    V("add_layernorm_fwd", "vec", ("add_layernorm_fwd_vec_h16",), "layernorm.cu", H16),
    V("layernorm_bwd_dx", "plain", ("layernorm_bwd_dx",), "layernorm.cu", ("fp32",) + H16),
    # production ran this and layernorm_bwd_params where the vec kernels apply, until the one-pass kernel below
    V("layernorm_bwd_dx", "vec", ("layernorm_bwd_dx_vec",), "layernorm.cu", ("fp32",) + H16, production=False),
    V("layernorm_bwd_params", "partials", ("layernorm_bwd_params", "ln_partials_final"), "layernorm.cu"),
    # production's backward when the vec kernels apply: dx and the parameter partials in one pass
    V("layernorm_bwd", "fused", tuple(f"layernorm_bwd_fused_{nv}" for nv in (1, 2, 3, 4, 6, 8, 12))
      + ("ln_partials_final",), "layernorm.cu", ("fp32",) + H16),
    # the 16-bit modes' residual add + LayerNorm, the branch read in 16 bits (where the vec kernels apply)
    V("add_layernorm_fwd", "vec, 16-bit branch", ("add_h16_layernorm_fwd_vec_h16",), "layernorm.cu", H16),
    # the 16-bit modes' one-pass backward: the output gradient read in 16 bits
    V("layernorm_bwd", "fused, 16-bit dout", tuple(f"layernorm_bwd_fused_h16_{nv}" for nv in (1, 2, 3, 4, 6, 8, 12))
      + ("ln_partials_final",), "layernorm.cu", H16),
    # production's 16-bit one-pass backward until 2026-12-01: the warps' sums in registers (no
    # dynamic shared memory), the old dx loaded after the row's reduction; at the models' widths
    V("layernorm_bwd", "fused, 16-bit dout, sums in registers", tuple(f"layernorm_bwd_fused_reg_h16_{nv}" for nv in REG_NV)
      + ("ln_partials_final",), "layernorm.cu", H16, production=False),
    # generation's few rows: the 16-bit-branch residual add, a block per row
    V("add_layernorm_fwd", "block per row, 16-bit branch", ("add_h16_layernorm_fwd_block_h16",), "layernorm.cu", H16),
    # the bf16 mode's 16-bit residual stream (andrea/engine/cupy residual_from_env): x and res in 16 bits,
    # the sum rounded before it is normalised; the first LayerNorm (no residual), the residual add,
    # generation's block per row, and the backward reading x and updating dx in 16 bits
    # (dev: a warp a row, as the fp32 stream's kernel; production runs add_layernorm_r16_<NV>, below)
    V("layernorm_fwd", "vec, 16-bit stream", ("add_h16_layernorm_fwd_vec_h16_r16",), "layernorm.cu", ("bf16",),
      production=False),
    V("add_layernorm_fwd", "vec, 16-bit stream", ("add_h16_layernorm_fwd_vec_h16_r16",), "layernorm.cu", ("bf16",),
      production=False),
    V("add_layernorm_fwd", "block per row, 16-bit stream", ("add_h16_layernorm_fwd_block_h16_r16",), "layernorm.cu",
      ("bf16",)),
    V("layernorm_bwd", "fused, 16-bit dout and stream", tuple(f"layernorm_bwd_fused_h16_r16_{nv}" for nv in (1, 2, 3, 4, 6, 8, 12))
      + ("ln_partials_final",), "layernorm.cu", ("bf16",)),
    # the stream's forward with LN_R16_ROWS rows a warp (production: 2; dev: 4), all their loads issued first
    V("layernorm_fwd", "2 rows a warp, 16-bit stream", tuple(f"add_layernorm_r16_{nv}" for nv in (1, 2, 3, 4, 6, 8, 12)),
      "layernorm.cu", ("bf16",)),
    V("add_layernorm_fwd", "2 rows a warp, 16-bit stream", tuple(f"add_layernorm_r16_{nv}" for nv in (1, 2, 3, 4, 6, 8, 12)),
      "layernorm.cu", ("bf16",)),
    V("add_layernorm_fwd", "4 rows a warp, 16-bit stream", tuple(f"add_layernorm_r16_{nv}" for nv in (1, 2, 3, 4, 6, 8, 12)),
      "layernorm.cu", ("bf16",), ("LN_R16_ROWS=4",), production=False),
    # dev: the 16-bit stream's backward at NV = 12 keeping the row as loaded (layernorm.cu KeptRow); with
    # __launch_bounds__ asking for one and for two blocks an SM
    V("layernorm_bwd", "fused, 16-bit dout and stream, row kept compact",
      ("layernorm_bwd_fused_h16_r16_c6", "layernorm_bwd_fused_h16_r16_c12", "ln_partials_final"), "layernorm.cu", ("bf16",),
      production=False),
    V("layernorm_bwd", "fused, 16-bit dout and stream, row kept compact, 2 blocks an SM",
      ("layernorm_bwd_fused_h16_r16_c12b2", "ln_partials_final"), "layernorm.cu", ("bf16",), production=False),
]
COMPACT_R16 = VERSIONS[23:25]
# dev: the stream's forward at NV = 12 with __launch_bounds__ asking for two blocks an SM (125 registers
# a thread instead of 133 in NVRTC's build: one block an SM)
VERSIONS += [V(op, "2 rows a warp, 16-bit stream, 2 blocks an SM", ("add_layernorm_r16_12b2",), "layernorm.cu", ("bf16",),
               production=False) for op in ("layernorm_fwd", "add_layernorm_fwd")]
FWD_R16_B2 = VERSIONS[25:27]
FUSED_NV = (1, 2, 3, 4, 6, 8, 12)  # layernorm.cu's layernorm_bwd_fused_<NV> (float4s per lane)
LN_MAXV = 12  # layernorm.cu: float4s per lane in the vec kernels, so C <= 4 * 32 * 12
LN_ROWS = 64  # rows per partial sum of dγ, dβ (as andrea.engine.cupy.layernorm.LN_ROWS)
EPS = 1e-5
EDGE = [common.Shape("edge B=3 T=37 C=130", 3, 37, 130, 2, 301),  # C % 4 != 0: the plain kernels only
        common.Shape("edge B=2 T=50 C=1536", 2, 50, 1536, 24, 301),  # the largest C the vec kernels hold
        common.Shape("edge B=3 T=37 C=384", 3, 37, 384, 12, 301)]  # N odd: a warp's second row past the end


def vec_ok(C: int) -> bool:
    return C % 4 == 0 and C <= 4 * 32 * LN_MAXV


def run_shape(cp, report, shape, rng, reps):
    N, C = shape.N, shape.C
    u32 = common.u("fp32")
    # sums in the kernels: C/32 terms per lane, then a 5-level warp tree, so each row sum carries
    # at most (C/32 + 5)·u of relative error (recursive-summation bound)
    k = C // 32 + 5
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    x = f32(rng.standard_normal((N, C)) * 2 + 0.5)  # an offset mean, as residual streams have
    f = f32(rng.standard_normal((N, C)))
    g = f32(1 + 0.1 * rng.standard_normal(C))
    b = f32(0.1 * rng.standard_normal(C))
    dout = f32(rng.standard_normal((N, C)))
    dx0 = f32(rng.standard_normal((N, C)))  # dx accumulates (the residual stream's gradient)
    dg0, db0 = f32(rng.standard_normal(C)), f32(rng.standard_normal(C))
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731

    def fwd_reference(add: bool, f_values=f):
        """(out, mean, rstd, res) of the op's NumPy reference in float64, and the tolerances."""
        out, mean, rstd, res = np.empty((N, C)), np.empty(N), np.empty(N), np.empty((N, C))
        if add:
            nb.add_layernorm_fwd(f64(x), f64(f_values), res, f64(g), f64(b), out, mean, rstd, EPS)
        else:
            nb.layernorm_fwd(f64(x), f64(g), f64(b), out, mean, rstd, EPS)
            res = f64(x)
        xhat = (res - mean[:, None]) * rstd[:, None]
        mean_abs = np.abs(res).mean(1)
        # the mean's error (k·u·mean|x|) moves every x − mean, times rstd; the rest is a few roundings
        bound = (k + 10) * u32 * (np.abs(xhat * g) + np.abs(b) + (mean_abs * rstd)[:, None] * np.abs(g))
        if add:  # the kernel normalises fl(x + f): each element off by ≤ u·|res|, the mean by ≤ u·mean|res|
            bound += u32 * (np.abs(res) + mean_abs[:, None]) * rstd[:, None] * np.abs(g)
        return out, mean, rstd, res, bound, (k + 1) * u32 * mean_abs

    refs = {"layernorm_fwd": fwd_reference(False), "add_layernorm_fwd": fwd_reference(True)}

    d = {name: cp.asarray(a) for name, a in dict(x=x, f=f, g=g, b=b, dout=dout).items()}
    stats = cp.zeros(N, cp.float32), cp.zeros(N, cp.float32)
    res = cp.zeros((N, C), cp.float32)
    null = np.uint64(0)
    grid = (common.blocks(N, 8),)  # 8 warps (rows) per block of 256, as production

    for v in VERSIONS[:8]:
        if v.name == "vec" and not vec_ok(C):
            continue
        for prec in v.precisions:
            kern = common.build(cp, v, prec)[v.kernels[0]]
            out = cp.zeros((N, C), cp.float32 if prec == "fp32" else cp.uint16)
            add = v.op == "add_layernorm_fwd"
            tail = (d["g"], d["b"], out, *stats, np.int32(N), np.int32(C), np.float32(EPS))
            if add:
                argv = (d["x"], d["f"], res) + tail
            elif v.name == "vec":
                argv = (d["x"], null, null) + tail  # no residual: plain LayerNorm
            else:
                argv = (d["x"],) + tail

            def case(kern=kern, argv=argv, out=out, prec=prec, add=add, op=v.op):
                kern(grid, (256,), argv)
                o_ref, m_ref, r_ref, res_ref, bound, mean_bound = refs[op]
                oh = 0.0 if prec == "fp32" else common.u(prec)  # the 16-bit output's one rounding
                err = common.compare(common.loaded(out, prec), o_ref, rtol=oh, atol=bound + common.tiny(prec), what="out")
                # a row sum and a division: (k + 1)·u·mean|x|
                err = err.worst(common.compare(stats[0].get(), m_ref, rtol=0, atol=mean_bound, what="mean"))
                err = err.worst(common.compare(stats[1].get(), r_ref, rtol=(k + 5) * u32, what="rstd"))  # + rsqrtf's 2 ulp
                if add:  # one fp32 addition
                    err = err.worst(common.compare(res.get(), res_ref, rtol=u32, what="res"))
                ms = common.bench(cp, lambda: kern(grid, (256,), argv), reps)
                esz = 4 if prec == "fp32" else 2
                nbytes = N * C * (4 * (3 if add else 1) + esz) + 8 * N + 8 * C  # each tensor once
                return err, ms, common.gbps(nbytes, ms)

            report.attempt(v.op, v.name, prec, shape, case)

    # backward: the kernels get fp32 mean and rstd; the reference uses the same values
    m32, r32 = f32(refs["layernorm_fwd"][1]), f32(refs["layernorm_fwd"][2])
    dx_ref, dg_ref, db_ref = f64(dx0), f64(dg0), f64(db0)
    nb.layernorm_bwd(f64(dout), f64(x), f64(m32), f64(r32), f64(g), dx_ref, dg_ref, db_ref)
    xhat = (f64(x) - f64(m32)[:, None]) * f64(r32)[:, None]
    dxh = f64(dout) * g
    s2 = (dxh * xhat).mean(1, keepdims=True)
    # the two row means carry (C/32 + 5)·u relative to the means of |terms|; the rest a few roundings
    dx_bound = (k + 6) * u32 * (f64(r32)[:, None] * (np.abs(dxh) + np.abs(dxh).mean(1, keepdims=True)
                                                      + np.abs(xhat) * (np.abs(dxh * xhat).mean(1, keepdims=True) + np.abs(s2)))
                                + np.abs(dx0))
    d_m, d_r = cp.asarray(m32), cp.asarray(r32)
    for v in VERSIONS[8:10]:
        if v.name == "vec" and not vec_ok(C):
            continue
        for prec in v.precisions:
            kern = common.build(cp, v, prec)[v.kernels[0]]
            dx = cp.asarray(dx0)
            copy = cp.zeros((N, C), cp.uint16) if prec != "fp32" else None
            argv = (d["dout"], d["x"], d_m, d_r, d["g"], dx, null if copy is None else copy, np.int32(N), np.int32(C))

            def case(kern=kern, argv=argv, dx=dx, copy=copy, prec=prec):
                kern(grid, (256,), argv)
                err = common.compare(dx.get(), dx_ref, rtol=0, atol=dx_bound, what="dx")
                if copy is not None:  # the 16-bit copy: the fp32 result rounded once more
                    err = err.worst(common.compare(common.from_h16(copy.get(), prec), dx_ref, rtol=common.u(prec),
                                                   atol=dx_bound + common.tiny(prec), what="dx_h16"))
                ms = common.bench(cp, lambda: kern(grid, (256,), argv), reps)
                return err, ms, common.gbps(N * C * (16 + (0 if copy is None else 2)) + 8 * N + 4 * C, ms)

            report.attempt(v.op, v.name, prec, shape, case, v.production)

    v = VERSIONS[10]
    kp = common.build(cp, v)
    chunks = (N + LN_ROWS - 1) // LN_ROWS
    partial = cp.zeros((chunks, 2 * C), cp.float32)
    dg, db = cp.asarray(dg0), cp.asarray(db0)

    def params():
        kp["layernorm_bwd_params"]((common.blocks(C, 128), chunks), (128,), (d["dout"], d["x"], d_m, d_r, partial,
                                                                              np.int32(N), np.int32(C), np.int32(LN_ROWS)))
        kp["ln_partials_final"]((common.blocks(2 * C, 32),), (32, 8), (partial, dg, db, np.int32(chunks), np.int32(C)))

    def case_params():
        params()
        # each column: LN_ROWS terms in order per chunk, then the chunks and the old value in order
        n = LN_ROWS + chunks + 1
        err = common.compare(dg.get(), dg_ref, rtol=0, atol=(n + 3) * u32 * (np.abs(dout * xhat).sum(0) + np.abs(dg0)), what="dg")
        err = err.worst(common.compare(db.get(), db_ref, rtol=0, atol=n * u32 * (np.abs(f64(dout)).sum(0) + np.abs(db0)), what="db"))
        ms = common.bench(cp, params, reps)
        return err, ms, common.gbps(2 * N * C * 4 + 8 * N + 2 * chunks * 2 * C * 4, ms)

    report.attempt(v.op, v.name, "fp32", shape, case_params)

    if not vec_ok(C):
        return
    rows = max(8, min(64, N // 256 // 8 * 8))  # andrea.engine.cupy.layernorm.ln_fused_rows
    chunks = (N + rows - 1) // rows
    partial = cp.zeros((chunks, 2 * C), cp.float32)
    n_sum = rows + chunks + 1  # each column: at most `rows` terms per block, then the blocks and the old value
    nv = next(nv for nv in FUSED_NV if 128 * nv >= C)
    for v in (VERSIONS[11], VERSIONS[13], VERSIONS[14]):
        h16_dout = "16-bit dout" in v.name
        in_registers = v.name.endswith("in registers")
        if in_registers and nv not in REG_NV:
            continue
        name = f"layernorm_bwd_fused_{'reg_' if in_registers else ''}{'h16_' if h16_dout else ''}{nv}"
        for prec in v.precisions:
            if h16_dout:  # the kernel reads dout rounded to 16 bits: so does its reference
                dout_v = common.rounded(dout, prec)
                ref_dx, ref_dg, ref_db = f64(dx0), f64(dg0), f64(db0)
                nb.layernorm_bwd(dout_v, f64(x), f64(m32), f64(r32), f64(g), ref_dx, ref_dg, ref_db)
                d_dout = cp.asarray(common.to_h16(dout, prec))
            else:
                dout_v, ref_dx, ref_dg, ref_db, d_dout = f64(dout), dx_ref, dg_ref, db_ref, d["dout"]
            kf = common.build(cp, v, prec)
            dx, dg, db = cp.asarray(dx0), cp.asarray(dg0), cp.asarray(db0)
            copy = cp.zeros((N, C), cp.uint16) if prec != "fp32" else None

            smem = 0 if in_registers else 8 * 2 * C * 4  # andrea.engine.cupy.layernorm.ln_fused_smem: each warp's dγ, dβ sums
            if kf[name].max_dynamic_shared_size_bytes < smem:
                kf[name].max_dynamic_shared_size_bytes = smem

            def fused(kf=kf, dx=dx, dg=dg, db=db, copy=copy, name=name, d_dout=d_dout, smem=smem):
                kf[name]((chunks,), (256,), (d_dout, d["x"], d_m, d_r, d["g"], dx, null if copy is None else copy, partial,
                                             np.int32(N), np.int32(C), np.int32(rows)), shared_mem=smem)
                kf["ln_partials_final"]((common.blocks(2 * C, 32),), (32, 8), (partial, dg, db, np.int32(chunks), np.int32(C)))

            def case_fused(fused=fused, dx=dx, dg=dg, db=db, copy=copy, prec=prec, dout_v=dout_v, ref=(ref_dx, ref_dg, ref_db),
                           esz=2 if h16_dout else 4):
                fused()
                err = common.compare(dx.get(), ref[0], rtol=0, atol=dx_bound, what="dx")
                if copy is not None:
                    err = err.worst(common.compare(common.from_h16(copy.get(), prec), ref[0], rtol=common.u(prec),
                                                   atol=dx_bound + common.tiny(prec), what="dx_h16"))
                err = err.worst(common.compare(dg.get(), ref[1], rtol=0, what="dg",
                                               atol=(n_sum + 3) * u32 * (np.abs(dout_v * xhat).sum(0) + np.abs(dg0))))
                err = err.worst(common.compare(db.get(), ref[2], rtol=0, what="db",
                                               atol=n_sum * u32 * (np.abs(dout_v).sum(0) + np.abs(db0))))
                ms = common.bench(cp, fused, reps)  # dx, dg, db accumulate: later runs do the same work
                nbytes = N * C * (12 + esz + (0 if copy is None else 2)) + 8 * N + 2 * chunks * 2 * C * 4
                return err, ms, common.gbps(nbytes, ms)

            report.attempt(v.op, v.name, prec, shape, case_fused)

    # the 16-bit modes' residual add: the branch f arrives in 16 bits (the reference adds the same values);
    # a warp per row (8 a block), or a block per row of C / 4 threads (generation's few rows)
    vec_v, block_v = VERSIONS[12], VERSIONS[15]
    for v, prec in [(v, prec) for prec in vec_v.precisions for v in (vec_v, block_v)]:
        kern = common.build(cp, v, prec)[v.kernels[0]]
        launch = ((grid, (256,)), ((1,), (256,))) if v is vec_v else (((N,), (-(-C // 128) * 32,)), ((1,), (-(-C // 128) * 32,)))
        f_v = common.rounded(f, prec)
        o_ref, m_ref, r_ref, res_ref, bound, mean_bound = fwd_reference(True, f_v)
        d_f = cp.asarray(common.to_h16(f, prec))
        out = cp.zeros((N, C), cp.uint16)
        argv = (d["x"], d_f, res, d["g"], d["b"], out, *stats, np.int32(N), np.int32(C), np.float32(EPS))

        def case_branch(kern=kern, launch=launch[0], argv=argv, out=out, prec=prec,
                        refs=(o_ref, m_ref, r_ref, res_ref, bound, mean_bound)):
            kern(*launch, argv)
            o_ref, m_ref, r_ref, res_ref, bound, mean_bound = refs
            err = common.compare(common.loaded(out, prec), o_ref, rtol=common.u(prec), atol=bound + common.tiny(prec), what="out")
            err = err.worst(common.compare(stats[0].get(), m_ref, rtol=0, atol=mean_bound, what="mean"))
            err = err.worst(common.compare(stats[1].get(), r_ref, rtol=(k + 5) * u32, what="rstd"))
            err = err.worst(common.compare(res.get(), res_ref, rtol=u32, what="res"))
            ms = common.bench(cp, lambda: kern(*launch, argv), reps)
            return err, ms, common.gbps(N * C * (4 + 2 + 4 + 2) + 8 * N + 8 * C, ms)

        report.attempt(v.op, v.name, prec, shape, case_branch)
        argv1 = argv[:8] + (np.int32(1),) + argv[9:]  # the first row alone: one warp's latency

        def case_one_row(kern=kern, launch=launch[1], argv1=argv1):
            kern(*launch, argv1)
            ms = common.bench(cp, lambda: kern(*launch, argv1), reps)
            return None, ms, common.gbps(C * (4 + 2 + 4 + 2) + 8 + 8 * C, ms)

        report.attempt(v.op, v.name, prec, f"{shape.name} N=1", case_one_row)

    # the 16-bit residual stream: x, f (and dx, dout) stored in 16 bits; the reference takes the same
    # stored values, and the stream the kernel writes is fp32(x + f) rounded once to 16 bits (exact)
    prec = "bf16"
    x16, f16 = common.rounded(x, prec), common.rounded(f, prec)
    res16 = common.rounded(f32(x16) + f32(f16), prec)  # one fp32 addition, one 16-bit rounding
    d_x16, d_f16 = cp.asarray(common.to_h16(x, prec)), cp.asarray(common.to_h16(f, prec))
    res_out, out = cp.zeros((N, C), cp.uint16), cp.zeros((N, C), cp.uint16)
    nv = next(nv for nv in FUSED_NV if 128 * nv >= C)
    for v in VERSIONS[16:19] + VERSIONS[20:23] + (FWD_R16_B2 if nv == 12 else []):
        add = v.op == "add_layernorm_fwd"
        stream = res16 if add else x16  # what the kernel normalises
        o_ref, m_ref, r_ref = np.empty((N, C)), np.empty(N), np.empty(N)
        nb.layernorm_fwd(stream, f64(g), f64(b), o_ref, m_ref, r_ref, EPS)
        xhat = (stream - m_ref[:, None]) * r_ref[:, None]
        mean_abs = np.abs(stream).mean(1)
        bound = (k + 10) * u32 * (np.abs(xhat * g) + np.abs(b) + (mean_abs * r_ref)[:, None] * np.abs(g))
        rows_a_warp = 4 if v.name.startswith("4 rows") else 2 if v.name.startswith("2 rows") else 0
        kern = common.build(cp, v, prec)[f"add_layernorm_r16_{nv}" if rows_a_warp and v not in FWD_R16_B2 else v.kernels[0]]
        block = "block" in v.name
        launch = (((N,), (-(-C // 128) * 32,)) if block else
                  ((common.blocks(N, 8 * rows_a_warp),), (256,)) if rows_a_warp else (grid, (256,)))
        argv = ((d_x16, d_f16, res_out) if add else (d_x16, null, null)) + (d["g"], d["b"], out, *stats, np.int32(N),
                                                                            np.int32(C), np.float32(EPS))

        def case_stream(kern=kern, launch=launch, argv=argv, add=add, refs=(o_ref, m_ref, r_ref, bound, mean_abs)):
            for a in (out, res_out):
                a.fill(0xFFFF)  # NaN: what a version does not write fails its check (the buffers are shared)
            for a in stats:
                a.fill(np.nan)
            kern(*launch, argv)
            o_ref, m_ref, r_ref, bound, mean_abs = refs
            err = common.compare(common.loaded(out, prec), o_ref, rtol=common.u(prec), atol=bound + common.tiny(prec), what="out")
            err = err.worst(common.compare(stats[0].get(), m_ref, rtol=0, atol=(k + 1) * u32 * mean_abs, what="mean"))
            err = err.worst(common.compare(stats[1].get(), r_ref, rtol=(k + 5) * u32, what="rstd"))
            if add:  # the stream written: exactly the host's fp32 sum rounded to 16 bits
                err = err.worst(common.compare(common.loaded(res_out, prec), res16, rtol=0, what="res"))
            ms = common.bench(cp, lambda: kern(*launch, argv), reps)
            return err, ms, common.gbps(N * C * (2 * (3 if add else 1) + 2) + 8 * N + 8 * C, ms)

        report.attempt(v.op, v.name, prec, shape, case_stream, v.production)

    # the backward over the 16-bit stream: dout, x and the old dx in 16 bits; dx is updated in fp32 and
    # rounded once to 16 bits, and it is the branch's gradient (no copy)
    compact = {6: COMPACT_R16[:1], 12: COMPACT_R16}.get(nv, [])  # the compact kernels built: c6, c12, c12b2
    production_bits = {}  # the production kernel's dx, dγ, dβ: the compact ones must give the same bits
    for v in [VERSIONS[19], *compact]:
        name = f"layernorm_bwd_fused_h16_r16_{nv}" if v is VERSIONS[19] else next(n for n in v.kernels if n.endswith(f"c{nv}") or n.endswith(f"c{nv}b2"))
        _layernorm_bwd_r16(cp, report, shape, v, reps, (x, dout, dx0, dg0, db0, g, b), k, rows, chunks, partial, n_sum, d,
                           d_x16, name, production_bits)


def _layernorm_bwd_r16(cp, report, shape, v, reps, inputs, k, rows, chunks, partial, n_sum, d, d_x16, name, bits):
    """One version of the 16-bit stream's backward (kernel `name`: layernorm_bwd_fused_h16_r16_<NV> or
    a compact one) against NumPy; `bits`: the first version's dx, dγ, dβ are kept there, and a later
    version's must equal them bit for bit (the compact kernels compute the same operations)."""
    x, dout, dx0, dg0, db0, g, b = inputs
    N, C, prec, u32 = shape.N, shape.C, "bf16", common.u("fp32")
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    x16 = common.rounded(x, prec)
    dout16, dx016 = common.rounded(dout, prec), common.rounded(dx0, prec)
    _, m16, r16 = np.empty((N, C)), np.empty(N), np.empty(N)
    nb.layernorm_fwd(x16, f64(g), f64(b), _, m16, r16, EPS)  # the forward's statistics of the stored stream
    m16, r16 = f32(m16), f32(r16)
    ref_dx, ref_dg, ref_db = dx016.copy(), f64(dg0), f64(db0)
    nb.layernorm_bwd(dout16, x16, f64(m16), f64(r16), f64(g), ref_dx, ref_dg, ref_db)
    xhat16 = (x16 - f64(m16)[:, None]) * f64(r16)[:, None]
    dxh16 = dout16 * g
    s2_16 = (dxh16 * xhat16).mean(1, keepdims=True)
    dx16_bound = (k + 6) * u32 * (f64(r16)[:, None] * (np.abs(dxh16) + np.abs(dxh16).mean(1, keepdims=True)
                                                        + np.abs(xhat16) * (np.abs(dxh16 * xhat16).mean(1, keepdims=True)
                                                                            + np.abs(s2_16))) + np.abs(dx016))
    kf = common.build(cp, v, prec)
    smem = 8 * 2 * C * 4
    if kf[name].max_dynamic_shared_size_bytes < smem:
        kf[name].max_dynamic_shared_size_bytes = smem
    dx = cp.asarray(common.to_h16(dx0, prec))
    dg, db = cp.asarray(dg0), cp.asarray(db0)
    d_dout16, d_m16, d_r16 = cp.asarray(common.to_h16(dout, prec)), cp.asarray(m16), cp.asarray(r16)

    def fused16():
        kf[name]((chunks,), (256,), (d_dout16, d_x16, d_m16, d_r16, d["g"], dx, partial, np.int32(N), np.int32(C),
                                     np.int32(rows)), shared_mem=smem)
        kf["ln_partials_final"]((common.blocks(2 * C, 32),), (32, 8), (partial, dg, db, np.int32(chunks), np.int32(C)))

    def case_fused16():
        fused16()
        got = {"dx": dx.get(), "dg": dg.get(), "db": db.get()}
        err = common.compare(common.loaded(dx, prec), ref_dx, rtol=common.u(prec), atol=dx16_bound + common.tiny(prec),
                             what="dx")
        if bits:  # a compact version: the production kernel's bits
            for what, a in got.items():
                err = err.worst(common.exact(a, bits[what], what=f"{what} bits"))
        else:
            bits.update(got)
        err = err.worst(common.compare(dg.get(), ref_dg, rtol=0, what="dg",
                                       atol=(n_sum + 3) * u32 * (np.abs(dout16 * xhat16).sum(0) + np.abs(dg0))))
        err = err.worst(common.compare(db.get(), ref_db, rtol=0, what="db",
                                       atol=n_sum * u32 * (np.abs(dout16).sum(0) + np.abs(db0))))
        dx[...] = cp.asarray(common.to_h16(dx0, prec))  # dx accumulates: time from the same start
        ms = common.bench(cp, fused16, reps)
        return err, ms, common.gbps(N * C * (2 + 2 + 2 + 2) + 8 * N + 2 * chunks * 2 * C * 4, ms)

    report.attempt(v.op, v.name, prec, shape, case_fused16, v.production)


def main(argv=None) -> int:
    return common.run_script(__doc__, SCRIPT, EDGE, [run_shape], argv)


if __name__ == "__main__":
    raise SystemExit(main())
