"""cuDNN's fused attention (andrea/engine/cupy/cudnn_attention.py, frontend 1.16) on our [B, T, 3, H, D]
buffers, against our flash kernels: agreement (y, lse, dq/dk/dv), repeatability of the backward with
and without cuDNN's deterministic algorithm, CUDA-graph capture, and time per call, at the model
shapes.

    PYTHONPATH=/tmp/site python3 bench/cudnn_attention_probe.py   (the frontend wheel in .whl, installed there)

This probe decided cudnn_attention.py; its output of 2026-12-01 on the H200 is in
records/2026-12-01/cudnn/probe.txt (from a first version that built the same graphs by hand).
"""

import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from andrea.engine.cupy import BF16, CupyBackend  # noqa: E402
from andrea.engine.cupy.cudnn_attention import CudnnAttention, _cudnn  # noqa: E402
from gpu_timing import median_ms  # noqa: E402 (bench/, the script's folder)


def rel(a, c):
    a, c = a.astype(cp.float32), c.astype(cp.float32)
    return float(cp.linalg.norm(a - c) / cp.linalg.norm(c))


def same_bytes(a, c) -> bool:
    return bool((a.view(cp.uint16) == c.view(cp.uint16)).all())


def run(B, H, T, D):
    rng = np.random.default_rng(0)
    be = CupyBackend("bf16")
    be.attention = "flash"  # ours
    os.environ.setdefault("ANDREA_ATTENTION_WORKSPACE_MIB", "100000")  # cuDNN's backward on the whole batch
    qkv = cp.asarray(rng.standard_normal((B, T, 3, H, D), np.float32)).astype(BF16)
    dy = cp.asarray(rng.standard_normal((B, T, H * D), np.float32)).astype(BF16)
    y, lse = cp.empty((B, T, H * D), BF16), cp.empty((B, H, T), cp.float32)
    dqkv = cp.empty_like(qkv)
    res = {"shape": (B, H, T, D),
           "ours fwd": median_ms(lambda: be.attn_fwd(qkv, y, lse)),
           "ours bwd": median_ms(lambda: be.attn_bwd(dy, qkv, y, lse, dqkv))}
    for det in (True, False):
        att = CudnnAttention(deterministic=det)
        y2, st, d2 = cp.empty_like(y), cp.empty_like(lse), cp.empty_like(qkv)

        def fwd():
            return att.fwd(be, qkv, y2, st)

        def bwd():
            return att.bwd(be, dy, qkv, y2, st, d2)

        if not (fwd() and bwd()):
            raise RuntimeError(f"cuDNN refused {att.refused()}")
        cp.cuda.Device().synchronize()
        res[f"det={det} rel y"] = rel(y2, y)
        res[f"det={det} rel lse"] = rel(st, lse)
        res[f"det={det} rel dqkv"] = [rel(d2[:, :, i], dqkv[:, :, i]) for i in range(3)]
        first = d2.copy()
        bwd()
        cp.cuda.Device().synchronize()
        res[f"det={det} bwd repeat identical"] = same_bytes(first, d2)
        res[f"det={det} cudnn fwd"] = median_ms(fwd)
        res[f"det={det} cudnn bwd"] = median_ms(bwd)
        if det:  # CUDA graph capture on a side stream
            try:
                side = cp.cuda.Stream(non_blocking=True)
                with side:
                    fwd()
                    bwd()
                    side.synchronize()
                    side.begin_capture()
                    fwd()
                    bwd()
                    graph = side.end_capture()
                    d2[...] = 0
                    graph.launch(side)
                    side.synchronize()
                res["graph replay equals"] = same_bytes(first, d2)
            except Exception as e:
                res["graph replay"] = f"failed: {e!r}"[:300]
    for k, v in res.items():
        print(f"  {k}: {v}", flush=True)


if __name__ == "__main__":
    if _cudnn() is None:
        sys.exit("the cuDNN frontend or library cannot be loaded (pip install nvidia-cudnn-frontend==1.16.0 nvidia-cudnn-cu13)")
    print("cudnn backend", _cudnn().backend_version(), flush=True)
    for shape in [(8, 12, 1024, 64), (32, 12, 1024, 64), (32, 12, 1024, 32), (8, 24, 1024, 64)]:
        try:
            run(*shape)
        except Exception:
            traceback.print_exc()
