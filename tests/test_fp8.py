"""The fp8 recipe's reference (andrea/fp8.py and the NumPy backend's "fp8" precision): casts that
round as the formats do and saturate, delayed per-tensor scales, the counts of what overflowed or
underflowed, and a simulated fp8 training run that follows fp32's."""

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes", reason="fp8 needs ml_dtypes (the test extra installs it)")

from andrea.engine import Engine  # noqa: E402
from andrea.fp8 import FP8Sites  # noqa: E402
from andrea.model import ModelConfig  # noqa: E402
from andrea.optim import OptimConfig, train_step  # noqa: E402


def test_a_cast_rounds_to_the_format_at_the_largest_power_of_two_scale_that_fits():
    sites = FP8Sites()
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 0.02
    q = sites.quantize(x, "a", "e4m3")
    amax = np.abs(x).max()
    s = sites.sites[("a", "e4m3")].last
    assert s == 2.0 ** np.floor(np.log2(448.0 / amax))  # a power of two: amax·s ≤ 448 < amax·2s
    want = (x * np.float32(s)).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) / np.float32(s)
    assert np.array_equal(q, want)
    assert np.abs(q - x).max() <= 2.0**-4 * amax  # e4m3: 3 mantissa bits, half an ulp at the top binade
    assert sites.counts.as_dict() == {"values": 1000, "overflow": 0, "underflow": 0}
    g = sites.quantize(x * 1e3, "g", "e5m2")
    assert np.array_equal(g, (x * 1e3 * np.float32(sites.sites[("g", "e5m2")].last)).astype(ml_dtypes.float8_e5m2)
                          .astype(np.float32) / np.float32(sites.sites[("g", "e5m2")].last))


def test_delayed_scales_lag_one_tensor_and_count_what_saturates_or_vanishes():
    sites = FP8Sites(history=4)
    small = np.full(8, 1.0, np.float32)
    sites.quantize(small, "x", "e4m3")  # the scale from its own amax: 256 (1·256 ≤ 448)
    big = np.array([8.0, -8.0, 1.0, 0.5], np.float32)
    q = sites.quantize(big, "x", "e4m3")  # still scale 256 (the history's amax 1): 8·256 > 448
    assert np.array_equal(q, [448 / 256, -448 / 256, 1.0, 0.5])  # saturated to ±max, not NaN
    assert sites.counts.overflow == 2
    tiny = np.array([1e-9, 0.0, 2.0], np.float32)
    sites.quantize(tiny, "x", "e4m3")  # scale from amax 8: 32; 1e-9·32 rounds to 0
    assert sites.counts.underflow == 1
    for _ in range(4):  # the big tensor leaves the history after 4 more casts: the scale grows back
        sites.quantize(small, "x", "e4m3")
    assert sites.sites[("x", "e4m3")].last == 128.0  # amaxes [2, 1, 1, 1] at that cast
    again = sites.requantize(big, "x", "e4m3")  # the last scale, bit for bit, uncounted
    assert np.array_equal(again, [448 / 128, -448 / 128, 1.0, 0.5]) and sites.counts.overflow == 2


def test_simulated_fp8_training_follows_fp32():
    """ANDREA's recipe on a small model memorising one batch: 40 steps of AdamW in fp8 end within
    3 % of fp32's loss (measured 2.2 % with W_Q, W_K, W_V cast as one tensor, as the GPU's one q/k/v
    product and Transformer Engine's fused QKV weight read them; 1.3 % with a scale each; the
    issue's gate, 1.5 % of validation loss after 2,000 steps of ANDREA-120M, is for the GPU path);
    its first gradients are fp32's to the formats' precision (e5m2 gradients: 2 mantissa bits)."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_head=2, n_layer=2, context=16)
    x = np.random.default_rng(0).integers(0, 64, (4, 17))
    oc = OptimConfig(lr=3e-3, warmup_steps=1)
    runs = {}
    for precision in ("fp32", "fp8"):
        e = Engine(cfg, 4, 16, precision=precision, seed=1)
        batch = e.prepare(x[:, :-1], x[:, 1:])
        e.zero_grads()
        e.forward_backward(batch)
        first = e.g.copy()
        e.zero_grads()
        losses = [train_step(e, [batch], i, oc).loss for i in range(40)]
        runs[precision] = (first, losses, e)
    g32, l32, _ = runs["fp32"]
    g8, l8, e8 = runs["fp8"]
    assert np.linalg.norm(g8 - g32) < 0.1 * np.linalg.norm(g32)
    assert not np.array_equal(g8, g32)  # the casts happened
    assert l8[0] == pytest.approx(l32[0], rel=1e-3) and l8[-1] == pytest.approx(l32[-1], rel=0.03)
    assert l8[-1] < l8[0] - 1.0
    counts = e8.be.fp8_counts()
    assert counts["values"] > 0 and counts["overflow"] < 1e-3 * counts["values"]


def test_fp8_training_runs_need_the_gpu():
    """The NumPy backend only simulates fp8 (the reference); a run that asks for fp8 on the CPU is
    told it needs the CuPy backend."""
    from andrea.engine import resolve_backend

    with pytest.raises(ValueError, match="precision 'fp8' needs the CuPy GPU backend"):
        resolve_backend("numpy", "fp8")
