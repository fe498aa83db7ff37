import numpy as np
import pytest

from andrea.engine import Engine
from andrea.model import ModelConfig, init_weights
from andrea.sampling import InferenceModel, chat_prompt, generate, sample_next

CFG = ModelConfig(vocab_size=60, d_model=16, n_head=4, n_layer=2, context=24)


@pytest.mark.parametrize("tied", [True, False])
def test_cached_decoding_gives_the_full_forward_logits(tied):
    cfg = ModelConfig(**{**CFG.__dict__, "tied_head": tied})
    w = init_weights(cfg, seed=2) * 8  # sharper distributions than the init's
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 24)
    eng = Engine(cfg, batch_size=1, seq_len=24, seed=2)
    eng.w[:] = w
    eng.forward(ids[None], np.zeros((1, 24), dtype=np.int64))
    full = eng.acts["probs"][0]
    m = InferenceModel(cfg, w)
    logits = [m.forward(ids[:5])]  # prefill, then one token at a time
    logits += [m.forward([t]) for t in ids[5:]]
    logits = np.concatenate(logits)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    assert np.abs(probs - full).max() < 1e-5
    with pytest.raises(ValueError, match="exceed the context"):
        m.forward([1])


def test_sampler_over_an_engines_weights_reads_them_in_place():
    """The trainer samples from its engine's own weight buffer (no copy per sample): the sampler
    sees each optimizer update, and generating never writes the weights."""
    eng = Engine(CFG, batch_size=1, seq_len=8, seed=4)
    m = InferenceModel(CFG, eng.w)
    before = m.forward([3, 4, 5]).copy()
    w0 = eng.w.copy()
    generate(m, [3, 4, 5], 30, np.random.default_rng(0), stop_at_bos=False)
    assert np.array_equal(eng.w, w0)
    eng.w *= 1.5  # an update of the engine's weights, in place
    m.reset()
    assert not np.allclose(m.forward([3, 4, 5]), before)


def test_generation_is_seeded_and_respects_its_limits():
    m = InferenceModel(CFG, init_weights(CFG, seed=1) * 8)
    a = generate(m, [256 % 60, 5, 6], 50, np.random.default_rng(7), stop_at_bos=False)
    b = generate(m, [256 % 60, 5, 6], 50, np.random.default_rng(7), stop_at_bos=False)
    c = generate(m, [256 % 60, 5, 6], 50, np.random.default_rng(8), stop_at_bos=False)
    assert a == b and a != c and len(a) == 50  # longer than the context: the cache was rebuilt


def test_sampling_filters():
    rng = np.random.default_rng(0)
    logits = np.array([5.0, 4.0, 1.0, -3.0])
    assert sample_next(logits, rng, temperature=0) == 0
    assert {sample_next(logits, rng, 1.0, top_k=2, top_p=None) for _ in range(300)} == {0, 1}
    # top_p 0.5: the most likely token alone already reaches it
    assert {sample_next(logits, rng, 1.0, top_k=None, top_p=0.5) for _ in range(100)} == {0}


def test_chat_prompt_uses_the_training_prefixes():
    assert chat_prompt("Why is the sky blue?") == "> Why is the sky blue?\n\n< "
