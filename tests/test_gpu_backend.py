"""The CuPy backend against the NumPy reference, on a GPU (run on the device:
`python3 -m pytest tests/test_gpu_backend.py`). Without CuPy or a GPU every test is skipped and
says so; CI never has a GPU."""

import json
import math

import numpy as np
import pytest

try:
    import cupy as cp

    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
    HOPPER = HAVE_GPU and cp.cuda.Device().compute_capability == "90"  # sm_90a: the wgmma forward runs
except Exception:  # ImportError, or CUDA without a device
    HAVE_GPU = HOPPER = False

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU with CuPy here (GPU tests run on the device)")]

if HAVE_GPU:
    from andrea.engine.cupy import BF16, VOCAB_PAD, CupyBackend, cublaslt, cudnn_attention
from andrea.engine import Engine
from andrea.engine import numpy_backend as nb
from andrea.engine.backend import CTRL_T
from andrea.model import ModelConfig
from andrea.optim import OptimConfig, launch_step, train_step

RNG = np.random.default_rng(7)
B, T, H, D = 2, 100, 4, 32  # T not a multiple of the tiles, on purpose
d, M, V = H * D, 4 * H * D, 301


def r(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def g(x):
    return cp.asarray(x)


def h(x):
    return cp.asnumpy(x)


def test_gemm_all_transposes_and_accumulation():
    gb = CupyBackend("fp32")
    a, b = r(37, 53), r(53, 29)
    for ta in (False, True):
        for tb in (False, True):
            A = g(np.ascontiguousarray(a.T)) if ta else g(a)
            Bm = g(np.ascontiguousarray(b.T)) if tb else g(b)
            c = cp.full((37, 29), 2.0, dtype=cp.float32)
            gb.gemm(A, Bm, c, ta=ta, tb=tb, accumulate=True)
            assert rel(h(c), a @ b + 2.0) < 1e-6, (ta, tb)
            gb.gemm(A, Bm, c, ta=ta, tb=tb)
            assert rel(h(c), a @ b) < 1e-6, (ta, tb)


def test_embedding_pair():
    gb = CupyBackend("fp32")
    tok = RNG.integers(0, V, (B, T)).astype(np.int32)
    tok[0, :20] = 5
    wte, wpe, dout = r(V, d), r(T, d), r(B, T, d)
    out_n, out_g = np.zeros((B, T, d), np.float32), cp.zeros((B, T, d), cp.float32)
    nb.embed_fwd(tok.astype(np.int64), wte, wpe, out_n)
    gb.embed_fwd(g(tok), g(wte), g(wpe), out_g)
    assert rel(h(out_g), out_n) < 1e-6
    dwte_n, dwpe_n = np.zeros_like(wte), np.zeros_like(wpe)
    dwte_g, dwpe_g = cp.zeros_like(g(wte)), cp.zeros_like(g(wpe))
    nb.embed_bwd(dout, tok.astype(np.int64), dwte_n, dwpe_n)
    gb.embed_bwd(g(dout), g(tok), dwte_g, dwpe_g)
    assert rel(h(dwte_g), dwte_n) < 1e-5 and rel(h(dwpe_g), dwpe_n) < 1e-5


def test_embedding_plan_is_a_stable_sort_for_any_vocabulary():
    """plan_tokens radix-sorts 16-bit IDs and falls back to a merge sort past 65535: the same plan."""
    for hi in (V, 1 << 16, 70_000):
        tok = RNG.integers(0, hi, (4, 64))
        tok[1, :9] = hi - 1
        plan = CupyBackend.plan_tokens(tok)
        flat, n = tok.reshape(-1), tok.size
        uniq = np.unique(flat)
        assert (plan[:n] == np.argsort(flat, kind="stable")).all(), hi
        assert plan[3 * n + 1] == uniq.size and (plan[2 * n + 1:2 * n + 1 + uniq.size] == uniq).all(), hi


def test_layernorm_pair():
    gb = CupyBackend("fp32")
    x, gam, bet, dout = r(B, T, d), r(d), r(d), r(B, T, d)
    outs = {}
    for name, be, conv in (("n", nb, lambda a: a), ("g", gb, g)):
        out, mean, rstd = conv(np.zeros((B, T, d), np.float32)), conv(np.zeros((B, T), np.float32)), conv(np.zeros((B, T), np.float32))
        be.layernorm_fwd(conv(x), conv(gam), conv(bet), out, mean, rstd)
        dx, dg, db = conv(np.ones((B, T, d), np.float32)), conv(np.zeros(d, np.float32)), conv(np.zeros(d, np.float32))
        be.layernorm_bwd(conv(dout), conv(x), mean, rstd, conv(gam), dx, dg, db)
        outs[name] = [np.asarray(h(a) if name == "g" else a) for a in (out, mean, rstd, dx, dg, db)]
    for a, b in zip(outs["g"], outs["n"]):
        assert rel(a, b) < 1e-5


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fused_residual_layernorm_pairs(precision):
    """residual add + LayerNorm in one kernel; LayerNorm backward with its parameter sums reduced
    on the way and the residual gradient handed to the branch (residual_add_bwd fused)."""
    gb = CupyBackend(precision)
    dt, tol = (BF16, 1e-2) if precision == "bf16" else (np.float32, 1e-5)
    x, f, gam, bet, dout = r(B, T, d), r(B, T, d), r(d), r(d), r(B, T, d)
    res_n, out_n = np.zeros((B, T, d), np.float32), np.zeros((B, T, d), np.float32)
    m_n, s_n = np.zeros((B, T), np.float32), np.zeros((B, T), np.float32)
    nb.add_layernorm_fwd(x, f, res_n, gam, bet, out_n, m_n, s_n)
    dx_n, dg_n, db_n, br_n = np.ones((B, T, d), np.float32), np.zeros(d, np.float32), np.zeros(d, np.float32), np.zeros((B, T, d), np.float32)
    nb.layernorm_bwd(dout, res_n, m_n, s_n, gam, dx_n, dg_n, db_n, branch=br_n)
    res_g, out_g = cp.zeros((B, T, d), cp.float32), cp.zeros((B, T, d), dt)
    m_g, s_g = cp.zeros((B, T), cp.float32), cp.zeros((B, T), cp.float32)
    gb.add_layernorm_fwd(g(x), g(f), res_g, g(gam), g(bet), out_g, m_g, s_g)
    dx_g, dg_g, db_g, br_g = cp.ones((B, T, d), cp.float32), cp.zeros(d, cp.float32), cp.zeros(d, cp.float32), cp.zeros((B, T, d), dt)
    gb.layernorm_bwd(g(dout), res_g, m_g, s_g, g(gam), dx_g, dg_g, db_g, branch=br_g)
    assert h(res_g).tobytes() == res_n.tobytes()  # the add is exact
    for a_, b_, tol_ in ((out_g, out_n, tol), (m_g, m_n, 1e-5), (s_g, s_n, 1e-5), (dx_g, dx_n, 1e-5), (dg_g, dg_n, 1e-5),
                         (db_g, db_n, 1e-5), (br_g, br_n, tol)):
        assert rel(np.asarray(h(a_), np.float32), b_) < tol_


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_row_kernels_at_widths_the_vector_kernels_do_not_take(precision):
    """d_model not a multiple of 4, and a GELU size not a multiple of 8: the scalar kernels."""
    gb = CupyBackend(precision)
    dt, tol = (BF16, 1e-2) if precision == "bf16" else (np.float32, 1e-5)
    C = 130
    x, f, gam, bet, dout = r(3, 5, C), r(3, 5, C), r(C), r(C), r(3, 5, C)
    res_n, out_n, m_n, s_n = np.zeros_like(x), np.zeros_like(x), np.zeros((3, 5), np.float32), np.zeros((3, 5), np.float32)
    nb.add_layernorm_fwd(x, f, res_n, gam, bet, out_n, m_n, s_n)
    dx_n, dg_n, db_n = np.zeros_like(x), np.zeros(C, np.float32), np.zeros(C, np.float32)
    nb.layernorm_bwd(dout, res_n, m_n, s_n, gam, dx_n, dg_n, db_n)
    res_g, out_g = cp.zeros(x.shape, cp.float32), cp.zeros(x.shape, dt)
    m_g, s_g = cp.zeros((3, 5), cp.float32), cp.zeros((3, 5), cp.float32)
    gb.add_layernorm_fwd(g(x), g(f), res_g, g(gam), g(bet), out_g, m_g, s_g)
    dx_g, dg_g, db_g = cp.zeros(x.shape, cp.float32), cp.zeros(C, cp.float32), cp.zeros(C, cp.float32)
    gb.layernorm_bwd(g(dout), res_g, m_g, s_g, g(gam), dx_g, dg_g, db_g)
    assert rel(np.asarray(h(out_g), np.float32), out_n) < tol
    for a_, b_ in ((dx_g, dx_n), (dg_g, dg_n), (db_g, db_n)):
        assert rel(h(a_), b_) < 1e-5
    hh = round16(r(7, 3))
    a_n = np.zeros_like(hh)
    nb.gelu(hh, a_n)
    a_g = cp.zeros(hh.shape, dt)
    gb.gelu(g(hh).astype(dt), a_g)
    assert rel(np.asarray(h(a_g), np.float32), a_n) < tol


def test_cuda_graph_replay_equals_eager_steps(monkeypatch):
    """bf16 training steps with forward + backward captured once as a CUDA graph and replayed give
    the same bytes as the same steps run kernel by kernel (two micro-batches in the last step), our
    attention kernels running (on an H100/H200 the wgmma forward, inside the graph)."""
    monkeypatch.setenv("ANDREA_ATTENTION", "flash")  # ours, also where the cuDNN frontend is installed
    oc = OptimConfig(lr=1e-3, warmup_steps=1)
    out = {}
    for graphs in (False, True):
        e = Engine(CFG, 4, 128, backend="cupy", seed=6, precision="bf16")
        e.graphs = graphs
        results = [train_step(e, [batch(40 + s)], s, oc) for s in range(3)]
        results.append(train_step(e, [batch(50), batch(51)], 3, oc))
        out[graphs] = (e.host(e.w).tobytes(), [r_.loss for r_ in results], [r_.grad_norm for r_ in results])
    assert e._captured and all(c.graph is not None for c in e._captured.values())  # it really replayed a graph
    assert out[True] == out[False]
    assert e.be.forwards_ran == ({"wgmma"} if HOPPER else {"mma.sync"})  # the TMA forward inside the graph
    assert e.be.backwards_ran == ({"wgmma"} if HOPPER else {"mma.sync"})


@pytest.mark.skipif(not HOPPER, reason="the wgmma forward runs on compute capability 9.0 only")
def test_wgmma_forward_is_not_captured_before_its_tensor_maps_exist():
    """The TMA forward reads qkv through tensor maps that are copied to the device when first made: a
    copy a CUDA graph cannot hold. While a graph is being captured, a buffer whose maps are not made yet
    goes to mma.sync (its replay gives mma.sync's eager bytes); made eagerly first, the wgmma forward is
    captured and its replay gives the wgmma forward's eager bytes."""
    from andrea.engine.cupy import attention_mma, attention_wgmma

    gb = CupyBackend("bf16")
    gb.attention = "flash"  # ours, also where the cuDNN frontend is installed
    Tt, Hh, Dd = 256, 2, 64
    qkv = g(round16(r(2, Tt, 3, Hh, Dd))).astype(gb.half)
    rows = attention_wgmma.launch("flash_fwd", Dd, attention_wgmma.PRODUCTION_FWD)[0]
    attention_wgmma._MAPS.pop(attention_wgmma._map_key(qkv, rows, attention_wgmma.config(attention_wgmma.PRODUCTION_FWD)["FWD_BN"]), None)
    y, lse = cp.zeros((2, Tt, Hh * Dd), gb.half), cp.zeros((2, Hh, Tt), cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)

    def replay_of_a_capture():
        with stream:
            y.fill(0)
            lse.fill(0)
            stream.begin_capture()
            try:
                gb.attn_fwd(qkv, y, lse)
            finally:
                graph = stream.end_capture()
            graph.launch(stream)
        stream.synchronize()
        return h(y).tobytes(), h(lse).tobytes()

    def eager(fwd):
        y2, lse2 = cp.zeros_like(y), cp.zeros_like(lse)
        fwd(gb, qkv, y2, lse2)
        return h(y2).tobytes(), h(lse2).tobytes()

    mma = eager(attention_mma.flash_fwd)  # (its kernel loaded before a capture, as a captured pass's warm-up does)
    assert replay_of_a_capture() == mma  # no maps yet: mma.sync was captured
    assert gb.forwards_ran == {"mma.sync"}
    wgmma = eager(lambda *a: attention_wgmma.flash_fwd(*a, attention_wgmma.PRODUCTION_FWD))  # makes the maps
    assert wgmma != mma  # (the two forwards' bytes differ, so the check below can fail)
    gb.forwards_ran.clear()
    assert replay_of_a_capture() == wgmma
    assert gb.forwards_ran == {"wgmma"}


def test_steps_launched_ahead_equal_steps_read_one_by_one():
    """The trainer launches a step before reading the one before (optim.launch_step): the decisions
    taken on the device (clipping, bias corrections) and the copies read later give each step the
    same loss, norm and clipping as steps read one at a time, and the same weights; the pinned
    uploads of later batches do not disturb a step in flight. A tight clip makes every step clip."""
    oc = OptimConfig(lr=1e-3, warmup_steps=1, grad_clip=0.05)
    out = {}
    for ahead in (False, True):
        e = Engine(CFG, 4, 128, backend="cupy", seed=6, precision="bf16")
        if ahead:
            pending = [launch_step(e, [batch(40 + s)], s, oc) for s in range(4)]  # four queued, none read
            results = [p.result() for p in pending]
        else:
            results = [train_step(e, [batch(40 + s)], s, oc) for s in range(4)]
        out[ahead] = (e.host(e.w).tobytes(), [(r_.loss, r_.grad_norm, r_.clipped, r_.row_losses.tolist()) for r_ in results],
                      e.adam_t)
    assert out[True] == out[False]
    assert out[True][2] == 4 and all(clipped for _, _, clipped, _ in out[True][1])


def test_optimizer_steps_on_the_gpu_match_numpy():
    """fp32 training steps on the GPU against the NumPy backend's: the norm and the decisions taken on
    the device (step_control: clipping, bias corrections), AdamW with the weight-decay mask a byte per
    granule of parameters, and the step count."""
    oc = OptimConfig(lr=3e-3, warmup_steps=1, weight_decay=0.1, grad_clip=0.5)
    ref = Engine(CFG, 4, 128, dtype="float32", seed=3)
    gpu = Engine(CFG, 4, 128, backend="cupy", seed=3)
    assert gpu.decay.size < gpu.w.size  # the coarse mask
    for s_ in range(3):
        r_ref, r_gpu = train_step(ref, [batch(60 + s_)], s_, oc), train_step(gpu, [batch(60 + s_)], s_, oc)
        assert math.isclose(r_gpu.loss, r_ref.loss, rel_tol=1e-5) and math.isclose(r_gpu.grad_norm, r_ref.grad_norm, rel_tol=1e-4)
        assert r_gpu.clipped == r_ref.clipped
    assert gpu.adam_t == ref.adam_t == 3
    assert rel(gpu.host(gpu.w), ref.w) < 1e-5 and rel(gpu.host(gpu.m), ref.m) < 1e-4


def test_a_step_with_a_non_finite_norm_leaves_the_state_on_the_device():
    """step_control on the GPU: a non-finite gradient norm skips AdamW (weights, m, v, the 16-bit copy
    and the step count untouched) without the host looking first, and the step reports it."""
    oc = OptimConfig(lr=1e-3, warmup_steps=1)
    e = Engine(CFG, 4, 128, backend="cupy", seed=6, precision="bf16")
    train_step(e, [batch(40)], 0, oc)
    e.P["lnf.g"][0] = cp.nan  # poisons the loss and every gradient
    e.be.invalidate_weight_cache()
    before = [e.host(a).tobytes() for a in (e.w, e.m, e.v)]
    res = train_step(e, [batch(41)], 1, oc)
    assert res.skipped and not math.isfinite(res.grad_norm) and e.adam_t == 1
    assert [e.host(a).tobytes() for a in (e.w, e.m, e.v)] == before
    assert int(e.host(e.ctrl)[CTRL_T]) == 1  # the device's count, which the next update starts from


@pytest.mark.parametrize("head_dim", [32, 64])
def test_attention_pair_matches_reference_without_a_TxT_matrix(head_dim):
    """fp32: the CUDA-core flash kernels, at every head size (T = 100: the last tile partial)."""
    gb = CupyBackend("fp32")
    Hh = d // head_dim
    qkv, dy = r(3, B, Hh, T, head_dim), r(B, T, d)
    y_n, lse_n = np.zeros((B, T, d), np.float32), np.zeros((B, Hh, T), np.float32)
    nb.attn_fwd(qkv, y_n, lse_n)
    y_g, lse_g = cp.zeros((B, T, d), cp.float32), cp.zeros((B, Hh, T), cp.float32)
    gb.attn_fwd(g(qkv), y_g, lse_g)
    assert rel(h(y_g), y_n) < 1e-5 and rel(h(lse_g), lse_n) < 1e-5
    dq_n = np.zeros_like(qkv)
    nb.attn_bwd(dy, qkv, y_n, lse_n, dq_n)
    dq_g = cp.zeros_like(g(qkv))
    gb.attn_bwd(g(dy), g(qkv), y_g, lse_g, dq_g)
    for i in range(3):
        assert rel(h(dq_g[i]), dq_n[i]) < 1e-5, "qkv"[i]


def round16(a, dtype=None):
    """a rounded to the 16-bit type (bf16 unless given), back in float32."""
    return np.asarray(a, np.float32).astype(dtype or BF16).astype(np.float32)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim,T_", [(32, 100), (64, 100), (64, 200), (16, 37)])
@pytest.mark.parametrize("impl", ["flash", "mma", "cudnn"])
def test_tensor_core_flash_attention_matches_reference(head_dim, T_, precision, impl, monkeypatch):
    """16-bit modes, every implementation on a [B, T, 3, H, D] buffer, partial tiles included: ours
    ("flash": on an H100/H200 the forward by wgmma with TMA and the backward by wgmma, attention_wgmma.py;
    elsewhere, and everything with "mma", the mma.sync kernels, tiles double-buffered with cp.async), and
    cuDNN's fused attention (where the frontend is installed; it must take the model's head sizes, 32
    and 64)."""
    if impl == "cudnn" and cudnn_attention._cudnn() is None:
        pytest.skip("the cuDNN frontend is not installed (pip install nvidia-cudnn-frontend)")
    monkeypatch.setenv("ANDREA_ATTENTION_WORKSPACE_MIB", "1024")  # cuDNN's backward on the whole batch
    gb = CupyBackend(precision)
    gb.attention = impl
    # an arena its workspace fits in: at head size 32 our backward would otherwise run instead
    gb.set_backward_arena(cp.zeros(64 << 20, cp.uint8))
    hd = gb.half
    Hh = 2
    dd = Hh * head_dim
    qkv = round16(r(B, T_, 3, Hh, head_dim), hd)
    dy = round16(r(B, T_, dd), hd)
    ref_qkv = np.ascontiguousarray(qkv.transpose(2, 0, 3, 1, 4))  # [3, B, H, T, D] for NumPy
    y_n, lse_n = np.zeros((B, T_, dd), np.float32), np.zeros((B, Hh, T_), np.float32)
    nb.attn_fwd(ref_qkv, y_n, lse_n)
    dq_n = np.zeros_like(ref_qkv)
    nb.attn_bwd(dy, ref_qkv, y_n, lse_n, dq_n)
    q_g = g(qkv).astype(hd)
    y_g, lse_g = cp.zeros((B, T_, dd), hd), cp.zeros((B, Hh, T_), cp.float32)
    gb.attn_fwd(q_g, y_g, lse_g)
    assert rel(h(y_g).astype(np.float32), y_n) < 1e-2 and rel(h(lse_g), lse_n) < 1e-3
    if impl != "cudnn":  # the forward the dispatch promises (the plan line names it)
        assert gb.forwards_ran == ({"wgmma"} if impl == "flash" and HOPPER else {"mma.sync"})
    if impl == "cudnn" and head_dim >= 32:
        (graphs,) = [c.graphs for c in gb._cudnn.values()]
        assert all(v is not None for v in graphs.values()), "cuDNN refused the shape: our kernels ran"
    runs = []
    for _ in range(2):
        d_g = cp.zeros_like(q_g)
        gb.attn_bwd(g(dy).astype(hd), q_g, y_g, lse_g, d_g)
        runs.append(h(d_g))
    assert runs[0].tobytes() == runs[1].tobytes()  # deterministic
    if impl != "cudnn":  # the backward the dispatch promises
        assert gb.backwards_ran == ({"wgmma"} if impl == "flash" and HOPPER else {"mma.sync"})
    if impl == "cudnn" and head_dim >= 32:
        assert len(graphs) == 2 and all(v is not None for v in graphs.values()), "cuDNN's backward did not run"
        assert not any(c.ours_instead for c in gb._cudnn.values()), "our backward ran instead of cuDNN's"
    got = runs[0].astype(np.float32).transpose(2, 0, 3, 1, 4)
    for i in range(3):
        assert rel(got[i], dq_n[i]) < 1e-2, "qkv"[i]


@pytest.mark.parametrize("cap_mib", ["0", None])
def test_at_head_size_32_our_backward_runs_instead_of_cudnn_slices(monkeypatch, cap_mib):
    """Where cuDNN's deterministic backward would need slices (no arena, no workspace allowed) or a
    workspace of its own (the default cap, no arena) at head size 32, our flash backward runs it (as
    fast there, and with no workspace); the plan line says so. The gradients match the NumPy reference."""
    if cudnn_attention._cudnn() is None:
        pytest.skip("the cuDNN frontend is not installed (pip install nvidia-cudnn-frontend)")
    if cap_mib is None:
        monkeypatch.delenv("ANDREA_ATTENTION_WORKSPACE_MIB", raising=False)
    else:
        monkeypatch.setenv("ANDREA_ATTENTION_WORKSPACE_MIB", cap_mib)
    Bb, Tt, Hh, Dd = 4, 128, 2, 32
    gb = CupyBackend("bf16")
    gb.attention = "cudnn"
    qkv = round16(r(Bb, Tt, 3, Hh, Dd))
    dy = round16(r(Bb, Tt, Hh * Dd))
    y, lse = cp.zeros((Bb, Tt, Hh * Dd), BF16), cp.zeros((Bb, Hh, Tt), cp.float32)
    gb.attn_fwd(g(qkv).astype(BF16), y, lse)
    d = cp.zeros((Bb, Tt, 3, Hh, Dd), BF16)
    gb.attn_bwd(g(dy).astype(BF16), g(qkv).astype(BF16), y, lse, d)
    (c,) = gb._cudnn.values()
    assert c.ours_instead == {(Bb, Hh, Tt, Dd)} and "our backward instead" in gb.implementation()
    ref = np.ascontiguousarray(qkv.transpose(2, 0, 3, 1, 4))
    y_n, lse_n = np.zeros((Bb, Tt, Hh * Dd), np.float32), np.zeros((Bb, Hh, Tt), np.float32)
    nb.attn_fwd(ref, y_n, lse_n)
    dq_n = np.zeros_like(ref)
    nb.attn_bwd(dy, ref, y_n, lse_n, dq_n)
    got = h(d).astype(np.float32).transpose(2, 0, 3, 1, 4)
    for i in range(3):
        assert rel(got[i], dq_n[i]) < 1e-2, "qkv"[i]


def test_cudnn_attention_backward_in_batch_slices_under_a_workspace_cap(monkeypatch):
    """Where the deterministic backward's workspace (linear in the batch) would pass both the
    backward arena (memory dead during the layers' backward: the loss's probabilities) and
    ANDREA_ATTENTION_WORKSPACE_MIB, it runs on slices of the batch: the same gradients as the whole
    batch in one call, within the workspace asked for; where the slices fit in the arena, the
    workspace is the arena and takes no memory of its own."""
    if cudnn_attention._cudnn() is None:
        pytest.skip("the cuDNN frontend is not installed (pip install nvidia-cudnn-frontend)")
    Bb, Tt, Hh, Dd = 4, 128, 2, 64
    qkv = g(round16(r(Bb, Tt, 3, Hh, Dd))).astype(BF16)
    dy = g(round16(r(Bb, Tt, Hh * Dd))).astype(BF16)

    def backward(arena_bytes=0):
        gb = CupyBackend("bf16")
        gb.attention = "cudnn"
        if arena_bytes:
            gb.set_backward_arena(cp.zeros(arena_bytes // 2, BF16))
        y, lse = cp.zeros((Bb, Tt, Hh * Dd), BF16), cp.zeros((Bb, Hh, Tt), cp.float32)
        gb.attn_fwd(qkv, y, lse)
        d = cp.zeros_like(qkv)
        gb.attn_bwd(dy, qkv, y, lse, d)
        (c,) = gb._cudnn.values()
        rows = c.slices[(Bb, Hh, Tt, Dd, qkv.dtype)]
        built = c.graphs[("bwd", rows, Hh, Tt, Dd, qkv.dtype)]
        assert built is not None, "cuDNN's backward did not run"
        own = [k for k in gb._scratch if k[0] == "cudnn_attention_ws" and k[1][0] >= built[2]]
        return rows, built[2], h(d).astype(np.float32), own

    monkeypatch.setenv("ANDREA_ATTENTION_WORKSPACE_MIB", "100000")
    whole, ws_whole, d_whole, own = backward()
    assert whole == Bb and own  # the whole batch in one call, in a workspace of its own
    cap = ws_whole / 2 + 1024  # half the whole batch's workspace (and a little): two rows a call
    monkeypatch.setenv("ANDREA_ATTENTION_WORKSPACE_MIB", str(cap / (1 << 20)))
    rows, ws, d_rows, own = backward()
    assert rows == Bb // 2 and ws < ws_whole and own, (whole, rows, ws, ws_whole)
    assert rel(d_rows, d_whole) < 1e-6
    monkeypatch.setenv("ANDREA_ATTENTION_WORKSPACE_MIB", "0")  # nothing beyond the arena
    rows, ws, d_arena, own = backward(arena_bytes=int(cap) // 16 * 16)
    assert rows == Bb // 2 and not own  # the slices' workspace is the arena
    assert rel(d_arena, d_whole) < 1e-6


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16bit_pairs_match_numpy(precision):
    """bf16 and fp16 modes on the buffers the engine plans for them (16-bit activations,
    [B, T, 3, H, D] q/k/v, padded 16-bit logits, weights read from the 16-bit copy AdamW keeps):
    each pair within 1e-2."""
    gb = CupyBackend(precision)
    bf = gb.half
    # the head first, as in the model's layout: its bf16 copy is padded with zero rows, and every
    # weight after it sits further on in the copy
    shapes = {"wte": (V, d), "wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, M), "w2": (M, d)}
    host = {k: r(*s, scale=0.1) for k, s in shapes.items()}
    flat = g(np.concatenate([round16(host[k], bf).ravel() for k in shapes]))
    W, off = {}, 0
    for k, s in shapes.items():
        W[k] = flat[off:off + math.prod(s)].reshape(s)
        host[k] = round16(host[k], bf)
        off += math.prod(s)
    gb.register_weights(flat, head=W["wte"])
    assert gb.weights.view(W["wte"], padded=True).shape == (-(-V // VOCAB_PAD) * VOCAB_PAD, d)
    x = round16(r(B, T, d), bf)
    xb = g(x).astype(bf)

    def close(got, want, what):
        assert rel(np.asarray(h(got), np.float32), want) < 1e-2, what

    # LayerNorm writes bf16
    res, gam, bet = r(B, T, d), r(d), r(d)
    out_n, m_n, s_n = np.zeros((B, T, d), np.float32), np.zeros((B, T), np.float32), np.zeros((B, T), np.float32)
    nb.layernorm_fwd(res, gam, bet, out_n, m_n, s_n)
    out_g, m_g, s_g = cp.zeros((B, T, d), bf), cp.zeros((B, T), cp.float32), cp.zeros((B, T), cp.float32)
    gb.layernorm_fwd(g(res), g(gam), g(bet), out_g, m_g, s_g)
    close(out_g, out_n, "layernorm")
    # q, k, v projection: one strided-batched GEMM into [B, T, 3, H, D], and its backward
    qkv_n = np.zeros((3, B, H, T, D), np.float32)
    nb.attn_qkv_fwd(x, host["wq"], host["wk"], host["wv"], qkv_n, H)
    qkv_g = cp.zeros((B, T, 3, H, D), bf)
    gb.attn_qkv_fwd(xb, W["wq"], W["wk"], W["wv"], qkv_g, H)
    close(cp.ascontiguousarray(qkv_g.transpose(2, 0, 3, 1, 4)), qkv_n, "qkv")
    dqkv = round16(r(B, T, 3, H, D), bf)
    dx_n, dws_n = np.zeros((B, T, d), np.float32), [np.zeros((d, d), np.float32) for _ in range(3)]
    nb.attn_qkv_bwd(np.ascontiguousarray(dqkv.transpose(2, 0, 3, 1, 4)), x, host["wq"], host["wk"], host["wv"], dx_n, *dws_n)
    grads = cp.zeros(3 * d * d, cp.float32)
    dws_g = [grads[i * d * d:(i + 1) * d * d].reshape(d, d) for i in range(3)]
    dx_g = cp.zeros((B, T, d), cp.float32)
    gb.attn_qkv_bwd(g(dqkv).astype(bf), xb, W["wq"], W["wk"], W["wv"], dx_g, *dws_g)
    close(dx_g, dx_n, "qkv dx")
    for i in range(3):
        close(dws_g[i], dws_n[i], f"qkv dw{i}")
    # weights that are not back to back (W_O stands in for W_V): copied one by one into [W_Q W_K W_O]
    # (and gradients apart: one product per weight)
    dws_n = [np.zeros((d, d), np.float32) for _ in range(3)]
    nb.attn_qkv_bwd(np.ascontiguousarray(dqkv.transpose(2, 0, 3, 1, 4)), x, host["wq"], host["wk"], host["wo"], dx_n, *dws_n)
    dx_g, dws_g = cp.zeros((B, T, d), cp.float32), [cp.zeros((d, d), cp.float32) for _ in range(3)]
    gb.attn_qkv_bwd(g(dqkv).astype(bf), xb, W["wq"], W["wk"], W["wo"], dx_g, *dws_g)
    close(dx_g, dx_n, "qkv dx, weights apart")
    for i in range(3):
        close(dws_g[i], dws_n[i], f"qkv dw{i}, gradients apart")
    # output projection, MLP (bf16 hidden and GELU output), residual gradient cast
    go = round16(r(B, T, d), bf)
    o_n, dy_n, dwo_n = np.zeros((B, T, d), np.float32), np.zeros((B, T, d), np.float32), np.zeros((d, d), np.float32)
    nb.attn_out_fwd(x, host["wo"], o_n)
    nb.attn_out_bwd(go, x, host["wo"], dy_n, dwo_n)
    o_g, dy_g, dwo_g = cp.zeros((B, T, d), cp.float32), cp.zeros((B, T, d), bf), cp.zeros((d, d), cp.float32)
    gb.attn_out_fwd(xb, W["wo"], o_g)
    gb.attn_out_bwd(g(go).astype(bf), xb, W["wo"], dy_g, dwo_g)
    for a_, b_, w_ in ((o_g, o_n, "out"), (dy_g, dy_n, "out dy"), (dwo_g, dwo_n, "out dw")):
        close(a_, b_, w_)
    hn, an, mn = np.zeros((B, T, M), np.float32), np.zeros((B, T, M), np.float32), np.zeros((B, T, d), np.float32)
    nb.mlp_fwd(x, host["w1"], host["w2"], hn, an, mn)
    hg, ag, mg = cp.zeros((B, T, M), bf), cp.zeros((B, T, M), bf), cp.zeros((B, T, d), cp.float32)
    gb.mlp_fwd(xb, W["w1"], W["w2"], hg, ag, mg)
    for a_, b_, w_ in ((hg, hn, "mlp h"), (ag, an, "mlp a"), (mg, mn, "mlp out")):
        close(a_, b_, w_)
    mdx_n, dw1_n, dw2_n = np.zeros((B, T, d), np.float32), np.zeros((d, M), np.float32), np.zeros((M, d), np.float32)
    nb.mlp_bwd(go, x, hn, an, host["w1"], host["w2"], mdx_n, dw1_n, dw2_n)
    mdx_g, dw1_g, dw2_g = cp.zeros((B, T, d), cp.float32), cp.zeros((d, M), cp.float32), cp.zeros((M, d), cp.float32)
    gb.mlp_bwd(g(go).astype(bf), xb, hg, ag, W["w1"], W["w2"], mdx_g, dw1_g, dw2_g)
    for a_, b_, w_ in ((mdx_g, mdx_n, "mlp dx"), (dw1_g, dw1_n, "mlp dw1"), (dw2_g, dw2_n, "mlp dw2")):
        close(a_, b_, w_)
    cast = cp.zeros((B, T, d), bf)
    gb.residual_add_bwd(g(go), cast)
    assert h(cast).astype(np.float32).tobytes() == go.tobytes()
    # classifier: bf16 logits in padded rows, loss and gradient in one kernel, 1/N in the GEMMs' alpha
    tgt = RNG.integers(0, V, (B, T))
    probs_n, losses_n = np.zeros((B, T, V), np.float32), np.zeros((B, T), np.float32)
    loss_n = nb.loss_fwd(x, host["wte"], tgt, probs_n, losses_n)
    ldx_n, ldw_n = np.zeros((B, T, d), np.float32), np.zeros((V, d), np.float32)
    nb.loss_bwd(x, host["wte"], tgt, probs_n, ldx_n, ldw_n, 0.5)
    shape, dtype = gb.plan_buffer("probs", (B, T, V), np.float32, H)
    assert shape[-1] % VOCAB_PAD == 0 and dtype == bf
    probs_g, losses_g = cp.zeros(shape, dtype), cp.zeros((B, T), cp.float32)
    loss_g = gb.loss_fwd(xb, W["wte"], g(tgt.astype(np.int32)), probs_g, losses_g)
    ldx_g, ldw_g = cp.zeros((B, T, d), cp.float32), cp.zeros((V, d), cp.float32)
    gb.loss_bwd(xb, W["wte"], g(tgt.astype(np.int32)), probs_g, ldx_g, ldw_g, 0.5)
    assert math.isclose(loss_g, loss_n, rel_tol=1e-2)
    for a_, b_, w_ in ((losses_g, losses_n, "losses"), (ldx_g, ldx_n, "loss dx"), (ldw_g, ldw_n, "loss dw")):
        close(a_, b_, w_)
    # AdamW refreshes the bf16 copy it serves to the matrix products
    grad, m_, v_ = cp.ones_like(flat), cp.zeros_like(flat), cp.zeros_like(flat)
    gb.adamw(flat, grad, m_, v_, cp.ones_like(flat), 1e-2, 0.9, 0.999, 1e-8, 0.0, 1)
    for k in shapes:
        assert h(gb.weights.operand(W[k], weight=True)).tobytes() == h(W[k]).astype(bf).tobytes(), k
    assert not h(gb.weights.view(W["wte"], padded=True)[V:]).astype(np.float32).any()  # the padding stays zero


def test_gemm_tuning_under_sustained_load_keeps_its_own_choices(tmp_path, monkeypatch):
    """ANDREA_GEMM_TUNE=sustained times each plan's algorithms after a warm-up, for longer, and keeps
    its choices in a section of its own (the default's are not reused, nor its own by the default);
    the product is the one asked for; an unknown mode is an error that names the variable."""
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("ANDREA_GEMM_TUNING", str(path))
    monkeypatch.setattr(cublaslt, "_TUNING", {})
    monkeypatch.setattr(cublaslt, "TUNE_SUSTAINED_MS", 20.0)  # the test's time, not the measurement's
    monkeypatch.setattr(cublaslt, "TUNE_SUSTAINED_WARM_MS", 10.0)
    timings = []  # graph_times' keyword arguments, call by call
    graph_times = cublaslt.graph_times
    monkeypatch.setattr(cublaslt, "graph_times", lambda *a, **kw: timings.append(kw) or graph_times(*a, **kw))
    m, k, n = 2048, 1024, 2048
    a, b = round16(r(m, k, scale=0.1)), round16(r(k, n, scale=0.1))
    want = a.astype(np.float64) @ b
    seen = []  # the tuning file's sections, in the order the modes made them
    for mode in ("sustained", "1"):
        monkeypatch.setenv("ANDREA_GEMM_TUNE", mode)
        timings.clear()
        lt = cublaslt.Lt()
        assert lt.tune_mode == {"sustained": "sustained", "1": "graph"}[mode]
        c = cp.zeros((m, n), dtype=cp.float32)
        lt.gemm(g(a).astype(BF16), g(b).astype(BF16), c)
        assert rel(h(c), want) < 1e-5
        (plan,) = lt.plans.values()
        assert plan.chosen is not None
        if len(plan.algos) < 2:
            pytest.skip("cuBLASLt offers one algorithm for this product here: nothing to time")
        assert timings == ([{"ms": 20.0, "warm_ms": 10.0}] if mode == "sustained" else [{}])
        (new,) = [name for name in json.loads(path.read_text()) if name not in seen]
        seen.append(new)
    assert [name.rsplit(" ", 1)[-1] for name in seen] == ["sustained-timed", "graph-timed"]
    monkeypatch.setenv("ANDREA_GEMM_TUNE", "fast")
    with pytest.raises(ValueError, match="ANDREA_GEMM_TUNE='fast'"):
        cublaslt.Lt()


def test_gemm_tuning_times_once_keeps_the_output_and_remembers(tmp_path, monkeypatch):
    """A 16-bit product large enough to tune: its algorithms are timed into a scratch output (c and
    what it accumulates come out as one call would leave them), the choice is written to the tuning
    file, and a later process takes the file's choice; a file that does not parse is a warning."""
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("ANDREA_GEMM_TUNING", str(path))
    monkeypatch.setattr(cublaslt, "_TUNING", {})
    m, k, n = 2048, 1024, 2048  # m·n·k = TUNE_MIN_WORK
    assert m * n * k >= cublaslt.TUNE_MIN_WORK
    a, b = round16(r(m, k, scale=0.1)), round16(r(k, n, scale=0.1))
    c0 = r(m, n)
    want = c0.astype(np.float64) + 0.5 * (a.astype(np.float64) @ b)
    lt = cublaslt.Lt(tune=True)
    c = g(c0)
    lt.gemm(g(a).astype(BF16), g(b).astype(BF16), c, accumulate=True, alpha=0.5)
    assert rel(h(c), want) < 1e-5  # fp32 output: the sum once, whatever the timing calls did
    (plan,) = lt.plans.values()
    assert plan.tunable and plan.chosen is not None
    store = json.loads(path.read_text())
    (section,) = store.values()
    assert section == {plan.name: plan.chosen}
    if len(plan.algos) > 1:  # a later process reads the file's choice instead of timing again
        other = (plan.chosen + 1) % len(plan.algos)
        path.write_text(json.dumps({s: {plan.name: other} for s in store}))
        monkeypatch.setattr(cublaslt, "_TUNING", {})
        lt2 = cublaslt.Lt(tune=True)
        c2 = g(c0)
        lt2.gemm(g(a).astype(BF16), g(b).astype(BF16), c2, accumulate=True, alpha=0.5)
        assert next(iter(lt2.plans.values())).chosen == other
        assert rel(h(c2), want) < 1e-5
    path.write_text("{not json")
    monkeypatch.setattr(cublaslt, "_TUNING", {})
    with pytest.warns(UserWarning, match="unreadable GEMM tuning file"):
        cublaslt.Lt(tune=True).gemm(g(a).astype(BF16), g(b).astype(BF16), g(c0), accumulate=True, alpha=0.5)
    assert json.loads(path.read_text())  # rewritten whole


def test_pinned_copies_replay_in_a_captured_pass():
    """The one-token step's copies: tokens up from a host buffer and the first V columns of padded
    logits rows down into one, queued in stream order and replayed by a captured pass with the
    host buffers' new contents; shapes that do not match are refused."""
    be = CupyBackend("bf16")
    tokens_host = be.host_buffer((3, 1), np.int32)
    tokens = cp.zeros((3, 1), cp.int32)
    padded = cp.zeros((3, 8), cp.float32)
    logits = padded[:, :5]  # rows 8 floats apart, as logits_fwd's padded head leaves them
    logits_host = be.host_buffer((3, 5), np.float32)
    columns = cp.arange(8, dtype=cp.float32)

    def step():  # allocates nothing (a captured pass must not)
        be.upload_async(tokens, tokens_host)
        cp.multiply(tokens, columns, out=padded)
        be.download_async(logits_host, logits)

    replay = be.capture(step)
    for first in (1, 10, 100):  # run eagerly (and captured), then the graph replayed twice
        tokens_host[:, 0] = [first, first + 1, first + 2]
        replay()
        be.wait()
        assert (logits_host == np.array([[t * c for c in range(5)] for t in tokens_host[:, 0]], np.float32)).all()
    with pytest.raises(ValueError, match="download_async"):
        be.download_async(be.host_buffer((3, 8), np.float32), logits)
    with pytest.raises(ValueError, match="upload_async"):
        be.upload_async(tokens, be.host_buffer((2, 1), np.int32))


def test_graph_times_replays_each_algorithm_and_skips_those_that_fail():
    """The tuner's timing: an algorithm whose call fails gets inf (the tuner never picks it), the
    others a time per call from their graph replays, longer work a longer time; the caller's
    current stream is the same after it."""
    x = cp.zeros(1 << 22, dtype=cp.float32)
    reps = {0: 1, 2: 8}  # algorithm 0 a short pass over x, 2 eight of them; 1 fails

    def call(i):
        if i == 1:
            return 7
        for _ in range(reps[i]):
            x.__iadd__(1.0)
        return 0

    before = cp.cuda.get_current_stream()
    times = cublaslt.graph_times(call, 3, calls=4, ms=2.0)
    assert times[1] == math.inf
    assert 0 < times[0] < times[2] < math.inf
    assert cp.cuda.get_current_stream() == before


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mlp_gelu_epilogues_match_the_elementwise_passes(precision):
    """The 16-bit MLP with GELU and GELU' applied by cuBLASLt as the products are written (the
    default) gives what the products plus elementwise passes give, with a = gelu(h) recomputed in
    the backward (the default) or kept from the forward (ANDREA_GELU=keep: then gelu'(h) is the
    epilogue of the product that makes h's gradient): h, a, the output and every gradient within
    the 16-bit rounding of the values in between (the epilogue applies GELU to the fp32
    accumulator, the pass to the rounded h), and all match NumPy."""
    bf = CupyBackend(precision).half
    x, gout = round16(r(B, T, d), bf), round16(r(B, T, d), bf)
    w1, w2 = round16(r(d, M, scale=0.1), bf), round16(r(M, d, scale=0.1), bf)
    hn, an, on = np.zeros((B, T, M), np.float32), np.zeros((B, T, M), np.float32), np.zeros((B, T, d), np.float32)
    nb.mlp_fwd(x, w1, w2, hn, an, on)
    dxn, dw1n, dw2n = np.zeros((B, T, d), np.float32), np.zeros((d, M), np.float32), np.zeros((M, d), np.float32)
    nb.mlp_bwd(gout, x, hn, an, w1, w2, dxn, dw1n, dw2n)
    got = {}
    for epilogue, keep in ((True, False), (False, False), (True, True), (False, True)):
        be = CupyBackend(precision)
        be.gelu_epilogue, be.keep_gelu = epilogue, keep
        assert be.recomputes_gelu is not keep
        hg, ag, og = cp.zeros((B, T, M), bf), cp.zeros((B, T, M), bf), cp.zeros((B, T, d), cp.float32)
        be.mlp_fwd(g(x).astype(bf), g(w1), g(w2), hg, ag, og)
        fwd = [h(v).astype(np.float32) for v in (hg, ag, og)]
        if not keep:
            ag.fill(np.nan)  # recomputed: the backward must not read the forward's a
        dx, dw1, dw2 = cp.zeros((B, T, d), cp.float32), cp.zeros((d, M), cp.float32), cp.zeros((M, d), cp.float32)
        be.mlp_bwd(g(gout).astype(bf), g(x).astype(bf), hg, ag, g(w1), g(w2), dx, dw1, dw2)
        got[epilogue, keep] = fwd + [h(v) for v in (dx, dw1, dw2)]
        # which products ran with an epilogue (plan keys: "h16", layouts, ta, tb, epilogue, ...)
        epilogues = {key[6] for lt in be._lt.values() for key in lt.plans if key[0] == "h16"}
        assert (cublaslt.EPILOGUE_GELU_AUX in epilogues) is epilogue
        assert (cublaslt.EPILOGUE_DGELU in epilogues) is (epilogue and keep)
    ulp = 2.0 ** -8 if precision == "bf16" else 2.0 ** -11  # the 16-bit types' unit in the last place (relative)
    names = ("h", "a", "out", "dx", "dw1", "dw2")
    for variant in ((True, False), (True, True), (False, True)):
        for name, got_, pass_, want in zip(names, got[variant], got[False, False], (hn, an, on, dxn, dw1n, dw2n)):
            assert rel(got_, pass_) < 2 * ulp, (variant, name, rel(got_, pass_))
            assert rel(got_, want) < 1e-2, (variant, name, rel(got_, want))


def test_matmul_pairs_and_classifier():
    gb = CupyBackend("fp32")
    x, wq, wk, wv, wo = r(B, T, d), r(d, d, scale=0.1), r(d, d, scale=0.1), r(d, d, scale=0.1), r(d, d, scale=0.1)
    w1, w2, wte = r(d, M, scale=0.1), r(M, d, scale=0.1), r(V, d, scale=0.1)
    tgt = RNG.integers(0, V, (B, T))
    res = {}
    for name, be, conv, idx in (("n", nb, lambda a: a, np.int64), ("g", gb, g, np.int32)):
        qkv = conv(np.zeros((3, B, H, T, D), np.float32))
        be.attn_qkv_fwd(conv(x), conv(wq), conv(wk), conv(wv), qkv, H)
        dx = conv(np.zeros((B, T, d), np.float32))
        dws = [conv(np.zeros((d, d), np.float32)) for _ in range(3)]
        be.attn_qkv_bwd(qkv, conv(x), conv(wq), conv(wk), conv(wv), dx, *dws)
        out = conv(np.zeros((B, T, d), np.float32))
        be.attn_out_fwd(conv(x), conv(wo), out)
        hbuf, abuf, mo = conv(np.zeros((B, T, M), np.float32)), conv(np.zeros((B, T, M), np.float32)), conv(np.zeros((B, T, d), np.float32))
        be.mlp_fwd(conv(x), conv(w1), conv(w2), hbuf, abuf, mo)
        mdx, dw1, dw2 = conv(np.zeros((B, T, d), np.float32)), conv(np.zeros((d, M), np.float32)), conv(np.zeros((M, d), np.float32))
        be.mlp_bwd(mo, conv(x), hbuf, abuf, conv(w1), conv(w2), mdx, dw1, dw2)
        probs, losses = conv(np.zeros((B, T, V), np.float32)), conv(np.zeros((B, T), np.float32))
        loss = be.loss_fwd(conv(x), conv(wte), conv(tgt.astype(idx)), probs, losses)
        ldx, ldw = conv(np.zeros((B, T, d), np.float32)), conv(np.zeros((V, d), np.float32))
        be.loss_bwd(conv(x), conv(wte), conv(tgt.astype(idx)), probs, ldx, ldw)
        res[name] = [np.asarray(h(a) if name == "g" else a) for a in (qkv, dx, *dws, out, hbuf, abuf, mo, mdx, dw1, dw2, losses, ldx, ldw)] + [loss]
    for i, (a, b) in enumerate(zip(res["g"][:-1], res["n"][:-1])):
        assert rel(a, b) < 1e-5, i
    assert math.isclose(res["g"][-1], res["n"][-1], rel_tol=1e-5)


def test_optimizer_kernels():
    gb = CupyBackend("fp32")
    n = 300_001
    w, grad, m, v = r(n), r(n), r(n, scale=0.01), np.abs(r(n, scale=0.01))
    decay = (RNG.random(n) > 0.3).astype(np.float32)
    part_n, part_g = np.zeros(5, np.float64), cp.zeros(5, cp.float64)
    nb.grad_norm_partial(grad, part_n)
    gb.grad_norm_partial(g(grad), part_g)
    assert math.isclose(gb.grad_norm_final(part_g), nb.grad_norm_final(part_n), rel_tol=1e-6)
    wg, gg, mg, vg = g(w), g(grad), g(m), g(v)
    gb.grad_scale(gg, 0.5)
    nb.grad_scale(grad, 0.5)
    nb.adamw(w, grad, m, v, decay, 1e-3, 0.9, 0.999, 1e-8, 0.1, 7)
    gb.adamw(wg, gg, mg, vg, g(decay), 1e-3, 0.9, 0.999, 1e-8, 0.1, 7)
    for a, b in ((wg, w), (mg, m), (vg, v)):
        assert rel(h(a), b) < 1e-6


CFG = ModelConfig(vocab_size=257 + 256, d_model=128, n_head=4, n_layer=2, context=128)


def batch(seed, Bb=4, Tt=128):
    x = np.random.default_rng(seed).integers(0, CFG.vocab_size, (Bb, Tt + 1))
    return x[:, :-1], x[:, 1:]


def test_whole_step_gradients_match_numpy_float64():
    inputs, targets = batch(0)
    ref = Engine(CFG, 4, 128, dtype="float64", seed=1)
    gpu = Engine(CFG, 4, 128, backend="cupy", seed=1)
    l_ref = ref.forward(inputs, targets)
    ref.backward()
    l_gpu = gpu.forward(inputs, targets)
    gpu.backward()
    assert math.isclose(l_gpu, l_ref, rel_tol=1e-5)
    assert rel(gpu.host(gpu.g), ref.g) < 1e-4
    for p in gpu.layout:
        a, b = gpu.host(gpu.g)[p.offset : p.offset + p.size], ref.g[p.offset : p.offset + p.size]
        assert rel(a, b) < 1e-3, p.name


def test_bf16_step_with_buffers_inside_the_probabilities_matches_numpy():
    """bf16: the GELU buffer, the MLP backward's scratch, the forward's branch, the attention's output
    gradient, the q/k/v weight copy and cuDNN's attention workspace live inside the loss's probabilities (dead while the layers run); the loss and every parameter's gradient
    still match the float64 reference within bf16's precision, twice in a row (the second pass
    reads nothing the first left there)."""
    # V >= 2 d_mlp + d: the GELU buffer, its gradient and the tail all fit at once, as in the shipped models
    cfg = ModelConfig(vocab_size=1280, d_model=128, n_head=4, n_layer=2, context=128)
    inputs, targets = batch(0)
    ref = Engine(cfg, 4, 128, dtype="float64", seed=1)
    gpu = Engine(cfg, 4, 128, backend="cupy", seed=1, precision="bf16")
    assert {"mlp_a", "branch", "d_y"} <= gpu.A.aliased and gpu.be.backward_arena is not None
    assert gpu.be.backward_arena.data.ptr + gpu.be.backward_arena.size <= gpu.A.scratch["d_y"].data.ptr
    l_ref = ref.forward(inputs, targets)
    ref.backward()
    for _ in range(2):
        gpu.zero_grads()
        l_gpu = gpu.forward(inputs, targets)
        gpu.backward()
        assert math.isclose(l_gpu, l_ref, rel_tol=1e-2)
        for p in gpu.layout:
            a, b = gpu.host(gpu.g)[p.offset : p.offset + p.size], ref.g[p.offset : p.offset + p.size]
            assert rel(a, b) < 5e-2, p.name
    # none of them took memory of its own: no fallback scratch; cuDNN's backward ran (not ours) with a
    # workspace that fits in the arena, which is then its workspace (CudnnAttention._run)
    own = {k[0] for k in gpu.be._scratch}
    assert not own & {"mlp_da", "qkv_wcat"}, own
    for c in gpu.be._cudnn.values():
        assert not c.ours_instead, "our backward ran instead of cuDNN's"
        bwd = [built[2] for key, built in c.graphs.items() if key[0] == "bwd" and built is not None]
        assert bwd and max(bwd) <= gpu.be.backward_arena.size, (bwd, gpu.be.backward_arena.size)


def test_head_gradient_of_a_vocabulary_one_past_a_multiple_of_64():
    """The shipped vocabularies are 256 + N + 1 entries: the head's weight gradient runs as the rows up to a
    multiple of 64 and then the last row alone; every row matches NumPy, the last one on its own."""
    Vv, dd = 321, 64
    gb = CupyBackend("bf16")
    w = round16(r(Vv, dd, scale=0.1))
    flat = g(w.ravel())
    gb.register_weights(flat, head=flat.reshape(Vv, dd))
    x = round16(r(2, 100, dd))
    tgt = RNG.integers(0, Vv, (2, 100))
    probs_n, losses_n = np.zeros((2, 100, Vv), np.float32), np.zeros((2, 100), np.float32)
    nb.loss_fwd(x, w, tgt, probs_n, losses_n)
    ldx_n, ldw_n = np.zeros((2, 100, dd), np.float32), np.zeros((Vv, dd), np.float32)
    nb.loss_bwd(x, w, tgt, probs_n, ldx_n, ldw_n, 1.0)
    shape, dtype = gb.plan_buffer("probs", (2, 100, Vv), np.float32, 1)
    probs_g, losses_g = cp.zeros(shape, dtype), cp.zeros((2, 100), cp.float32)
    xb, tg = g(x).astype(BF16), g(tgt.astype(np.int32))
    gb.loss_fwd(xb, flat.reshape(Vv, dd), tg, probs_g, losses_g)
    ldx_g, ldw_g = cp.zeros((2, 100, dd), cp.float32), cp.full((Vv, dd), 0.25, cp.float32)  # it accumulates
    gb.loss_bwd(xb, flat.reshape(Vv, dd), tg, probs_g, ldx_g, ldw_g, 1.0)
    got = h(ldw_g) - 0.25
    assert rel(got[:320], ldw_n[:320]) < 1e-2 and rel(got[320:], ldw_n[320:]) < 1e-2
    assert rel(h(ldx_g), ldx_n) < 1e-2


@pytest.mark.parametrize("Vv", [8193, 60001])
def test_16bit_loss_matches_numpy_over_large_vocabularies(Vv):
    """The 16-bit loss over rows of several warps (8,193: ANDREA-120M's vocabulary, the row held in
    registers) and over rows too long for a block of those registers in bf16 (60,001: the three-pass
    kernel takes them): per-position losses and (p − onehot) against NumPy, the padding untouched."""
    dd = 64
    gb = CupyBackend("bf16")
    w, x = round16(r(Vv, dd, scale=0.3)), round16(r(2, 8, dd))
    tgt = RNG.integers(0, Vv, (2, 8))
    probs_n, losses_n = np.zeros((2, 8, Vv), np.float32), np.zeros((2, 8), np.float32)
    nb.loss_fwd(x, w, tgt, probs_n, losses_n)
    onehot = np.zeros_like(probs_n)
    np.put_along_axis(onehot, tgt[..., None], 1.0, axis=-1)
    shape, dtype = gb.plan_buffer("probs", (2, 8, Vv), np.float32, 1)
    probs_g, losses_g = cp.full(shape, 7.0, dtype), cp.zeros((2, 8), cp.float32)  # 7: the padding's sentinel
    gb.loss_fwd(g(x).astype(BF16), g(w), g(tgt.astype(np.int32)), probs_g, losses_g)
    got = h(probs_g).astype(np.float32)
    assert rel(h(losses_g), losses_n) < 5e-3  # the logits rounded to bf16 before the loss
    assert rel(got[..., :Vv], probs_n - onehot) < 1e-2
    assert (got[..., Vv:] == 7.0).all()


def test_whole_step_gradients_match_pytorch_autograd():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    inputs, targets = batch(1)
    gpu = Engine(CFG, 4, 128, backend="cupy", seed=2)
    gpu.forward(inputs, targets)
    gpu.backward()
    W = {k: torch.tensor(v.copy(), dtype=torch.float64, requires_grad=True) for k, v in
         ((p.name, gpu.host(gpu.w)[p.offset : p.offset + p.size].reshape(p.shape)) for p in gpu.layout)}
    idx, tgt = torch.tensor(inputs), torch.tensor(targets)
    Hh, Dd = CFG.n_head, CFG.head_dim
    x = W["wte"][idx] + W["wpe"][: idx.shape[1]]
    for l in range(CFG.n_layer):
        p = lambda n: W[f"h{l}.{n}"]  # noqa: E731
        hN = F.layer_norm(x, (CFG.d_model,), p("ln1.g"), p("ln1.b"), 1e-5)
        q, k, v = ((hN @ p(n)).view(4, 128, Hh, Dd).transpose(1, 2) for n in ("wq", "wk", "wv"))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(4, 128, CFG.d_model)
        x = x + y @ p("wo")
        x = x + F.gelu(F.layer_norm(x, (CFG.d_model,), p("ln2.g"), p("ln2.b"), 1e-5) @ p("w1"), approximate="tanh") @ p("w2")
    logits = F.layer_norm(x, (CFG.d_model,), W["lnf.g"], W["lnf.b"], 1e-5) @ W["wte"].T
    F.cross_entropy(logits.reshape(-1, CFG.vocab_size), tgt.reshape(-1)).backward()
    ours = gpu.host(gpu.g)
    for p in gpu.layout:
        assert rel(ours[p.offset : p.offset + p.size].reshape(p.shape), W[p.name].grad.numpy()) < 1e-3, p.name


def trained_bytes(precision: str = "bf16", steps: int = 3) -> bytes:
    """A fresh engine's weights after `steps` training steps (graph replays), as bytes."""
    e = Engine(CFG, 4, 128, backend="cupy", seed=4, precision=precision)
    for step in range(steps):
        train_step(e, [batch(10 + step)], step, OptimConfig(lr=1e-3, warmup_steps=1))
    return e.host(e.w).tobytes()


def test_bf16_step_is_close_and_deterministic():
    inputs, targets = batch(3)
    ref = Engine(CFG, 4, 128, seed=4)
    ref.forward(inputs, targets)
    ref.backward()
    assert trained_bytes() == trained_bytes()  # same bytes twice
    e = Engine(CFG, 4, 128, backend="cupy", seed=4, precision="bf16")
    e.forward(inputs, targets)
    e.backward()
    assert rel(e.host(e.g), ref.g) < 1e-2


def test_fp16_step_with_loss_scaling_matches_fp32():
    """fp16 mode: the classifier's gradient is multiplied by the loss scale on the device, the
    gradients come out scaled by it, and a few optimizer steps (graph replays) stay finite and
    byte-identical between two runs."""
    inputs, targets = batch(3)
    ref = Engine(CFG, 4, 128, seed=4)
    ref.forward(inputs, targets)
    ref.backward()
    e = Engine(CFG, 4, 128, backend="cupy", seed=4, precision="fp16")
    assert e.loss_scale == 2.0**15 and e.acts["qkv"].dtype == np.float16
    e.forward_backward(inputs, targets)
    assert rel(e.host(e.g) / e.loss_scale, ref.g) < 1e-2
    runs = []
    for _ in range(2):
        e = Engine(CFG, 4, 128, backend="cupy", seed=4, precision="fp16")
        res = [train_step(e, [batch(10 + step)], step, OptimConfig(lr=1e-3, warmup_steps=1)) for step in range(4)]
        assert all(math.isfinite(r_.loss) and not r_.skipped for r_ in res)
        runs.append(e.host(e.w).tobytes())
    assert runs[0] == runs[1]


def test_bf16_engine_plans_bf16_activations(monkeypatch):
    fp32 = Engine(CFG, 4, 128, backend="cupy", seed=1)
    bf16 = Engine(CFG, 4, 128, backend="cupy", seed=1, precision="bf16")
    assert bf16.acts["qkv"].shape == (CFG.n_layer, 4, 128, 3, CFG.n_head, CFG.head_dim)
    # the residual stream and its gradient in bf16 too, the branch's gradient one buffer with it
    assert bf16.acts["mlp_h"].dtype == BF16 and bf16.acts["res"].dtype == BF16
    assert bf16.A.scratch["d_branch"] is bf16.A.scratch["d_res"] and bf16.A.scratch["d_res"].dtype == BF16
    assert bf16.memory_plan().activations < 0.5 * fp32.memory_plan().activations
    monkeypatch.setenv("ANDREA_RESIDUAL", "fp32")  # the fp32 stream, on request
    r32 = Engine(CFG, 4, 128, backend="cupy", seed=1, precision="bf16")
    assert r32.acts["res"].dtype == np.float32 and r32.A.scratch["d_branch"].dtype == BF16
    assert r32.A.scratch["d_branch"] is not r32.A.scratch["d_res"]
    assert bf16.memory_plan().activations < r32.memory_plan().activations


def test_bf16_engine_keeps_gelu_on_request(monkeypatch):
    """ANDREA_GELU=keep: each layer's a = gelu(h) is saved (L buffers, counted by the memory plan,
    instead of one inside the probabilities) and the backward, with gelu'(h) as a product's epilogue,
    gives the recomputing engine's gradients within bf16's rounding; training steps replay alike."""
    inputs, targets = batch(3)
    monkeypatch.delenv("ANDREA_GELU", raising=False)
    rec = Engine(CFG, 4, 128, backend="cupy", seed=4, precision="bf16")  # auto: 512 tokens a pass recompute
    monkeypatch.setenv("ANDREA_GELU", "keep")
    keep = Engine(CFG, 4, 128, backend="cupy", seed=4, precision="bf16")
    assert rec.be.recomputes_gelu and not keep.be.recomputes_gelu
    assert rec.acts["mlp_a"].shape[0] == 1 and keep.acts["mlp_a"].shape[0] == CFG.n_layer
    assert keep.memory_plan().activations > rec.memory_plan().activations
    for e in (rec, keep):
        e.forward(inputs, targets)
        e.backward()
    assert rel(keep.host(keep.g), rec.host(rec.g)) < 1e-2
    assert trained_bytes() == trained_bytes()  # same bytes twice, the GELU kept
    monkeypatch.setenv("ANDREA_GELU", "sometimes")
    with pytest.raises(ValueError, match="ANDREA_GELU='sometimes'"):
        CupyBackend("bf16")


def test_gelu_auto_keeps_it_for_large_passes_with_memory_to_spare(monkeypatch):
    """ANDREA_GELU=auto (the default): a = gelu(h) is kept from GELU_KEEP_TOKENS tokens a pass, unless
    the kept buffers would take more than 1/GELU_KEEP_SHARE of the GPU's memory (batches that fill it
    recompute); fp8 always recomputes, fp32 always keeps."""
    from andrea.engine.cupy import GELU_KEEP_SHARE, GELU_KEEP_TOKENS

    monkeypatch.delenv("ANDREA_GELU", raising=False)
    total = cp.cuda.runtime.memGetInfo()[1]
    for tokens, kept, want in ((GELU_KEEP_TOKENS - 1, 1 << 20, False), (GELU_KEEP_TOKENS, 1 << 20, True),
                               (GELU_KEEP_TOKENS, total // GELU_KEEP_SHARE, True),
                               (GELU_KEEP_TOKENS, total // GELU_KEEP_SHARE + 1, False)):
        be = CupyBackend("bf16")
        be.plan_gelu(tokens, kept)
        assert be.keep_gelu is want and be.recomputes_gelu is not want, (tokens, kept)
        assert f"GELU {'kept' if want else 'recomputed'}" in be.implementation()
    fp8, fp32 = CupyBackend("fp8"), CupyBackend("fp32")
    for be in (fp8, fp32):
        be.plan_gelu(GELU_KEEP_TOKENS, 1 << 20)
    assert fp8.recomputes_gelu and not fp32.recomputes_gelu


def test_bf16_residual_stream_pairs_match_numpy():
    """The 16-bit residual stream's kernels: the residual add rounds fp32(x + f) to bf16 once and
    normalises that; the backward reads x and the old dx in bf16 and stores dx rounded once, which is
    then the branch's gradient (no copy); the embedding writes the stream and reads its gradient in
    bf16. Each against NumPy on the same stored values."""
    gb = CupyBackend("bf16")
    assert gb.residual == "bf16"
    x, f, gam, bet, dout, dx0 = (round16(a) for a in (r(B, T, d), r(B, T, d), r(d), r(d), r(B, T, d), r(B, T, d)))
    res_n = round16(x + f)
    out_n, m_n, s_n = np.zeros((B, T, d), np.float32), np.zeros((B, T), np.float32), np.zeros((B, T), np.float32)
    nb.layernorm_fwd(res_n, gam, bet, out_n, m_n, s_n)
    res_g, out_g = cp.zeros((B, T, d), BF16), cp.zeros((B, T, d), BF16)
    m_g, s_g = cp.zeros((B, T), cp.float32), cp.zeros((B, T), cp.float32)
    gb.add_layernorm_fwd(g(x).astype(BF16), g(f).astype(BF16), res_g, g(gam), g(bet), out_g, m_g, s_g)
    assert np.array_equal(h(res_g).astype(np.float32), res_n)  # one fp32 add, one rounding
    assert rel(h(out_g), out_n) < 1e-2 and rel(h(m_g), m_n) < 1e-5 and rel(h(s_g), s_n) < 1e-5
    # a few rows (generation's step: a block per row), and an odd count (the 2-rows kernel's last warp)
    for n in (3, 77):
        res_k, out_k = cp.zeros((1, n, d), BF16), cp.zeros((1, n, d), BF16)
        m_k, s_k = cp.zeros((1, n), cp.float32), cp.zeros((1, n), cp.float32)
        gb.add_layernorm_fwd(g(x[:1, :n]).astype(BF16), g(f[:1, :n]).astype(BF16), res_k, g(gam), g(bet), out_k, m_k, s_k)
        assert np.array_equal(h(res_k).astype(np.float32), res_n[:1, :n]), n
        assert rel(h(out_k), out_n[:1, :n]) < 1e-2 and rel(h(s_k), s_n[:1, :n]) < 1e-5, n
    # the first LayerNorm: the stream alone
    out1 = cp.zeros((B, T, d), BF16)
    gb.layernorm_fwd(g(x).astype(BF16), g(gam), g(bet), out1, m_g, s_g)
    o1_n = np.zeros((B, T, d), np.float32)
    nb.layernorm_fwd(x, gam, bet, o1_n, np.zeros((B, T), np.float32), np.zeros((B, T), np.float32))
    assert rel(h(out1), o1_n) < 1e-2
    # the backward over the stream, dx updated in place and handed on as the branch's gradient
    gb.add_layernorm_fwd(g(x).astype(BF16), g(f).astype(BF16), res_g, g(gam), g(bet), out_g, m_g, s_g)
    dx_n, dg_n, db_n = dx0.copy(), np.zeros(d, np.float32), np.zeros(d, np.float32)
    nb.layernorm_bwd(dout, res_n, h(m_g), h(s_g), gam, dx_n, dg_n, db_n)
    dx_g, dg_g, db_g = g(dx0).astype(BF16), cp.zeros(d, cp.float32), cp.zeros(d, cp.float32)
    gb.layernorm_bwd(g(dout).astype(BF16), res_g, m_g, s_g, g(gam), dx_g, dg_g, db_g, branch=dx_g)
    assert rel(h(dx_g), dx_n) < 1e-2 and rel(h(dg_g), dg_n) < 1e-4 and rel(h(db_g), db_n) < 1e-4
    with pytest.raises(ValueError, match="16-bit residual gradient"):
        gb.layernorm_bwd(g(dout).astype(BF16), res_g, m_g, s_g, g(gam), dx_g, dg_g, db_g, branch=cp.zeros_like(dx_g))
    # the embedding pair on the 16-bit stream
    V_, T_ = 50, T
    wte, wpe = r(V_, d), r(T_, d)
    tok = RNG.integers(0, V_, (B, T_))
    emb_n = np.zeros((B, T_, d), np.float32)
    nb.embed_fwd(tok, wte, wpe, emb_n)
    emb_g = cp.zeros((B, T_, d), BF16)
    gb.embed_fwd(g(tok.astype(np.int32)), g(wte), g(wpe), emb_g)
    assert np.array_equal(h(emb_g).astype(np.float32), round16(emb_n))
    dwte_n, dwpe_n = np.zeros_like(wte), np.zeros_like(wpe)
    nb.embed_bwd(dout, tok, dwte_n, dwpe_n)
    dwte_g, dwpe_g = cp.zeros(wte.shape, cp.float32), cp.zeros(wpe.shape, cp.float32)
    gb.embed_bwd(g(dout).astype(BF16), g(tok.astype(np.int32)), dwte_g, dwpe_g)
    assert rel(h(dwte_g), dwte_n) < 1e-5 and rel(h(dwpe_g), dwpe_n) < 1e-5


def test_gpu_checkpoint_loads_in_the_numpy_backend(tmp_path):
    from andrea.checkpoint import read_checkpoint, write_checkpoint

    e = Engine(CFG, 4, 128, backend="cupy", seed=5)
    for step in range(3):
        train_step(e, [batch(20 + step)], step, OptimConfig(lr=1e-3, warmup_steps=1))
    write_checkpoint(tmp_path / "c.bin", 3, e.host(e.w), e.host(e.m), e.host(e.v))
    ck = read_checkpoint(tmp_path / "c.bin", e.n_params)
    cpu = Engine(CFG, 4, 128, seed=0)
    cpu.load_state(ck.weights, ck.m, ck.v, adam_t=3)
    inputs, targets = batch(99)
    assert math.isclose(cpu.forward(inputs, targets), e.forward(inputs, targets), rel_tol=1e-5)


def test_snapshot_holds_the_value_at_its_step():
    """A checkpoint's snapshot is the buffer when it was taken, whatever the training does next:
    the device-side copy, brought to the host later on a stream of its own."""
    a = cp.arange(50_000_000, dtype=cp.float32)
    want = cp.asnumpy(a)
    snap = CupyBackend("fp32").snapshot(a)
    a *= 2  # the next steps change the weights
    got = snap.host()
    assert np.array_equal(got, want) and snap.copy is None


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_forward_only_batches_between_steps_change_nothing(precision):
    """Validation uploads its windows without the embedding backward's plan (prepare(...,
    backward=False)); the training steps around it, graph replays included, give the same bytes
    as steps with no validation in between, and a forward-only batch cannot be trained on."""
    from andrea.evaluation import EvalSet, evaluate, prepare_batches

    windows = np.random.default_rng(40).integers(0, CFG.vocab_size, (6, 129)).astype(np.uint16)
    es = EvalSet(128, windows, np.zeros(6, np.int64), np.full(6, 128), ["s"], {})
    runs = []
    for with_eval in (False, True):
        e = Engine(CFG, 4, 128, backend="cupy", seed=6, precision=precision)
        evb = prepare_batches(e, es)
        losses = []
        for step in range(3):
            losses.append(train_step(e, [batch(30 + step)], step, OptimConfig(lr=1e-3, warmup_steps=1)).loss)
            if with_eval:
                r = evaluate(e, es, evb)
                assert 0 < r["loss"] < 20
        runs.append((losses, e.host(e.w).tobytes()))
        with pytest.raises(ValueError, match="forward pass only"):
            e.forward_backward(evb[0])
    assert runs[0] == runs[1]


def _layer_pass(be, loss_scale):
    """One transformer layer's kernel pairs, the classifier and an AdamW step on `be`, over buffers
    it planned and weights it registered: a generator that yields after each call (so that calls of
    several backends can interleave), returning the results as host arrays."""
    rng = np.random.default_rng(9)
    shapes = {"wte": (V, d), "wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, M), "w2": (M, d)}
    n = sum(math.prod(s) for s in shapes.values())
    # every draw from this pass's own generator: a backend's pass sees the same data whenever it runs
    flat, grads = g((rng.standard_normal(n) * 0.1).astype(np.float32)), cp.zeros(n, cp.float32)
    W, G, off = {}, {}, 0
    for k, s in shapes.items():
        W[k], G[k] = flat[off:off + math.prod(s)].reshape(s), grads[off:off + math.prod(s)].reshape(s)
        off += math.prod(s)
    be.register_weights(flat, head=W["wte"])
    be.set_loss_scale(loss_scale)

    def buf(name, *shape):
        shape, dtype = be.plan_buffer(name, shape, np.float32, H)
        return cp.zeros(shape, dtype)

    x = g(rng.standard_normal((B, T, d)).astype(np.float32))
    tgt = g(rng.integers(0, V, (B, T)).astype(np.int32))
    ln, mean, rstd = buf("ln1", B, T, d), buf("ln1_mean", B, T), buf("ln1_rstd", B, T)
    be.layernorm_fwd(x, cp.ones(d, cp.float32), cp.zeros(d, cp.float32), ln, mean, rstd)
    yield
    qkv, y, lse = buf("qkv", 3, B, H, T, D), buf("att_y", B, T, d), buf("att_lse", B, H, T)
    be.attn_qkv_fwd(ln, W["wq"], W["wk"], W["wv"], qkv, H)
    yield
    be.attn_fwd(qkv, y, lse)
    yield
    out, hbuf, abuf = buf("branch", B, T, d), buf("mlp_h", B, T, M), buf("mlp_a", B, T, M)
    be.attn_out_fwd(y, W["wo"], out)
    yield
    be.mlp_fwd(ln, W["w1"], W["w2"], hbuf, abuf, out)
    yield
    probs, losses = buf("probs", B, T, V), buf("losses", B, T)
    loss = be.loss_fwd(ln, W["wte"], tgt, probs, losses)
    yield
    d_ln, d_branch, d_y, d_qkv = buf("d_ln", B, T, d), buf("d_branch", B, T, d), buf("d_y", B, T, d), buf("d_qkv", 3, B, H, T, D)
    be.loss_bwd(ln, W["wte"], tgt, probs, d_ln, G["wte"])
    yield
    be.residual_add_bwd(d_ln, d_branch)
    yield
    be.mlp_bwd(d_branch, ln, hbuf, abuf, W["w1"], W["w2"], d_ln, G["w1"], G["w2"])
    yield
    be.attn_out_bwd(d_branch, y, W["wo"], d_y, G["wo"])
    yield
    be.attn_bwd(d_y, qkv, y, lse, d_qkv)
    yield
    be.attn_qkv_bwd(d_qkv, ln, W["wq"], W["wk"], W["wv"], d_ln, G["wq"], G["wk"], G["wv"])
    yield
    be.adamw(flat, grads, cp.zeros_like(flat), cp.zeros_like(flat), cp.ones(n, cp.uint8), 1e-2, 0.9, 0.999, 1e-8, 0.1, 1,
             1.0 / loss_scale)
    yield
    mlp = be.weights.operand(W["w1"], weight=True)  # the weight copy AdamW refreshed (fp32: the weights)
    return [np.float64(loss), h(losses), h(d_qkv).view(np.uint8), h(d_ln), h(grads), h(flat), h(mlp).view(np.uint8)]


def test_backends_of_different_precisions_work_side_by_side():
    """fp32, bf16 and fp16 backends in one process, their calls interleaved one by one, give the same
    bytes as each backend alone: precision, weight copies, loss scale, scratch buffers and cuBLAS
    handles are each backend's own (fp16 with a loss scale the others must not see)."""
    scales = {"fp32": 1.0, "bf16": 1.0, "fp16": 1024.0}

    def finish(gen):
        try:
            while True:
                next(gen)
        except StopIteration as stop:
            return stop.value

    alone = {p: finish(_layer_pass(CupyBackend(p), s)) for p, s in scales.items()}
    running = {p: _layer_pass(CupyBackend(p), s) for p, s in scales.items()}
    together = {}
    while running:
        for p in list(running):
            try:
                next(running[p])
            except StopIteration as stop:
                together[p] = stop.value
                del running[p]
    for p in scales:
        assert all(a.tobytes() == b.tobytes() for a, b in zip(together[p], alone[p])), p
    # the fp16 backend's gradients carry its loss scale; bf16's (the same model) do not
    assert 100 < np.linalg.norm(alone["fp16"][4]) / np.linalg.norm(alone["bf16"][4]) < 10_000


def test_engines_of_different_precisions_train_side_by_side():
    """A bf16, an fp16 and an fp32 engine in one process, their training steps interleaved (graph
    replays included), end with the same weights and losses as each engine trained alone."""
    oc = OptimConfig(lr=1e-3, warmup_steps=1)

    def steps(e):
        for s in range(3):
            yield train_step(e, [batch(60 + s)], s, oc).loss

    alone = {}
    for p in ("bf16", "fp16", "fp32"):
        e = Engine(CFG, 4, 128, backend="cupy", seed=8, precision=p)
        alone[p] = (list(steps(e)), e.host(e.w).tobytes())
    engines = {p: Engine(CFG, 4, 128, backend="cupy", seed=8, precision=p) for p in alone}
    runs = {p: steps(e) for p, e in engines.items()}
    losses = {p: [] for p in engines}
    for _ in range(3):
        for p in engines:
            losses[p].append(next(runs[p]))
    for p, e in engines.items():
        assert (losses[p], e.host(e.w).tobytes()) == alone[p], p


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_attention_probabilities_on_the_gpu_are_the_forward_pass_own(precision):
    """Backend.attn_probs on the GPU (the geometry views' attention maps): rows sum to one, nothing
    on the future, P·V equals the attention output the forward pass computed (its own flash or
    cuDNN kernels), and P equals the NumPy engine's on the same weights."""
    cfg = ModelConfig(vocab_size=V, d_model=128, n_head=2, n_layer=2, context=64)
    x = RNG.integers(0, V, (2, 49))
    ge = Engine(cfg, batch_size=2, seq_len=48, backend="cupy", precision=precision)
    ne = Engine(cfg, batch_size=2, seq_len=48)
    for e in (ge, ne):
        e.forward(x[:, :-1], x[:, 1:])
    for l in range(cfg.n_layer):
        a = ge.A.layer(l)
        P = ge.be.attn_probs(a.qkv, a.att_lse)
        assert isinstance(P, cp.ndarray) and P.dtype == cp.float32 and P.shape == (2, 2, 48, 48)
        P = h(P)
        assert np.allclose(P.sum(-1), 1, atol=1e-3 if precision == "bf16" else 1e-5)
        assert not np.triu(P, 1).any()
        v = h(ge.be.qkv_heads(a.qkv)[2]).astype(np.float32)
        y = (P @ v).transpose(0, 2, 1, 3).reshape(2, 48, 128)
        assert rel(y, h(a.att_y).astype(np.float32)) < (2e-2 if precision == "bf16" else 1e-5)
        ref = ne.be.attn_probs(ne.A.layer(l).qkv, ne.A.layer(l).att_lse)
        assert np.abs(P - ref).max() < (5e-2 if precision == "bf16" else 1e-4)
