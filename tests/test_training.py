"""A tiny model learns from the embedded corpus's own tokens on the NumPy backend."""

import numpy as np

from andrea.engine import Engine
from andrea.model import ModelConfig
from andrea.optim import OptimConfig, train_step
from andrea.shards import Shard, encode_shards
from andrea.tokenizer import train_tokenizer
from andrea.versions import enabled_sources


def test_tiny_model_loss_falls_on_embedded_tokens(embedded_megachat, tmp_path):
    cfg, megachat = embedded_megachat
    train_tokenizer(megachat, tmp_path / "tok", 256, cfg, "v")
    encode_shards(megachat, tmp_path / "tok" / "harris_segments.json", tmp_path / "shards", enabled_sources(cfg), cfg["megachat"], "v")
    shard = Shard(tmp_path / "shards", "gutenberg")
    model = ModelConfig(vocab_size=256 + 256 + 1, d_model=64, n_head=4, n_layer=2, context=64)
    B, T = 8, 64
    engine = Engine(model, batch_size=B, seq_len=T, seed=0)
    oc = OptimConfig(lr=3e-3, warmup_steps=10, max_steps=80, weight_decay=0.1)
    rng = np.random.default_rng(0)
    losses = []
    for step in range(80):
        starts = rng.integers(0, shard.n_tokens - T - 1, B)
        x = np.stack([shard.tokens[s : s + T + 1] for s in starts]).astype(np.int64)
        losses.append(train_step(engine, [(x[:, :-1], x[:, 1:])], step, oc).loss)
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert first > 5.5  # about ln(513) at the start
    assert last < first - 2.0, (first, last)
