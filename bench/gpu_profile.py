"""Where a CuPy-engine training step spends its time: every backend function bracketed by CUDA
events (recorded without synchronising, so the step runs as it would) over a few steps, with its
share of the step. CUDA graphs are off here, so that every function runs as itself.

    python3 bench/gpu_profile.py --model ANDREA-120M --batch 8
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_bench import MODELS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="ANDREA-120M")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    import os

    os.environ["ANDREA_CUDA_GRAPHS"] = "0"  # time every backend function: no graph replay
    import cupy as cp

    from andrea.engine import Engine
    from andrea.optim import OptimConfig, train_step

    cfg = MODELS[args.model]
    e = Engine(cfg, batch_size=args.batch, seq_len=args.seq, backend="cupy", precision=args.precision)
    e.graphs = False
    be = e.be  # the engine's CupyBackend: its methods are timed (instance attributes shadow them)
    x = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq + 1))
    batch = [(x[:, :-1], x[:, 1:])]
    oc = OptimConfig(warmup_steps=1)
    train_step(e, batch, 0, oc)  # compile kernels, warm cuBLAS

    events = []  # (name, start, end), recorded without synchronising: GPU-side durations
    names = [n for n in dir(type(be)) if n.endswith(("_fwd", "_bwd")) or n in ("grad_norm_partial", "grad_norm_final", "grad_scale", "adamw")]
    for n in names:
        fn = getattr(be, n)

        def timed(*a, _fn=fn, _n=n, **k):
            s, t = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            out = _fn(*a, **k)
            t.record()
            events.append((_n, s, t))
            return out

        setattr(be, n, timed)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for s in range(args.steps):
        train_step(e, batch, 1 + s, oc)
    cp.cuda.Device().synchronize()
    wall = (time.perf_counter() - t0) / args.steps * 1e3
    gpu_ms = defaultdict(float)
    for n, s, t in events:
        gpu_ms[n] += cp.cuda.get_elapsed_time(s, t)
    total = sum(gpu_ms.values()) / args.steps
    print(f"{args.model} B={args.batch} T={args.seq} {args.precision}, kernel by kernel (no graph): {wall:.1f} ms/step wall, "
          f"{total:.1f} ms between the events around backend functions")
    print("| function | ms/step | share |")
    print("|---|---|---|")
    for n, ms in sorted(gpu_ms.items(), key=lambda kv: -kv[1]):
        print(f"| {n} | {ms / args.steps:.2f} | {ms / args.steps / total:.1%} |")


if __name__ == "__main__":
    main()
