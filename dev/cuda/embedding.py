"""Embedding kernels (andrea/kernels/embedding.cu): the token + position lookup and its two
backward kernels, checked against andrea/engine/numpy_backend.embed_fwd / embed_bwd and timed.

    python3 dev/cuda/embedding.py [--quick]

embed_fwd          out[b, t] = wte[tok[b, t]] + wpe[t]
embed_bwd_wpe      dwpe[t] += Σ_b dout[b, t]  (b in order)
embed_bwd_planned  dwte[v] += Σ dout over the positions of token v, planned on the host
                   (CupyBackend.plan_tokens: positions sorted stably by token), one block per token
*_h16              the same over a 16-bit (bf16) residual stream (the bf16 and fp8 modes): embed_fwd_h16
                   writes the fp32 sum rounded once to 16 bits; embed_bwd_wpe_h16 and
                   embed_bwd_planned_h16 read a 16-bit dout and sum it in fp32 in the same order (their
                   reference: numpy_backend.embed_bwd on dout rounded to bf16)
"""

from __future__ import annotations

import common
import numpy as np

from andrea.engine import numpy_backend as nb

SCRIPT = "embedding"
REFERENCES = {"embed_fwd": nb.embed_fwd, "embed_bwd_wpe": nb.embed_bwd, "embed_bwd_planned": nb.embed_bwd}
V = common.Version
BF = ("bf16",)
VERSIONS = [
    V("embed_fwd", "embed_fwd", ("embed_fwd",), "embedding.cu"),
    V("embed_bwd_wpe", "embed_bwd_wpe", ("embed_bwd_wpe",), "embedding.cu"),
    V("embed_bwd_planned", "embed_bwd_planned", ("embed_bwd_planned",), "embedding.cu"),
    # the 16-bit residual stream (andrea/engine/cupy residual_from_env: the bf16 and fp8 modes)
    V("embed_fwd", "embed_fwd_h16", ("embed_fwd_h16",), "embedding.cu", BF),
    V("embed_bwd_wpe", "embed_bwd_wpe_h16", ("embed_bwd_wpe_h16",), "embedding.cu", BF),
    V("embed_bwd_planned", "embed_bwd_planned_h16", ("embed_bwd_planned_h16",), "embedding.cu", BF),
]
EDGE = [common.Shape("edge B=3 T=37 C=130", 3, 37, 130, 2, 301)]  # C not a multiple of 4 or of the block


def tokens(rng, shape):
    """Token IDs drawn with a skew like text's (a few IDs very frequent): the planned backward's
    blocks then do unequal work, as in training."""
    p = 1.0 / (np.arange(shape.V) + 10.0)
    return rng.choice(shape.V, size=(shape.B, shape.T), p=p / p.sum()).astype(np.int32)


def run_shape(cp, report, shape, rng, reps):
    from andrea.engine.cupy import CupyBackend

    plan_tokens = CupyBackend.plan_tokens  # the production planner (host side)
    B, T, C, Vv, N = shape.B, shape.T, shape.C, shape.V, shape.N
    u = common.u("fp32")
    tok = tokens(rng, shape)
    wte = rng.standard_normal((Vv, C)).astype(np.float32)
    wpe = rng.standard_normal((T, C)).astype(np.float32)
    dout = rng.standard_normal((B, T, C)).astype(np.float32)
    dwte0 = rng.standard_normal((Vv, C)).astype(np.float32)  # the kernels accumulate: start non-zero
    dwpe0 = rng.standard_normal((T, C)).astype(np.float32)
    f64 = lambda a: a.astype(np.float64)  # noqa: E731

    out_ref = np.zeros((B, T, C))
    nb.embed_fwd(tok, f64(wte), f64(wpe), out_ref)
    dwte_ref, dwpe_ref = f64(dwte0), f64(dwpe0)
    nb.embed_bwd(f64(dout), tok, dwte_ref, dwpe_ref)
    # Σ|terms| of each accumulated sum: the same reference on absolute values
    dwte_abs, dwpe_abs = np.abs(f64(dwte0)), np.abs(f64(dwpe0))
    nb.embed_bwd(np.abs(f64(dout)), tok, dwte_abs, dwpe_abs)
    most = int(np.bincount(tok.reshape(-1)).max())

    d_tok, d_wte, d_wpe, d_dout = (cp.asarray(a) for a in (tok, wte, wpe, dout))
    k = common.build(cp, VERSIONS[0])["embed_fwd"]
    d_out = cp.zeros((B, T, C), cp.float32)
    fwd = lambda: k((common.blocks(N * C),), (256,), (d_tok, d_wte, d_wpe, d_out, np.int32(N), np.int32(T), np.int32(C)))  # noqa: E731

    def case_fwd():
        fwd()
        err = common.compare(d_out.get(), out_ref, rtol=u)  # one fp32 addition: one rounding
        ms = common.bench(cp, fwd, reps)
        return err, ms, common.gbps(3 * N * C * 4 + N * 4, ms)

    report.attempt("embed_fwd", "embed_fwd", "fp32", shape, case_fwd)

    k = common.build(cp, VERSIONS[1])["embed_bwd_wpe"]
    d_dwpe = cp.asarray(dwpe0)
    wpe_bwd = lambda: k((common.blocks(T * C),), (256,), (d_dout, d_dwpe, np.int32(B), np.int32(T), np.int32(C)))  # noqa: E731

    def case_wpe():
        wpe_bwd()
        # B + 1 terms summed in order in fp32: |error| ≤ (B + 1)·u·Σ|terms|
        err = common.compare(d_dwpe.get(), dwpe_ref, rtol=0, atol=(B + 1) * u * dwpe_abs)
        ms = common.bench(cp, wpe_bwd, reps)
        return err, ms, common.gbps((N * C + 2 * T * C) * 4, ms)

    report.attempt("embed_bwd_wpe", "embed_bwd_wpe", "fp32", shape, case_wpe)

    k = common.build(cp, VERSIONS[2])["embed_bwd_planned"]
    plan = cp.asarray(plan_tokens(tok))
    d_dwte = cp.asarray(dwte0)
    n = N
    args = (d_dout, plan[:n], plan[n:2 * n + 1], plan[2 * n + 1:3 * n + 1], plan[3 * n + 1:], d_dwte, np.int32(C))
    planned = lambda: k((n,), (256,), args)  # noqa: E731
    distinct = int(np.unique(tok).size)

    def case_planned():
        planned()
        # each row sums (its token's count + 1) terms in position order: ≤ (count + 1)·u·Σ|terms|
        err = common.compare(d_dwte.get(), dwte_ref, rtol=0, atol=(most + 1) * u * dwte_abs)
        ms = common.bench(cp, planned, reps)
        return err, ms, common.gbps((N * C + 2 * distinct * C) * 4 + 3 * N * 4, ms)

    report.attempt("embed_bwd_planned", "embed_bwd_planned", "fp32", shape, case_planned)

    # ---- the 16-bit residual stream: the same tables and tokens, dout rounded to bf16
    prec = "bf16"
    u16 = common.u(prec)
    # the kernel's fp32 sum is one IEEE addition, as NumPy's in fp32: the fp32 result itself
    out32 = np.zeros((B, T, C), np.float32)
    nb.embed_fwd(tok, wte, wpe, out32)
    k = common.build(cp, VERSIONS[3], prec)["embed_fwd_h16"]
    d_out16 = cp.zeros((B, T, C), cp.uint16)
    fwd16 = lambda: k((common.blocks(N * C),), (256,), (d_tok, d_wte, d_wpe, d_out16, np.int32(N), np.int32(T), np.int32(C)))  # noqa: E731

    def case_fwd16():
        fwd16()
        # the fp32 result rounded once to 16 bits: u16·|x| + the subnormal half step
        err = common.compare(common.loaded(d_out16, prec), out32.astype(np.float64), rtol=u16, atol=common.tiny(prec))
        ms = common.bench(cp, fwd16, reps)
        return err, ms, common.gbps(2 * N * C * 4 + N * C * 2 + N * 4, ms)

    report.attempt("embed_fwd", VERSIONS[3].name, prec, shape, case_fwd16)

    # dout as the kernels see it (exact in fp32), then the fp32 checks' reference and bounds on it
    dout16 = common.to_h16(dout, prec)
    dout_r = common.from_h16(dout16, prec)
    dwte_ref16, dwpe_ref16 = f64(dwte0), f64(dwpe0)
    nb.embed_bwd(dout_r, tok, dwte_ref16, dwpe_ref16)
    dwte_abs16, dwpe_abs16 = np.abs(f64(dwte0)), np.abs(f64(dwpe0))
    nb.embed_bwd(np.abs(dout_r), tok, dwte_abs16, dwpe_abs16)
    d_dout16 = cp.asarray(dout16)

    k = common.build(cp, VERSIONS[4], prec)["embed_bwd_wpe_h16"]
    d_dwpe16 = cp.asarray(dwpe0)
    wpe_bwd16 = lambda: k((common.blocks(T * C),), (256,), (d_dout16, d_dwpe16, np.int32(B), np.int32(T), np.int32(C)))  # noqa: E731

    def case_wpe16():
        wpe_bwd16()
        # the 16-bit values are exact in fp32: the fp32 sum's bound, (B + 1)·u·Σ|terms|
        err = common.compare(d_dwpe16.get(), dwpe_ref16, rtol=0, atol=(B + 1) * u * dwpe_abs16)
        ms = common.bench(cp, wpe_bwd16, reps)
        return err, ms, common.gbps(N * C * 2 + 2 * T * C * 4, ms)

    report.attempt("embed_bwd_wpe", VERSIONS[4].name, prec, shape, case_wpe16)

    k = common.build(cp, VERSIONS[5], prec)["embed_bwd_planned_h16"]
    d_dwte16 = cp.asarray(dwte0)
    args16 = (d_dout16, plan[:n], plan[n:2 * n + 1], plan[2 * n + 1:3 * n + 1], plan[3 * n + 1:], d_dwte16, np.int32(C))
    planned16 = lambda: k((n,), (256,), args16)  # noqa: E731

    def case_planned16():
        planned16()
        # as the fp32 check: (count + 1)·u·Σ|terms| per row, the terms exact in fp32
        err = common.compare(d_dwte16.get(), dwte_ref16, rtol=0, atol=(most + 1) * u * dwte_abs16)
        ms = common.bench(cp, planned16, reps)
        return err, ms, common.gbps(N * C * 2 + 2 * distinct * C * 4 + 3 * N * 4, ms)

    report.attempt("embed_bwd_planned", VERSIONS[5].name, prec, shape, case_planned16)


def main(argv=None) -> int:
    return common.run_script(__doc__, SCRIPT, EDGE, [run_shape], argv)


if __name__ == "__main__":
    raise SystemExit(main())
