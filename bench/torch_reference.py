"""The ANDREA architecture in PyTorch, for the side-by-side benchmarks (bench/engine_cpu.py on
the CPU, bench/gpu_bench.py on a GPU): tied head, pre-LayerNorm, no linear biases, tanh GELU,
causal scaled_dot_product_attention."""

from __future__ import annotations


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

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            logits = self.lnf(x) @ self.wte.weight.T
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT()
