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
from andrea.sampling import InferenceModel, generate_rows  # noqa: E402
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
