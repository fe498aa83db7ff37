import numpy as np
import pytest

from andrea.engine import Engine
from andrea.model import ModelConfig, init_weights
from andrea.tokenizer import BOS
from andrea.sampling import InferenceModel, chat_prompt, generate, generate_rows, sample_next

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


def test_rows_decoded_together_are_the_samples_each_generator_gives_alone():
    """The audit decodes a prompt's samples together, one cache row each: row k is what
    `generate` gives with generator k, stopping at BOS included, through a cache rebuild."""
    m = InferenceModel(CFG, init_weights(CFG, seed=1) * 8)
    prompt = [1, 5, 6, 7]
    together = generate_rows(m, prompt, 40, [np.random.default_rng([3, k]) for k in range(3)], stop_at_bos=False)
    alone = [generate(m, prompt, 40, np.random.default_rng([3, k]), stop_at_bos=False) for k in range(3)]
    assert together == alone and len(set(map(tuple, together))) == 3 and all(len(r) == 40 for r in together)
    # a vocabulary with BOS, leaning towards it (LN_f's bias along BOS's embedding): rows stop at different steps
    cfg = ModelConfig(**{**CFG.__dict__, "vocab_size": 300})
    stopping = InferenceModel(cfg, init_weights(cfg, seed=5) * 4)
    stopping.P["lnf.b"][:] = 3 * stopping.P["wte"][BOS] / np.linalg.norm(stopping.P["wte"][BOS])
    rows = generate_rows(stopping, prompt, 60, [np.random.default_rng([9, k]) for k in range(4)], temperature=1.0)
    assert rows == [generate(stopping, prompt, 60, np.random.default_rng([9, k]), temperature=1.0) for k in range(4)]
    assert len({len(r) for r in rows}) > 2 and min(map(len, rows)) < 60


def test_rows_share_nothing_but_the_weights():
    m = InferenceModel(CFG, init_weights(CFG, seed=3) * 8)
    ids = np.random.default_rng(1).integers(0, CFG.vocab_size, (3, 9))
    m.reset(rows=3)
    together = np.concatenate([m.forward(ids[:, :4]), m.forward(ids[:, 4:5]), m.forward(ids[:, 5:])], axis=1)
    for k in range(3):
        m.reset()
        assert np.allclose(together[k], m.forward(ids[k]), rtol=1e-5, atol=1e-4)  # one chunk, not 4 + 1 + 4
    with pytest.raises(ValueError, match="2 rows of token IDs for a cache of 1"):
        m.forward(ids[:2])


def test_sampling_filters():
    rng = np.random.default_rng(0)
    logits = np.array([5.0, 4.0, 1.0, -3.0])
    assert sample_next(logits, rng, temperature=0) == 0
    assert {sample_next(logits, rng, 1.0, top_k=2, top_p=None) for _ in range(300)} == {0, 1}
    # top_p 0.5: the most likely token alone already reaches it
    assert {sample_next(logits, rng, 1.0, top_k=None, top_p=0.5) for _ in range(100)} == {0}


def test_chat_prompt_uses_the_training_prefixes():
    assert chat_prompt("Why is the sky blue?") == "> Why is the sky blue?\n\n< "
