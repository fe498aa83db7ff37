"""The NumPy engine: every kernel pair against central differences in float64, the whole model,
the optimizer, clipping, accumulation and determinism."""

import math

import numpy as np
import pytest

from andrea.config import load_config
from andrea.engine import Engine
from andrea.engine import numpy_backend as nb
from andrea.model import ModelConfig, coarse_decay_mask, decay_mask, init_weights, n_params, param_layout
from andrea.optim import NonFiniteCounter, NonFiniteHalt, OptimConfig, lr_at, train_step
from conftest import REPO

RNG = np.random.default_rng(1234)


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), np.linalg.norm(b), 1e-30))


def numeric_grad(f, x, eps=1e-6):
    """Central differences of scalar f() with respect to every element of x (in place)."""
    g = np.zeros_like(x)
    flat, gf = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gf[i] = (fp - fm) / (2 * eps)
    return g


def r(*shape):
    return RNG.standard_normal(shape)


# ------------------------------------------------------------------ every pair, float64

B, T, d, H, V = 2, 5, 8, 2, 11
D, M = d // H, 4 * d


def test_embed_pair():
    tok = RNG.integers(0, V, (B, T))
    tok[0, :3] = 4  # repeated tokens must sum
    wte, wpe, R = r(V, d), r(T + 2, d), r(B, T, d)
    out = np.zeros((B, T, d))

    def f():
        nb.embed_fwd(tok, wte, wpe, out)
        return float((out * R).sum())

    dwte, dwpe = np.zeros_like(wte), np.zeros_like(wpe)
    nb.embed_bwd(R, tok, dwte, dwpe)
    assert rel_err(dwte, numeric_grad(f, wte)) < 1e-6
    assert rel_err(dwpe, numeric_grad(f, wpe)) < 1e-6


def test_layernorm_pair_accumulates():
    x, g, b, R = r(B, T, d), r(d), r(d), r(B, T, d)
    out, mean, rstd = np.zeros((B, T, d)), np.zeros((B, T)), np.zeros((B, T))

    def f():
        nb.layernorm_fwd(x, g, b, out, mean, rstd)
        return float((out * R).sum())

    f()
    dx0, dg0, db0 = r(B, T, d), r(d), r(d)  # gradients already there must be added to
    dx, dg, db = dx0.copy(), dg0.copy(), db0.copy()
    nb.layernorm_bwd(R, x, mean, rstd, g, dx, dg, db)
    assert rel_err(dx - dx0, numeric_grad(f, x)) < 1e-6
    assert rel_err(dg - dg0, numeric_grad(f, g)) < 1e-6
    assert rel_err(db - db0, numeric_grad(f, b)) < 1e-6


def test_attn_qkv_pair():
    x, wq, wk, wv, R = r(B, T, d), r(d, d), r(d, d), r(d, d), r(3, B, H, T, D)
    qkv = np.zeros((3, B, H, T, D))

    def f():
        nb.attn_qkv_fwd(x, wq, wk, wv, qkv, H)
        return float((qkv * R).sum())

    dx = np.zeros_like(x)
    dws = [np.zeros_like(w) for w in (wq, wk, wv)]
    nb.attn_qkv_bwd(R, x, wq, wk, wv, dx, *dws)
    assert rel_err(dx, numeric_grad(f, x)) < 1e-6
    for w, dw in zip((wq, wk, wv), dws):
        assert rel_err(dw, numeric_grad(f, w)) < 1e-6


def test_attention_pair_is_causal():
    qkv, R = r(3, B, H, T, D), r(B, T, d)
    y, lse = np.zeros((B, T, d)), np.zeros((B, H, T))

    def f():
        nb.attn_fwd(qkv, y, lse)
        return float((y * R).sum())

    f()
    dqkv = np.zeros_like(qkv)
    nb.attn_bwd(R, qkv, y.copy(), lse.copy(), dqkv)
    assert rel_err(dqkv, numeric_grad(f, qkv)) < 1e-6
    # a query never sees the future: changing the last key/value leaves earlier outputs alone
    before = y.copy()
    qkv[1:, :, :, -1] += 10.0
    f()
    assert np.allclose(y[:, :-1], before[:, :-1]) and not np.allclose(y[:, -1], before[:, -1])


def test_attn_out_pair():
    y, wo, R = r(B, T, d), r(d, d), r(B, T, d)
    out = np.zeros((B, T, d))

    def f():
        nb.attn_out_fwd(y, wo, out)
        return float((out * R).sum())

    dy, dwo = np.zeros_like(y), np.zeros_like(wo)
    nb.attn_out_bwd(R, y, wo, dy, dwo)
    assert rel_err(dy, numeric_grad(f, y)) < 1e-6
    assert rel_err(dwo, numeric_grad(f, wo)) < 1e-6


def test_mlp_pair_and_gelu():
    x, w1, w2, R = r(B, T, d), r(d, M) * 0.5, r(M, d) * 0.5, r(B, T, d)
    h, a, out = np.zeros((B, T, M)), np.zeros((B, T, M)), np.zeros((B, T, d))

    def f():
        nb.mlp_fwd(x, w1, w2, h, a, out)
        return float((out * R).sum())

    f()
    dx, dw1, dw2 = np.zeros_like(x), np.zeros_like(w1), np.zeros_like(w2)
    nb.mlp_bwd(R, x, h, a, w1, w2, dx, dw1, dw2)
    assert rel_err(dx, numeric_grad(f, x)) < 1e-6
    assert rel_err(dw1, numeric_grad(f, w1)) < 1e-6
    assert rel_err(dw2, numeric_grad(f, w2)) < 1e-6
    z = np.array([-3.0, -0.5, 0.0, 0.5, 3.0])
    out = np.zeros_like(z)
    nb.gelu(z, out)
    ref = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    assert np.allclose(out, ref, rtol=0, atol=1e-15)


def test_residual_pair():
    x, fb, R = r(B, T, d), r(B, T, d), r(B, T, d)
    out = np.zeros_like(x)
    nb.residual_add(x, fb, out)
    assert np.array_equal(out, x + fb)
    df = np.zeros_like(fb)
    nb.residual_add_bwd(R, df)
    assert np.array_equal(df, R)


def test_loss_pair_and_row_losses():
    x, w = r(B, T, d), r(V, d)
    tgt = RNG.integers(0, V, (B, T))
    probs, losses = np.zeros((B, T, V)), np.zeros((B, T))

    def f():
        return nb.loss_fwd(x, w, tgt, probs, losses)

    mean = f()
    logits = x @ w.T
    ref = np.log(np.exp(logits).sum(-1)) - np.take_along_axis(logits, tgt[..., None], -1)[..., 0]
    assert np.allclose(losses, ref) and math.isclose(mean, ref.mean())
    dx, dw0 = np.zeros_like(x), r(V, d)
    dw = dw0.copy()
    nb.loss_bwd(x, w, tgt, probs, dx, dw, dloss=1.0)
    assert rel_err(dx, numeric_grad(f, x)) < 1e-6
    assert rel_err(dw - dw0, numeric_grad(f, w)) < 1e-6


# ------------------------------------------------------------------ whole model, float64

TINY = ModelConfig(vocab_size=23, d_model=8, n_head=2, n_layer=2, context=6)


@pytest.mark.parametrize("tied,vocab", [(True, 23), (False, 23), (True, 6)])
def test_whole_model_gradient_float64(tied, vocab):
    """Analytic gradients against finite differences. With 23 entries the forward's branch and the
    backward's d_y live inside the loss's probabilities; with 6 (fewer than d_model) they do not fit
    there and get buffers of their own."""
    cfg = ModelConfig(**{**TINY.__dict__, "tied_head": tied, "vocab_size": vocab})
    e = Engine(cfg, batch_size=2, seq_len=6, dtype="float64", seed=3)
    assert ({"branch", "d_y"} <= e.A.aliased) == (vocab >= cfg.d_model)
    e.w[:] = init_weights(cfg, 3, np.float64) * 5  # larger weights: a less trivial function
    x = RNG.integers(0, cfg.vocab_size, (2, 7))
    e.zero_grads()
    e.forward(x[:, :-1], x[:, 1:])
    e.backward()
    analytic = e.g.copy()
    numeric = numeric_grad(lambda: e.forward(x[:, :-1], x[:, 1:]), e.w)
    assert rel_err(analytic, numeric) < 1e-6
    for p in e.layout:  # every tensor on its own, too
        a, n = analytic[p.offset : p.offset + p.size], numeric[p.offset : p.offset + p.size]
        assert rel_err(a, n) < 1e-6 or np.abs(a - n).max() < 1e-9, p.name


# ------------------------------------------------------------------ model layout

def test_parameter_counts_match_the_spec_table():
    cfg = load_config(REPO / "config" / "config.yaml")
    counts = {k: n_params(ModelConfig.from_config(m)) for k, m in cfg["models"].items()}
    assert counts["ANDREA-12M"] == 12_691_584
    assert counts["ANDREA-120M"] == 92_248_320
    assert counts["ANDREA-480M"] == 480_219_648
    untied = ModelConfig.from_config({**cfg["models"]["ANDREA-12M"], "tied_head": False})
    assert n_params(untied) == 12_691_584 + 4353 * 384


def test_layout_order_init_and_decay_mask():
    cfg = ModelConfig(vocab_size=30, d_model=8, n_head=2, n_layer=3, context=4)
    names = [p.name for p in param_layout(cfg)]
    assert names[:12] == ["wte", "wpe", "h0.ln1.g", "h0.ln1.b", "h0.wq", "h0.wk", "h0.wv", "h0.wo", "h0.ln2.g", "h0.ln2.b", "h0.w1", "h0.w2"]
    assert names[-2:] == ["lnf.g", "lnf.b"]
    big = ModelConfig(vocab_size=2000, d_model=64, n_head=2, n_layer=4, context=64)
    w = init_weights(big, seed=0)
    P = {p.name: w[p.offset : p.offset + p.size] for p in param_layout(big)}
    assert abs(P["wte"].std() - 0.02) < 0.001
    assert abs(P["h0.w2"].std() - 0.02 / math.sqrt(8)) < 0.0005
    assert (P["h1.ln1.g"] == 1).all() and (P["lnf.b"] == 0).all()
    mask = decay_mask(param_layout(big))
    assert mask[param_layout(big)[2].offset] == 0 and mask[0] == 1
    assert np.array_equal(init_weights(big, seed=0), w)


def test_the_model_module_is_a_leaf_that_imports_numpy_and_the_standard_library_only():
    """andrea/model.py is the bottom of the package: every other module may import it, so it may
    import none of them (nor any other third-party package), at the top or inside a function."""
    import ast
    import sys

    tree = ast.parse((REPO / "andrea" / "model.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    roots = {name.split(".")[0] for name in imported}
    assert roots - {"numpy", "__future__"} <= set(sys.stdlib_module_names), sorted(imported)


def test_coarse_decay_mask_expands_to_the_mask_of_every_shipped_model():
    """The GPU keeps the weight-decay mask a byte per granule of 2^shift parameters: expanded, it is
    the per-parameter mask exactly, for the shipped models and an odd small one (where the granule
    is what the layout allows, down to single parameters)."""
    for cfg in (ModelConfig(vocab_size=4353, d_model=384, n_head=12, n_layer=6, context=1024),
                ModelConfig(vocab_size=16641, d_model=1536, n_head=24, n_layer=16, context=1024),
                ModelConfig(vocab_size=31, d_model=6, n_head=2, n_layer=2, context=5)):
        mask = decay_mask(param_layout(cfg), np.uint8)
        packed, shift = coarse_decay_mask(mask)
        assert np.array_equal(np.repeat(packed, 1 << shift)[: mask.size], mask)
        assert packed.size == -(-mask.size >> shift)  # one entry per granule, the last one partial
    assert coarse_decay_mask(decay_mask(param_layout(ModelConfig(vocab_size=4353, d_model=384, n_head=12, n_layer=6,
                                                                     context=1024)), np.uint8))[1] >= 7


# ------------------------------------------------------------------ optimizer

def test_schedule_against_hand_computed_values():
    oc = OptimConfig(lr=3e-4, min_lr_ratio=0.1, warmup_steps=2000, max_steps=200_000)
    assert math.isclose(lr_at(0, oc), 3e-4 * (0.1 * 1 + 0.9 * 1.0) * (1 / 2000))  # cosine at 1.0
    # step 999: warm-up factor (999 + 1) / 2000 = 0.5; cos(π·999/200000) = cos(0.0156923) = 0.99987688,
    # so 0.5 × (3e-5 + 1.35e-4 × 1.99987688) = 0.5 × 2.9998338e-4
    assert math.isclose(lr_at(999, oc), 1.4999169e-4, rel_tol=1e-7)
    assert math.isclose(lr_at(100_000, oc), 3e-5 + 0.5 * 2.7e-4)  # halfway down the cosine
    assert math.isclose(lr_at(200_000, oc), 3e-5) and math.isclose(lr_at(300_000, oc), 3e-5)


def test_adamw_against_hand_computed_values():
    w = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    g = np.array([0.1, 0.2, -0.3], dtype=np.float32)
    m, v = np.zeros(3, np.float32), np.zeros(3, np.float32)
    decay = np.array([1, 1, 0], dtype=np.float32)  # third: a LayerNorm parameter
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-8, 0.1
    for step in (1, 2):
        nb.adamw(w, g, m, v, decay, lr, b1, b2, eps, wd, step)
    # by hand, in float64
    W = np.array([1.0, -2.0, 0.5])
    G = np.array([0.1, 0.2, -0.3])
    Mm, Vv = np.zeros(3), np.zeros(3)
    for t in (1, 2):
        Mm = b1 * Mm + (1 - b1) * G
        Vv = b2 * Vv + (1 - b2) * G * G
        W = W - lr * wd * np.array([1, 1, 0]) * W
        W = W - lr * (Mm / (1 - b1**t)) / (np.sqrt(Vv / (1 - b2**t)) + eps)
    assert np.allclose(w, W, rtol=1e-6) and np.allclose(m, Mm, rtol=1e-6) and np.allclose(v, Vv, rtol=1e-6)


def make_engine(dtype="float64", B=2, seed=0):
    return Engine(TINY, batch_size=B, seq_len=6, dtype=dtype, seed=seed)


def batch(B, seed):
    x = np.random.default_rng(seed).integers(0, TINY.vocab_size, (B, 7))
    return x[:, :-1], x[:, 1:]


def test_global_clipping_keeps_relative_magnitudes_and_runs_before_adam():
    e = make_engine()
    inputs, targets = batch(2, 0)
    e.forward(inputs, targets)
    e.backward()
    raw = e.g.copy()
    norm = e.grad_norm()
    assert math.isclose(norm, float(np.linalg.norm(raw)), rel_tol=1e-12)
    oc = OptimConfig(lr=1e-3, warmup_steps=1, grad_clip=norm / 10)  # force clipping
    e2 = make_engine()
    res = train_step(e2, [(inputs, targets)], 0, oc)
    assert res.clipped and math.isclose(res.grad_norm, norm, rel_tol=1e-12)
    # m after one step is (1 − β1)·g with g the *clipped* gradient: clipping came first,
    # and every tensor was scaled by the same factor
    clipped = raw * (oc.grad_clip / norm)
    assert np.allclose(e2.m, (1 - oc.beta1) * clipped, rtol=1e-10, atol=1e-15)
    assert np.allclose(e2.v, (1 - oc.beta2) * clipped**2, rtol=1e-10, atol=1e-20)
    assert math.isclose(float(np.linalg.norm(clipped)), oc.grad_clip, rel_tol=1e-12)


def test_micro_batches_equal_one_larger_batch():
    oc = OptimConfig(lr=1e-3, warmup_steps=1)
    inputs, targets = batch(6, 7)
    big = Engine(TINY, batch_size=6, seq_len=6, dtype="float64")
    small = Engine(TINY, batch_size=2, seq_len=6, dtype="float64")
    rb = train_step(big, [(inputs, targets)], 0, oc)
    rs = train_step(small, [(inputs[i : i + 2], targets[i : i + 2]) for i in (0, 2, 4)], 0, oc)
    assert math.isclose(rb.loss, rs.loss, rel_tol=1e-12) and math.isclose(rb.grad_norm, rs.grad_norm, rel_tol=1e-10)
    assert np.allclose(rb.row_losses, rs.row_losses, rtol=1e-12)
    assert np.allclose(big.w, small.w, rtol=1e-10, atol=1e-14)


def test_same_seed_same_bytes():
    oc = OptimConfig(lr=1e-3, warmup_steps=2)
    runs = []
    for _ in range(2):
        e = make_engine("float32", seed=5)
        for step in range(3):
            train_step(e, [batch(2, step)], step, oc)
        runs.append((e.w.tobytes(), e.m.tobytes(), e.v.tobytes()))
    assert runs[0] == runs[1]
    assert make_engine("float32", seed=6).w.tobytes() != make_engine("float32", seed=5).w.tobytes()


def test_non_finite_steps_are_skipped_counted_and_halt():
    oc = OptimConfig(lr=1e-3, warmup_steps=1, max_nonfinite=3)
    e = make_engine("float32")
    counter = NonFiniteCounter()
    good = batch(2, 0)
    train_step(e, [good], 0, oc, counter)
    before = (e.w.copy(), e.m.copy(), e.v.copy())
    e.P["lnf.g"][0] = np.nan  # poisons the loss
    nan_w = e.w.copy()
    for step in (1, 2):
        res = train_step(e, [good], step, oc, counter)
        assert res.skipped and not math.isfinite(res.loss)
    assert np.array_equal(e.m, before[1]) and np.array_equal(e.v, before[2])  # untouched
    assert np.array_equal(e.w, nan_w, equal_nan=True)
    with pytest.raises(NonFiniteHalt, match="3 consecutive"):
        train_step(e, [good], 3, oc, counter)
    assert counter.total == 3 and counter.steps == [1, 2, 3]


def test_steps_read_one_behind_equal_steps_read_at_once():
    """StepsInFlight, the loop the benchmarks share with the trainer's order: each push returns the
    step before's result (one engine reads ahead), drain the last; the same losses and weights as
    train_step one by one."""
    from andrea.optim import StepsInFlight, launch_step

    oc = OptimConfig(lr=1e-3, warmup_steps=1)
    a, b = make_engine("float32", seed=4), make_engine("float32", seed=4)
    once = [train_step(a, [batch(2, s)], s, oc).loss for s in range(4)]
    flight = StepsInFlight(b)
    got = [flight.push(launch_step(b, [batch(2, s)], s, oc)) for s in range(4)]
    assert got[0] is None and flight.ahead
    got = [r.loss for r in got[1:]] + [flight.drain().loss]
    assert got == once and a.w.tobytes() == b.w.tobytes() and flight.drain() is None


def test_fp16_loss_scaling_unscales_skips_overflows_and_grows(monkeypatch):
    """The loss-scaling bookkeeping of an fp16 engine, on the NumPy backend: gradients that come
    out multiplied by the scale give the same update as unscaled ones; an overflow skips the step,
    halves the scale and does not count towards the non-finite halt; clean steps grow it back."""
    from andrea.engine.engine import LOSS_SCALE_WINDOW

    oc = OptimConfig(lr=1e-3, warmup_steps=1)
    ref, e = make_engine("float32", seed=3), make_engine("float32", seed=3)
    e.precision = "fp16"
    e.set_loss_scale(8.0)

    def scaled(inputs, targets, reduce=True, on_host=True, zero_grads=False):  # the fp16 GPU path: gradients times the scale
        if zero_grads:
            e.zero_grads()
        e.forward(inputs, targets)
        e.backward(dloss=e.loss_scale)
        return e.row_losses(on_host)

    e.forward_backward = scaled
    r_ref, r_e = train_step(ref, [batch(2, 0)], 0, oc), train_step(e, [batch(2, 0)], 0, oc)
    assert e.w.tobytes() == ref.w.tobytes() and r_e.grad_norm == r_ref.grad_norm  # powers of two: exact
    counter, w = NonFiniteCounter(), e.w.copy()
    monkeypatch.setattr(e.be, "grad_norm_final", lambda partial: math.inf)  # an overflow in the scaled gradients
    res = train_step(e, [batch(2, 1)], 1, oc, counter)
    assert res.skipped and e.loss_scale == 4.0 and counter.total == 0 and np.array_equal(e.w, w)
    monkeypatch.undo()
    e.scale_good_steps = LOSS_SCALE_WINDOW - 1
    train_step(e, [batch(2, 2)], 2, oc)
    assert e.loss_scale == 8.0 and e.scale_good_steps == 0


def test_bad_batches_are_refused():
    e = make_engine()
    with pytest.raises(ValueError, match="batch must be"):
        e.forward(np.zeros((3, 6), int), np.zeros((3, 6), int))
    with pytest.raises(ValueError, match="token IDs"):
        e.forward(np.full((2, 6), 99), np.zeros((2, 6), int))


def test_memory_plan_counts_every_buffer():
    e = Engine(ModelConfig.from_config(load_config(REPO / "config" / "config.yaml")["models"]["ANDREA-tiny"]), batch_size=2, seq_len=32)
    plan = e.memory_plan()
    assert plan.parameters == 5 * 4 * e.n_params  # w, g, m, v and the decay mask, float32
    # what the forward pass keeps, counted from the model (SPEC §3.2), in float32 elements
    c, B, T = e.cfg, 2, 32
    L, d, H, V = c.n_layer, c.d_model, c.n_head, c.vocab_size
    N = B * T
    per_layer = N * d * (1 + 3 + 1 + 1) + N * 4 * d * 2 + N * 4 + B * H * T  # ln1, q/k/v, att_y, ln2; h, gelu(h); 4 LN stats; lse
    saved = (2 * L + 1) * N * d + L * per_layer + N * d + 2 * N + N * V + N  # residuals, blocks, LN_f (+ stats), probs, losses
    assert plan.activations == 4 * saved + 2 * 8 * N  # and the token and target IDs, int64
    norm_blocks = -(-e.n_params // (1 << 16))
    # d_res, d_ln, dq/dk/dv; fp64 partial sums. The forward's branch and the backward's d_y live at
    # the tail of the probabilities (dead while the layers run), and the branch's gradient is the
    # residual stream's (both fp32 here): no memory of their own
    assert {"branch", "d_y", "d_branch"} <= e.A.aliased
    assert e.A.scratch["d_branch"] is e.A.scratch["d_res"]
    assert plan.scratch == 4 * (2 * N * d + 3 * N * d) + 8 * norm_blocks
    assert "memory plan" in plan.describe()


def test_every_backend_implements_the_interface_with_its_signatures():
    """The engine calls the interface's methods with the interface's arguments: a backend whose
    method takes other arguments would only fail deep inside a pass."""
    import inspect

    from andrea.engine.backend import Backend
    from andrea.engine.engine import BACKENDS, load_backend

    for name in BACKENDS:
        try:
            cls = load_backend(name)
        except RuntimeError:  # CuPy is not installed here (the GPU tests cover it on the device)
            continue
        assert not inspect.isabstract(cls), f"{name}: {sorted(cls.__abstractmethods__)} not implemented"
        for method in Backend.__abstractmethods__:
            want = [p for p in inspect.signature(getattr(Backend, method)).parameters if p != "self"]
            got = [p for p in inspect.signature(getattr(cls, method)).parameters if p != "self"]
            assert got[: len(want)] == want, f"{name}.{method}{got} differs from the interface's {want}"


def test_a_forward_only_pass_over_reused_buffers_equals_the_training_forward():
    """Generation's buffers (one set for all layers, two residual buffers) give the training
    forward's loss, byte for byte on the same backend."""
    from andrea import model as gpt
    from andrea.engine.activations import Activations

    e = make_engine("float32", seed=5)
    x, y = batch(2, 0)
    loss = e.forward(x, y)
    A = Activations(e.cfg, e.B, e.T, e.be, saved=False, backward=False)
    A.saved["probs"], A.saved["losses"] = np.zeros_like(e.acts["probs"]), np.zeros_like(e.acts["losses"])
    assert gpt.forward(e.cfg, e.be, e.W, A, e.tokens, e.targets) == loss


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("bucket_mb", [0, 0.001, 0.02, 25])
def test_gradient_buckets_reduce_every_gradient_once_and_only_when_final(tied, bucket_mb):
    """With several ranks each gradient is averaged exactly once, after the backward pass has
    finished it: block l's stretch (and the last block's with LN_f and an untied head) no sooner
    than after block l, the embeddings' after them."""
    cfg = ModelConfig(vocab_size=40, d_model=16, n_head=2, n_layer=3, context=8, tied_head=tied)
    e = Engine(cfg, batch_size=1, seq_len=8, reduce_bucket_mb=bucket_mb)
    covered = np.zeros(e.n_params, int)
    for lo, hi in e.buckets.values():
        covered[lo:hi] += 1
    assert (covered == 1).all()
    offset = {p.name: p.offset for p in e.layout}
    for l, (lo, hi) in e.buckets.items():
        # nothing below the first parameter of the block just finished (or of block 0 … for -1: anything)
        assert l == -1 or lo >= offset[f"h{l}.ln1.g"], (l, lo, hi)
    # a block here holds ~13 KB: 1 KB buckets send each block alone, 20 KB ones pair them, 25 MB: one at the end
    assert -1 in e.buckets and len(e.buckets) == {0: 1, 0.001: 4, 0.02: 2, 25: 1}[bucket_mb]
