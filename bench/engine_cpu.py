"""One training step on the CPU: ANDREA's NumPy engine vs PyTorch eager, same architecture.

Both run the full step — forward, backward, global-norm clipping, AdamW — in float32 on the same
batch shape, in the same process, with the same number of threads. PyTorch is a benchmark-only
dependency (`pip install torch`).

    python bench/engine_cpu.py                      # ANDREA-tiny and ANDREA-12M, B=8, T=256
    python bench/engine_cpu.py --models ANDREA-tiny --steps 5
"""

from __future__ import annotations

import argparse
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
from torch_reference import torch_model  # noqa: E402


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
