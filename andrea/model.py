"""The ANDREA model (SPEC §2): a pre-LayerNorm GPT without biases in its linear layers.

    x = wte[tokens] + wpe[positions]
    for each block:  x = x + attn(LN1(x) · [W_Q W_K W_V]) · W_O     causal, scaled by 1/sqrt(head_dim)
                     x = x + gelu(LN2(x) · W_1) · W_2               GELU, tanh approximation
    logits = LN_f(x) · wteᵀ                                         tied head (untied: a config option)
    loss   = mean cross-entropy over all B×T positions

This module fixes the parameter layout — names, shapes and their order in the one flat buffer
each for weights, gradients and Adam's m and v, which is also the checkpoint layout — and the
initialisation. The forward and backward passes are in andrea/engine, one kernel pair per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from andrea.config import vocab_size

LN_EPS = 1e-5
INIT_STD = 0.02


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    n_head: int
    n_layer: int
    context: int
    mlp_ratio: int = 4
    tied_head: bool = True

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def d_mlp(self) -> int:
        return self.mlp_ratio * self.d_model

    @classmethod
    def from_config(cls, model: dict) -> "ModelConfig":
        """From a `models:` entry of config/config.yaml (vocab = 256 + n_segments + 1)."""
        return cls(
            vocab_size=vocab_size(model),
            d_model=model["d_model"],
            n_head=model["n_head"],
            n_layer=model["n_layer"],
            context=model["context"],
            mlp_ratio=model.get("mlp_ratio", 4),
            tied_head=model.get("tied_head", True),
        )

    def __post_init__(self):
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_head {self.n_head}")


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    offset: int  # into the flat buffer, in elements
    decay: bool  # AdamW weight decay applies (matrices and embeddings, not LayerNorm)
    init: str  # "normal", "normal_scaled" (W_O, W_2), "ones", "zeros"

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def param_layout(cfg: ModelConfig) -> list[Param]:
    """Every parameter in checkpoint order (SPEC §2): wte, wpe, then per layer
    [LN1.γ, LN1.β, W_Q, W_K, W_V, W_O, LN2.γ, LN2.β, W_1, W_2], then LN_f.γ, LN_f.β, then the
    output head if untied. Linear weights are [d_in, d_out] (y = x · W)."""
    d, V, T, m = cfg.d_model, cfg.vocab_size, cfg.context, cfg.d_mlp
    spec: list[tuple[str, tuple[int, ...], bool, str]] = [("wte", (V, d), True, "normal"), ("wpe", (T, d), True, "normal")]
    for l in range(cfg.n_layer):
        spec += [
            (f"h{l}.ln1.g", (d,), False, "ones"),
            (f"h{l}.ln1.b", (d,), False, "zeros"),
            (f"h{l}.wq", (d, d), True, "normal"),
            (f"h{l}.wk", (d, d), True, "normal"),
            (f"h{l}.wv", (d, d), True, "normal"),
            (f"h{l}.wo", (d, d), True, "normal_scaled"),
            (f"h{l}.ln2.g", (d,), False, "ones"),
            (f"h{l}.ln2.b", (d,), False, "zeros"),
            (f"h{l}.w1", (d, m), True, "normal"),
            (f"h{l}.w2", (m, d), True, "normal_scaled"),
        ]
    spec += [("lnf.g", (d,), False, "ones"), ("lnf.b", (d,), False, "zeros")]
    if not cfg.tied_head:
        spec.append(("head", (V, d), True, "normal"))
    layout, offset = [], 0
    for name, shape, decay, init in spec:
        p = Param(name, shape, offset, decay, init)
        layout.append(p)
        offset += p.size
    return layout


def n_params(cfg: ModelConfig) -> int:
    last = param_layout(cfg)[-1]
    return last.offset + last.size


def views(flat, layout: list[Param]) -> dict:
    """Named views into a flat buffer (NumPy or CuPy): writing a view writes the buffer."""
    return {p.name: flat[p.offset : p.offset + p.size].reshape(p.shape) for p in layout}


def decay_mask(layout: list[Param], dtype=np.float32) -> np.ndarray:
    mask = np.zeros(layout[-1].offset + layout[-1].size, dtype=dtype)
    for p in layout:
        if p.decay:
            mask[p.offset : p.offset + p.size] = 1
    return mask


def init_weights(cfg: ModelConfig, seed: int = 0, dtype=np.float32) -> np.ndarray:
    """The flat weight buffer initialised as SPEC §2: N(0, 0.02) for embeddings and linear
    weights, W_O and W_2 scaled by 1/sqrt(2·layers), γ = 1, β = 0. Drawn in float64 from one
    seeded generator in layout order, then cast, so every backend and precision starts alike."""
    layout = param_layout(cfg)
    rng = np.random.default_rng(seed)
    flat = np.empty(n_params(cfg), dtype=np.float64)
    scaled = INIT_STD / math.sqrt(2 * cfg.n_layer)
    for p in layout:
        seg = flat[p.offset : p.offset + p.size]
        if p.init == "normal":
            seg[:] = rng.normal(0.0, INIT_STD, p.size)
        elif p.init == "normal_scaled":
            seg[:] = rng.normal(0.0, scaled, p.size)
        elif p.init == "ones":
            seg[:] = 1.0
        else:
            seg[:] = 0.0
    return flat.astype(dtype)


def flops_per_token(cfg: ModelConfig) -> int:
    """Training FLOPs per token, llm.c's convention: 6·N + 6·L·d·T."""
    return 6 * n_params(cfg) + 6 * cfg.n_layer * cfg.d_model * cfg.context
