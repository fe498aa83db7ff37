"""Where a training step spends its GPU time, kernel by kernel, from torch.profiler (CUPTI sees every
kernel of the process, CuPy's and those inside CUDA graphs included): PyTorch's step (bf16 autocast +
torch.compile, bench/gpu_bench.py's reference) and ours side by side, so that a gap between the two can
be put on a part of the step.

    python3 bench/kernel_profile.py --model ANDREA-12M --batch 32 --runners torch bf16
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpu_bench import MODELS, Ours, Torch  # noqa: E402

# kernel name patterns -> the part of the step they belong to (first match wins)
GROUPS = [
    ("attention", r"flash|fmha|attention|attn|sdpa|cudnn"),
    ("matrix products", r"gemm|cutlass|sm90_xmma|nvjet|cublas"),
    ("layernorm", r"layernorm|layer_norm|ln_"),
    ("loss", r"cross_entropy|softmax_xent|loss|logsoftmax"),
    ("optimizer", r"adam|foreach|multi_tensor|clip|grad_norm|norm_kernel|reduce_kernel"),
    ("fused elementwise (Triton)", r"^triton"),
]


def group(name: str) -> str:
    for g, pat in GROUPS:
        if re.search(pat, name, re.IGNORECASE):
            return g
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="ANDREA-12M")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--runners", nargs="+", default=["torch", "bf16"], help="torch, or one of our precisions (bf16, fp8, ...)")
    args = ap.parse_args()
    for name in args.runners:
        profile_runner(name, args)


def profile_runner(name, args) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    cfg = MODELS[args.model]
    if name == "torch":
        runner = Torch(cfg, args.batch, args.seq, warmup=3)
    else:
        runner = Ours(cfg, args.batch, args.seq, name, warmup=3)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        runner.run(args.steps)
        wall = (time.perf_counter() - t0) * 1e3 / args.steps
    kernels = defaultdict(lambda: [0.0, 0])
    spans = []  # (start, end, name) in microseconds: when the GPU was busy
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[ev.name]
            k[0] += ev.device_time / 1e3  # microseconds -> ms
            k[1] += 1
            spans.append((ev.time_range.start, ev.time_range.end, ev.name))
    total = sum(v[0] for v in kernels.values()) / args.steps
    print(f"\n## {name} {args.model} B={args.batch} T={args.seq}: {total:.2f} ms of kernels per step, "
          f"{wall:.2f} ms wall per step (under the profiler)\n")
    # the GPU idle between kernels, put on the pair of kernels around each idle stretch: where the
    # host (a synchronisation, host work between launches) holds the step up
    gaps, busy_until, prev = defaultdict(lambda: [0.0, 0]), None, None
    for start, end, kname in sorted(spans):
        if busy_until is not None and start - busy_until > 2:
            gap = gaps[(prev[:40], kname[:40])]
            gap[0] += (start - busy_until) / 1e3
            gap[1] += 1
        if busy_until is None or end > busy_until:
            busy_until, prev = end, kname
    idle = sum(g[0] for g in gaps.values()) / args.steps
    print(f"GPU idle between kernels (stretches over 2 us): {idle:.2f} ms per step\n")
    print("| idle after | before | ms/step | times/step |\n|---|---|---|---|")
    for (a, b), (ms, n) in sorted(gaps.items(), key=lambda kv: -kv[1][0])[:10]:
        print(f"| {a} | {b} | {ms / args.steps:.3f} | {n / args.steps:.1f} |")
    print()
    by_group = defaultdict(float)
    for name, (ms, _) in kernels.items():
        by_group[group(name)] += ms / args.steps
    print("| part | ms/step | share |\n|---|---|---|")
    for g, ms in sorted(by_group.items(), key=lambda kv: -kv[1]):
        print(f"| {g} | {ms:.2f} | {ms / total:.1%} |")
    print(f"\n| kernel (top {args.top}) | ms/step | calls/step |\n|---|---|---|")
    for name, (ms, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"| {name[:110]} | {ms / args.steps:.3f} | {n // args.steps} |")


if __name__ == "__main__":
    main()
