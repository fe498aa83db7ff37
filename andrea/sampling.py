"""Text generation from a checkpoint: incremental decoding with a key/value cache.

The prompt is run once (prefill) and every new token costs one position's work: its keys and
values are appended to a per-layer cache and its query attends over the cache. The arithmetic is
the NumPy backend's (andrea/engine/numpy_backend.py), so cached decoding gives the same logits
as a full forward pass (tests/test_sampling.py). Sampling: temperature, top-k, top-p, a seeded
generator, stop at BOS or a length. When the context is full the cache is rebuilt from the last
half of it (decision: positions are learned, so a window cannot simply slide).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from andrea.checkpoint import read_weights
from andrea.engine import numpy_backend as nb
from andrea.model import LN_EPS, ModelConfig, n_params, param_layout, views
from andrea.tokenizer import BOS, HarrisTokenizer


class InferenceModel:
    def __init__(self, cfg: ModelConfig, weights: np.ndarray):
        if weights.size != n_params(cfg):
            raise ValueError(f"{weights.size:,} weights for a model of {n_params(cfg):,} parameters")
        self.cfg = cfg
        self.P = views(np.asarray(weights, dtype=np.float32), param_layout(cfg))
        L, H, T, D = cfg.n_layer, cfg.n_head, cfg.context, cfg.head_dim
        self.k = np.zeros((L, H, T, D), dtype=np.float32)
        self.v = np.zeros((L, H, T, D), dtype=np.float32)
        self.pos = 0

    def reset(self) -> None:
        self.pos = 0

    def _ln(self, x, g, b):
        out = np.empty_like(x)
        nb.layernorm_fwd(x, g, b, out, np.empty(x.shape[:-1], x.dtype), np.empty(x.shape[:-1], x.dtype), LN_EPS)
        return out

    def forward(self, ids) -> np.ndarray:
        """Logits [n, V] of `ids` placed after what is cached (which grows by n)."""
        cfg, P = self.cfg, self.P
        ids = np.asarray(ids, dtype=np.int64)
        n, s = len(ids), self.pos
        if s + n > cfg.context:
            raise ValueError(f"{s + n} positions exceed the context of {cfg.context}")
        H, D = cfg.n_head, cfg.head_dim
        x = P["wte"][ids] + P["wpe"][s : s + n]  # [n, d]
        mask = np.triu(np.full((n, s + n), -np.inf, dtype=np.float32), s + 1)  # new query i sees ≤ s+i
        for l in range(cfg.n_layer):
            p = lambda name: P[f"h{l}.{name}"]  # noqa: E731
            h = self._ln(x, p("ln1.g"), p("ln1.b"))
            q = (h @ p("wq")).reshape(n, H, D).transpose(1, 0, 2)
            self.k[l, :, s : s + n] = (h @ p("wk")).reshape(n, H, D).transpose(1, 0, 2)
            self.v[l, :, s : s + n] = (h @ p("wv")).reshape(n, H, D).transpose(1, 0, 2)
            K, V = self.k[l, :, : s + n], self.v[l, :, : s + n]
            att = q @ K.transpose(0, 2, 1) / math.sqrt(D) + mask
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            x = x + (att @ V).transpose(1, 0, 2).reshape(n, H * D) @ p("wo")
            h = self._ln(x, p("ln2.g"), p("ln2.b")) @ p("w1")
            a = np.empty_like(h)
            nb.gelu(h, a)
            x = x + a @ p("w2")
        self.pos = s + n
        head = P["wte"] if cfg.tied_head else P["head"]
        return self._ln(x, P["lnf.g"], P["lnf.b"]) @ head.T


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


def load_model(ckpt: str | Path) -> LoadedModel:
    """A checkpoint directory (results/<model>/ckpt, with run.json) or a .bin inside one."""
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
    return LoadedModel(cfg, InferenceModel(cfg, ck.weights), ck.weights, tok, ck.step, meta)
