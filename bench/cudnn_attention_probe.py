"""cuDNN's fused attention (frontend 1.16 pygraph) built by hand on our [B, T, 3, H, D] buffers, against
our flash kernels: agreement (y, lse, dq/dk/dv), repeatability of the backward with and without the
deterministic algorithm, CUDA-graph capture, and time per call, at the model shapes.

    PYTHONPATH=/tmp/site python3 bench/cudnn_attention_probe.py   (the frontend wheel in .whl, installed there)

This probe decided andrea/engine/cupy/cudnn_attention.py; its output of 2026-12-01 on the H200 is in
bench/results/2026-12-01/cudnn/probe.txt.
"""

import math
import sys
import traceback

sys.path.insert(0, ".")
import cudnn  # noqa: E402
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from andrea.engine.cupy import BF16, CupyBackend  # noqa: E402
from gpu_timing import median_ms  # noqa: E402 (bench/, the script's folder)

print("cudnn backend", cudnn.backend_version(), "frontend", getattr(cudnn, "__version__", "?"), flush=True)
handle = cudnn.create_handle()
BFT = cudnn.data_type.BFLOAT16
F32 = cudnn.data_type.FLOAT


def build(B, H, T, D, det):
    sq = [T * 3 * H * D, D, 3 * H * D, 1]
    so = [T * H * D, D, H * D, 1]
    dims = [B, H, T, D]
    scale = 1.0 / math.sqrt(D)
    f = cudnn.pygraph(io_data_type=BFT, intermediate_data_type=F32, compute_data_type=F32, handle=handle)
    q, k, v = (f.tensor(name=n, dim=dims, stride=sq, data_type=BFT) for n in "qkv")
    o, st = f.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True, attn_scale=scale, use_causal_mask=True)
    o.set_output(True).set_dim(dims).set_stride(so).set_data_type(BFT)
    st.set_output(True).set_data_type(F32).set_dim([B, H, T, 1]).set_stride([H * T, T, 1, 1])
    f.validate()
    f.build_operation_graph()
    f.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    f.check_support()
    f.build_plans()
    b = cudnn.pygraph(io_data_type=BFT, intermediate_data_type=F32, compute_data_type=F32, handle=handle)
    q2, k2, v2 = (b.tensor(name=n, dim=dims, stride=sq, data_type=BFT) for n in "qkv")
    o2 = b.tensor(name="o", dim=dims, stride=so, data_type=BFT)
    do = b.tensor(name="do", dim=dims, stride=so, data_type=BFT)
    st2 = b.tensor(name="stats", dim=[B, H, T, 1], stride=[H * T, T, 1, 1], data_type=F32)
    kw = dict(use_deterministic_algorithm=True) if det else {}
    dq, dk, dv = b.sdpa_backward(
        name="bwd", q=q2, k=k2, v=v2, o=o2, dO=do, stats=st2, attn_scale=scale, use_causal_mask=True, **kw
    )
    for t in (dq, dk, dv):
        t.set_output(True).set_dim(dims).set_stride(sq).set_data_type(BFT)
    b.validate()
    b.build_operation_graph()
    b.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    b.check_support()
    b.build_plans()
    return (f, (q, k, v, o, st)), (b, (q2, k2, v2, o2, do, st2, dq, dk, dv))


def run(B, H, T, D):
    rng = np.random.default_rng(0)
    be = CupyBackend("bf16")
    qkv = cp.asarray(rng.standard_normal((B, T, 3, H, D), np.float32)).astype(BF16)
    dy = cp.asarray(rng.standard_normal((B, T, H * D), np.float32)).astype(BF16)
    y, lse = cp.empty((B, T, H * D), BF16), cp.empty((B, H, T), cp.float32)
    dqkv = cp.empty_like(qkv)
    be.attn_fwd(qkv, y, lse)
    be.attn_bwd(dy, qkv, y, lse, dqkv)
    t_f = median_ms(lambda: be.attn_fwd(qkv, y, lse))
    t_b = median_ms(lambda: be.attn_bwd(dy, qkv, y, lse, dqkv))
    res = {"shape": (B, H, T, D), "ours fwd": t_f, "ours bwd": t_b}
    for det in (True, False):
        (f, ft), (b, bt) = build(B, H, T, D, det)
        ws = cp.empty(max(f.get_workspace_size(), b.get_workspace_size(), 1), cp.uint8)
        y2, st = cp.empty_like(y), cp.empty((B, H, T, 1), cp.float32)
        d2 = cp.empty_like(qkv)
        base, dbase, hd = qkv.data.ptr, d2.data.ptr, H * D * 2
        q, k, v, o, s = ft
        fp = {q: base, k: base + hd, v: base + 2 * hd, o: y2.data.ptr, s: st.data.ptr}
        q2, k2, v2, o2, do, st2, dq, dk, dv = bt
        bp = {
            q2: base,
            k2: base + hd,
            v2: base + 2 * hd,
            o2: y2.data.ptr,
            do: dy.data.ptr,
            st2: st.data.ptr,
            dq: dbase,
            dk: dbase + hd,
            dv: dbase + 2 * hd,
        }
        cudnn.set_stream(handle=handle, stream=cp.cuda.get_current_stream().ptr)
        try:
            f.execute(fp, ws.data.ptr, handle=handle)
        except TypeError as e:
            print("int pointers refused:", e, flush=True)
            raise
        b.execute(bp, ws.data.ptr, handle=handle)
        cp.cuda.Device().synchronize()
        def rel(a, c):
            return float(cp.linalg.norm(a.astype(cp.float32) - c.astype(cp.float32)) / cp.linalg.norm(c.astype(cp.float32)))

        res[f"det={det} rel y"] = rel(y2, y)
        res[f"det={det} rel lse"] = rel(st.reshape(B, H, T), lse)
        res[f"det={det} rel dqkv"] = [rel(d2[:, :, i], dqkv[:, :, i]) for i in range(3)]
        first = d2.copy()
        b.execute(bp, ws.data.ptr, handle=handle)
        cp.cuda.Device().synchronize()
        res[f"det={det} bwd repeat identical"] = bool((first.view(cp.uint16) == d2.view(cp.uint16)).all())
        res[f"det={det} cudnn fwd"] = median_ms(lambda: f.execute(fp, ws.data.ptr, handle=handle))
        res[f"det={det} cudnn bwd"] = median_ms(lambda: b.execute(bp, ws.data.ptr, handle=handle))
        if det:  # CUDA graph capture on a side stream
            try:
                s_ = cp.cuda.Stream(non_blocking=True)
                with s_:
                    cudnn.set_stream(handle=handle, stream=s_.ptr)
                    f.execute(fp, ws.data.ptr, handle=handle)
                    b.execute(bp, ws.data.ptr, handle=handle)
                    s_.synchronize()
                    s_.begin_capture()
                    f.execute(fp, ws.data.ptr, handle=handle)
                    b.execute(bp, ws.data.ptr, handle=handle)
                    gr = s_.end_capture()
                    d2[...] = 0
                    gr.launch(s_)
                    s_.synchronize()
                res["graph replay equals"] = bool((first.view(cp.uint16) == d2.view(cp.uint16)).all())
            except Exception as e:
                res["graph replay"] = f"failed: {e!r}"[:300]
            cudnn.set_stream(handle=handle, stream=cp.cuda.get_current_stream().ptr)
    for k_, v_ in res.items():
        print(f"  {k_}: {v_}", flush=True)


for shape in [(8, 12, 1024, 64), (32, 12, 1024, 64), (32, 12, 1024, 32), (8, 24, 1024, 64)]:
    try:
        run(*shape)
    except Exception:
        traceback.print_exc()
