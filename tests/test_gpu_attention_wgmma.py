"""The Hopper warp-group (wgmma) attention, forward and backward (andrea/engine/cupy/attention_wgmma.py,
kernels/attention_wgmma.cu), every variant dev/cuda/attention_wgmma.py times (its FWD_VARIANTS and
BWD_VARIANTS), against the NumPy reference, on a GPU that runs sm_90a code (compute capability 9.0:
H100, H200). Run on the device: `python3 -m pytest tests/test_gpu_attention_wgmma.py`. Without CuPy, a
GPU, or on another GPU every test is skipped and says so; CI never has a GPU. The variants not yet run on
a device come last: one that faults takes the process's CUDA context, and the tests after it, down."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

try:
    import cupy as cp

    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
    CAPABILITY = cp.cuda.Device().compute_capability if HAVE_GPU else None
except Exception:  # ImportError, or CUDA without a device
    HAVE_GPU, CAPABILITY = False, None

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU with CuPy here (GPU tests run on the device)"),
              pytest.mark.skipif(HAVE_GPU and CAPABILITY != "90",
                                 reason=f"compute capability {CAPABILITY}: sm_90a code runs only on 9.0 (H100/H200)")]

if HAVE_GPU:
    from andrea.engine.cupy import CupyBackend, attention_mma, attention_wgmma
from andrea.engine import numpy_backend as nb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev" / "cuda"))
import attention_wgmma as dev  # noqa: E402  (dev/cuda/attention_wgmma.py: the variants)
import common  # noqa: E402  (dev/cuda/common.py: the tolerances' pieces)

RNG = np.random.default_rng(11)
B = 2
# the verified variants first, then the new ones (see the docstring)
FWD = sorted(dev.FWD_VARIANTS, key=lambda v: v[2])
BWD = sorted(dev.BWD_VARIANTS, key=lambda v: v[4])
SHAPES = [(64, 100), (64, 200), (32, 129), (16, 37), (64, 1)]


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def y_terms(qkv, lse):
    """Σ_j P_ij·|v_j| per output element ([B, T, H·D]): the sum each y element adds up, which scales its
    rounding error (P rounded to 16 bits as an operand, the output rounded once)."""
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3).astype(np.float64) for i in range(3))  # [B, H, T, D]
    T, D = q.shape[2], q.shape[3]
    s = np.where(np.tril(np.ones((T, T), bool)), q @ k.swapaxes(-1, -2) / np.sqrt(D) - lse[..., None], -np.inf)
    a = np.exp(s) @ np.abs(v)
    return a.transpose(0, 2, 1, 3).reshape(q.shape[0], T, -1)


def inputs(gb, T, H, D, batch=B):
    """qkv [B, T, 3, H, D] rounded to the backend's 16-bit type (float32 values), and on the device."""
    qkv = RNG.standard_normal((batch, T, 3, H, D)).astype(np.float32).astype(gb.half).astype(np.float32)
    return qkv, cp.asarray(qkv).astype(gb.half)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim,T", SHAPES)
@pytest.mark.parametrize("defines", [v[1] for v in FWD], ids=[v[0].replace(" ", "-") for v in FWD])
def test_wgmma_forward_matches_reference(precision, head_dim, T, defines):
    """y and lse of every variant against numpy_backend.attn_fwd, at partial tiles (T = 100, 200: not a
    multiple of 64 or 128; 129: one row past a CTA; 37 and 1: a single partial tile), nothing written
    past y or lse."""
    gb = CupyBackend(precision)
    H = 2
    C = H * head_dim
    qkv, d_qkv = inputs(gb, T, H, head_dim)
    y_n, lse_n = np.zeros((B, T, C), np.float32), np.zeros((B, H, T), np.float32)
    nb.attn_fwd(np.ascontiguousarray(qkv.transpose(2, 0, 3, 1, 4)), y_n, lse_n)
    guard = 1024
    y_all = cp.full(B * T * C + guard, 3.0, np.float32).astype(gb.half)
    lse_all = cp.full(B * H * T + guard, -7.0, cp.float32)
    y, lse = y_all[:B * T * C].reshape(B, T, C), lse_all[:B * H * T].reshape(B, H, T)
    attention_wgmma.flash_fwd(gb, d_qkv, y, lse, defines)
    got_y, got_lse = cp.asnumpy(y).astype(np.float32), cp.asnumpy(lse)
    assert np.isfinite(got_y).all() and np.isfinite(got_lse).all()
    assert rel(got_y, y_n) < 1e-2 and rel(got_lse, lse_n) < 1e-3
    # every element (a wrong row of a partial tile hides in a norm): within a few 16-bit roundings of
    # what it sums, and of itself; lse within fp32 sums and exp2.approx
    u16 = 2.0**-8 if precision == "bf16" else 2.0**-11
    bound = 4 * u16 * (y_terms(qkv, lse_n.astype(np.float64)) + np.abs(y_n)) + 1e-6
    assert (np.abs(got_y - y_n) <= bound).all(), f"max err/bound {(np.abs(got_y - y_n) / bound).max():.2f}"
    assert np.abs(got_lse - lse_n).max() <= 1e-4 * max(1.0, np.abs(lse_n).max())
    assert (cp.asnumpy(y_all[-guard:]).astype(np.float32) == 3.0).all(), "written past y"
    assert (cp.asnumpy(lse_all[-guard:]) == -7.0).all(), "written past lse"


@pytest.mark.parametrize("defines", [v[1] for v in FWD], ids=[v[0].replace(" ", "-") for v in FWD])
def test_wgmma_forward_matches_the_mma_kernel_at_a_model_shape(defines):
    """ANDREA-120M's attention shape (T = 1024, 12 heads of 64) on a small batch: every wgmma forward and
    the production mma.sync forward agree (both fp32-accumulated; P rounded to bf16 in both). 192 work
    tiles of 128 rows: more than an H200's 132 SMs, so the persistent variants' CTAs loop."""
    gb = CupyBackend("bf16")
    T, H, D = 1024, 12, 64
    _, d_qkv = inputs(gb, T, H, D)
    out = []
    for fwd in (lambda *a: attention_wgmma.flash_fwd(*a, defines), attention_mma.flash_fwd):
        y, lse = cp.zeros((B, T, H * D), gb.half), cp.zeros((B, H, T), cp.float32)
        fwd(gb, d_qkv, y, lse)
        out.append((cp.asnumpy(y).astype(np.float32), cp.asnumpy(lse)))
    (y_w, lse_w), (y_m, lse_m) = out
    assert rel(y_w, y_m) < 1e-2 and np.abs(lse_w - lse_m).max() < 1e-3


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim,T", SHAPES)
@pytest.mark.parametrize("variant", BWD, ids=[v[0].replace(" ", "-") for v in BWD])
def test_wgmma_backward_matches_reference(precision, head_dim, T, variant):
    """dq, dk, dv of every variant against numpy_backend.attn_bwd (given the forward's own y and lse),
    at partial tiles, every element within the bound dev/cuda/attention_wgmma.py derives (a multiple of
    the unit roundoff times the sum of the absolute terms each output adds up: an absolute floor from
    the inputs' scale, so an output whose true value is 0, as dq at T = 1 where softmax is 1 and dS = 0,
    is held to it and not to a relative error); the deterministic ones give the same bytes twice."""
    _, defines, deterministic, fused, _ = variant
    gb = CupyBackend(precision)
    H = 2
    C = H * head_dim
    scale = 1.0 / math.sqrt(head_dim)
    qkv, d_qkv = inputs(gb, T, H, head_dim)
    dy = RNG.standard_normal((B, T, C)).astype(np.float32).astype(gb.half).astype(np.float32)
    y, lse = cp.zeros((B, T, C), gb.half), cp.zeros((B, H, T), cp.float32)
    attention_wgmma.flash_fwd(gb, d_qkv, y, lse)
    y_in, lse_in = cp.asnumpy(y).astype(np.float64), cp.asnumpy(lse).astype(np.float64)
    ref = np.ascontiguousarray(qkv.transpose(2, 0, 3, 1, 4)).astype(np.float64)
    d_n = np.zeros_like(ref)
    nb.attn_bwd(dy.astype(np.float64), ref, y_in, lse_in, d_n)
    runs = []
    for _ in range(2):
        d_g = cp.full(d_qkv.shape, np.nan, np.float32).astype(gb.half)  # every element must be written
        attention_wgmma.flash_bwd(gb, cp.asarray(dy).astype(gb.half), d_qkv, y, lse, d_g, defines,
                                  deterministic=deterministic, fused=fused)
        runs.append(cp.asnumpy(d_g))
    if deterministic:
        assert runs[0].tobytes() == runs[1].tobytes()
    u16, u32 = common.u(precision), common.u("fp32")
    delta = (common.heads(dy, H) * common.heads(y_in, H)).sum(-1)
    terms = common.attention_abs(ref[0], ref[1], ref[2], lse_in, scale, common.heads(dy, H), delta)
    c = 2 * (2 * common.score_error(ref[0], ref[1], scale)) + 2 * u16 + (T + 2 * head_dim + 10) * u32
    for run in runs:  # both (the atomic sums may differ from run to run, each within the bound)
        got = run.astype(np.float64).transpose(2, 0, 3, 1, 4)
        assert np.isfinite(got).all()
        for i, name in enumerate(("dq", "dk", "dv")):
            bound = c * terms[name] + u16 * np.abs(d_n[i]) + common.tiny(precision)
            err = np.abs(got[i] - d_n[i])
            assert (err <= bound).all(), f"{name}: max err/bound {(err / bound).max():.2f}"


@pytest.mark.parametrize("variant", [v for v in BWD if v[3]], ids=[v[0].replace(" ", "-") for v in BWD if v[3]])
def test_wgmma_fused_backward_matches_the_two_kernel_one_at_a_model_shape(variant):
    """ANDREA-120M's shape on a small batch: the fused passes (their dq sums over 16 key blocks, ordered
    or atomic) against the verified two-kernel backward."""
    _, defines, deterministic, fused, _ = variant
    gb = CupyBackend("bf16")
    T, H, D = 1024, 12, 64
    _, d_qkv = inputs(gb, T, H, D)
    y, lse = cp.zeros((B, T, H * D), gb.half), cp.zeros((B, H, T), cp.float32)
    attention_wgmma.flash_fwd(gb, d_qkv, y, lse)
    dy = cp.asarray(RNG.standard_normal((B, T, H * D)).astype(np.float32)).astype(gb.half)
    out = []
    for args in ((defines, deterministic, fused), ((), True, False)):
        d = cp.zeros_like(d_qkv)
        attention_wgmma.flash_bwd(gb, dy, d_qkv, y, lse, d, args[0], deterministic=args[1], fused=args[2])
        out.append(cp.asnumpy(d).astype(np.float32))
    for i in range(3):
        assert rel(out[0][:, :, i], out[1][:, :, i]) < 1e-2, "qkv"[i]
