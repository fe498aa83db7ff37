"""The ANDREA architecture in PyTorch, for the side-by-side benchmarks (bench/engine_cpu.py on
the CPU, bench/gpu_bench.py on a GPU) and the loss-parity replay (bench/loss_parity.py): tied head
(untied: cfg.tied_head False), pre-LayerNorm, no linear biases, tanh GELU, causal
scaled_dot_product_attention. load_flat copies our flat weight buffer (andrea/model.py's layout)
into the module."""

from __future__ import annotations

import numpy as np


def torch_model(cfg):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg.d_model
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.wo = nn.Linear(d, d, bias=False)
            self.w1 = nn.Linear(d, cfg.d_mlp, bias=False)
            self.w2 = nn.Linear(cfg.d_mlp, d, bias=False)

        def forward(self, x):
            B, T, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (t.view(B, T, cfg.n_head, cfg.head_dim).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(y.transpose(1, 2).reshape(B, T, d))
            return x + self.w2(F.gelu(self.w1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.wpe = nn.Embedding(cfg.context, cfg.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.lnf = nn.LayerNorm(cfg.d_model)
            if not cfg.tied_head:
                self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # weight [V, d], as ours

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            head = self.wte.weight if cfg.tied_head else self.head.weight
            logits = self.lnf(x) @ head.T
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT()


def flat_sources(cfg) -> dict[str, tuple[list[str], bool]]:
    """Each torch parameter name → (the names of our parameters it is made of, transposed?).
    Our linear weights are [d_in, d_out] (y = x · W), torch's [d_out, d_in]; q, k and v are one
    torch matrix, our W_Q, W_K, W_V side by side."""
    src = {"wte.weight": (["wte"], False), "wpe.weight": (["wpe"], False)}
    for l in range(cfg.n_layer):
        h, b = f"h{l}.", f"blocks.{l}."
        src.update({
            b + "ln1.weight": ([h + "ln1.g"], False), b + "ln1.bias": ([h + "ln1.b"], False),
            b + "qkv.weight": ([h + "wq", h + "wk", h + "wv"], True),
            b + "wo.weight": ([h + "wo"], True),
            b + "ln2.weight": ([h + "ln2.g"], False), b + "ln2.bias": ([h + "ln2.b"], False),
            b + "w1.weight": ([h + "w1"], True), b + "w2.weight": ([h + "w2"], True),
        })
    src.update({"lnf.weight": (["lnf.g"], False), "lnf.bias": (["lnf.b"], False)})
    if not cfg.tied_head:
        src["head.weight"] = (["head"], False)  # [V, d] both
    return src


def load_flat(model, cfg, flat) -> dict[str, bool]:
    """Copy `flat` (our weight buffer, andrea/model.py's layout) into `model`; returns each torch
    parameter's name → whether AdamW decays it (our layout's decay flag: matrices and embeddings,
    not LayerNorm γ/β)."""
    import torch

    from andrea.model import n_params, param_layout, views

    flat = np.asarray(flat, dtype=np.float32)
    if flat.shape != (n_params(cfg),):
        raise ValueError(f"flat weights have shape {flat.shape}, this model {n_params(cfg):,} parameters")
    layout = param_layout(cfg)
    ours, decays = views(flat, layout), {p.name: p.decay for p in layout}
    sources = flat_sources(cfg)
    params = dict(model.named_parameters())
    if set(params) != set(sources):
        raise ValueError(f"torch parameters and the layout disagree: {sorted(set(params) ^ set(sources))}")
    decay = {}
    with torch.no_grad():
        for name, (names, transpose) in sources.items():
            w = np.concatenate([ours[n] for n in names], axis=1) if len(names) > 1 else ours[names[0]]
            w = w.T if transpose else w
            if tuple(w.shape) != tuple(params[name].shape):
                raise ValueError(f"{name}: torch shape {tuple(params[name].shape)}, ours {w.shape}")
            params[name].copy_(torch.from_numpy(np.ascontiguousarray(w)))
            decay[name] = {decays[n] for n in names}.pop()
    return decay
