"""Build, check and time ANDREA's attention kernels on the GPU, llm.c dev/cuda style: every variant
against a float64 NumPy reference, then timed at the shapes of ANDREA-12M and ANDREA-120M, next to
PyTorch's scaled_dot_product_attention (flash) when PyTorch is there; then every matrix product of
an ANDREA-120M step timed alone against the tensor-core rate.

    python3 bench/gpu_kernels.py                # check + time
    python3 bench/gpu_kernels.py --no-gemm      # without the table of matrix products
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def reference(q, k, v, dy):
    """Causal attention and its gradients in float64; q, k, v, dy: [B, H, T, D]."""
    T, D = q.shape[2], q.shape[3]
    scale = 1 / math.sqrt(D)
    s = q @ k.transpose(0, 1, 3, 2) * scale
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    lse = (m + np.log(e.sum(-1, keepdims=True)))[..., 0]
    p = e / e.sum(-1, keepdims=True)
    y = p @ v
    dv = p.transpose(0, 1, 3, 2) @ dy
    dp = dy @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return y, lse, ds @ k * scale, ds.transpose(0, 1, 3, 2) @ q * scale, dv


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check(gb, cp, B, H, T, D, rng):
    bf = gb.half
    qkv = rng.standard_normal((B, T, 3, H, D)).astype(bf)
    dy = rng.standard_normal((B, T, H, D)).astype(bf)
    heads = lambda a: a.astype(np.float64).transpose(0, 2, 1, 3)  # [B, T, H, D] -> [B, H, T, D]  # noqa: E731
    y_r, lse_r, dq_r, dk_r, dv_r = reference(heads(qkv[:, :, 0]), heads(qkv[:, :, 1]), heads(qkv[:, :, 2]), heads(dy))
    g_qkv = cp.asarray(qkv)
    y = cp.zeros((B, T, H * D), bf)
    lse = cp.zeros((B, H, T), cp.float32)
    gb.attn_fwd(g_qkv, y, lse)
    dqkv = cp.zeros_like(g_qkv)
    gb.attn_bwd(cp.asarray(dy.reshape(B, T, H * D)), g_qkv, y, lse, dqkv)
    out = cp.asnumpy(dqkv).astype(np.float64)
    errs = {
        "y": rel(cp.asnumpy(y).astype(np.float64).reshape(B, T, H, D).transpose(0, 2, 1, 3), y_r),
        "lse": rel(cp.asnumpy(lse), lse_r),
        "dq": rel(heads(out[:, :, 0]), dq_r), "dk": rel(heads(out[:, :, 1]), dk_r), "dv": rel(heads(out[:, :, 2]), dv_r),
    }
    # deterministic: the same bytes twice
    dqkv2 = cp.zeros_like(g_qkv)
    gb.attn_bwd(cp.asarray(dy.reshape(B, T, H * D)), g_qkv, y, lse, dqkv2)
    errs["same_bytes"] = bool((dqkv2.view(cp.uint16) == dqkv.view(cp.uint16)).all())
    return errs


def timed(cp, fn, reps=20):
    fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / reps / 1e3


def time_ours(gb, cp, B, H, T, D):
    bf = gb.half
    qkv = cp.asarray(np.random.default_rng(0).standard_normal((B, T, 3, H, D)).astype(bf))
    y = cp.zeros((B, T, H * D), bf)
    lse = cp.zeros((B, H, T), cp.float32)
    dy = cp.asarray(np.random.default_rng(1).standard_normal((B, T, H * D)).astype(bf))
    dqkv = cp.zeros_like(qkv)
    fwd = timed(cp, lambda: gb.attn_fwd(qkv, y, lse))
    bwd = timed(cp, lambda: gb.attn_bwd(dy, qkv, y, lse, dqkv))
    return fwd, bwd


def time_torch(B, H, T, D):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dy = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)

    def run(bwd):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if bwd:
            y.backward(dy)

    out = []
    for bwd in (False, True):
        run(bwd)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            run(bwd)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / 20)
    return out[0], out[1] - out[0]


def gemm_table(gb, cp, B, cfg_name, d, M, V, reps=20):
    """Every matrix product of one ANDREA training step at these sizes, timed alone (bf16 operands)."""
    from andrea.engine.cupy import VOCAB_PAD

    N, bf = B * 1024, gb.half
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
VARIANTS = ("2",)  # the package's flash attention (cp.async); variants 1 and 3 are no longer in it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-gemm", action="store_true", help="skip the table of matrix products")
    ap.add_argument("--once", action="store_true", help="one forward and backward at the ANDREA-120M B=8 shape, "
                    "nothing else (for a profiler: ncu -k regex:flash python3 bench/gpu_kernels.py --once)")
    args = ap.parse_args()
    import cupy as cp

    from andrea.engine.cupy import CupyBackend

    gb = CupyBackend("bf16")

    if args.once:
        time_ours(gb, cp, 8, 12, 1024, 64)
        return

    rng = np.random.default_rng(0)
    print("correctness (bf16 inputs vs float64 reference; relative error)")
    for variant in VARIANTS:
        for B, H, T, D in ((2, 3, 200, 64), (2, 3, 200, 32), (1, 2, 64, 64), (1, 1, 37, 16)):
            errs = check(gb, cp, B, H, T, D, rng)
            ok = all(v < 2e-2 for k, v in errs.items() if k != "same_bytes") and errs["same_bytes"]
            print(f"  variant {variant} B={B} H={H} T={T} D={D}: "
                  + ", ".join(f"{k} {v:.2e}" if k != "same_bytes" else f"{k} {v}" for k, v in errs.items()) + ("  ok" if ok else "  FAIL"))
    print("\ntiming (T=1024; causal FLOPs: forward 2·B·H·T²·D, backward 2.5× that)")
    print("| shape | variant | ours fwd ms (TFLOP/s) | ours bwd ms (TFLOP/s) | torch SDPA fwd ms | torch bwd ms |")
    print("|---|---|---|---|---|---|")
    for name, B, H, D in (("12M B=8", 8, 12, 32), ("120M B=8", 8, 12, 64), ("120M B=32", 32, 12, 64)):
        T = 1024
        flops = 2 * B * H * T * T * D
        tt = time_torch(B, H, T, D)
        tcol = f"{tt[0] * 1e3:.3f} | {tt[1] * 1e3:.3f}" if tt else "— | —"
        for variant in VARIANTS:
            f, b = time_ours(gb, cp, B, H, T, D)
            print(f"| {name} | {variant} | {f * 1e3:.3f} ({flops / f / 1e12:.0f}) | {b * 1e3:.3f} ({2.5 * flops / b / 1e12:.0f}) | {tcol} |")
    if not args.no_gemm:
        for B in (8, 32):
            per_layer = gemm_table(gb, cp, B, "ANDREA-120M", 768, 3072, 8449)
            print(f"sum per layer (logits spread over 12 layers): {per_layer * 1e3:.3f} ms; x 12 layers = {per_layer * 12e3:.2f} ms")


if __name__ == "__main__":
    main()
