"""Where our engine's GPU memory goes, beside the peak gpu_bench.py reports: after a warmed-up
training step, every live CuPy array put on the engine's buffer it is (parameters and optimizer
state, each saved activation, the backward's scratch, the backend's own scratch), the pool's
in-use figure and its peak, and the allocation that set the peak (with where in our code it was
made), so that the gap to PyTorch's peak can be put on a buffer.

    python3 bench/memory_breakdown.py --models ANDREA-12M:32 ANDREA-480M:8
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpu_bench import MODELS, PEAK_TRACKER, Ours  # noqa: E402

MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="+", default=["ANDREA-12M:32", "ANDREA-480M:8"], help="MODEL:BATCH")
    ap.add_argument("--precision", default="bf16")
    args = ap.parse_args()
    import cupy as cp

    pool = cp.get_default_memory_pool()
    for spec in args.models:
        name, B = spec.split(":")
        gc.collect()
        pool.free_all_blocks()
        base = pool.used_bytes()
        PEAK_TRACKER.record_sites = True  # Ours starts the tracker: its peak, and where it was reached
        runner = Ours(MODELS[name], int(B), 1024, args.precision, warmup=3)
        tracker = PEAK_TRACKER
        e = runner.e
        known = {}
        for k in ("w", "g", "m", "v", "decay", "tokens", "targets"):
            known[id(getattr(e, k))] = f"engine.{k}"
        for k, a in e.A.saved.items():
            known[id(a)] = f"saved.{k}"
        for k, a in e.A.scratch.items():
            known[id(a)] = f"scratch.{k}"
        for k, a in e.be._scratch.items():
            known[id(a)] = f"backend scratch {k[0]} {k[1]}"
        groups: dict[str, int] = {}
        seen = set()
        for obj in gc.get_objects():
            if isinstance(obj, cp.ndarray) and obj.base is None and obj.data.ptr not in seen:
                seen.add(obj.data.ptr)
                label = known.get(id(obj), f"other {obj.dtype} {obj.shape}")
                groups[label] = groups.get(label, 0) + obj.nbytes
        live = sum(groups.values())
        print(f"\n## {name} B={B} {args.precision}: peak {(tracker.peak - base) / MiB:,.0f} MiB, in use after the steps "
              f"{(pool.used_bytes() - base) / MiB:,.0f} MiB, arrays found {live / MiB:,.0f} MiB")
        print(f"the allocation that set the peak: {tracker.site}\n")
        print("| buffer | MiB |\n|---|---|")
        for label, n in sorted(groups.items(), key=lambda kv: -kv[1])[:40]:
            print(f"| {label} | {n / MiB:,.1f} |")
        del runner, e


if __name__ == "__main__":
    main()
