"""Classifier kernels (andrea/kernels/classifier.cu): fused softmax cross-entropy over the logits,
checked against andrea/engine/numpy_backend.loss_fwd / loss_bwd and timed.

    python3 dev/cuda/classifier.py [--quick]

softmax_xent_fwd  fp32 mode: logits -> probabilities in place, and each row's loss
softmax_xent_bwd  fp32 mode: probabilities -> (p − onehot)·dloss/N in place
softmax_xent_h16  16-bit modes, one pass: each row's loss, and the row overwritten by
                  (softmax − onehot)·loss_scale in bf16 or fp16; rows padded to a multiple of 64
                  (the padding must stay untouched). Two kernels: softmax_xent_h16_rows holds the
                  row in registers (16-byte loads, XENT_NV vectors a thread, the block sized by
                  andrea.engine.cupy.kernels.xent_threads, e^x as an FMA and ex2.approx);
                  softmax_xent_h16 (2-byte loads, three reads of the row, expf) takes rows too
                  long for that
Rows are independent: the reference covers 64 of them (the first, the last and 62 drawn). It gets
logits = x·Iᵀ with x the kernel's very logits, so loss_fwd's product reproduces its inputs exactly.
"""

from __future__ import annotations

import common
import numpy as np

from andrea.engine import numpy_backend as nb

SCRIPT = "classifier"
REFERENCES = {"softmax_xent_fwd": nb.loss_fwd, "softmax_xent_bwd": nb.loss_bwd, "softmax_xent_h16": nb.loss_fwd}
V = common.Version
VERSIONS = [
    V("softmax_xent_fwd", "softmax_xent_fwd", ("softmax_xent_fwd",), "classifier.cu"),
    V("softmax_xent_bwd", "softmax_xent_bwd", ("softmax_xent_bwd",), "classifier.cu"),
    V("softmax_xent_h16", "softmax_xent_h16", ("softmax_xent_h16",), "classifier.cu", ("bf16", "fp16")),
    # e^x as one FMA and ex2.approx (production; the tolerance below adds its error), or expf (dev, XENT_EXPF)
    V("softmax_xent_h16", "row in registers", ("softmax_xent_h16_rows",), "classifier.cu", ("bf16", "fp16")),
    V("softmax_xent_h16", "row in registers, expf", ("softmax_xent_h16_rows",), "classifier.cu", ("bf16", "fp16"),
      ("XENT_EXPF",), production=False),
]

VOCAB_PAD = 64  # andrea.engine.cupy.VOCAB_PAD: 16-bit logits rows padded to this many entries
CHECK_ROWS = 64
LOSS_SCALE = {"bf16": 1.0, "fp16": 1024.0}  # fp16 trains with loss scaling: exercise a scale != 1
# V not a multiple of 64 or of the block. (Rows past the register-resident kernel's limit, ~57,000 in
# bf16, are tests/test_gpu_backend.py's: this reference's identity head would be V² values.)
EDGE = [common.Shape("edge B=3 T=37 V=301", 3, 37, 64, 2, 301)]


def reference(z, targets, factor):
    """Probabilities, losses and (p − onehot)·factor of rows of logits z, through
    numpy_backend.loss_fwd / loss_bwd with w = I (so logits = z exactly)."""
    n, Vv = z.shape
    eye = np.eye(Vv)
    probs, losses = np.empty((n, Vv)), np.empty(n)
    nb.loss_fwd(z, eye, targets, probs, losses)
    p = probs.copy()
    dx, dw = np.empty((n, Vv)), np.zeros((Vv, Vv))
    nb.loss_bwd(z, eye, targets, probs, dx, dw, dloss=factor * n)  # it scales by dloss / n
    return p, losses, probs  # probs now holds (p − onehot)·factor


def run_shape(cp, report, shape, rng, reps):
    N, Vv = shape.N, shape.V
    u32 = common.u("fp32")
    # logits like a trained head's: std 3 (a max near ±15 over a large vocabulary)
    z32 = (3 * rng.standard_normal((N, Vv))).astype(np.float32)
    targets = rng.integers(0, Vv, size=N).astype(np.int32)
    rows = np.unique(np.concatenate(([0, N - 1], rng.choice(N, size=min(N, CHECK_ROWS - 2), replace=False))))
    d_targets = cp.asarray(targets)
    # exp, and sums of V/256 terms per thread then a 13-level block tree: the row sum's relative error
    c_sum = (Vv // 256 + 20) * u32
    losses = cp.zeros(N, cp.float32)

    p_ref, loss_ref, dl_ref = reference(z32[rows].astype(np.float64), targets[rows], 1.0)
    onehot = np.zeros_like(p_ref)
    onehot[np.arange(rows.size), targets[rows]] = 1.0

    kf = common.build(cp, VERSIONS[0])["softmax_xent_fwd"]
    probs = cp.asarray(z32)

    def case_fwd():
        kf((N,), (256,), (probs, d_targets, losses, np.int32(Vv)))
        err = common.compare(probs.get()[rows], p_ref, rtol=c_sum + 3 * u32, what="probs")  # + exp's 2 ulp, the division
        err = err.worst(common.compare(losses.get()[rows], loss_ref, rtol=u32, atol=c_sum + 3 * u32, what="loss"))  # −log p
        # timed in place: later runs see probabilities instead of logits, the same work
        ms = common.bench(cp, lambda: kf((N,), (256,), (probs, d_targets, losses, np.int32(Vv))), reps)
        return err, ms, common.gbps(2 * N * Vv * 4, ms)

    report.attempt("softmax_xent_fwd", "softmax_xent_fwd", "fp32", shape, case_fwd)

    kb = common.build(cp, VERSIONS[1])["softmax_xent_bwd"]
    p32 = np.zeros((N, Vv), np.float32)  # the backward's input: the reference's probabilities, in fp32
    p32[rows] = p_ref
    dl = cp.asarray(p32)
    scale = 1.0 / N  # dloss = 1: the gradient of the mean loss

    def case_bwd():
        kb((N,), (256,), (dl, d_targets, np.float32(scale), np.int32(Vv)))
        # the input's rounding, the subtraction and the product: 3 roundings of |p| + onehot
        err = common.compare(dl.get()[rows], dl_ref * scale, rtol=0, atol=3 * u32 * (p_ref + onehot) * scale)
        ms = common.bench(cp, lambda: kb((N,), (256,), (dl, d_targets, np.float32(scale), np.int32(Vv))), reps)
        return err, ms, common.gbps(2 * N * Vv * 4, ms)

    report.attempt("softmax_xent_bwd", "softmax_xent_bwd", "fp32", shape, case_bwd)

    from andrea.engine.cupy.kernels import XENT_NV, xent_threads  # the production launch (imports CuPy)

    ld = -(-Vv // VOCAB_PAD) * VOCAB_PAD
    for version, prec in [(v, p) for v in VERSIONS[2:] for p in v.precisions]:
        fn = version.kernels[0]
        kh = common.build(cp, version, prec, extra_defines=(f"XENT_NV={XENT_NV}",))[fn]
        threads = 256 if fn == "softmax_xent_h16" else xent_threads(ld)
        if threads is None or threads > kh.max_threads_per_block:
            continue  # the production launch takes softmax_xent_h16 for such rows
        # the rows kernel sums up to 8·XENT_NV terms a thread before its tree; with exp2 each term also
        # carries ex2.approx's error (2^-22 = 4 u32) and the exponent z·log2 e − mx·log2 e's rounding
        # ((|z| + |mx|)·log2 e rounded, times ln 2: ≤ 2 max |z|·u32)
        c_sum_h = c_sum if fn == "softmax_xent_h16" else (8 * XENT_NV + 20) * u32
        if fn == "softmax_xent_h16_rows" and "XENT_EXPF" not in version.defines:
            c_sum_h += (4 + 2 * float(np.abs(z32).max())) * u32
        ls = LOSS_SCALE[prec]
        zh = np.zeros((N, ld), np.uint16)
        zh[:, :Vv] = common.to_h16(z32, prec)
        sentinel = common.to_h16(np.full(1, 7.0), prec)[0]
        zh[:, Vv:] = sentinel  # the padding: the kernel must not write it
        zr = common.from_h16(zh[rows, :Vv], prec)
        p_h, loss_h, dl_h = reference(zr, targets[rows], ls)
        scale_buf = cp.full(1, ls, cp.float32)
        buf = cp.asarray(zh)
        run = lambda kh=kh, threads=threads: kh((N,), (threads,), (buf, d_targets, losses, scale_buf, np.int32(Vv),  # noqa: E731
                                                                  np.int32(ld)))

        def case_h16(prec=prec, run=run, buf=buf, dl_h=dl_h, loss_h=loss_h, zr=zr, sentinel=sentinel, c_sum=c_sum_h):
            run()
            out = buf.get()
            # fp32 arithmetic on exact 16-bit inputs; the result rounded once to 16 bits (rtol u16);
            # the loss mx + log s − z_t: the sum's error plus a rounding of each term
            err = common.compare(common.from_h16(out[rows, :Vv], prec), dl_h, rtol=common.u(prec),
                                 atol=(c_sum + 3 * u32) * np.abs(dl_h) + common.tiny(prec), what="(p − onehot)·scale")
            mx = np.abs(zr).max(1)
            err = err.worst(common.compare(losses.get()[rows], loss_h, rtol=2 * u32, atol=c_sum + 2 * u32 * mx, what="loss"))
            err = err.worst(common.exact(out[:, Vv:], np.full((N, ld - Vv), sentinel, np.uint16), what="padding"))
            ms = common.bench(cp, run, reps)  # in place, as the forward: the same work on other values
            return err, ms, common.gbps(2 * N * ld * 2, ms)

        report.attempt("softmax_xent_h16", version.name, prec, shape, case_h16, production=version.production)


def main(argv=None) -> int:
    return common.run_script(__doc__, SCRIPT, EDGE, [run_shape], argv)


if __name__ == "__main__":
    raise SystemExit(main())
