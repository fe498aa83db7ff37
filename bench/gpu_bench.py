"""ANDREA's CuPy engine vs PyTorch on one GPU, side by side in one run (issue: GPU backend).

PyTorch runs the same architecture (bf16 autocast + torch.compile + scaled_dot_product_attention,
fused AdamW, global clipping); ours runs the CuPy backend in fp32 and bf16. For each model and
batch size: tokens/s, MFU (llm.c's formula: flops/token = 6·N + 6·L·d·T, against 989 TFLOP/s
bf16), peak GPU memory, and the ratio ours/PyTorch. Prints a Markdown table and writes JSON.

    python3 bench/gpu_bench.py --out results.json
    python3 bench/gpu_bench.py --models ANDREA-12M --batches 8 --steps 5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from andrea.model import ModelConfig, flops_per_token, n_params  # noqa: E402

PEAK = 989e12
MODELS = {  # the config/config.yaml table (read without the config machinery: the device lacks jsonschema)
    "ANDREA-12M": ModelConfig(vocab_size=4353, d_model=384, n_head=12, n_layer=6, context=1024),
    "ANDREA-120M": ModelConfig(vocab_size=8449, d_model=768, n_head=12, n_layer=12, context=1024),
}


def bench_ours(cfg, B, T, precision, steps, warmup):
    """precision: fp32, bf16 (with CUDA graphs) or bf16-eager (kernel by kernel, no graphs)."""
    import cupy as cp

    from andrea.engine import Engine
    from andrea.engine import cupy_backend
    from andrea.optim import OptimConfig, train_step

    cupy_backend.clear_caches()
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    e = Engine(cfg, batch_size=B, seq_len=T, backend="cupy", precision=precision.split("-")[0])
    e.graphs = e.graphs and not precision.endswith("-eager")
    x = np.random.default_rng(0).integers(0, cfg.vocab_size, (B, T + 1))
    batch = [(x[:, :-1], x[:, 1:])]
    oc = OptimConfig(lr=3e-4, warmup_steps=1)
    for s in range(warmup):
        train_step(e, batch, s, oc)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for s in range(steps):
        train_step(e, batch, warmup + s, oc)
    cp.cuda.Device().synchronize()
    dt = (time.perf_counter() - t0) / steps
    plan = e.memory_plan().total
    peak = pool.total_bytes()
    del e
    cupy_backend.clear_caches()
    pool.free_all_blocks()
    return dt, peak, plan


def bench_torch(cfg, B, T, steps, warmup):
    import torch

    from torch_reference import torch_model

    torch.manual_seed(0)
    dev = "cuda"
    model = torch_model(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, fused=True)
    cmodel = torch.compile(model)
    x = torch.randint(0, cfg.vocab_size, (B, T + 1), device=dev)
    inp, tgt = x[:, :-1].contiguous(), x[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = cmodel(inp, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    peak = torch.cuda.max_memory_allocated()
    del model, opt, cmodel
    torch.cuda.empty_cache()
    return dt, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--precisions", nargs="+", default=["bf16", "bf16-eager", "fp32"],
                    help="bf16 (CUDA graphs), bf16-eager (no graphs), fp32")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    rows = []
    for name in args.models:
        cfg = MODELS[name]
        for B in args.batches:
            tokens = B * args.seq
            fpt = flops_per_token(cfg)
            row = {"model": name, "params": n_params(cfg), "B": B, "T": args.seq}
            if not args.no_torch:
                dt, peak = bench_torch(cfg, B, args.seq, args.steps, args.warmup)
                row["torch"] = {"tok_s": tokens / dt, "mfu": fpt * tokens / dt / PEAK, "peak_gib": peak / 2**30, "step_ms": dt * 1e3}
                print(f"{name} B={B} PyTorch: {tokens / dt:,.0f} tok/s, MFU {fpt * tokens / dt / PEAK:.1%}, peak {peak / 2**30:.2f} GiB", flush=True)
            for prec in args.precisions:
                dt, peak, plan = bench_ours(cfg, B, args.seq, prec, args.steps, args.warmup)
                row[f"ours_{prec}"] = {"tok_s": tokens / dt, "mfu": fpt * tokens / dt / PEAK, "peak_gib": peak / 2**30,
                                       "plan_gib": plan / 2**30, "step_ms": dt * 1e3}
                print(f"{name} B={B} ours {prec}: {tokens / dt:,.0f} tok/s, MFU {fpt * tokens / dt / PEAK:.1%}, "
                      f"pool {peak / 2**30:.2f} GiB (plan {plan / 2**30:.2f})", flush=True)
            rows.append(row)

    print()
    print("| model | B×T | PyTorch tok/s (MFU, GiB) | ours bf16 tok/s (MFU, GiB) | bf16 no graphs | fp32 | bf16 / PyTorch |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        t, b, be, f = r.get("torch"), r.get("ours_bf16"), r.get("ours_bf16-eager"), r.get("ours_fp32")
        cell = lambda x: f"{x['tok_s']:,.0f} ({x['mfu']:.1%}, {x['peak_gib']:.2f})" if x else "—"  # noqa: E731
        ratio = f"{b['tok_s'] / t['tok_s']:.2f}" if (t and b) else "—"
        plain = lambda x: f"{x['tok_s']:,.0f}" if x else "—"  # noqa: E731
        print(f"| {r['model']} | {r['B']}×{r['T']} | {cell(t)} | {cell(b)} | {plain(be)} | {plain(f)} | {ratio} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
