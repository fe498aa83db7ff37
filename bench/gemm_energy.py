"""The training step's bf16 matrix products, each of cuBLASLt's algorithms timed as the backend's tuner
times them (graph_times: replayed from CUDA graphs, all algorithms in turn), as the tuner before
2026-12-01 timed them (TUNE_REPS eager calls each, back to back, after an idle second), and run back
to back for about --seconds (the GPU at its power cap, as in training), with NVML's energy counter
read around that.

Why: ANDREA-120M's B=32 training step holds the H200 at its 700 W cap (bench/gpu_power.py). There
the algorithm that is fastest alone need not be the one that takes least energy, and so least time in
training.

    python3 bench/gemm_energy.py [--m 32768 8192] [--d 768] [--seconds 0.4] [--out gemm_energy.json]
    python3 bench/gemm_energy.py --m 8192 --d 1536 --algos 32 --written --torch   # ANDREA-480M B=8

Prints per product: each algorithm's two short timings, its time and millijoules per call under
sustained load; which one each short timing picks (the tuner's choice, "tuned", and the old
tuner's), the fastest under load, and the lowest-energy one (millijoules a call are coarse: NVML's
counter over --seconds). --algos N asks cuBLASLt's heuristic for N candidates (the tuner asks 8);
--written adds the weight gradients written (beta 0, a step's first micro-batch) beside accumulated;
--torch adds PyTorch's own call of each product (its nn.Linear layouts, bf16 output as its autocast
step makes it; its weight gradients are then converted to fp32 by kernels of their own, not timed
here, where ours read and write fp32), sustained the same way: what the step's profile compares.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from andrea.engine.cupy import BF16  # noqa: E402
from andrea.engine.cupy.cublaslt import TUNE_REPS, Lt, graph_times  # noqa: E402
from gpu_power import PowerMeter  # noqa: E402 (bench/, the script's folder)
from gpu_timing import mean_ms  # noqa: E402


def products(m: int, d: int, M: int) -> list:
    """(name, a shape, b shape, c shape and dtype, ta, tb, accumulate) of the training step's cuBLASLt
    products (the q/k/v products are strided-batched cuBLAS calls, not here)."""
    f32 = np.float32
    return [
        ("out fwd  y·Wo", (m, d), (d, d), (m, d), BF16, False, False, False),
        ("fc1 fwd  x·W1", (m, d), (d, M), (m, M), BF16, False, False, False),
        ("fc2 fwd  a·W2", (m, M), (M, d), (m, d), BF16, False, False, False),
        ("fc2 dgrad g·W2ᵀ", (m, d), (M, d), (m, M), BF16, False, True, False),
        ("fc2 wgrad aᵀ·g", (m, M), (m, d), (M, d), f32, True, False, True),
        ("fc1 wgrad xᵀ·da", (m, d), (m, M), (d, M), f32, True, False, True),
        ("fc1 dgrad da·W1ᵀ", (m, M), (d, M), (m, d), BF16, False, True, False),
        ("qkv dgrad g·Wcatᵀ", (m, 3 * d), (d, 3 * d), (m, d), BF16, False, True, False),
        ("out dgrad g·Woᵀ", (m, d), (d, d), (m, d), BF16, False, True, False),
        ("out wgrad yᵀ·g", (m, d), (m, d), (d, d), f32, True, False, True),
    ]


def sustained(call, meter: PowerMeter, ms_alone: float, seconds: float, per_graph: int = 50) -> tuple:
    """(ms, mJ, mean SM MHz) per call over about `seconds` of back-to-back calls, after a quarter of
    that to reach the steady clock. The calls replay as a CUDA graph of `per_graph` of them, so that
    the host's launches do not set the pace of the short products."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for _ in range(per_graph):
            call()
        graph = stream.end_capture()
        n = max(2, int(seconds * 1e3 / max(ms_alone * per_graph, 1e-3)))
        return under_load(lambda: graph.launch(stream), stream.synchronize, meter, n, per_graph)


def under_load(replay, sync, meter: PowerMeter, n: int, per_graph: int) -> tuple:
    """(ms, mJ, mean SM MHz) per call: a quarter of n untimed replays of a graph of `per_graph` calls
    (the clock settling at the cap), then n replays measured (time and NVML's energy)."""
    for _ in range(max(1, n // 4)):
        replay()
    sync()
    with meter.measure() as r:
        for _ in range(n):
            replay()
        sync()
    return r.seconds * 1e3 / (n * per_graph), r.joules * 1e3 / (n * per_graph), r.sm_mhz


def torch_sustained(a, b, ta: bool, tb: bool, meter: PowerMeter, seconds: float, per_graph: int = 50) -> tuple:
    """(ms, mJ, mean SM MHz) per call of the product as PyTorch's nn.Linear makes it, in bf16 (a, b:
    the float32 CuPy arrays ours are rounded from), replayed from a CUDA graph of `per_graph` calls for
    about `seconds` (as sustained() does ours). PyTorch keeps a weight as [out, in] where ours is
    [in, out], so its three products have other layouts: forward x·Wᵀ, input gradient g·W, weight
    gradient gᵀ·x (an [out, in] result)."""
    import torch

    x, y = torch.from_dlpack(a).to(torch.bfloat16), torch.from_dlpack(b).to(torch.bfloat16)
    if ta:  # weight gradient: ours aᵀ·g [in, out]; PyTorch's gᵀ·x [out, in]
        g, xs = y.contiguous(), x.contiguous()
        op = lambda: torch.matmul(g.t(), xs)  # noqa: E731
    else:  # forward (x·W) or input gradient (g·Wᵀ), W [in, out] in ours: PyTorch's [out, in] weight
        w = y.t().contiguous()
        op = (lambda: torch.matmul(x, w)) if tb else (lambda: torch.matmul(x, w.t()))  # noqa: E731
    side = torch.cuda.Stream()  # warm-up off the capturing stream, as torch.cuda.graph asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            op()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            op()
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    n = max(2, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    return under_load(graph.replay, torch.cuda.synchronize, meter, n, per_graph)


def bench(m: int, d: int, seconds: float, meter: PowerMeter, candidates: int = 8, written: bool = False,
          with_torch: bool = False) -> list:
    rng = np.random.default_rng(0)
    lt = Lt(tune=False, candidates=candidates)
    out = []
    todo = products(m, d, 4 * d)
    if written:  # the weight gradients also written, not accumulated (beta 0)
        todo += [(f"{name} (written)", sa, sb, sc, cdt, ta, tb, False) for name, sa, sb, sc, cdt, ta, tb, acc in todo if acc]
    for name, sa, sb, sc, cdt, ta, tb, acc in todo:
        a32 = cp.asarray(rng.standard_normal(sa, np.float32))
        b32 = cp.asarray(rng.standard_normal(sb, np.float32) * 0.03)
        a, b = a32.astype(BF16), b32.astype(BF16)
        c = cp.zeros(sc, cdt)
        call = lambda: lt.gemm(a, b, c, ta=ta, tb=tb, accumulate=acc)  # noqa: E731
        call()
        plan = list(lt.plans.values())[-1]
        # first every algorithm's short timings, back to back after an idle second: the old tuner's
        # eager calls, then the tuner's graph replays; then each under sustained load
        time.sleep(1.0)
        alone = {}
        for i in range(len(plan.algos)):
            plan.chosen = i
            try:
                call()
            except RuntimeError:
                continue
            alone[i] = mean_ms(call, TUNE_REPS, warm=False)  # the call above was the warm-up

        def call_with(i):
            plan.chosen = i
            call()
            return 0

        graphed = graph_times(call_with, len(plan.algos))
        rows = []
        for i, ms_alone in alone.items():
            plan.chosen = i
            ms, mj, mhz = sustained(call, meter, ms_alone, seconds)
            rows.append({"algo": i, "alone_ms": ms_alone, "graph_ms": graphed[i], "sustained_ms": ms, "mj": mj, "sm_mhz": mhz})
        flops = 2 * sa[0] * sa[1] * (sb[0] if tb else sb[1])
        old = min(rows, key=lambda r: r["alone_ms"])
        tuned = min(rows, key=lambda r: r["graph_ms"])
        frugal = min(rows, key=lambda r: r["mj"])
        fastest = min(rows, key=lambda r: r["sustained_ms"])
        out.append({"product": name, "m": m, "flops": flops, "algos": rows, "tuned": tuned["algo"], "old_tuner": old["algo"],
                    "least_energy": frugal["algo"],
                    "fastest_sustained": fastest["algo"]})
        if with_torch and not name.endswith("(written)"):  # (PyTorch's call is the same written or not)
            ms, mj, mhz = torch_sustained(a32, b32, ta, tb, meter, seconds)
            out[-1]["torch"] = {"sustained_ms": ms, "mj": mj, "sm_mhz": mhz}
        print(f"\n## {name}  (m={m}, d={d}; {flops / 1e9:.0f} GFLOP)")
        print("| algo | 5 eager calls ms | graph-timed ms | sustained ms | mJ/call | SM MHz | |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            mark = " ".join(x for x, y in (("tuned", tuned), ("old-tuner", old), ("least-energy", frugal),
                                           ("fastest-sustained", fastest)) if y is r)
            print(f"| {r['algo']} | {r['alone_ms']:.3f} | {r['graph_ms']:.3f} | {r['sustained_ms']:.3f} | {r['mj']:.1f} | "
                  f"{r['sm_mhz']:.0f} | {mark} |")
        print(f"under load: tuned choice {tuned['sustained_ms']:.3f} ms, old tuner's {old['sustained_ms']:.3f}, best "
              f"{fastest['sustained_ms']:.3f} ({tuned['sustained_ms'] / fastest['sustained_ms'] - 1:+.1%} and "
              f"{old['sustained_ms'] / fastest['sustained_ms'] - 1:+.1%})")
        if "torch" in out[-1]:
            t = out[-1]["torch"]
            print(f"PyTorch (nn.Linear's layout, bf16 out) under load: {t['sustained_ms']:.3f} ms, {t['mj']:.1f} mJ, "
                  f"{t['sm_mhz']:.0f} MHz; ours / PyTorch: tuned {tuned['sustained_ms'] / t['sustained_ms']:.3f}, "
                  f"best {fastest['sustained_ms'] / t['sustained_ms']:.3f}")
        sys.stdout.flush()
    lt.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", nargs="+", type=int, default=[32768, 8192], help="rows: B·T")
    ap.add_argument("--d", type=int, default=768, help="d_model (the MLP is 4d)")
    ap.add_argument("--seconds", type=float, default=0.4, help="sustained run per algorithm")
    ap.add_argument("--algos", type=int, default=8, help="candidates asked of cuBLASLt's heuristic (the tuner asks 8)")
    ap.add_argument("--written", action="store_true", help="also the weight gradients written (beta 0), not accumulated")
    ap.add_argument("--torch", action="store_true", help="also PyTorch's call of each product (torch.matmul)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    meter = PowerMeter.open()
    if meter is None:
        sys.exit("gemm_energy: NVML (libnvidia-ml.so.1) or its energy counter is not available on this machine")
    t0 = time.perf_counter()
    results = [r for m in args.m for r in bench(m, args.d, args.seconds, meter, args.algos, args.written, args.torch)]
    print(f"\n{time.perf_counter() - t0:.0f} s")
    for m in args.m:
        ours = [r for r in results if r["m"] == m and not r["product"].endswith("(written)")]
        pick = lambda r, k: next(a for a in r["algos"] if a["algo"] == r[k])  # noqa: E731
        tuned, old, best = (sum(pick(r, k)["sustained_ms"] for r in ours) for k in ("tuned", "old_tuner", "fastest_sustained"))
        print(f"m={m}: one of each product under load: tuned choices {tuned:.3f} ms ({tuned / best - 1:+.1%}), the old "
              f"tuner's {old:.3f} ms ({old / best - 1:+.1%}), fastest sustained {best:.3f} ms"
              + (f"; PyTorch's calls {sum(r['torch']['sustained_ms'] for r in ours):.3f} ms" if args.torch else ""))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
