"""bench/torch_generate.py, the PyTorch generation baseline: its cached decoding (eager slices and
the static-shape masked step that torch.compile captures on the GPU) gives the logits of a full
causal forward pass, and the logits of our own generation (andrea/sampling.py), so the benchmark
times the same computation on both sides."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
_spec = importlib.util.spec_from_file_location("torch_generate", REPO / "bench" / "torch_generate.py")
tg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tg)

from andrea.model import ModelConfig, init_weights  # noqa: E402
from andrea.sampling import InferenceModel  # noqa: E402

CONTEXT = 16


def _cfg(tied):
    return ModelConfig(vocab_size=50, d_model=32, n_head=2, n_layer=2, context=CONTEXT, tied_head=tied)


def _weights(cfg):
    w = init_weights(cfg, seed=1)
    # Larger than the init's 0.02 so that attention is far from uniform and a wrong mask or position shows.
    return (w * np.where(np.abs(w) < 0.5, 10.0, 1.0)).astype(np.float32)


def _full_logits(dec, ids):
    """Logits [B, n, V] of the whole sequence through torch_reference's own modules."""
    m = dec.model
    x = m.wte(ids) + m.wpe.weight[: ids.shape[1]]
    for b in m.blocks:
        x = b(x)
    return m.lnf(x) @ dec.head.T


def _decode(dec, ids, n_prompt):
    """Prefill ids[:, :n_prompt], then one step per remaining position: logits [B, n - n_prompt + 1, V]."""
    out = [dec.prefill(ids[:, :n_prompt])]
    for t in range(n_prompt, ids.shape[1]):
        out.append(dec.step(ids[:, t]))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_cached_decoding_matches_the_full_forward(tied, static):
    cfg = _cfg(tied)
    dec = tg.TorchDecoder(cfg, _weights(cfg), batch=2, device="cpu", dtype=torch.float32, static=static)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, CONTEXT)))
    with torch.no_grad():
        full = _full_logits(dec, ids)
    for n_prompt in (5, 1):  # a second prefill restarts at position 0 over a cache holding the first run
        got = _decode(dec, ids, n_prompt)
        np.testing.assert_allclose(got.numpy(), full[:, n_prompt - 1 :].numpy(), rtol=1e-5, atol=1e-5)
    assert dec.pos == CONTEXT
    with pytest.raises(ValueError, match="cache is full"):
        dec.step(ids[:, 0])


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_logits_match_our_generation(tied, static):
    cfg = _cfg(tied)
    w = _weights(cfg)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, 12)
    ours = InferenceModel(cfg, w, backend="numpy")
    want = [ours.forward(ids[:4])[-1]] + [ours.forward(ids[t : t + 1])[-1] for t in range(4, 12)]
    dec = tg.TorchDecoder(cfg, w, batch=1, device="cpu", dtype=torch.float32, static=static)
    got = _decode(dec, torch.from_numpy(ids)[None], 4)[0]
    np.testing.assert_allclose(got.numpy(), np.stack(want), rtol=1e-4, atol=1e-4)


def test_timing_reports_greedy_generation():
    cfg = _cfg(True)
    r = tg.generate_tokens_per_s(cfg, _weights(cfg), "cpu", torch.float32, compile=False, prompt_len=4, new_tokens=8,
                                 batch=2, warmup=1, rounds=3)
    assert r["variant"] == "eager" and r["batch"] == 2 and len(r["rounds_s"]) == 3
    assert r["tokens_per_s"] == pytest.approx(8 * 2 / np.median(r["rounds_s"]), rel=1e-3)
    assert r["ms_per_token"] == pytest.approx(np.median(r["rounds_s"]) / 8 * 1e3, rel=1e-3)
    with pytest.raises(ValueError, match="exceed the context"):
        tg.generate_tokens_per_s(cfg, _weights(cfg), "cpu", torch.float32, compile=False, prompt_len=10, new_tokens=7)


def test_bad_prompt_shape_is_refused():
    cfg = _cfg(True)
    dec = tg.TorchDecoder(cfg, _weights(cfg), batch=2)
    with pytest.raises(ValueError, match=r"want \[2, 1..16\]"):
        dec.prefill(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"want \[2\]"):
        dec.step(torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="compile needs"):
        tg.TorchDecoder(cfg, _weights(cfg), compile=True, static=False)


def test_the_compiled_step_is_one_graph(monkeypatch):
    """compile=True as built for the GPU, traced on the CPU by dynamo + AOT autograd (no Inductor,
    no CUDA graphs): one graph for every step, no graph break, no recompile as the position moves,
    and the cache updates it makes in place give the eager logits."""
    cfg = _cfg(False)
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, mode, fullgraph: real_compile(fn, backend="aot_eager", fullgraph=fullgraph))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    dec = tg.TorchDecoder(cfg, _weights(cfg), batch=2, compile=True)
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, cfg.vocab_size, (2, 10)))
    runs = [_decode(dec, ids, 3), _decode(dec, ids, 5)]  # the second restarts over a used cache
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    eager = tg.TorchDecoder(cfg, _weights(cfg), batch=2)
    for got, n_prompt in zip(runs, (3, 5)):
        np.testing.assert_allclose(got.numpy(), _decode(eager, ids, n_prompt).numpy(), rtol=1e-5, atol=1e-5)
