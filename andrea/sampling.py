"""Text generation from a checkpoint: incremental decoding with a key/value cache.

The prompt is run once (prefill) and every new token costs one position's work: its keys and
values are appended to a per-layer cache and its query attends over the cache. The pass is the
model's own (andrea/model.py `forward` with a KVCache) on the backend the model is loaded on (the
GPU when there is one), so cached decoding gives the logits of a full forward pass
(tests/test_sampling.py). Sampling: temperature, top-k, top-p, a seeded generator, stop at BOS or
a length. When the context is full the cache is rebuilt from the last half of it (decision:
positions are learned, so a window cannot simply slide).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from andrea import model as gpt
from andrea.checkpoint import read_weights
from andrea.engine import make_backend, resolve_backend
from andrea.model import Activations, KVCache, ModelConfig, Weights, n_params, param_layout, views
from andrea.tokenizer import BOS, HarrisTokenizer


class InferenceModel:
    """A model for generation: fp32 weights on a backend ("numpy", or "cupy" for the GPU), a KV
    cache, and the forward pass of andrea/model.py. Given an array already on the backend (an
    engine's weights) it reads that array in place, so it sees every update and never writes it."""

    def __init__(self, cfg: ModelConfig, weights, backend: str = "numpy"):
        if weights.size != n_params(cfg):
            raise ValueError(f"{weights.size:,} weights for a model of {n_params(cfg):,} parameters")
        self.cfg = cfg
        self.backend = backend
        self.be = make_backend(backend, "fp32")
        self.w = self.be.xp.asarray(weights, dtype=np.float32)  # no copy when it is already there, in fp32
        self.W = Weights(cfg, self.w)
        self.P = views(self.w, param_layout(cfg))
        self.cache = KVCache(cfg, self.be)
        self._acts: dict[int, Activations] = {}

    @property
    def pos(self) -> int:
        return self.cache.pos

    def reset(self) -> None:
        self.cache.pos = 0

    def _activations(self, n: int) -> Activations:
        """Forward-only buffers for n new positions: kept for the one-token step and the last prompt length."""
        if n not in self._acts:
            if len(self._acts) > 1:
                self._acts = {k: v for k, v in self._acts.items() if k == 1}
            self._acts[n] = Activations(self.cfg, 1, n, self.be, saved=False, backward=False)
        return self._acts[n]

    def forward(self, ids) -> np.ndarray:
        """Logits [n, V] (host, fp32) of `ids` placed after what is cached (which grows by n)."""
        ids = np.asarray(ids, dtype=self.be.index_dtype).reshape(1, -1)
        if self.pos + ids.shape[1] > self.cfg.context:
            raise ValueError(f"{self.pos + ids.shape[1]} positions exceed the context of {self.cfg.context}")
        tokens = self.be.xp.asarray(ids)
        return self.be.to_host(gpt.forward(self.cfg, self.be, self.W, self._activations(ids.shape[1]), tokens, cache=self.cache))


def sample_next(logits: np.ndarray, rng: np.random.Generator, temperature: float = 0.8, top_k: int | None = 40,
                top_p: float | None = 0.95) -> int:
    """One token from a logits row: greedy at temperature 0, else temperature, top-k, top-p."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if top_k and top_k < z.size:
        cut = np.partition(z, -top_k)[-top_k]
        z[z < cut] = -np.inf
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        keep = np.cumsum(p[order]) - p[order] < top_p  # the smallest prefix reaching top_p
        p[order[~keep]] = 0.0
        p /= p.sum()
    return int(rng.choice(p.size, p=p))


def generate(model: InferenceModel, prompt_ids, max_new: int, rng: np.random.Generator, temperature: float = 0.8,
             top_k: int | None = 40, top_p: float | None = 0.95, stop_at_bos: bool = True) -> list[int]:
    """Up to max_new token IDs after `prompt_ids` (which should start with BOS)."""
    T = model.cfg.context
    seq = list(prompt_ids)[-T:]
    model.reset()
    logits = model.forward(seq)[-1]
    out: list[int] = []
    for _ in range(max_new):
        nxt = sample_next(logits, rng, temperature, top_k, top_p)
        if stop_at_bos and nxt == BOS:
            break
        out.append(nxt)
        seq.append(nxt)
        if model.pos >= T:  # context full: rebuild the cache from the last half
            seq = seq[-(T // 2) :]
            model.reset()
            logits = model.forward(seq)[-1]
        else:
            logits = model.forward([nxt])[-1]
    return out


def chat_prompt(text: str, mcfg: dict | None = None) -> str:
    """A user turn rendered as in training (SPEC §8), followed by the assistant's prefix."""
    mcfg = mcfg or {}
    return f"{mcfg.get('user_prefix', '> ')}{text.strip()}{mcfg.get('turn_separator', chr(10) * 2)}{mcfg.get('assistant_prefix', '< ')}"


@dataclass
class LoadedModel:
    cfg: ModelConfig
    model: InferenceModel
    weights: np.ndarray  # the flat weights (andrea/model.py layout)
    tokenizer: HarrisTokenizer
    step: int
    meta: dict


def load_model(ckpt: str | Path, backend: str = "auto") -> LoadedModel:
    """A checkpoint directory (results/<model>/ckpt, with run.json) or a .bin inside one, for
    generation on `backend` (auto: the GPU when one is usable, else the CPU)."""
    ckpt = Path(ckpt)
    d = ckpt if ckpt.is_dir() else ckpt.parent
    bin_path = d / "final.bin" if ckpt.is_dir() else ckpt
    meta_path = d / "run.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{meta_path}: missing; give a trained model's ckpt directory (results/<model>/ckpt)")
    meta = json.loads(meta_path.read_text())
    cfg = ModelConfig(**meta["model_config"])
    ck = read_weights(bin_path, expected_n_params=n_params(cfg))
    tok = HarrisTokenizer.load(meta["segments"])
    name, _, _ = resolve_backend(backend, "auto")
    return LoadedModel(cfg, InferenceModel(cfg, ck.weights, backend=name), ck.weights, tok, ck.step, meta)
