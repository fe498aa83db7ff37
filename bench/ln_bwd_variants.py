"""The 16-bit modes' one-pass LayerNorm backward (kernels/layernorm.cu) at the models' shapes: the
production kernel (the warps' running dγ/dβ sums in shared memory, the old dx loaded early) against
the previous one (layernorm_bwd_fused_reg_h16_<NV>: the sums in registers), which must give the same
dx, 16-bit dx copy and partials bit for bit (the same sums in the same order); time and bandwidth.

    python3 bench/ln_bwd_variants.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

SHAPES = [("12M B=32", 32 * 1024, 384), ("120M B=8", 8 * 1024, 768), ("120M B=32", 32 * 1024, 768),
          ("480M B=8", 8 * 1024, 1536), ("480M B=16", 16 * 1024, 1536)]
VARIANTS = ["reg"]  # layernorm_bwd_fused_<v>_h16_<NV>, where built for that NV


def main() -> None:
    import cupy as cp
    from gpu_timing import median_ms

    from andrea.engine.cupy import CupyBackend, _ln_fused, ln_fused_rows, ln_fused_smem

    be = CupyBackend("bf16")
    rng = np.random.default_rng(0)
    print("| shape | kernel | same bits | us | GB/s |\n|---|---|---|---|---|")
    for label, N, C in SHAPES:
        x = cp.asarray(rng.standard_normal((N, C), dtype=np.float32) * 2 + 0.5)
        dout32 = rng.standard_normal((N, C), dtype=np.float32)
        dout = cp.asarray((dout32.view(np.uint32) >> 16).astype(np.uint16))  # bf16 by truncation
        mean = cp.asarray(rng.standard_normal(N, dtype=np.float32))
        rstd = cp.asarray(rng.uniform(0.5, 2.0, N).astype(np.float32))
        g = cp.asarray(1 + 0.1 * rng.standard_normal(C, dtype=np.float32))
        dx0 = cp.asarray(rng.standard_normal((N, C), dtype=np.float32))
        rows = ln_fused_rows(N)
        chunks = -(-N // rows)
        nv = int(_ln_fused(C, True).rsplit("_", 1)[1])
        nbytes = N * C * (4 + 2 + 4 + 4 + 2) + 8 * N + chunks * 2 * C * 4
        ref = None
        for v in [None] + VARIANTS:
            name = _ln_fused(C, True) if v is None else f"layernorm_bwd_fused_{v}_h16_{nv}"
            try:
                kern = be.kernel("layernorm", name)
            except cp.cuda.driver.CUDADriverError:  # not built for this NV
                continue
            smem = ln_fused_smem(C) if v is None else 0
            if kern.max_dynamic_shared_size_bytes < smem:  # past 48 KiB by request
                kern.max_dynamic_shared_size_bytes = smem
            dx, copy, partial = dx0.copy(), cp.zeros((N, C), cp.uint16), cp.zeros((chunks, 2 * C), cp.float32)

            def run(kern=kern, dx=dx, copy=copy, partial=partial, smem=smem):
                kern((chunks,), (256,), (dout, x, mean, rstd, g, dx, copy, partial, np.int32(N), np.int32(C), np.int32(rows)),
                     shared_mem=smem)

            run()
            out = [a.get() for a in (dx, copy, partial)]
            if ref is None:
                ref, same = out, "(production)"
            else:
                same = "yes" if all(a.tobytes() == b.tobytes() for a, b in zip(out, ref)) else "NO"
            ms = median_ms(run, 50)
            print(f"| {label} | {name} | {same} | {ms * 1e3:.1f} | {nbytes / ms / 1e6:.0f} |")


if __name__ == "__main__":
    main()
