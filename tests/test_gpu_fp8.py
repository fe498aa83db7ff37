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


def test_gelu_cast_is_the_backward_recompute_bit_for_bit():
    """The forward casts a = gelu(h) straight from h; the backward recomputes a in bf16 and casts it
    again at the same scale: the dW2 product must read exactly the forward's operand."""
    be = CupyBackend("fp8")
    f = be.fp8
    h = cp.asarray((np.random.default_rng(1).standard_normal((64, 256)) * 2).astype(BF16))
    anchor = cp.zeros(1, cp.float32)
    site = f._site("mlp2.x", anchor, "e4m3")
    q = cp.zeros((64, 256), cp.uint8)
    f.cast(h, site, "e4m3", q=q, gelu=True)
    a, da = cp.zeros_like(h), cp.zeros_like(h)
    be.kernel("elementwise", "gelu_bwd_recompute_h16x8")((8,), (256,), (h, da, a, np.int64(h.size // 8)))
    qt = cp.zeros((256, 64), cp.uint8)
    f.cast(a, site, "e4m3", qt=qt, record=False)
    assert np.array_equal(q.get().T, qt.get())


@pytest.mark.parametrize("fast", [False, True])
def test_fp8_matmul_matches_numpy(fast):
    """c = (a · btᵀ) · inv_a · inv_b through cuBLASLt, into bf16 and accumulated into fp32, against
    NumPy on the same fp8 values (products of fp8 values are exact; the sums differ by order)."""
    be = CupyBackend("fp8")
    lt = be.fp8._lt()
    rng = np.random.default_rng(2)
    m, n, k = 96, 80, 160
    a = (rng.standard_normal((m, k)) * 20).astype(E4M3)
    bt = (rng.standard_normal((n, k)) * 1000).astype(E5M2)
    inv = cp.asarray(np.array([2.0**-5, 2.0**-10], np.float32))
    want = (a.astype(np.float64) * 2.0**-5) @ (bt.astype(np.float64) * 2.0**-10).T
    d_a, d_bt = cp.asarray(a.view(np.uint8)), cp.asarray(bt.view(np.uint8))
    c = cp.zeros((m, n), BF16)
    lt.matmul(d_a, inv.data.ptr, "e4m3", d_bt, inv.data.ptr + 4, "e5m2", c, fast=fast)
    assert rel(c.get().astype(np.float32), want) < 2.0**-7
    acc = cp.full((m, n), 3.0, cp.float32)
    lt.matmul(d_a, inv.data.ptr, "e4m3", d_bt, inv.data.ptr + 4, "e5m2", acc, accumulate=True, fast=fast)
    assert rel(acc.get(), want + 3.0) < (1e-3 if fast else 1e-5)


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
    """40 steps on one batch: fp8 ends within 3 % of bf16's loss (the reference's bound, test_fp8.py);
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
    assert l8[-1] == pytest.approx(l16[-1], rel=0.03) and l8[-1] < l8[0] - 1.0
    counts = runs["fp8"][1].be.fp8_counts()
    assert counts["values"] > 0 and counts["overflow"] < 1e-3 * counts["values"]
    assert set(counts["by_role"]) == {"w", "qkv.x", "qkv.dy", "out.x", "out.dy", "mlp1.x", "mlp1.dy", "mlp2.x", "mlp2.dy"}


def test_fp8_refuses_shapes_the_products_cannot_take():
    e = Engine(ModelConfig(vocab_size=64, d_model=64, n_head=2, n_layer=1, context=32), 1, 9, backend="cupy",
               precision="fp8", seed=0)
    e.graphs = False
    x = np.zeros((1, 9), np.int64)
    with pytest.raises(ValueError, match="multiples of 16"):
        e.forward(x, x)
