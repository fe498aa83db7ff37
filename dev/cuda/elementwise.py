"""Elementwise and optimizer kernels (andrea/kernels/elementwise.cu): GELU, the 16-bit casts,
global gradient-norm clipping and AdamW, checked against andrea/engine/numpy_backend and timed.

    python3 dev/cuda/elementwise.py [--quick]

gelu_fwd / gelu_bwd   fp32 (gelu_fwd, gelu_bwd), 16-bit one element per thread (*_h16), 16-bit
                      eight elements per thread with tanh on the SFU (*_h16x8, n a multiple of 8);
                      references numpy_backend.gelu and the GELU derivative inside mlp_bwd;
                      x8 + recompute (gelu_bwd_recompute_h16x8, production's 16-bit MLP backward)
                      also writes a = gelu(h), checked against numpy_backend.gelu
cast_h16              fp32 -> bf16/fp16, and with the zero gap of the padded head (cast_h16_gap)
grad_norm             per-block double sums of squares, then their ordered sum and square root
grad_scale            g *= scale
adamw                 fused AdamW (gradient scale folded in), and adamw_h16 that also refreshes the
                      16-bit copy of the weights (with the gap), of all or of a stretch (fp8: the head)
step_control          the step's decisions from the norm's partial sums (norm, applied, clipping
                      scale, bias corrections, step count: Backend.step_control), without and with
                      clipping, with an fp16 loss scale, and for a non-finite norm
GELU runs over the MLP's hidden activations (B·T × 4C); the optimizer kernels over the model's
flat parameter buffer (andrea.model's layout, the tied head's copy padded to 64 rows).
"""

from __future__ import annotations

import common
import numpy as np

from andrea.engine import numpy_backend as nb
from andrea.model import ModelConfig, decay_mask, param_layout


def gelu_bwd_reference(h, da):
    """da·GELU'(h) through numpy_backend.mlp_bwd, whose GELU derivative is computed inline: with
    W1 = W2 = I (width K) and x = 0 its dx is exactly dout·GELU'(h) (products with I are exact)."""
    K = 64
    n = h.size
    pad = -n % K
    h2 = np.concatenate([h.reshape(-1), np.zeros(pad)]).reshape(-1, K)
    da2 = np.concatenate([da.reshape(-1), np.zeros(pad)]).reshape(-1, K)
    eye, zeros = np.eye(K), np.zeros_like(h2)
    dx = np.empty_like(h2)
    nb.mlp_bwd(da2, zeros, h2, zeros, eye, eye, dx, np.zeros((K, K)), np.zeros((K, K)))
    return dx.reshape(-1)[:n].reshape(h.shape)


def cast_reference(x, precision):
    """Round to nearest even (numpy_backend keeps no 16-bit copies: IEEE rounding is the reference)."""
    return common.to_h16(x, precision)


SCRIPT = "elementwise"
REFERENCES = {"gelu_fwd": nb.gelu, "gelu_bwd": gelu_bwd_reference, "cast_h16": cast_reference,
              "cast_h16_gap": cast_reference, "grad_norm": nb.grad_norm_final, "grad_scale": nb.grad_scale,
              "adamw": nb.adamw, "step_control": nb.NumpyBackend().step_control}
V = common.Version
H16 = ("bf16", "fp16")
SRC = "elementwise.cu"
VERSIONS = [
    V("gelu_fwd", "scalar", ("gelu_fwd",), SRC),
    V("gelu_fwd", "scalar", ("gelu_fwd_h16",), SRC, H16),
    V("gelu_fwd", "x8", ("gelu_fwd_h16x8",), SRC, H16),
    V("gelu_bwd", "scalar", ("gelu_bwd",), SRC),
    V("gelu_bwd", "scalar", ("gelu_bwd_h16",), SRC, H16),
    V("gelu_bwd", "x8", ("gelu_bwd_h16x8",), SRC, H16, production=False),  # production: "x8 + recompute" below
    V("cast_h16", "cast_h16", ("cast_h16",), SRC, H16),
    V("cast_h16_gap", "cast_h16_gap", ("cast_h16_gap",), SRC, H16),
    V("grad_norm", "partial+final", ("grad_norm_partial", "grad_norm_final"), SRC),
    V("grad_scale", "grad_scale", ("grad_scale",), SRC),
    V("adamw", "adamw", ("adamw",), SRC),
    V("adamw", "adamw_h16", ("adamw_h16",), SRC, H16),
    # the 16-bit MLP backward's one pass: da *= gelu'(h) and a = gelu(h) recomputed (checked as both)
    V("gelu_bwd", "x8 + recompute", ("gelu_bwd_recompute_h16x8",), SRC, H16),
    V("step_control", "one thread", ("step_control",), SRC),
]
GELU_C = np.sqrt(2 / np.pi)
TANH_APPROX = 2.0**-10.987  # tanh.approx.f32's maximum relative error (PTX ISA), the x8 kernels' tanh
VOCAB_PAD = 64
NORM_BLOCK = 1 << 16  # elements per partial sum of squares (numpy_backend.grad_norm_partial's default)
EDGE = [common.Shape("edge B=3 T=37 C=130", 3, 37, 130, 2, 301),
        common.Shape("edge B=1 T=7 C=3", 1, 7, 3, 1, 301)]  # n % 8 != 0: no x8 kernels; n < one block


def gelu_error_terms(x, precision):
    """|∂out| bounds of GELU at x: the fp32 evaluation's (a few roundings in the polynomial, tanhf's
    2 ulp, and the cancellation in 1 + t for x < 0, all ≤ 8u·|x|·(1 + |arg|)), and the x8 kernels'
    tanh.approx error (relative TANH_APPROX of t, times 0.5·|x|)."""
    arg = GELU_C * (x + 0.044715 * x**3)
    t = np.tanh(arg)
    fwd32 = 8 * common.u("fp32") * np.abs(x) * (1 + np.abs(arg))
    # the derivative's sensitivity to t: ∂d/∂t = 0.5 − x·t·c·(1 + 3·0.044715·x²)
    dd_dt = 0.5 + np.abs(x * t) * GELU_C * (1 + 3 * 0.044715 * x * x)
    bwd32 = 8 * common.u("fp32") * (1 + np.abs(arg)) * (1 + dd_dt)
    approx_fwd = 0.5 * np.abs(x) * np.abs(t) * TANH_APPROX if precision != "fp32" else 0
    approx_bwd = dd_dt * np.abs(t) * TANH_APPROX if precision != "fp32" else 0
    return fwd32, bwd32, approx_fwd, approx_bwd


def run_gelu(cp, report, shape, rng, reps):
    n = shape.N * shape.M
    for prec in ("fp32",) + H16:
        h = common.rounded(rng.standard_normal(n) * 1.5, prec)  # the values the kernel sees
        da = common.rounded(rng.standard_normal(n), prec)
        a_ref = np.empty(n)
        nb.gelu(h, a_ref)
        dh_ref = gelu_bwd_reference(h, da)
        fwd32, bwd32, approx_fwd, approx_bwd = gelu_error_terms(h, prec)
        oh, tiny = common.u(prec), common.tiny(prec)  # the output's one rounding to its storage type
        esz = 4 if prec == "fp32" else 2
        d_h = cp.asarray(common.stored(h, prec))
        for ver in [v for v in VERSIONS if v.op in ("gelu_fwd", "gelu_bwd")]:
            x8 = ver.name.startswith("x8")
            if prec not in ver.precisions or (x8 and n % 8):
                continue
            kern = common.build(cp, ver, prec)[ver.kernels[0]]
            count = np.int64(n // 8 if x8 else n)
            grid = (common.blocks(int(count)),)
            if ver.op == "gelu_fwd":
                out = cp.zeros(n, d_h.dtype)
                run = lambda kern=kern, out=out, grid=grid, count=count: kern(grid, (256,), (d_h, out, count))  # noqa: E731

                def case(run=run, out=out, x8=x8, prec=prec):
                    run()
                    atol = fwd32 + (approx_fwd if x8 else 0)
                    err = common.compare(common.loaded(out, prec), a_ref, rtol=oh, atol=atol + tiny)
                    ms = common.bench(cp, run, reps)
                    return err, ms, common.gbps(2 * n * esz, ms)
            else:
                d_da = cp.asarray(common.stored(da, prec))
                recompute = ver.name == "x8 + recompute"
                out = cp.zeros(n, d_h.dtype) if recompute else None
                argv = (d_h, d_da, out, count) if recompute else (d_h, d_da, count)
                run = lambda kern=kern, grid=grid, argv=argv: kern(grid, (256,), argv)  # noqa: E731

                def case(run=run, d_da=d_da, x8=x8, prec=prec, out=out):
                    run()
                    atol = np.abs(da) * (bwd32 + (approx_bwd if x8 else 0))
                    err = common.compare(common.loaded(d_da, prec), dh_ref, rtol=oh, atol=atol + tiny)
                    if out is not None:  # the recomputed activation, as gelu_fwd's
                        err = err.worst(common.compare(common.loaded(out, prec), a_ref, rtol=oh,
                                                       atol=fwd32 + approx_fwd + tiny, what="a"))
                    ms = common.bench(cp, run, reps)  # in place: later runs multiply again, the same work
                    return err, ms, common.gbps((3 if out is None else 4) * n * esz, ms)

            report.attempt(ver.op, ver.name, prec, shape, case, ver.production)


def model_buffers(shape):
    """The flat parameter count, the weight-decay mask and the head's gap of a model of this shape
    (tied head: wte's rows first, its 16-bit copy padded to a multiple of VOCAB_PAD rows)."""
    cfg = ModelConfig(vocab_size=shape.V, d_model=shape.C, n_head=shape.H, n_layer=shape.L, context=shape.T)
    layout = param_layout(cfg)
    decay = decay_mask(layout, dtype=np.uint8)
    Vp = -(-shape.V // VOCAB_PAD) * VOCAB_PAD
    return decay.size, decay, shape.V * shape.C, (Vp - shape.V) * shape.C


def run_optimizer(cp, report, shape, rng, reps):
    n, decay, gap_at, gap = model_buffers(shape)
    u32 = common.u("fp32")
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    w = f32(rng.standard_normal(n) * 0.02)
    g = f32(rng.standard_normal(n) * 0.01)
    d_w, d_g = cp.asarray(w), cp.asarray(g)

    for prec in H16:
        for ver in VERSIONS[6:8]:
            kern = common.build(cp, ver, prec)[ver.kernels[0]]
            gapped = ver.op == "cast_h16_gap"
            size = n + (gap if gapped else 0)
            sentinel = common.to_h16(np.full(1, 7.0), prec)[0]
            out = cp.full(size, int(sentinel), cp.uint16)
            argv = (d_w, out, np.int64(n)) + ((np.int64(gap_at), np.int64(gap)) if gapped else ())
            run = lambda kern=kern, argv=argv: kern((common.blocks(n),), (256,), argv)  # noqa: E731

            def case(run=run, out=out, prec=prec, gapped=gapped, sentinel=sentinel):
                run()
                got = out.get()
                want = cast_reference(w, prec)
                if gapped:  # the copy with the gap: the gap itself untouched
                    want = np.concatenate([want[:gap_at], np.full(gap, sentinel, np.uint16), want[gap_at:]])
                err = common.exact(got, want)  # both round to nearest even: the same bits
                ms = common.bench(cp, run, reps)
                return err, ms, common.gbps(n * 6, ms)

            report.attempt(ver.op, ver.name, prec, shape, case)

    kn = common.build(cp, VERSIONS[8])
    nblocks = -(-n // NORM_BLOCK)
    partial = cp.zeros(nblocks, cp.float64)
    norm = cp.zeros(1, cp.float64)
    part_ref = np.empty(nblocks)
    nb.grad_norm_partial(f64(g), part_ref, NORM_BLOCK)
    norm_ref = nb.grad_norm_final(part_ref)

    def run_norm():
        kn["grad_norm_partial"]((nblocks,), (256,), (d_g, partial, np.int64(n), np.int64(NORM_BLOCK)))
        kn["grad_norm_final"]((1,), (1,), (partial, np.int32(nblocks), norm))

    def case_norm():
        run_norm()
        # squares of fp32 values are exact in double; both sides add ≤ NORM_BLOCK positive terms
        # per partial (and the partials) in double, each sum within (terms)·2^-53 relative
        rtol = 2 * (NORM_BLOCK + nblocks) * 2.0**-53
        err = common.compare(partial.get(), part_ref, rtol=rtol, what="partial")
        err = err.worst(common.compare(norm.get(), [norm_ref], rtol=rtol, what="norm"))
        ms = common.bench(cp, run_norm, reps)
        return err, ms, common.gbps(n * 4, ms)

    report.attempt("grad_norm", "partial+final", "fp32", shape, case_norm)

    ks = common.build(cp, VERSIONS[9])["grad_scale"]
    scale = float(np.float32(0.37))  # the kernel's fp32 scale; the reference gets the same value
    d_gs = cp.asarray(g)
    run_scale = lambda: ks((common.blocks(n),), (256,), (d_gs, np.float32(scale), np.int64(n)))  # noqa: E731

    def case_scale():
        run_scale()
        want = f64(g)
        nb.grad_scale(want, scale)
        err = common.compare(d_gs.get(), want, rtol=u32)  # one product, one rounding
        ms = common.bench(cp, run_scale, reps)
        return err, ms, common.gbps(n * 8, ms)

    report.attempt("grad_scale", "grad_scale", "fp32", shape, case_scale)

    kc = common.build(cp, VERSIONS[-1])["step_control"]
    ref_backend = nb.NumpyBackend()
    betas = (0.9, 0.95)
    poisoned = part_ref.copy()
    poisoned[-1] = np.nan
    # (case, partial sums, clip, loss scale, steps applied before)
    for label, parts, clip, scale, t0 in [("no clip", part_ref, 2 * norm_ref, 1.0, 0),
                                          ("clipped", part_ref, norm_ref / 3, 1.0, 9),
                                          ("fp16 scale", part_ref * 2.0**20, norm_ref / 2, 1024.0, 3),
                                          ("non-finite", poisoned, 1.0, 1.0, 5)]:
        d_parts = cp.asarray(parts)
        ctrl = cp.zeros(6, cp.float64)
        args = (d_parts, np.int32(nblocks), ctrl, np.float64(clip), np.float64(scale), *map(np.float64, betas))

        def run_ctrl(args=args, ctrl=ctrl, t0=t0):
            ctrl[:] = 0.0
            ctrl[5] = t0
            kc((1,), (1,), args)

        def case_ctrl(run=run_ctrl, parts=parts, clip=clip, scale=scale, t0=t0, ctrl=ctrl, label=label):
            run()
            want = np.zeros(6)
            want[5] = t0
            ref_backend.step_control(parts, want, clip, scale, *betas)
            got = ctrl.get()
            rtol = 2 * (NORM_BLOCK + nblocks) * 2.0**-53  # the norm's sums, as grad_norm's
            finite = np.isfinite(want[0])
            err = common.exact(np.isfinite(got[0]), finite, what="norm finite")
            if finite:
                err = err.worst(common.compare(got[[0, 2]], want[[0, 2]], rtol=2 * rtol, what="norm, gscale"))
            err = err.worst(common.exact(got[[1, 5]], want[[1, 5]], what="applied, t"))
            # 1 − βᵗ: CUDA's pow within 2 ulp of the host's (about 1), absolute
            err = err.worst(common.compare(got[3:5], want[3:5], rtol=0, atol=4 * 2.0**-53, what="bc1, bc2"))
            return err, common.bench(cp, run, reps), label

        report.attempt("step_control", "one thread", "fp32", shape, case_ctrl)

    # AdamW at step 10 from non-zero moments, gradients scaled by 0.5 (clipping folded in)
    hyper = {k: float(np.float32(x)) for k, x in dict(lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1).items()}
    step, gscale = 10, float(np.float32(0.5))
    m0 = f32(rng.standard_normal(n) * 0.005)
    v0 = f32(np.abs(rng.standard_normal(n)) * 1e-5 + 1e-7)
    w_ref, g_ref, m_ref, v_ref = f64(w), f64(g), f64(m0), f64(v0)
    nb.adamw(w_ref, g_ref, m_ref, v_ref, f64(decay), step=step, gscale=gscale, **hyper)
    b1, b2, lr = hyper["beta1"], hyper["beta2"], hyper["lr"]
    bc1, bc2 = 1 - b1**step, 1 - b2**step
    gs = np.abs(f64(g)) * gscale
    # m, v: a scaled gradient and a weighted sum, a few roundings of each term
    m_bound = 4 * u32 * (b1 * np.abs(m0) + (1 - b1) * gs)
    v_bound = 5 * u32 * (b2 * v0 + (1 - b2) * gs * gs)
    denom = np.sqrt(v_ref / bc2) + hyper["eps"]
    upd = lr * np.abs(m_ref) / bc1 / denom
    # w: the decay and the step (≈ 10 roundings of the update, bc1 and bc2 rounded to fp32), plus
    # the errors of m and v carried through the update
    w_bound = 4 * u32 * np.abs(w) + 12 * u32 * upd + lr * m_bound / bc1 / denom + upd * v_bound / (2 * v_ref)
    args = tuple(np.float32(x) for x in (hyper["lr"], b1, b2, hyper["eps"], hyper["weight_decay"], bc1, bc2))
    d_decay = cp.asarray(decay)

    # adamw_h16's copy of all of w, and of a stretch of it (fp8: the head alone), its gap inside
    GUARD = 64
    spans = {"adamw": [None], "adamw_h16": [(0, n, gap_at), (n // 3, 2 * (n // 3), n // 6)]}
    for ver in [v for v in VERSIONS if v.op == "adamw"]:
        for prec, span in [(p, s) for p in ver.precisions for s in spans[ver.name]]:
            ka = common.build(cp, ver, prec)[ver.kernels[0]]
            state = [cp.asarray(a) for a in (w, g, m0, v0)]
            h16 = span is not None
            sentinel = common.to_h16(np.full(1, 7.0), prec if h16 else "bf16")[0]
            lo, hi, at = span if h16 else (0, 0, 0)
            # the copy between GUARD sentinels each side: a write outside it shows
            wb = cp.full(hi - lo + gap + 2 * GUARD, int(sentinel), cp.uint16) if h16 else None
            extra = (wb[GUARD:], np.int64(at), np.int64(gap), np.int64(lo), np.int64(hi)) if h16 else ()
            argv = (*state, d_decay, *extra, np.float32(gscale), *args, np.int64(n), np.uint64(0), np.int32(0))  # no ctrl; a mask per parameter
            run = lambda ka=ka, argv=argv: ka((common.blocks(n),), (256,), argv)  # noqa: E731

            def case(run=run, state=state, wb=wb, prec=prec, sentinel=sentinel, lo=lo, hi=hi, at=at):
                run()
                w_got = state[0].get()
                err = common.compare(w_got, w_ref, rtol=0, atol=w_bound, what="w")
                err = err.worst(common.compare(state[2].get(), m_ref, rtol=0, atol=m_bound, what="m"))
                err = err.worst(common.compare(state[3].get(), v_ref, rtol=0, atol=v_bound, what="v"))
                if wb is not None:  # the 16-bit copy is the kernel's own new w, rounded: exactly those bits
                    want = common.to_h16(w_got[lo:hi], prec)
                    guard = np.full(GUARD, sentinel, np.uint16)
                    want = np.concatenate([guard, want[:at], np.full(gap, sentinel, np.uint16), want[at:], guard])
                    err = err.worst(common.exact(wb.get(), want, what="16-bit copy"))
                ms = common.bench(cp, run, reps)  # repeated steps: the same work
                return err, ms, common.gbps(n * (4 * 4 + 3 * 4 + 1) + 2 * (hi - lo), ms)

            report.attempt("adamw", ver.name + ("" if span in (None, spans["adamw_h16"][0]) else " (a stretch)"),
                           prec, shape, case)


def main(argv=None) -> int:
    return common.run_script(__doc__, SCRIPT, EDGE, [run_gelu, run_optimizer], argv)


if __name__ == "__main__":
    raise SystemExit(main())
