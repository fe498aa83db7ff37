"""Generation on the GPU against the NumPy reference (run on the device: `python3 -m pytest
tests/test_sampling_gpu.py`): the 16-bit cached decoding (kernels/decode.cu, the one-token step
replayed as a CUDA graph) gives the fp32 logits to 16-bit rounding, replaying equals running the
step eagerly bit for bit, and the trainer's sampler sees every update of the engine's weights.
Skipped, saying so, without a GPU; CI has none."""

import numpy as np
import pytest

try:
    import cupy as cp

    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
except Exception:  # ImportError, or CUDA without a device
    HAVE_GPU = False

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU with CuPy here (GPU tests run on the device)")]

from andrea.engine import Engine  # noqa: E402
from andrea.model import ModelConfig, init_weights  # noqa: E402
from andrea.engine import make_backend  # noqa: E402
from andrea.engine import numpy_backend as nb  # noqa: E402
from andrea.sampling import InferenceModel, generate, generate_rows  # noqa: E402
from andrea.tokenizer import BOS  # noqa: E402
from test_trainer import shards  # noqa: E402,F401  (fixture)


def config(head_dim: int, tied: bool = True) -> ModelConfig:
    return ModelConfig(vocab_size=300, d_model=2 * head_dim, n_head=2, n_layer=2, context=64, tied_head=tied)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim,tied", [(64, True), (32, False), (16, True), (128, True)])
def test_gpu_decoding_gives_the_fp32_logits_to_16bit_rounding(head_dim, tied, precision):
    """Three rows: a prompt of 7 (the flash kernel over the chunk; the array-module attention at
    head size 128), a chunk of 5 after it (the array-module attention on the 16-bit cache), then 28
    tokens one at a time (the decode kernel, its position on the device, replayed as a graph),
    against NumPy in fp32.
    16-bit rounding alone moves the logits by 1–3 % here in bf16 (weights ×4: larger activations
    than trained ones); its yardstick is the same 16-bit model reading all 40 tokens as one chunk
    (the training attention kernel): one token at a time must not stray further from fp32 than that."""
    cfg = config(head_dim, tied)
    w = init_weights(cfg, seed=3) * 4
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (3, 40))
    chunks = [ids[:, :7], ids[:, 7:12]] + [ids[:, t:t + 1] for t in range(12, 40)]
    ref = InferenceModel(cfg, w, backend="numpy")
    gpu = InferenceModel(cfg, w, backend="cupy", precision=precision)
    assert gpu.graphs and gpu.precision == precision
    ref.reset(rows=3)
    want = ref.forward(ids)
    gpu.reset(rows=3)
    whole = gpu.forward(ids)
    gpu.reset(rows=3)
    stepped = np.concatenate([gpu.forward(c) for c in chunks], axis=1)
    assert stepped.shape == want.shape == (3, 40, cfg.vocab_size) and gpu.pos == 40
    scale = np.abs(want).mean()
    e_whole, e_step = np.abs(whole - want), np.abs(stepped - want)
    assert e_whole.mean() < (0.04 if precision == "bf16" else 0.005) * scale, e_whole.mean() / scale
    assert e_step.mean() < 1.5 * e_whole.mean() + 1e-4 * scale, (e_step.mean(), e_whole.mean())
    assert np.quantile(e_step, 0.999) < 2 * np.quantile(e_whole, 0.999) + 1e-3 * scale
    assert (stepped.argmax(-1) == want.argmax(-1)).mean() > 0.8


def test_replaying_the_captured_step_equals_running_it_eagerly():
    """100 new tokens past a context of 64 (the cache rebuilt once), 3 rows sampled at temperature 1."""
    cfg = config(64)
    w = init_weights(cfg, seed=5) * 4

    def samples(graphs: bool):
        m = InferenceModel(cfg, w, backend="cupy", graphs=graphs)
        rngs = [np.random.default_rng([1, k]) for k in range(3)]
        return generate_rows(m, [1, 2, 3, 4, 5], 100, rngs, temperature=1.0, stop_at_bos=False)

    replayed, eager = samples(True), samples(False)
    assert replayed == eager and all(len(r) == 100 for r in replayed) and len({tuple(r) for r in replayed}) == 3


def test_the_trainers_sampler_sees_each_update_of_the_engines_weights():
    cfg = config(64)
    eng = Engine(cfg, batch_size=1, seq_len=8, backend="cupy", precision="bf16", seed=4)
    m = InferenceModel(cfg, eng.w, backend="cupy")  # bf16, reading eng.w in place
    before = m.forward([3, 4, 5]).copy()
    w0 = eng.w.copy()
    generate_rows(m, [3, 4, 5], 30, [np.random.default_rng(0)], stop_at_bos=False)
    assert bool((eng.w == w0).all())  # generating never writes the weights
    # an update in place of a matrix that only the 16-bit copy feeds to the products: the copy is
    # made again at the next reset, so the logits are those of a new model over the new weights
    eng.P["h0.w1"][...] *= 3
    m.reset()
    after = m.forward([3, 4, 5])
    assert np.array_equal(after, InferenceModel(cfg, eng.w.copy(), backend="cupy").forward([3, 4, 5]))
    assert not np.allclose(after, before, rtol=1e-2, atol=1e-2)


def test_a_prompt_one_short_of_the_context_and_row_counts_that_change():
    """The first token of a prompt of context − 1 is the step's capture (its eager warm-up and its
    capture start from the same position); one model decodes 3 rows, then 1, then 3 again, each
    as a fresh model would."""
    cfg = config(64)
    w = init_weights(cfg, seed=6) * 4
    long = list(np.random.default_rng(2).integers(0, cfg.vocab_size, cfg.context - 1))
    m = InferenceModel(cfg, w, backend="cupy")
    got = generate_rows(m, long, 5, [np.random.default_rng(k) for k in range(2)], stop_at_bos=False)
    eager = InferenceModel(cfg, w, backend="cupy", graphs=False)
    assert got == generate_rows(eager, long, 5, [np.random.default_rng(k) for k in range(2)], stop_at_bos=False)

    def rows(model, n):
        return generate_rows(model, [1, 2, 3], 20, [np.random.default_rng([4, k]) for k in range(n)], stop_at_bos=False)

    shared = InferenceModel(cfg, w, backend="cupy")
    seq = [rows(shared, 3), rows(shared, 1), rows(shared, 3)]
    assert seq == [rows(InferenceModel(cfg, w, backend="cupy"), n) for n in (3, 1, 3)]
    assert seq[0] == seq[2]


def dev_sampling():
    """dev/cuda/sampling.py (its near_boundary: where fp32 exp rounding may decide a pick)."""
    import importlib.util
    import sys
    from pathlib import Path

    dev = Path(__file__).resolve().parents[1] / "dev" / "cuda"
    sys.path.insert(0, str(dev))  # it imports its helpers as `common`
    spec = importlib.util.spec_from_file_location("dev_cuda_sampling", dev / "sampling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 1, None), (0.8, 40, 0.95), (1.0, 1024, None), (0.5, 3, 0.5)])
def test_the_gpu_sampler_picks_the_numpy_references_tokens(temperature, top_k, top_p):
    """kernels/sampling.cu through the backend against numpy_backend.sample_tokens: 64 rows of a
    vocabulary of 8,449 (ANDREA-120M's), logits rounded to bf16 (ties at the k-th), two rows of
    small integers (thousands of ties, ±0 among them: past 1,024 candidates at top-k 1,024), padded
    rows as the backend leaves them. The picks are equal, but where the draw or the top-p limit
    lies within 10⁻⁵ of a running sum (dev/cuda/sampling.py's near_boundary: the last ulp of exp
    decides there). The ring (host memory the kernel writes) and the draw counts are exact."""
    rng = np.random.default_rng(3)
    B, V, R = 64, 8449, 4
    z = rng.standard_normal((B, V)).astype(np.float32) * 3
    bits = z.view(np.uint32)
    z = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)  # rounded to bf16, to nearest even
    z[:2] = np.trunc(z[:2] / 4) * np.where(rng.random((2, V)) < 0.5, -1, 1)
    seeds = rng.integers(0, 2**63, B, dtype=np.uint64)
    draws = rng.integers(0, 500, B).astype(np.int32)
    want, want_draws, want_ring = np.zeros((B, 1), np.int64), draws.copy(), np.full((B, R), -9, np.int32)
    nb.sample_tokens(z, seeds, want_draws, want, want_ring, temperature, top_k, top_p)
    be = make_backend("cupy", "bf16")
    pad = cp.zeros((B, V + 63), cp.float32)
    pad[:, :V] = cp.asarray(z)
    tok, d_draws = cp.zeros((B, 1), cp.int32), cp.asarray(draws)
    ring = be.host_buffer((B, R), np.int32)
    ring[...] = -9
    be.sample_tokens(pad[:, :V], cp.asarray(seeds), d_draws, tok, ring, temperature, top_k, top_p)
    be.wait()
    got = tok.get()[:, 0]
    near = dev_sampling().near_boundary
    differ = [b for b in np.flatnonzero(got != want[:, 0])
              if not near(z[b], temperature, top_k, 1.0 if top_p is None else top_p, int(seeds[b]), int(draws[b]))]
    assert not differ, differ
    assert (got >= 0).all() and np.array_equal(d_draws.get(), want_draws)
    assert np.array_equal(ring[np.arange(B), draws % R], got) and (np.delete(ring.reshape(-1), np.arange(B) * R + draws % R) == -9).all()
    if temperature > 0:  # every pick among the top_k largest logits
        assert (z[np.arange(B), got] >= np.sort(z, axis=1)[:, V - top_k]).all()


def test_gpu_rows_stop_at_bos_as_each_would_alone_and_bad_logits_are_reported():
    """Sampled on the GPU and fed back inside the captured step, the host reading a chunk behind:
    rows decoded together are the samples each generator gives alone (to the rounding of a
    batched product: compared as sets of long common prefixes), stopping at BOS at different steps."""
    cfg = ModelConfig(vocab_size=300, d_model=128, n_head=2, n_layer=2, context=64)
    m = InferenceModel(cfg, init_weights(cfg, seed=5) * 4, backend="cupy")
    m.P["lnf.b"][:] = 3 * m.P["wte"][BOS] / float(np.linalg.norm(m.P["wte"][BOS].get()))
    m.reset()
    rows = generate_rows(m, [1, 5, 6, 7], 60, [np.random.default_rng([9, k]) for k in range(6)], temperature=1.0)
    alone = [generate(m, [1, 5, 6, 7], 60, np.random.default_rng([9, k]), temperature=1.0) for k in range(6)]
    assert sum(r == a for r, a in zip(rows, alone)) >= 5
    assert len({len(r) for r in rows}) > 2 and min(map(len, rows)) < 60 and BOS not in sum(rows, [])
    m.P["lnf.b"][:] = cp.nan
    m.reset()
    with pytest.raises(FloatingPointError, match="generated token 1: the model's logits are not finite"):
        generate(m, [1, 2, 3], 5, np.random.default_rng(0))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_gpu_training_run_samples_in_its_own_precision(shards, tmp_path, precision):  # noqa: F811
    """The trainer's coherence samples on one GPU: fp32 runs generate with the array-module path,
    bf16 runs with the captured step; both write their samples and finish."""
    import json

    from test_trainer import train, write_config

    cfg = write_config(tmp_path / "c.yaml", batch_size=4, max_steps=40, checkpoint_every=20, eval_every=20, sample_every=20,
                       backend="cupy", precision=precision)
    p = train(cfg, shards, tmp_path / "run")
    assert p.returncode == 0, p.stderr[-3000:]
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [20, 40] and all("coherence" in s for s in samples)
