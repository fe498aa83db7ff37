"""Every matrix product of an ANDREA-120M training step, timed alone through the backend's cuBLAS
wrappers (andrea.engine.cupy.CupyBackend.gemm and bgemm, bf16 operands, fp32 accumulation), with its
TFLOP/s against the tensor-core rate: where a step's GEMM time goes, and what the head's padding
to a multiple of 64 rows buys.

    python3 bench/gpu_kernels.py                # B = 8 and 32
    python3 bench/gpu_kernels.py --batch 8

Our own CUDA kernels (attention included) are checked and timed by dev/cuda (python3 dev/cuda/run_all.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from gpu_timing import mean_ms  # noqa: E402 (bench/, the script's folder)


def timed(cp, fn, reps=20):
    """Seconds per call of fn (gpu_timing.mean_ms)."""
    return mean_ms(fn, reps) / 1e3


def gemm_table(gb, cp, B, cfg_name, d, M, V, reps=20):
    """Every matrix product of one ANDREA training step at these sizes, timed alone (bf16 operands)."""
    from andrea.engine.cupy import BF16, VOCAB_PAD

    N, bf = B * 1024, BF16
    Vp = -(-V // VOCAB_PAD) * VOCAB_PAD
    z = lambda *s, dt=bf: cp.zeros(s, dt)  # noqa: E731
    x, w, wd = z(N, d), z(d, d), z(3 * d, d)
    h, w1, w2, wte, wtep = z(N, M), z(d, M), z(M, d), z(V, d), z(Vp, d)
    logits = z(N, Vp)
    f32 = lambda *s: z(*s, dt=cp.float32)  # noqa: E731
    qkv = z(N, 3 * d)
    cases = [  # name, count per step, flops, call
        ("qkv fwd (batched ×3)", 1, 2 * N * d * 3 * d, lambda: gb.bgemm(x, wd, qkv, N, d, d, d, d, 3 * d, 0, d * d, d, 3)),
        ("attn out fwd", 1, 2 * N * d * d, lambda: gb.gemm(x, w, OUT["nd"])),
        ("mlp up fwd (bf16 out)", 1, 2 * N * d * M, lambda: gb.gemm(x, w1, h)),
        ("mlp down fwd", 1, 2 * N * M * d, lambda: gb.gemm(h, w2, OUT["nd"])),
        ("logits, V unpadded (bf16 out)", 0, 2 * N * d * V, lambda: gb.gemm(x, wte, logits[:, :V], tb=True)),
        ("logits dx, V unpadded", 0, 2 * N * d * V, lambda: gb.gemm(logits[:, :V], wte, OUT["nd"], alpha=0.5)),
        ("logits, head padded to Vp (what runs)", 1 / 12, 2 * N * d * V, lambda: gb.gemm(x, wtep, logits, tb=True)),
        ("logits dx, K padded to Vp (what runs)", 1 / 12, 2 * N * d * V, lambda: gb.gemm(logits, wtep, OUT["nd"], alpha=0.5)),
        ("logits dW (+=)", 1 / 12, 2 * N * d * V, lambda: gb.gemm(logits[:, :V], x, OUT["vd"], ta=True, accumulate=True)),
        ("mlp dW2 (+=)", 1, 2 * N * M * d, lambda: gb.gemm(h, x, OUT["md"], ta=True, accumulate=True)),
        ("mlp da (bf16 out)", 1, 2 * N * M * d, lambda: gb.gemm(x, w2, h, tb=True)),
        ("mlp dW1 (+=)", 1, 2 * N * M * d, lambda: gb.gemm(x, h, OUT["dm"], ta=True, accumulate=True)),
        ("mlp dx", 1, 2 * N * M * d, lambda: gb.gemm(h, w1, OUT["nd"], tb=True)),
        ("qkv dx (3 × +=)", 3, 2 * N * d * d, lambda: gb.gemm(qkv[:, :d], w, OUT["nd"], tb=True, accumulate=True)),
        ("qkv dW (batched ×3, +=)", 1, 2 * N * d * 3 * d, lambda: gb.bgemm(x, qkv, OUT["dd3"], d, d, N, d, 3 * d, d, 0, d, d * d, 3, ta=True, accumulate=True)),
        ("attn out dy (bf16 out)", 1, 2 * N * d * d, lambda: gb.gemm(x, w, x, tb=True)),
        ("attn out dW (+=)", 1, 2 * N * d * d, lambda: gb.gemm(x, x, OUT["dd"], ta=True, accumulate=True)),
    ]
    OUT.update(nd=f32(N, d), vd=f32(V, d), md=f32(M, d), dm=f32(d, M), dd=f32(d, d), dd3=f32(3, d, d))
    total = 0.0
    print(f"\nmatrix products of one {cfg_name} B={B} step, each timed alone")
    print("| product | ms | TFLOP/s | per layer |")
    print("|---|---|---|---|")
    for name, count, flops, call in cases:
        t = timed(cp, call, reps)
        total += t * count
        print(f"| {name} | {t * 1e3:.3f} | {flops / t / 1e12:.0f} | {count:g} |")
    return total


OUT: dict = {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32], help="batch sizes (default 8 32)")
    args = ap.parse_args()
    import cupy as cp

    from andrea.engine.cupy import CupyBackend

    gb = CupyBackend("bf16")
    for B in args.batch:
        per_layer = gemm_table(gb, cp, B, "ANDREA-120M", 768, 3072, 8449)
        print(f"sum per layer (logits spread over 12 layers): {per_layer * 1e3:.3f} ms; x 12 layers = {per_layer * 12e3:.2f} ms")


if __name__ == "__main__":
    main()
