"""The MLP's products on the GPU, one by one: cublasGemmEx plus the elementwise GELU passes against
cuBLASLt with the GELU epilogues, every algorithm cuBLASLt's heuristic offers timed on its own.

    python3 bench/mlp_gemm_bench.py [--shapes 32768x768x3072 8192x768x3072 ...]

Prints one table per shape (ms per call, median of --reps timed calls after a warm-up); JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from andrea.engine.cupy import BF16, CupyBackend  # noqa: E402
from andrea.engine.cupy.cublaslt import EPILOGUE_DEFAULT, EPILOGUE_DGELU, EPILOGUE_GELU_AUX, Lt  # noqa: E402
from andrea.engine.cupy.kernels import blocks  # noqa: E402
from gpu_timing import median_ms  # noqa: E402 (bench/, the script's folder)


def per_algo(lt: Lt, call, reps: int) -> list:
    """call() once to make the plan, then each of the heuristic's algorithms timed alone (in the
    heuristic's order: the first is cublasGemmEx's choice)."""
    call()
    plan = list(lt.plans.values())[-1]
    out = []
    for i in range(len(plan.algos)):
        plan.chosen = i
        try:
            out.append(median_ms(call, reps))
        except RuntimeError:
            out.append(float("nan"))
    return out


def bench(m: int, d: int, M: int, reps: int) -> dict:
    be = CupyBackend("bf16")
    blas, lt = be._blas(), Lt(tune=False)
    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal((m, d), np.float32)).astype(BF16)
    w1 = cp.asarray(rng.standard_normal((d, M), np.float32) * 0.03).astype(BF16)
    w2 = cp.asarray(rng.standard_normal((M, d), np.float32) * 0.03).astype(BF16)
    g = cp.asarray(rng.standard_normal((m, d), np.float32)).astype(BF16)
    h, a, da = (cp.empty((m, M), BF16) for _ in range(3))
    gelu_bwd = be.kernel("elementwise", "gelu_bwd_recompute_h16x8")
    r = {"shape": [m, d, M]}
    r["fwd gemmEx"] = median_ms(lambda: blas.gemm(x, w1, h), reps)
    r["fwd gelu pass"] = median_ms(lambda: be.gelu(h, a), reps)
    r["fwd Lt default (algos)"] = per_algo(lt, lambda: lt.gemm(x, w1, h), reps)
    r["fwd Lt GELU_AUX (algos)"] = per_algo(lt, lambda: lt.gemm(x, w1, a, epilogue=EPILOGUE_GELU_AUX, aux=h), reps)
    r["bwd gemmEx"] = median_ms(lambda: blas.gemm(g, w2, da, tb=True), reps)
    r["bwd gelu' pass (recompute a)"] = median_ms(lambda: gelu_bwd((blocks(da.size // 8),), (256,), (h, da, a, np.int64(da.size // 8))), reps)
    r["bwd Lt default (algos)"] = per_algo(lt, lambda: lt.gemm(g, w2, da, tb=True, epilogue=EPILOGUE_DEFAULT), reps)
    r["bwd Lt DGELU (algos)"] = per_algo(lt, lambda: lt.gemm(g, w2, da, tb=True, epilogue=EPILOGUE_DGELU, aux=h), reps)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["32768x768x3072", "8192x768x3072", "32768x384x1536", "8192x1536x6144"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = []
    for s in args.shapes:
        m, d, M = (int(v) for v in s.split("x"))
        r = bench(m, d, M, args.reps)
        results.append(r)
        print(f"\n## m={m} d={d} M={M} (ms per call)")
        for k, v in r.items():
            if k != "shape":
                print(f"{k:32s} " + (", ".join(f"{t:.3f}" for t in v) if isinstance(v, list) else f"{v:.3f}"))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
