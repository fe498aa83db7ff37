"""The ANDREA model (SPEC §2): a pre-LayerNorm GPT without biases in its linear layers.

    x = wte[tokens] + wpe[positions]
    for each block:  x = x + attn(LN1(x) · [W_Q W_K W_V]) · W_O     causal, scaled by 1/sqrt(head_dim)
                     x = x + gelu(LN2(x) · W_1) · W_2               GELU, tanh approximation
    logits = LN_f(x) · wteᵀ                                         tied head (untied: a config option)
    loss   = mean cross-entropy over all B×T positions

This module is the whole model, top to bottom: its config and vocabulary, its parameter layout
(names, shapes and their order in the one flat buffer each for weights, gradients and Adam's m and
v, which is also the checkpoint layout), its initialisation, and the forward and backward passes,
written once against the backend interface (andrea/engine/backend.py), one kernel pair per step.
Where the activations live is the engine's business (andrea/engine/activations.py): the passes
only name them. Training (andrea/engine/engine.py) and generation (andrea/sampling.py, with a KV
cache) both run `forward` below, on any backend. It imports NumPy only: the rest of andrea/ may
import it, and it imports none of theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

LN_EPS = 1e-5  # LayerNorm's guard against dividing by a near-zero deviation (GPT-2's value)
INIT_STD = 0.02  # GPT-2's initial standard deviation of embeddings and linear weights


def vocab_size(model: dict) -> int:
    """256 byte tokens + N Harris segments + 1 BOS (SPEC §2)."""
    return 256 + model["n_segments"] + 1


@dataclass(frozen=True)
class ModelConfig:
    """The model's shape: everything its parameter layout and its passes depend on."""

    vocab_size: int  # V: token IDs 0 … V - 1
    d_model: int  # the residual stream's width
    n_head: int  # attention heads, each of head_dim = d_model / n_head
    n_layer: int  # transformer blocks
    context: int  # T: positions (wpe has one row each)
    mlp_ratio: int = 4  # the MLP's hidden width in multiples of d_model
    tied_head: bool = True  # the output head is wte (fewer parameters; GPT-2's choice)

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
    """One parameter tensor's place in the flat buffers."""

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
    """The length of each flat buffer (weights, gradients, m, v): the end of its last tensor."""
    last = param_layout(cfg)[-1]
    return last.offset + last.size


def views(flat, layout: list[Param]) -> dict:
    """Named views into a flat buffer (NumPy or CuPy): writing a view writes the buffer."""
    return {p.name: flat[p.offset : p.offset + p.size].reshape(p.shape) for p in layout}


def decay_mask(layout: list[Param], dtype=np.float32) -> np.ndarray:
    """1 where AdamW's weight decay applies, else 0, over the flat buffer: matrices and embeddings.
    LayerNorm's γ and β are not decayed (as in nanoGPT): pulling a gain towards 0 shrinks the signal
    rather than regularising the model."""
    mask = np.zeros(layout[-1].offset + layout[-1].size, dtype=dtype)
    for p in layout:
        if p.decay:
            mask[p.offset : p.offset + p.size] = 1
    return mask


def coarse_decay_mask(mask: np.ndarray, max_shift: int = 16) -> tuple[np.ndarray, int]:
    """The weight-decay mask one entry per granule of 2^shift parameters, the coarsest granule on
    which the mask is constant (every parameter tensor of the model starts and ends on a multiple of
    128 or 256): (packed, shift), packed[i >> shift] == mask[i]. At ANDREA-480M a byte per
    parameter is 458 MiB; a byte per granule of 512 (its shift), 0.96 MiB."""
    n = mask.size
    for shift in range(max_shift, 0, -1):
        g = 1 << shift
        padded = np.concatenate([mask, np.repeat(mask[-1:], -n % g)]) if n % g else mask
        blocks = padded.reshape(-1, g)
        if (blocks == blocks[:, :1]).all():
            return np.ascontiguousarray(blocks[:, 0]), shift
    return mask, 0


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


# ----------------------------------------------------------------------------- named parameters


@dataclass
class Block:
    """One transformer block's parameters (or their gradients): views into a flat buffer."""

    ln1_g: object
    ln1_b: object
    wq: object
    wk: object
    wv: object
    wo: object
    ln2_g: object
    ln2_b: object
    w1: object
    w2: object


class Weights:
    """The parameters of a flat buffer (weights or gradients) by name: .wte, .wpe, .blocks[l].wq,
    …, .lnf_g, .lnf_b and .head (wte itself when the head is tied). Writing a view writes the buffer."""

    def __init__(self, cfg: ModelConfig, flat, layout: list[Param] | None = None):
        P = views(flat, layout or param_layout(cfg))
        self.wte, self.wpe = P["wte"], P["wpe"]
        self.blocks = [Block(**{f.name: P[f"h{l}.{f.name.replace('_', '.')}"] for f in fields(Block)})
                       for l in range(cfg.n_layer)]
        self.lnf_g, self.lnf_b = P["lnf.g"], P["lnf.b"]
        self.head = P["wte"] if cfg.tied_head else P["head"]


# ----------------------------------------------------------------------------- forward and backward


def forward(cfg: ModelConfig, be, W: Weights, A, tokens, targets=None, cache=None, last: bool = False):
    """The forward pass over token IDs [B, T] already on the backend, through the buffers A
    (andrea/engine/activations.py Activations).

    Training (`targets`): returns the mean cross-entropy (per-position losses stay in A.saved
    ["losses"]; None while a CUDA graph is captured). Generation (`cache`, a KVCache of the same
    module): the positions follow the cache's, their keys and values are added to it, and the
    logits [B·T, V] come back (with `last`, of each row's last position only: [B, V])."""
    L, H = cfg.n_layer, cfg.n_head
    T = tokens.shape[1]
    pos = cache.pos if cache is not None else 0
    if pos + T > cfg.context:
        raise ValueError(f"{pos + T} positions exceed the context of {cfg.context}")
    if cache is None:
        be.embed_fwd(tokens, W.wte, W.wpe[:T], A.res(0))
    else:
        be.embed_cached_fwd(tokens, W.wte, W.wpe, pos, cache.pos_dev, A.res(0))
    first = A.layer(0)
    be.layernorm_fwd(A.res(0), W.blocks[0].ln1_g, W.blocks[0].ln1_b, first.ln1, first.ln1_mean, first.ln1_rstd, LN_EPS,
                     feeds=("qkv", W.blocks[0].wq))
    for l in range(L):
        w, a = W.blocks[l], A.layer(l)
        # attention: x = x + attn(LN1(x))
        be.attn_qkv_fwd(a.ln1, w.wq, w.wk, w.wv, a.qkv, H)
        if cache is None:
            be.attn_fwd(a.qkv, a.att_y, a.att_lse)
        else:
            be.attn_cached_fwd(a.qkv, cache.k[l], cache.v[l], pos, a.att_y, cache.pos_dev)
        be.attn_out_fwd(a.att_y, w.wo, A.branch)
        be.add_layernorm_fwd(A.res(2 * l), A.branch, A.res(2 * l + 1), w.ln2_g, w.ln2_b, a.ln2, a.ln2_mean, a.ln2_rstd, LN_EPS,
                             feeds=("mlp1", w.w1))
        # MLP: x = x + gelu(LN2(x)·W_1)·W_2, then the next LayerNorm (LN1 of the next block, or LN_f)
        be.mlp_fwd(a.ln2, w.w1, w.w2, a.mlp_h, a.mlp_a, A.branch)
        g, b = (W.blocks[l + 1].ln1_g, W.blocks[l + 1].ln1_b) if l + 1 < L else (W.lnf_g, W.lnf_b)
        feeds = ("qkv", W.blocks[l + 1].wq) if l + 1 < L else None  # LN_f feeds the head
        be.add_layernorm_fwd(A.res(2 * l + 1), A.branch, A.res(2 * l + 2), g, b, *_next_norm(A, l, L), LN_EPS, feeds=feeds)
    if cache is not None:
        cache.pos = pos + T
        be.advance_position(cache.pos_dev, T)
        return be.logits_fwd(A.lnf[:, -1:] if last else A.lnf, W.head)
    return be.loss_fwd(A.lnf, W.head, targets, A.saved["probs"], A.saved["losses"])


def _next_norm(A, l: int, L: int) -> tuple:
    """The buffers of the LayerNorm after block l: LN1 of block l + 1, or LN_f after the last."""
    if l + 1 < L:
        a = A.layer(l + 1)
        return a.ln1, a.ln1_mean, a.ln1_rstd
    return A.lnf, A.lnf_mean, A.lnf_rstd


def backward(cfg: ModelConfig, be, W: Weights, G: Weights, A, tokens, targets, dloss: float = 1.0,
             grads_final=None) -> None:
    """Gradients of the last training forward's mean loss (times dloss), added into G: the pairs
    of `forward` in reverse. Each LayerNorm backward also hands the residual stream's gradient to
    the branch that joined it there (fused). `grads_final(l)`, when given, is called once block
    l's gradients are complete (the last block's with LN_f's and the head's), and
    `grads_final(-1)` after the embeddings': data parallelism reduces each while the rest runs."""
    S = A.scratch
    d_res, d_branch, d_ln = S["d_res"], S["d_branch"], S["d_ln"]
    be.loss_bwd(A.lnf, W.head, targets, A.saved["probs"], d_ln, G.head, dloss)
    d_res[...] = 0
    # each LayerNorm backward hands the branch's gradient to the product whose backward comes next
    # (feeds: a backend may write it in that product's form, as for the forward's LayerNorms)
    L = cfg.n_layer
    be.layernorm_bwd(d_ln, A.res(2 * L), A.lnf_mean, A.lnf_rstd, W.lnf_g, d_res, G.lnf_g, G.lnf_b, branch=d_branch,
                     feeds=("mlp2", W.blocks[L - 1].w2))
    for l in reversed(range(L)):
        w, g, a = W.blocks[l], G.blocks[l], A.layer(l)
        be.mlp_bwd(d_branch, a.ln2, a.mlp_h, a.mlp_a, w.w1, w.w2, d_ln, g.w1, g.w2)
        be.layernorm_bwd(d_ln, A.res(2 * l + 1), a.ln2_mean, a.ln2_rstd, w.ln2_g, d_res, g.ln2_g, g.ln2_b, branch=d_branch,
                         feeds=("out", w.wo))
        be.attn_out_bwd(d_branch, a.att_y, w.wo, S["d_y"], g.wo)
        be.attn_bwd(S["d_y"], a.qkv, a.att_y, a.att_lse, S["d_qkv"])
        be.attn_qkv_bwd(S["d_qkv"], a.ln1, w.wq, w.wk, w.wv, d_ln, g.wq, g.wk, g.wv)
        be.layernorm_bwd(d_ln, A.res(2 * l), a.ln1_mean, a.ln1_rstd, w.ln1_g, d_res, g.ln1_g, g.ln1_b,
                         branch=d_branch if l > 0 else None, feeds=("mlp2", W.blocks[l - 1].w2) if l > 0 else None)
        if grads_final is not None:
            grads_final(l)
    be.embed_bwd(d_res, tokens, G.wte, G.wpe)
    if grads_final is not None:
        grads_final(-1)
