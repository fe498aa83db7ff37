"""One training step on the CPU: ANDREA's NumPy engine vs PyTorch eager, same architecture.

Both run the full step — forward, backward, global-norm clipping, AdamW — in float32 on the same
batch shape, in the same process, with the same number of threads. PyTorch is a benchmark-only
dependency (`pip install torch`).

    python bench/engine_cpu.py                      # ANDREA-tiny and ANDREA-12M, B=8, T=256
    python bench/engine_cpu.py --models ANDREA-tiny --steps 5
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from andrea.config import load_config  # noqa: E402
from andrea.engine import Engine  # noqa: E402
from andrea.model import ModelConfig, n_params  # noqa: E402
from andrea.optim import OptimConfig, train_step  # noqa: E402


def torch_model(cfg: ModelConfig):
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
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            logits = self.lnf(x) @ self.wte.weight.T
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT()


def time_steps(step_fn, steps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        step_fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step_fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["ANDREA-tiny", "ANDREA-12M"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()

    import torch

    cfg_all = load_config(REPO / "config" / "config.yaml")
    rows = []
    for name in args.models:
        cfg = ModelConfig.from_config(cfg_all["models"][name])
        B, T = args.batch, min(args.seq, cfg.context)
        rng = np.random.default_rng(0)
        x = rng.integers(0, cfg.vocab_size, (B, T + 1))
        inputs, targets = x[:, :-1], x[:, 1:]
        oc = OptimConfig(lr=3e-4, warmup_steps=1)

        engine = Engine(cfg, batch_size=B, seq_len=T)
        step = [0]

        def ours():
            train_step(engine, [(inputs, targets)], step[0], oc)
            step[0] += 1

        t_ours = time_steps(ours, args.steps)

        torch.manual_seed(0)
        model = torch_model(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
        ti, tt = torch.from_numpy(np.ascontiguousarray(inputs)), torch.from_numpy(np.ascontiguousarray(targets))

        def theirs():
            opt.zero_grad(set_to_none=True)
            loss = model(ti, tt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        t_torch = time_steps(theirs, args.steps)
        rows.append((name, n_params(cfg), B, T, t_ours, t_torch))
        print(f"{name}: ours {t_ours * 1e3:.1f} ms/step, PyTorch eager {t_torch * 1e3:.1f} ms/step, "
              f"ratio {t_ours / t_torch:.2f}", flush=True)

    print()
    print("| model | params | B×T | NumPy engine (ms/step) | PyTorch eager (ms/step) | ours / PyTorch |")
    print("|---|---|---|---|---|---|")
    for name, n, B, T, a, b in rows:
        print(f"| {name} | {n:,} | {B}×{T} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.2f} |")
    print()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
          f"NumPy {np.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
