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
    ap.add_argument("--runners", nargs="+", default=["torch", "bf16"], help="torch, torch_graphs (torch.compile's CUDA-graph mode), or one of our precisions (bf16, fp8, ...)")
    ap.add_argument("--host", action="store_true",
                    help="also trace the host's CUDA API calls: which calls block, and the host's own work between them")
    args = ap.parse_args()
    for name in args.runners:
        profile_runner(name, args)


def profile_runner(name, args) -> None:
    cfg = MODELS[args.model]
    if name in ("torch", "torch_graphs"):  # torch.compile's default mode, or its CUDA-graph mode
        runner = Torch(cfg, args.batch, args.seq, warmup=3, mode="graphs" if name == "torch_graphs" else "default")
    else:
        runner = Ours(cfg, args.batch, args.seq, name, warmup=3)
    profile_kernels(lambda: runner.run(args.steps), args.steps, f"{name} {args.model} B={args.batch} T={args.seq}",
                    "step", args.top, args.host)


def profile_kernels(run, steps: int, title: str, unit: str = "step", top: int = 25, host: bool = False) -> None:
    """Profile run() (`steps` units of work) and print: kernel and wall time per unit, the GPU's idle
    stretches and the kernels around them, the parts of the work, the top kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if host else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / steps
    kernels = defaultdict(lambda: [0.0, 0])
    host_calls = []  # (start, end, name, thread) of the CUDA runtime and driver API calls
    spans = []  # (start, end, name) in microseconds: when the GPU was busy
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[ev.name]
            k[0] += ev.device_time / 1e3  # microseconds -> ms
            k[1] += 1
            spans.append((ev.time_range.start, ev.time_range.end, ev.name))
        elif host and re.match(r"cu[A-Z]|cuda[A-Z]", ev.name):
            host_calls.append((ev.time_range.start, ev.time_range.end, ev.name, ev.thread))
    total = sum(v[0] for v in kernels.values()) / steps
    calls = sum(v[1] for v in kernels.values()) / steps
    print(f"\n## {title}: {total:.3f} ms of kernels per {unit} ({calls:.0f} kernels), {wall:.3f} ms wall per {unit} "
          f"(under the profiler)\n")
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
    idle = sum(g[0] for g in gaps.values()) / steps
    print(f"GPU idle between kernels (stretches over 2 us): {idle:.3f} ms per {unit}\n")
    print(f"| idle after | before | ms/{unit} | times/{unit} |\n|---|---|---|---|")
    for (a, b), (ms, n) in sorted(gaps.items(), key=lambda kv: -kv[1][0])[:10]:
        print(f"| {a} | {b} | {ms / steps:.3f} | {n / steps:.1f} |")
    print()
    if host:
        report_host(host_calls, steps)
    by_group = defaultdict(float)
    for name, (ms, _) in kernels.items():
        by_group[group(name)] += ms / steps
    print(f"| part | ms/{unit} | share |\n|---|---|---|")
    for g, ms in sorted(by_group.items(), key=lambda kv: -kv[1]):
        print(f"| {g} | {ms:.3f} | {ms / total:.1%} |")
    print(f"\n| kernel (top {top}) | ms/{unit} | calls/{unit} |\n|---|---|---|")
    for name, (ms, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name[:110]} | {ms / steps:.4f} | {n / steps:g} |")
    sys.stdout.flush()


def report_host(calls, steps) -> None:
    """The CUDA API calls of the thread that made most of them (the step loop's): time in each API
    (a blocking copy or synchronisation shows as a long call), and the host's own work between two
    calls where it ran over 20 us (Python between launches: what keeps the GPU waiting after a sync)."""
    if not calls:
        print("no CUDA API calls traced\n")
        return
    counts = defaultdict(int)
    for c in calls:
        counts[c[3]] += 1
    main_thread = max(counts, key=counts.get)
    calls = sorted(c for c in calls if c[3] == main_thread)
    per_api = defaultdict(lambda: [0.0, 0, 0.0])
    for start, end, name, _ in calls:
        a = per_api[name]
        a[0] += (end - start) / 1e3
        a[1] += 1
        a[2] = max(a[2], (end - start) / 1e3)
    print("| host API call | ms/step | calls/step | longest ms |\n|---|---|---|---|")
    for name, (ms, n, longest) in sorted(per_api.items(), key=lambda kv: -kv[1][0])[:12]:
        print(f"| {name} | {ms / steps:.3f} | {n / steps:.1f} | {longest:.3f} |")
    between = defaultdict(lambda: [0.0, 0])
    for (s0, e0, a, _), (s1, _e1, b, _) in zip(calls, calls[1:]):
        if s1 - e0 > 20:
            g = between[(a, b)]
            g[0] += (s1 - e0) / 1e3
            g[1] += 1
    total = sum(g[0] for g in between.values()) / steps
    print(f"\nhost work between API calls (stretches over 20 us): {total:.2f} ms per step\n")
    print("| after | before | ms/step | times/step |\n|---|---|---|---|")
    for (a, b), (ms, n) in sorted(between.items(), key=lambda kv: -kv[1][0])[:10]:
        print(f"| {a} | {b} | {ms / steps:.3f} | {n / steps:.1f} |")
    print()


if __name__ == "__main__":
    main()
