"""The attention backward's kernels at one model shape, for a kernel profiler: PyTorch's cuDNN and
flash SDPA backends, our mma.sync backward and attention_wgmma's backward variants (production: "wgmma
1wg overlap"), each run --reps times on the same random q, k, v, dy (bf16, causal, T = 1,024). Without
a profiler it prints each one's median time (CUDA events; PyTorch's include its autograd's host work,
so read its kernels' own times under the profiler, or dev/cuda/attention_wgmma.py's yardsticks);
under Nsight Compute it gives the kernels to read:

    ncu --clock-control none -k 'regex:bprop|matmul_dq|dot_do|flash_bwd|flash_delta|attention_bwd' \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --csv --page details python3 bench/attention_bwd_profile.py --model ANDREA-120M --batch 8 --reps 1
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpu_bench import MODELS  # noqa: E402

sys.path.insert(0, str(REPO / "dev" / "cuda"))
from attention_wgmma import BWD_VARIANTS, PRODUCTION  # noqa: E402  dev/cuda's: (name, defines, deterministic, fused, new)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="ANDREA-120M", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", nargs="*", default=None,
                    help="runners by name: torch cudnn, torch flash, mma.sync and dev/cuda/attention_wgmma.py's backward "
                         "variants (default: the first three and the production variant)")
    a = ap.parse_args(argv)

    import cupy as cp
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from andrea.engine.cupy import attention_mma
    from andrea.engine.cupy import attention_wgmma as wg
    from andrea.engine.cupy.backend import CupyBackend

    cfg = MODELS[a.model]
    H, C, T, B = cfg.n_head, cfg.d_model, 1024, a.batch
    D = C // H
    be = CupyBackend("bf16")
    gen = cp.random.default_rng(0)
    qkv = gen.standard_normal((B, T, 3, H, D), dtype=cp.float32).astype(be.half)
    dy = gen.standard_normal((B, T, C), dtype=cp.float32).astype(be.half)
    y = cp.empty((B, T, C), be.half)
    lse = cp.empty((B, H, T), cp.float32)
    dqkv = cp.empty_like(qkv)
    attention_mma.flash_fwd(be, qkv, y, lse)

    tq = torch.as_tensor(qkv.view(cp.uint16), device="cuda").view(torch.bfloat16)
    q, k, v = (tq[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3))
    tdy = torch.as_tensor(dy.view(cp.uint16), device="cuda").view(torch.bfloat16).view(B, T, H, D).transpose(1, 2)

    def torch_runner(backend):
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        def run():
            with sdpa_kernel(backend):
                torch.autograd.grad(out, (q, k, v), tdy, retain_graph=True)
        return run

    runners = {
        "torch cudnn": torch_runner(SDPBackend.CUDNN_ATTENTION),
        "torch flash": torch_runner(SDPBackend.FLASH_ATTENTION),
        "mma.sync": lambda: attention_mma.flash_bwd(be, dy, qkv, y, lse, dqkv),
    }
    for name, defines, det, fused, _ in BWD_VARIANTS:
        runners[name] = (lambda d=defines, de=det, f=fused: wg.flash_bwd(be, dy, qkv, y, lse, dqkv, d, deterministic=de, fused=f))
    names = a.only or ["torch cudnn", "torch flash", "mma.sync", PRODUCTION["bwd"]]
    unknown = sorted(set(names) - set(runners))
    if unknown:
        ap.error(f"no runner {unknown}; runners: {', '.join(runners)}")
    flops = 5 * 2 * B * H * T * T * D / 2  # five T × T × D products over the causal half
    print(f"{a.model} B={B} T={T} H={H} D={D}: attention backward, median of {a.reps}")
    for name in names:
        run = runners[name]
        run()  # compile, plan
        torch.cuda.synchronize()
        times = []
        for _ in range(a.reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            run()
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1))
        ms = sorted(times)[len(times) // 2]
        print(f"  {name:18s} {ms:.4f} ms  {flops / ms / 1e9:6.1f} TFLOP/s (5 products)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
