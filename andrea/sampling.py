"""Text generation from the engine's weights (used by the trainer's coherence gate).

Each new token runs a full forward pass over the last `T` tokens of a B=1 inference engine and
samples from the next-token distribution at the last real position (causal attention makes the
padding after it irrelevant). Simple and exact; incremental decoding with a key/value cache is
the audit issue's work.
"""

from __future__ import annotations

import numpy as np

from andrea.engine import Engine
from andrea.model import ModelConfig
from andrea.tokenizer import BOS


class Sampler:
    def __init__(self, cfg: ModelConfig, seq_len: int, backend: str = "numpy"):
        self.engine = Engine(cfg, batch_size=1, seq_len=seq_len, backend=backend)
        self.T = seq_len
        self._targets = np.zeros((1, seq_len), dtype=np.int64)

    def generate(self, weights, prompt_ids, n_tokens: int, rng: np.random.Generator, temperature: float = 0.8,
                 top_k: int | None = 40, stop_at_bos: bool = True) -> list[int]:
        """Up to n_tokens new token IDs after `prompt_ids` (which should start with BOS)."""
        self.engine.w[:] = weights
        seq = list(prompt_ids)[-self.T :]
        out: list[int] = []
        buf = np.zeros((1, self.T), dtype=np.int64)
        for _ in range(n_tokens):
            window = seq[-self.T :]
            buf[0, : len(window)] = window
            buf[0, len(window) :] = 0
            self.engine.forward(buf, self._targets)
            p = self.engine.acts["probs"][0, len(window) - 1].astype(np.float64)
            if temperature != 1.0:
                p = np.exp(np.log(np.maximum(p, 1e-30)) / temperature)
            if top_k:
                cut = np.partition(p, -top_k)[-top_k]
                p[p < cut] = 0.0
            p /= p.sum()
            nxt = int(rng.choice(p.size, p=p))
            if stop_at_bos and nxt == BOS:
                break
            out.append(nxt)
            seq.append(nxt)
        return out
