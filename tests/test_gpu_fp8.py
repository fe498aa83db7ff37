"""The CuPy backend's fp8 mode on a GPU (run on the device: `python3 -m pytest tests/test_gpu_fp8.py`):
casts and delayed scales as the NumPy reference (andrea/fp8.py) computes them, the fp8 products
through cuBLASLt, and training that follows bf16. Without CuPy or a GPU every test is skipped and
says so; CI never has a GPU. The kernels' bit-level checks at the model shapes: dev/cuda/fp8.py."""

import numpy as np
import pytest

try:
    import cupy as cp

    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
except Exception:  # ImportError, or CUDA without a device
    HAVE_GPU = False

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU with CuPy here (GPU tests run on the device)")]
ml_dtypes = pytest.importorskip("ml_dtypes", reason="fp8 needs ml_dtypes")

if HAVE_GPU:
    from andrea.engine.cupy import BF16, CupyBackend
    from andrea.engine.cupy.kernels import blocks
from andrea.engine import Engine  # noqa: E402
from andrea.fp8 import FP8Sites  # noqa: E402
from andrea.model import ModelConfig  # noqa: E402
from andrea.optim import OptimConfig, train_step  # noqa: E402

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def unscaled(q, fmt, scale):
    return q.get().view(E4M3 if fmt == "e4m3" else E5M2).astype(np.float32) / np.float32(scale)


def test_casts_and_delayed_scales_follow_the_reference():
    """Three tensors through one site, cast and transposed by the GPU and by andrea/fp8.py: the same
    fp8 values, the same scales (the first from its own amax, then from the history), the same
    overflow and underflow counts."""
    be = CupyBackend("fp8")
    f = be.fp8
    ref = FP8Sites()
    rng = np.random.default_rng(0)
    anchor = cp.zeros(1, cp.float32)  # a site is keyed by a weight's pointer
    for fmt in ("e4m3", "e5m2"):
        site = f._site("t", anchor, fmt)
        for step, mult in enumerate((1.0, 40.0, 1e-3)):  # the second saturates at the first's scale
            x = (rng.standard_normal((80, 48)) * 0.05 * mult).astype(np.float32)
            x[0, 0] = 1e-30  # underflows
            xb = x.astype(BF16).astype(np.float32)  # what a bf16 activation holds
            f.begin_pass()
            q, qt = cp.zeros((80, 48), cp.uint8), cp.zeros((48, 80), cp.uint8)
            f.cast(cp.asarray(xb.astype(BF16)), site, fmt, q=q, qt=qt)
            want = ref.quantize(xb, ("t", fmt), fmt)
            scale = ref.sites[(("t", fmt), fmt)].last
            assert float(f.scale[site]) == scale, (fmt, step)
            assert np.array_equal(unscaled(q, fmt, scale), want), (fmt, step)
            assert np.array_equal(q.get().T, qt.get()), (fmt, step)
        got = f.counts_dict()["by_role"]["t"]
    want = ref.counts.as_dict()
    assert got == want and want["overflow"] > 0 and want["underflow"] > 0


def test_weights_cast_in_one_launch_match_their_casts_one_by_one():
    """A pass casts each weight as its product first needs it; every later pass casts them all at its
    start in one launch (fp8_cast_f32_e4m3_jobs) and the products find them done. The launch gives
    the same bytes (the copy and its transpose, side by side where weights share a site), the same
    amaxes and counts, for weights whose blocks end partway (rows and columns not multiples of 64 or
    256), and leaves nothing for the products to cast again."""
    be = CupyBackend("fp8")
    f = be.fp8
    rng = np.random.default_rng(4)
    flat = cp.asarray((rng.standard_normal(3 * 96 * 80 + 96 * 328) * 0.02).astype(np.float32))
    qkv = [flat[i * 96 * 80:(i + 1) * 96 * 80].reshape(96, 80) for i in range(3)]  # one site, side by side
    other = flat[3 * 96 * 80:].reshape(96, 328)
    f.begin_pass()
    assert not f.weights_cast  # nothing to cast in one launch yet
    first = [f.cast_weights(qkv), f.cast_weights((other,))]
    want = [(site, wt.get(), wp.get()) for site, wt, wp in first]
    counts, amax = f.counts.get().copy(), f.amax_now.get().copy()
    assert len(f.jobs) == 4
    for _, wt, wp in first:
        wt.fill(0)
        wp.fill(0)
    f.amax_now.fill(-1.0)  # as fp8_update leaves it, without moving these amaxes into the histories
    f.weights_cast = True
    ptrs, ints, nblocks, _ = f.job_table
    be.kernel("fp8", "fp8_cast_f32_e4m3_jobs")((nblocks,), (256,), (ptrs, ints, np.int32(len(ints)), f.scale,
                                                                    f.amax_now, f.counts))
    again = [f.cast_weights(qkv), f.cast_weights((other,))]  # found done: no launch
    for (site, wt, wp), (site0, wt0, wp0) in zip(again, want):
        assert site == site0 and np.array_equal(wt.get(), wt0) and np.array_equal(wp.get(), wp0)
    sites = [s for s, *_ in want]
    assert np.array_equal(f.amax_now.get()[sites], amax[sites])
    assert np.array_equal(f.counts.get()[sites], 2 * counts[sites])  # each weight counted once more
    f.begin_pass()  # a later pass: the scales from the histories, then the one launch
    assert f.weights_cast and np.array_equal(f.counts.get()[sites], 3 * counts[sites])


@pytest.mark.parametrize("C", [64, 768, 1536])
@pytest.mark.parametrize("add", [False, True])
def test_layernorm_casts_its_output_as_the_16bit_layernorm_then_the_cast(C, add):
    """A LayerNorm that feeds an fp8 product (add_layernorm_fp8) writes the product's e4m3 operand and
    its transpose itself: the same bytes, amax and counts as the bf16 LayerNorm's output cast by
    fp8_cast_h16_e4m3, and the same residual sum, mean and rstd; rows not a multiple of its 32 (the
    first LayerNorm without the residual add, and the others with it); a site's first cast takes its
    scale from the output's own amax."""
    rng = np.random.default_rng(C + add)
    N = 80
    x = cp.asarray(rng.standard_normal((N, C)).astype(np.float32) * 3)
    f = cp.asarray((rng.standard_normal((N, C)) * 2).astype(BF16)) if add else None
    g = cp.asarray(rng.standard_normal(C).astype(np.float32))
    b = cp.asarray(rng.standard_normal(C).astype(np.float32) * 0.1)
    out = {}
    for fused in (False, True):
        be = CupyBackend("fp8")
        fp = be.fp8
        w = cp.zeros((C, 16), cp.float32)  # the product's weight: the site's key
        res = cp.zeros((N, C), cp.float32) if add else None
        mean, rstd = cp.zeros(N, cp.float32), cp.zeros(N, cp.float32)
        site = fp._site("qkv.x", w, "e4m3")
        if fused:
            ln = cp.zeros((N, C), cp.uint8)
            for _ in range(2):  # the first: the scale from its own amax; the second from the history
                if add:
                    be.add_layernorm_fwd(x, f, res, g, b, ln, mean, rstd, 1e-5, feeds=("qkv", w))
                else:
                    be.layernorm_fwd(x, g, b, ln, mean, rstd, 1e-5, feeds=("qkv", w))
                fp.begin_pass()
            q, qt = fp._u8(f"x{C}", (N, C)), ln.reshape(C, N)
        else:
            ln = cp.zeros((N, C), BF16)
            q, qt = cp.zeros((N, C), cp.uint8), cp.zeros((C, N), cp.uint8)
            for _ in range(2):
                if add:
                    be.add_layernorm_fwd(x, f, res, g, b, ln, mean, rstd, 1e-5)
                else:
                    be.layernorm_fwd(x, g, b, ln, mean, rstd, 1e-5)
                fp.cast(ln, site, "e4m3", q=q, qt=qt)
                fp.begin_pass()
        out[fused] = [a.get().tobytes() for a in (q, qt, mean, rstd, fp.scale[site:site + 1], fp.hist[site],
                                                  fp.counts[site])] + ([res.get().tobytes()] if add else [])
    assert out[True] == out[False]


# blocks of 8 rows; of 64 (the tile at its largest), the last of 16
@pytest.mark.parametrize("N, C", [(80, 64), (16384, 768), (16400, 768)])
def test_layernorm_backward_casts_the_branch_gradient_as_the_16bit_copy_then_the_cast(N, C):
    """The LayerNorm backward whose branch gradient feeds fp8 products (layernorm_bwd_fused_fp8)
    writes their e5m2 operand and its transpose itself: the same bytes, amax and counts as its 16-bit
    copy cast by fp8_cast_h16_e5m2, and the same dx, dγ and dβ. The site's first cast goes the
    16-bit way (its scale from its own amax); the second runs the fused kernel."""
    rng = np.random.default_rng(N)
    x = cp.asarray(rng.standard_normal((N, C)).astype(np.float32) * 2)
    mean, rstd = x.mean(axis=1), 1 / cp.sqrt(x.var(axis=1) + 1e-5)
    gamma = cp.asarray(rng.standard_normal(C).astype(np.float32))
    dout = [cp.asarray((rng.standard_normal((N, C)) * 1e-3).astype(BF16)) for _ in range(2)]
    out = {}
    for fused in (False, True):
        be = CupyBackend("fp8")
        fp = be.fp8
        w = cp.zeros((16, C), cp.float32)
        site = fp._site("out.dy", w, "e5m2")
        dx = cp.asarray(rng.standard_normal((N, C)).astype(np.float32) * 1e-3) if not fused else out["dx0"].copy()
        if not fused:
            out["dx0"] = dx.copy()
        dg, db = cp.zeros(C, cp.float32), cp.zeros(C, cp.float32)
        branch = cp.zeros((2, N, C), cp.uint8)
        q, qt = branch[0], branch[1].reshape(C, N)
        for i in range(2):
            if fused:
                be.layernorm_bwd(dout[i], x, mean, rstd, gamma, dx, dg, db, branch=branch, feeds=("out", w))
            else:
                copy = cp.zeros((N, C), BF16)
                be.layernorm_bwd(dout[i], x, mean, rstd, gamma, dx, dg, db, branch=copy)
                fp.cast(copy, site, "e5m2", q=q, qt=qt)
            fp.begin_pass()
        out[fused] = [a.get().tobytes() for a in (q, qt, dx, dg, db, fp.scale[site:site + 1], fp.hist[site], fp.counts[site])]
    assert out[True] == out[False]


@pytest.mark.parametrize("name, tiles", [("fp8_gelu_bwd_cast", 1), ("fp8_gelu_bwd_cast_tiles", 4)])
def test_gelu_casts_forward_and_backward_agree(name, tiles):
    """The cast pass (where the first MLP product's epilogue does not make a) casts a = gelu(h) straight
    from h; the backward's one pass over h and a's gradient (fp8_gelu_bwd_cast, a tile a block, and
    the production's _tiles, four: here a block with one tile left) casts a again at the same scale,
    transposed, for dW2: exactly that operand, its counts (count_a, as where the epilogue made a)
    those of the forward's cast. Its other output, h's gradient in e5m2 (and transposed), is the
    bf16 path's da·gelu'(h) to e5m2's precision."""
    be = CupyBackend("fp8")
    f = be.fp8
    rng = np.random.default_rng(1)
    rows, cols = 128, 320
    h = cp.asarray((rng.standard_normal((rows, cols)) * 2).astype(BF16))
    g = cp.asarray(rng.standard_normal((rows, cols)).astype(BF16))
    anchor = cp.zeros(1, cp.float32)
    sa, sd = f._site("mlp2.x", anchor, "e4m3"), f._site("mlp1.dy", anchor, "e5m2")
    q = cp.zeros((rows, cols), cp.uint8)
    f.cast(h, sa, "e4m3", q=q, gelu=True)
    f.scale[sd] = 2.0  # dh's scale as a delayed scale would have it
    forward_counts = f.counts[sa].get()
    dq, dqt, aqt = cp.zeros((rows, cols), cp.uint8), cp.zeros((cols, rows), cp.uint8), cp.zeros((cols, rows), cp.uint8)
    be.kernel("fp8", name)((-(-cols // (64 * tiles)), rows // 64), (256,), (
        g, h, np.int32(rows), np.int32(cols), dq, dqt, np.int32(sd), aqt, np.int32(sa), f.scale, f.amax_now, f.counts,
        np.int32(1), np.int32(1), np.int32(1)))  # count_a: a's cast counted here (the forward's was an epilogue)
    assert np.array_equal(q.get().T, aqt.get())
    assert np.array_equal(f.counts[sa].get(), 2 * forward_counts) and forward_counts[0] == rows * cols
    assert np.array_equal(dq.get().T, dqt.get())
    a, dh = cp.zeros_like(h), g.copy()  # the bf16 path: dh in bf16 (a recomputed beside it)
    be.kernel("elementwise", "gelu_bwd_recompute_h16x8")((blocks(h.size // 8),), (256,), (h, dh, a, np.int64(h.size // 8)))
    want = dh.get().astype(np.float32)
    assert rel(unscaled(dq, "e5m2", 2.0), want) < 0.1  # e5m2: 2 mantissa bits, ≤ 12.5 % per value
    assert float(f.amax_now[sd]) == pytest.approx(float(np.abs(want).max()), rel=2.0**-7)


def fp8_operands(seed: int, m: int, n: int, k: int, a: tuple, b: tuple):
    """Random fp8 operands on the device, a [m, k] and bt [n, k] as bytes, each from (multiplier of a
    standard normal, fp8 type, inverse scale); their inverse scales 16 bytes apart (as cuBLASLt needs);
    and the exact product (a · inv_a) · (bt · inv_b)ᵀ in float64."""
    rng = np.random.default_rng(seed)
    qa = (rng.standard_normal((m, k)) * a[0]).astype(a[1])
    qb = (rng.standard_normal((n, k)) * b[0]).astype(b[1])
    inv = cp.asarray(np.array([a[2], 0, 0, 0, b[2]], np.float32))
    want = (qa.astype(np.float64) * a[2]) @ (qb.astype(np.float64) * b[2]).T
    return cp.asarray(qa.view(np.uint8)), cp.asarray(qb.view(np.uint8)), inv, want


@pytest.mark.parametrize("fast", [False, True])
def test_fp8_matmul_matches_numpy(fast):
    """c = (a · btᵀ) · inv_a · inv_b through cuBLASLt, into bf16 and accumulated into fp32, against
    NumPy on the same fp8 values (products of fp8 values are exact; the sums differ by order)."""
    lt = CupyBackend("fp8").fp8._lt()
    m, n, k = 96, 80, 160
    d_a, d_bt, inv, want = fp8_operands(2, m, n, k, (20, E4M3, 2.0**-5), (1000, E5M2, 2.0**-10))
    c = cp.zeros((m, n), BF16)
    lt.matmul(d_a, inv.data.ptr, "e4m3", d_bt, inv.data.ptr + 16, "e5m2", c, fast=fast)
    err16 = rel(c.get().astype(np.float32), want)
    assert err16 < 2.0**-7, err16
    acc = cp.full((m, n), 3.0, cp.float32)
    lt.matmul(d_a, inv.data.ptr, "e4m3", d_bt, inv.data.ptr + 16, "e5m2", acc, accumulate=True, fast=fast)
    # Hopper's fp8 MMA keeps fewer than fp32's 24 bits in its accumulator between cuBLASLt's
    # promotions to fp32 (fast accumulation: none); a wrong scale or layout would be off by O(1)
    err32 = rel(acc.get(), want + 3.0)
    assert err32 < (2e-3 if fast else 2e-4), err32


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def test_fp8_gelu_epilogue_writes_h_and_a_in_e4m3():
    """The MLP's first fp8 product with cuBLASLt's GELU epilogue: h in bf16 (the product), a = gelu(h)
    times the scale read from the device in e4m3, its amax before scaling written to the device, and
    saturation (a scale 64 times too large) to ±448, never NaN. a is within one e4m3 step of the host's
    cast of the tanh GELU of the exact product, and 2^-10 besides: the forward products accumulate in
    fast mode (fp8's without fp32 promotions), whose sums measured up to ~5e-4 off near h = 0 on the
    H200. Printed: that departure, the one from the GELU of the h the product wrote, and how many
    values of a differ from the backward's cast of a made from the 16-bit h (fp8_gelu_bwd_cast)."""
    lt = CupyBackend("fp8").fp8._lt()
    m, n, k = 256, 384, 128
    d_a, d_bt, inv, prod = fp8_operands(11, m, n, k, (4, E4M3, 2.0**-2), (4, E4M3, 2.0**-3))
    want = gelu_tanh(prod)
    amax = float(np.abs(want).max())
    s = 2.0 ** np.floor(np.log2(448.0 / amax))
    for scale in (s, 64 * s):
        lts = cp.asarray(np.array([[scale, 0, 0, 0], [-1, 0, 0, 0]], np.float32))
        aux, d = cp.zeros((m, n), BF16), cp.zeros((m, n), cp.uint8)
        lt.matmul(d_a, inv.data.ptr, "e4m3", d_bt, inv.data.ptr + 16, "e4m3", d, fast=True, aux=aux,
                  d_scale=lts.data.ptr, amax_d=lts.data.ptr + 16)
        h = aux.get().astype(np.float64)
        assert rel(h, prod) < 2.0**-7
        assert float(lts[1, 0]) == pytest.approx(amax, rel=1e-3)
        q = d.get()
        assert not np.any((q & 0x7F) == 0x7F)  # e4m3's NaN: the conversion saturates
        got = q.view(E4M3).astype(np.float64) / scale
        if scale == s:
            # within one e4m3 step: 3 mantissa bits, subnormals below 2^-6
            for what, ref in (("the exact product", want), ("the h it wrote", gelu_tanh(h))):
                off = np.abs(got - ref) - np.maximum(np.abs(ref), 2.0**-6 / scale) * 2.0**-3
                i = int(np.argmax(off))
                print(f"epilogue a beyond one e4m3 step of the tanh GELU of {what}: at most {max(off.flat[i], 0):.2e} "
                      f"(h = {prod.flat[i]:.4f})")
                assert np.all(off <= 2.0**-10)
            a16 = gelu_tanh(h.astype(BF16).astype(np.float64)).astype(BF16).astype(np.float32)
            again = (a16 * np.float32(scale)).astype(E4M3).astype(np.float64) / scale  # -0 == +0 here
            print(f"epilogue a vs the backward's recast from 16-bit h: {np.mean(again != got):.2%} of values differ, "
                  f"{np.mean(np.abs(again - got) > np.abs(got) * 2.0**-3 + 2.0**-9 / scale):.2%} by more than a step")
        else:
            big = np.abs(want) * scale > 448
            assert big.any() and np.all(np.abs(got[big]) * scale == 448.0)


def test_fp8_gelu_epilogue_trains_as_the_cast_pass(monkeypatch):
    """The MLP's a in e4m3 from the first product's epilogue (the default) or from a cast pass over h
    (ANDREA_GELU_EPILOGUE=0): 10 steps' losses agree to fp8's precision, captured and eager runs of
    the epilogue give the same bits, a's cast is counted once a training pass either way (the
    epilogue's by the backward's pass over h), and the epilogue's amaxes reach a's history (a pass's
    amax waits in its slot until the next pass begins). Where it was measured, on compute capability
    9.0, cuBLASLt must offer the epilogue; elsewhere a GPU without it takes the cast pass."""
    tokens, targets = batch(np.random.default_rng(12))
    oc = OptimConfig(lr=3e-3, warmup_steps=1)
    runs = {}
    for name, env, graphs in (("epilogue", "1", True), ("epilogue eager", "1", False), ("cast", "0", True)):
        monkeypatch.setenv("ANDREA_GELU_EPILOGUE", env)
        e = Engine(CFG, 4, 32, backend="cupy", precision="fp8", seed=2)
        e.graphs = graphs
        b = e.prepare(tokens, targets)
        runs[name] = ([train_step(e, [b], i, oc).loss for i in range(10)], e)
    (fused, ef), (eager, _), (cast, ec) = runs["epilogue"], runs["epilogue eager"], runs["cast"]
    assert ec.be.fp8.gelu_fused is False and "gelu(h) to e4m3 in a cast pass" in ec.be.implementation()
    if not ef.be.fp8.gelu_fused:
        assert cp.cuda.Device().compute_capability != "90", "cuBLASLt offered no fp8 GELU epilogue on Hopper"
        pytest.skip("this GPU's cuBLASLt has no fp8 GELU epilogue: the cast pass ran (the fallback)")
    assert "gelu(h) to e4m3 in the product's epilogue" in ef.be.implementation()
    f = ef.be.fp8
    sa = [i for (role, _, _), i in f.sites.items() if role == "mlp2.x"]
    assert len(sa) == CFG.n_layer
    # 10 passes: the first primed a's scale, the next 8 amaxes came from the epilogue, the 10th's waits
    assert (f.hist[sa, -9:].get() > 0).all() and (f.lt[sa, 1, 0].get() > 0).all()
    f.begin_pass()
    assert (f.hist[sa, -10:].get() > 0).all() and (f.lt[sa, 1, 0].get() == -1).all()
    assert fused == eager
    assert max(abs(x - y) for x, y in zip(fused, cast)) < 0.05, (fused, cast)
    cf, cc = (e.be.fp8_counts()["by_role"]["mlp2.x"] for e in (ef, ec))
    assert cf["values"] == cc["values"] == 10 * CFG.n_layer * 4 * 32 * 4 * CFG.d_model
    assert abs(cf["underflow"] - cc["underflow"]) <= 0.05 * cc["underflow"] + 10
    scales = [ef.be.fp8.scales()["mlp2.x:e4m3"], ec.be.fp8.scales()["mlp2.x:e4m3"]]
    # powers of two from nearly the same amaxes (the runs' weights part by fp8's noise): at most a step apart
    assert all(x / y in (0.5, 1.0, 2.0) for x, y in zip(*scales)), scales


CFG = ModelConfig(vocab_size=64, d_model=64, n_head=2, n_layer=2, context=32)


def batch(rng, B=4, T=32):
    x = rng.integers(0, 64, (B, T + 1))
    return x[:, :-1], x[:, 1:]


def test_fp8_gradients_follow_the_numpy_reference():
    """One forward-backward of a small model: the GPU's fp8 gradients against the NumPy backend's
    simulated fp8 and its fp32 (the GPU keeps bf16 activations besides: a looser match than the
    kernels' own)."""
    tokens, targets = batch(np.random.default_rng(3))
    grads = {}
    for backend, precision in (("numpy", "fp32"), ("numpy", "fp8"), ("cupy", "fp8"), ("cupy", "bf16")):
        e = Engine(CFG, 4, 32, backend=backend, precision=precision, seed=5)
        e.graphs = False
        e.zero_grads()
        e.forward_backward(tokens, targets)
        grads[backend, precision] = np.asarray(e.host(e.g), np.float64)
    g32, g8, gpu8, gpu16 = grads["numpy", "fp32"], grads["numpy", "fp8"], grads["cupy", "fp8"], grads["cupy", "bf16"]
    assert rel(g8, g32) < 0.1
    assert rel(gpu8, g8) < 0.1
    assert rel(gpu8, g32) < 0.1
    assert rel(gpu8, gpu16) > 1e-4  # the fp8 products ran


def test_fp8_training_follows_bf16_and_replays_as_a_graph():
    """40 steps on one batch (measured: fp8 follows bf16 to within 0.004 nats at the end, from 4.2 to 0.11);
    the captured pass gives the eager pass's losses bit for bit (amaxes are maxima: no order
    dependence); the counts say what was cast and that almost nothing saturated."""
    tokens, targets = batch(np.random.default_rng(4))
    oc = OptimConfig(lr=3e-3, warmup_steps=1)
    runs = {}
    for name, precision, graphs in (("bf16", "bf16", True), ("fp8", "fp8", True), ("fp8 eager", "fp8", False)):
        e = Engine(CFG, 4, 32, backend="cupy", precision=precision, seed=1)
        e.graphs = graphs
        b = e.prepare(tokens, targets)
        runs[name] = ([train_step(e, [b], i, oc).loss for i in range(40)], e)
    l16, l8, l8e = runs["bf16"][0], runs["fp8"][0], runs["fp8 eager"][0]
    assert l8 == l8e
    # the curves agree step by step (absolute nats: near the end the losses are ~0.1, where a
    # relative bound would say little); a broken scale or product would leave them at once
    gap = max(abs(x - y) for x, y in zip(l8, l16))
    assert gap < 0.1 and abs(l8[-1] - l16[-1]) < 0.01, (gap, l8[-1], l16[-1])
    assert l8[-1] < l8[0] - 3.0
    e8 = runs["fp8"][1]  # the LayerNorms cast what they feed: their planned outputs are bytes
    assert e8.A.saved["ln1"].dtype == e8.A.saved["ln2"].dtype == e8.A.scratch["d_branch"].dtype == np.uint8
    counts = runs["fp8"][1].be.fp8_counts()
    assert counts["values"] > 0 and counts["overflow"] < 1e-3 * counts["values"]
    assert set(counts["by_role"]) == {"w", "qkv.x", "qkv.dy", "out.x", "out.dy", "mlp1.x", "mlp1.dy", "mlp2.x", "mlp2.dy"}


@pytest.mark.parametrize("tied", [True, False])
def test_fp8_keeps_a_16bit_copy_of_the_head_alone(monkeypatch, tied):
    """Every block product reads 8-bit copies of the fp32 weights in fp8, so the 16-bit copy AdamW
    refreshes holds the output head alone (2 bytes a parameter less; at ANDREA-480M 916 MiB less):
    the losses and weights of 5 steps are those of a run keeping the whole copy, bit for bit, and
    the head's copy is its weights rounded to bf16, padded with zero rows."""
    import dataclasses

    cfg = dataclasses.replace(CFG, vocab_size=72, tied_head=tied)  # 72: padded to 128 rows
    tokens, targets = batch(np.random.default_rng(8))
    oc = OptimConfig(lr=3e-3, warmup_steps=1)

    def run():
        e = Engine(cfg, 4, 32, backend="cupy", precision="fp8", seed=2)
        b = e.prepare(tokens, targets)
        return [train_step(e, [b], i, oc).loss for i in range(5)], e

    losses, e = run()
    e.graphs = False  # an eager pass: no product read a 16-bit weight beside the copy
    e.forward_backward(tokens, targets)
    assert not e.be.weights.copies
    mirror = e.be.weights.mirror
    V, d = cfg.vocab_size, cfg.d_model
    assert mirror.copy.size == 128 * d < e.w.size
    head = e.W.head
    got = mirror.view(head, padded=True).get()
    assert np.array_equal(got[:V].view(np.uint16), e.host(head).astype(BF16).view(np.uint16))
    assert not got[V:].any()
    monkeypatch.setattr(CupyBackend, "register_weights", lambda self, w, head=None: self.weights.register(w, head))
    whole_losses, whole = run()
    assert whole.be.weights.mirror.copy.size == e.w.size + (128 - V) * d
    assert losses == whole_losses
    assert np.array_equal(e.host(e.w), whole.host(whole.w))


def test_fp8_refuses_shapes_the_products_cannot_take():
    """B·T = 9: told when the engine is built (not at the first product), with the shape and the way out."""
    with pytest.raises(ValueError, match=r"multiples of 16.*B·T = 9.*use bf16"):
        Engine(ModelConfig(vocab_size=64, d_model=64, n_head=2, n_layer=1, context=32), 1, 9, backend="cupy",
               precision="fp8", seed=0)


def gradients_in(cfg, precision: str, seed: int, tokens, targets):
    """One eager forward-backward's gradients (float64 on the host), and the engine."""
    e = Engine(cfg, 4, 32, backend="cupy", precision=precision, seed=seed)
    e.graphs = False
    e.zero_grads()
    e.forward_backward(tokens, targets)
    return np.asarray(e.host(e.g), np.float64), e


def test_fp8_with_mlp_width_equal_to_d_model():
    """mlp_ratio 1 (M = d): h's gradient and dout's casts must not share scratch (dW2 reads the latter
    after the former is written). fp8 gradients against bf16's on the same weights and batch."""
    cfg = ModelConfig(vocab_size=64, d_model=64, n_head=2, n_layer=1, context=32, mlp_ratio=1)
    tokens, targets = batch(np.random.default_rng(6))
    g16, _ = gradients_in(cfg, "bf16", 2, tokens, targets)
    g8, _ = gradients_in(cfg, "fp8", 2, tokens, targets)
    assert rel(g8, g16) < 0.1


def test_a_non_finite_amax_is_not_recorded():
    """As the reference (DelayedScale.record): an amax of inf (a step that overflowed, which the
    optimizer skips) leaves the history alone, so the next scales still come from the finite ones."""
    be = CupyBackend("fp8")
    f = be.fp8
    site = f._site("t", cp.zeros(1, cp.float32), "e4m3")
    f.cast(cp.asarray(np.full((16, 16), 2.0, np.float32).astype(BF16)), site, "e4m3", q=cp.zeros((16, 16), cp.uint8))
    f.begin_pass()
    scale = float(f.scale[site])
    f.amax_now[site] = np.inf
    f.begin_pass()
    assert float(f.scale[site]) == scale == 128.0  # 2 * 128 <= 448 < 2 * 256


@pytest.mark.parametrize("products, roles, planned", [
    ("mlp", {"w", "mlp1.x", "mlp1.dy", "mlp2.x", "mlp2.dy"}, ("ln2",)),
    ("qkv", {"w", "qkv.x", "qkv.dy"}, ("ln1",)),
    ("out,mlp", {"w", "out.x", "out.dy", "mlp1.x", "mlp1.dy", "mlp2.x", "mlp2.dy"}, ("ln2", "d_branch")),
])
def test_the_fp8_products_can_be_chosen(monkeypatch, products, roles, planned):
    """ANDREA_FP8_PRODUCTS (for measuring what each product gains): the others run as in bf16 and
    cast nothing (their LayerNorms' outputs stay 16-bit; the branch's gradient is cast by the
    LayerNorm backward only where both products reading it are fp8); the gradients stay close to
    bf16's; an unknown name is refused, naming the choices."""
    tokens, targets = batch(np.random.default_rng(5))
    monkeypatch.setenv("ANDREA_FP8_PRODUCTS", products)
    g16, _ = gradients_in(CFG, "bf16", 1, tokens, targets)
    g8, e = gradients_in(CFG, "fp8", 1, tokens, targets)
    assert e.be.fp8.products == set(products.split(","))
    assert set(e.be.fp8_counts()["by_role"]) == roles
    bufs = {**e.A.saved, **e.A.scratch}
    assert {n for n in ("ln1", "ln2", "d_branch") if bufs[n].dtype == np.uint8} == set(planned)
    assert rel(g8, g16) < 0.1
    said = e.be.implementation()  # the plan line: where gelu(h) is made, or that the MLP runs in 16 bits
    assert ("gelu(h) to e4m3 in" in said) == ("mlp" in products) and ("the MLP in 16 bits" in said) != ("mlp" in products)
    monkeypatch.setenv("ANDREA_FP8_PRODUCTS", "mlp,attention")
    with pytest.raises(ValueError, match="unknown products.*qkv, out, mlp"):
        CupyBackend("fp8")


def test_a_resumed_fp8_run_continues_exactly():
    """The delayed scales, the amaxes since the last update and the counts travel in a checkpoint's
    state (JSON, as the trainer writes it): 3 steps, a new engine from the weights, Adam state and
    that state, 3 more steps give an uninterrupted run's losses and counts bit for bit."""
    import json

    tokens, targets = batch(np.random.default_rng(7))
    oc = OptimConfig(lr=3e-3, warmup_steps=1)

    def engine():
        e = Engine(CFG, 4, 32, backend="cupy", precision="fp8", seed=3)
        return e, e.prepare(tokens, targets)

    e, b = engine()
    whole = [train_step(e, [b], i, oc).loss for i in range(6)]
    want_counts = e.be.fp8_counts()
    e1, b1 = engine()
    first = [train_step(e1, [b1], i, oc).loss for i in range(3)]
    saved = json.loads(json.dumps(e1.be.precision_state()))
    assert len(saved["sites"]) == 12 * CFG.n_layer  # per layer, for q/k/v, output, MLP in, MLP out: w, x, dy
    w, m, v = (e1.host(a) for a in (e1.w, e1.m, e1.v))
    e2, b2 = engine()
    e2.load_state(w, m, v, adam_t=e1.adam_t)
    e2.be.load_precision_state(saved)
    rest = [train_step(e2, [b2], i, oc).loss for i in range(3, 6)]
    assert first + rest == whole
    assert e2.be.fp8_counts() == want_counts
