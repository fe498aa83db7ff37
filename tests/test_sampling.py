import numpy as np
import pytest

from andrea.engine import Engine
from andrea.engine import numpy_backend as nb
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


@pytest.mark.parametrize("top_k", [40, None])
def test_tokens_reach_on_tokens_as_they_come(top_k):
    """Each row's tokens arrive in order through on_tokens (a chunk at a time, or one by one on the
    host path), together exactly the returned samples, BOS never among them."""
    cfg = ModelConfig(**{**CFG.__dict__, "vocab_size": 300})
    m = InferenceModel(cfg, init_weights(cfg, seed=5) * 4)
    m.P["lnf.b"][:] = 3 * m.P["wte"][BOS] / np.linalg.norm(m.P["wte"][BOS])
    seen: dict[int, list[int]] = {}
    calls = []

    def got(row, ids):
        seen.setdefault(row, []).extend(ids)
        calls.append(len(ids))

    rows = generate_rows(m, [1, 5, 6, 7], 60, [np.random.default_rng([9, k]) for k in range(4)], temperature=1.0,
                         top_k=top_k, on_tokens=got)
    assert [seen.get(k, []) for k in range(4)] == rows and sum(map(len, rows)) == sum(calls)
    assert all(BOS not in r for r in rows)
    if top_k:  # rows that stopped early (these draws): nothing of theirs reported past BOS
        assert len({len(r) for r in rows}) > 1 and max(calls) > 1
    else:
        assert max(calls) == 1


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


def expected_probabilities(z, temperature, top_k, top_p):
    """What a draw should follow, written plainly in float64: softmax(z / temperature) over the
    top_k largest (ties at the k-th kept), then the smallest most-likely-first prefix reaching top_p."""
    z = np.asarray(z, dtype=np.float64)
    cut = np.sort(z)[::-1][min(top_k, z.size) - 1]
    keep = z >= cut
    p = np.where(keep, np.exp((z - z.max()) / temperature), 0.0)
    p /= p.sum()
    order = np.lexsort((np.arange(z.size), -p))
    before = np.cumsum(p[order]) - p[order]
    p[order[before >= top_p]] = 0.0
    return p / p.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 5, 1.0), (0.7, 40, 0.9), (1.3, 12, 0.5), (0.8, 1000, 0.95)])
def test_the_sampler_draws_from_the_filtered_softmax(temperature, top_k, top_p):
    """4,000 draws (one counter-based generator, draws 0..3999) against the probabilities of a
    direct float64 formulation: no token outside the kept set, and the frequencies within 4.5
    binomial standard deviations (plus 0.002) of their probabilities."""
    z = np.random.default_rng(1).standard_normal(300).astype(np.float32) * 2
    want = expected_probabilities(z, temperature, top_k, top_p)
    n = 4000
    picks = np.array([nb.sample_row(z, False, np.float32(1 / temperature), top_k, top_p, seed=11, draw=d) for d in range(n)])
    assert set(picks.tolist()) <= set(np.flatnonzero(want > 0).tolist())
    freq = np.bincount(picks, minlength=z.size) / n
    assert np.all(np.abs(freq - want) <= 4.5 * np.sqrt(want * (1 - want) / n) + 0.002), np.abs(freq - want).max()


def test_the_sampler_keeps_ties_and_reports_non_finite_logits():
    # bf16-like logits: many exact ties; the 3rd largest value (2.0) is shared by three tokens, all kept
    z = np.array([3.0, 2.0, 1.0, 2.0, 2.5, 2.0, -np.inf], dtype=np.float32)
    picks = {nb.sample_row(z, False, np.float32(1.0), 3, 1.0, seed=5, draw=d) for d in range(2000)}
    assert picks == {0, 1, 3, 4, 5}
    assert nb.sample_row(z, True, np.float32(0), 1, 1.0, seed=5, draw=0) == 0  # greedy: the first largest
    assert nb.sample_row(np.array([1.0, 4.0, 4.0], np.float32), True, np.float32(0), 1, 1.0, 0, 0) == 1
    for bad in (np.nan, np.inf):
        z2 = z.copy()
        z2[2] = bad
        assert nb.sample_row(z2, False, np.float32(1.0), 3, 1.0, seed=5, draw=0) == -1
        assert nb.sample_row(z2, True, np.float32(0), 1, 1.0, seed=5, draw=0) == -1
    # top_p 0.5 with one dominant token: it alone is kept
    assert {nb.sample_row(np.array([5, 4, 1, -3], np.float32), False, np.float32(1), 4, 0.5, 2, d) for d in range(200)} == {0}


def test_the_counter_based_generator_is_uniform_and_reproducible():
    u = np.array([nb.draw_uniform(7, d) for d in range(20000)], dtype=np.float64)
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.003
    assert np.histogram(u, bins=10, range=(0, 1))[0].min() > 1800
    assert nb.draw_uniform(7, 3) == u[3] and nb.draw_uniform(8, 3) != u[3]


def test_sample_tokens_writes_the_token_the_ring_and_counts_draws():
    """Row b's pick goes to ring[b, draw % R] (no other slot) and to tokens[b]; a row with a NaN
    logit picks −1 in the ring and feeds token 0 to the next step (an index the embedding has)."""
    logits = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    logits[2, 7] = np.nan
    tokens, draws, ring = np.zeros((3, 1), np.int64), np.array([0, 5, 17], np.int32), np.full((3, 4), -9, np.int32)
    seeds = np.array([1, 2, 3], np.uint64)
    nb.sample_tokens(logits, seeds, draws, tokens, ring, 0.8, 10, 0.9)
    assert draws.tolist() == [1, 6, 18]
    picks = [nb.sample_row(logits[b], False, np.float32(1 / 0.8), 10, 0.9, int(seeds[b]), d) for b, d in enumerate([0, 5, 17])]
    assert picks[2] == -1 and min(picks[:2]) >= 0
    assert [ring[0, 0], ring[1, 1], ring[2, 1]] == picks and (ring == -9).sum() == 9
    assert tokens[:, 0].tolist() == [*picks[:2], 0]


def reference_generation(m, prompt, max_new, seeds, temperature, top_k, top_p):
    """The host loop the device path replaces: each step's logits to the host, the pick by
    numpy_backend.sample_row with draw d for the d-th token, stop at BOS, and the cache rebuilt
    from the last half when it is full."""
    T, B = m.cfg.context, len(seeds)
    seqs = np.tile(np.asarray(list(prompt)[-T:]), (B, 1))
    m.reset(rows=B)
    logits = m.forward(seqs, last=True)[:, -1]
    outs, done = [[] for _ in range(B)], [False] * B
    greedy, inv = temperature <= 0, np.float32(0 if temperature <= 0 else 1 / temperature)
    for d in range(max_new):
        nxt = np.array([nb.sample_row(logits[k], greedy, inv, top_k, 1.0 if top_p is None else top_p, seeds[k], d)
                        for k in range(B)])
        for k in range(B):
            if not done[k]:
                done[k] = nxt[k] == BOS
                outs[k] += [] if done[k] else [int(nxt[k])]
        if all(done):
            break
        seqs = np.concatenate([seqs, nxt[:, None]], axis=1)
        if m.pos >= T:
            seqs = seqs[:, -(T // 2):]
            m.reset(rows=B)
            logits = m.forward(seqs, last=True)[:, -1]
        else:
            logits = m.forward(nxt[:, None])[:, 0]
    return outs


@pytest.mark.parametrize("setting", [(0.0, 1, None), (1.0, 40, 0.95), (0.9, 3, 0.5)])
@pytest.mark.parametrize("prompt_len,max_new", [(4, 60), (30, 9), (23, 1)])
def test_queued_steps_give_what_the_host_loop_gives(setting, prompt_len, max_new):
    """InferenceModel.sample (steps queued in chunks, the picks fed back, read a chunk behind) is the
    host loop's generation token for token: through cache rebuilds (context 24), a prompt longer
    than the context, one new token, and rows stopping at BOS."""
    cfg = ModelConfig(**{**CFG.__dict__, "vocab_size": 300})
    m = InferenceModel(cfg, init_weights(cfg, seed=5) * 4)
    m.P["lnf.b"][:] = 3 * m.P["wte"][BOS] / np.linalg.norm(m.P["wte"][BOS])
    prompt = np.random.default_rng(prompt_len).integers(0, 300, prompt_len).tolist()
    seeds = [11, 12, 13]
    assert m.sample(prompt, max_new, seeds, *setting) == reference_generation(m, prompt, max_new, seeds, *setting)


def test_generation_stops_with_a_clear_error_on_non_finite_logits():
    m = InferenceModel(CFG, init_weights(CFG, seed=1))
    m.P["lnf.b"][:] = np.nan
    with pytest.raises(FloatingPointError, match="generated token 1: the model's logits are not finite"):
        generate(m, [1, 2, 3], 5, np.random.default_rng(0))


def test_top_k_off_samples_on_the_host():
    """top_k None (or 0) keeps the whole vocabulary: the host path (sample_next), seeded the same way."""
    m = InferenceModel(CFG, init_weights(CFG, seed=1) * 8)
    a = generate(m, [1, 5, 6], 30, np.random.default_rng(4), top_k=None, top_p=0.9, stop_at_bos=False)
    b = generate(m, [1, 5, 6], 30, np.random.default_rng(4), top_k=0, top_p=0.9, stop_at_bos=False)
    assert a == b and len(a) == 30
    with pytest.raises(ValueError, match="takes top_k from 1 to 1024"):
        m.sample([1, 5, 6], 3, [0], temperature=1.0, top_k=None)


def test_chat_prompt_uses_the_training_prefixes():
    assert chat_prompt("Why is the sky blue?") == "> Why is the sky blue?\n\n< "
