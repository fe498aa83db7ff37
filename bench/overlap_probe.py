"""Would the weight-gradient products gain from a second stream? One transformer block's backward with
the backend's own kernels (cuBLASLt products, the GELU and LayerNorm backward passes, cuDNN
attention), run back to back for many blocks, first on one stream, then with the weight gradients
(dW2, dW1, dWo, dWqkv) on a second stream that joins at the end of each block, on all SMs or on
--sm-counts of them (cuBLASLt's SM_COUNT_TARGET), leaving the rest to the memory-bound kernels.

Why: ANDREA-120M's B=32 step averages ~665 W against the H200's 700 W cap (bench/gpu_power.py):
its memory-bound stretches leave power unused that the products could take.

    python3 bench/overlap_probe.py [--batches 32 8] [--blocks 240] [--sm-counts 0 120 100 80] [--residual fp32]

Prints ms per block for each variant and the energy per block (NVML). A probe of the timing only: it
does not keep the model's buffer lifetimes (the engine would need d_branch, a and da kept until the
join), and it recomputes a = gelu(h) as the engine does below 16,384 tokens a pass (above, the engine
keeps a and the first product's DGELU epilogue replaces that pass: ANDREA_GELU).
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
from andrea.engine.cupy.cublaslt import Lt  # noqa: E402
from andrea.engine.cupy.kernels import blocks  # noqa: E402
from gpu_power import PowerMeter  # noqa: E402 (bench/, the script's folder)


class Block:
    """Buffers of one block's backward at ANDREA-120M's width and batch B (T = 1024), with the residual
    stream the engine keeps: bf16 (the default: the branch's gradient is the stream's, one buffer) or
    fp32 (ANDREA_RESIDUAL=fp32: an fp32 gradient and a 16-bit copy of it for the products)."""

    def __init__(self, be: CupyBackend, B: int, T: int = 1024, d: int = 768, H: int = 12, residual: str = "bf16"):
        rng = np.random.default_rng(0)
        m, M, D = B * T, 4 * d, d // H
        self.be, self.m, self.d, self.M = be, m, d, M

        def h16(*shape, scale=1.0):
            return cp.asarray(rng.standard_normal(shape, np.float32) * scale).astype(BF16)

        def f32(*shape, scale=1.0):
            return cp.asarray(rng.standard_normal(shape, np.float32) * scale)

        self.ln2, self.ln1, self.y = h16(m, d), h16(m, d), h16(m, d)
        self.h, self.a, self.da = h16(m, M), h16(m, M), h16(m, M)
        self.w1, self.w2, self.wo, self.wcat = h16(d, M, scale=0.03), h16(M, d, scale=0.03), h16(d, d, scale=0.03), h16(d, 3 * d, scale=0.03)
        self.dx, self.dy = h16(m, d), h16(m, d)
        self.dw1, self.dw2, self.dwo, self.dwqkv = cp.zeros((d, M), cp.float32), cp.zeros((M, d), cp.float32), \
            cp.zeros((d, d), cp.float32), cp.zeros((d, 3 * d), cp.float32)
        stream = h16 if residual == "bf16" else f32
        self.res, self.d_res = stream(B, T, d), stream(B, T, d)
        # the products read the branch's gradient: the stream's own in bf16, a 16-bit copy beside fp32's
        self.branch = self.d_res if residual == "bf16" else h16(B, T, d)
        self.g = self.branch.reshape(m, d)
        self.mean, self.rstd = f32(B, T, scale=0.1), cp.ones((B, T), cp.float32)
        self.gamma, self.dgamma, self.dbeta = cp.ones(d, cp.float32), cp.zeros(d, cp.float32), cp.zeros(d, cp.float32)
        self.qkv, self.dqkv = h16(B, T, 3, H, D, scale=0.5), h16(B, T, 3, H, D)
        self.att_y, self.lse = h16(B, T, d), cp.zeros((B, H, T), cp.float32)
        be.attn_fwd(self.qkv, self.att_y, self.lse)

    def backward(self, main: Lt, side: Lt | None, stream2, sm: int) -> None:
        """One block's backward; with `side`, the weight gradients on stream2 (joined at the end)."""
        be, m, d = self.be, self.m, self.d
        s1 = cp.cuda.get_current_stream()

        def wgrad(a, b, c):
            if side is None:
                main.gemm(a, b, c, ta=True, accumulate=True)
                return
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(s1)
            stream2.wait_event(ev)
            with stream2:
                side.gemm(a, b, c, ta=True, accumulate=True, sm_count=sm)

        main.gemm(self.g, self.w2, self.da, tb=True)  # fc2 dgrad
        be.kernel("elementwise", "gelu_bwd_recompute_h16x8")((blocks(self.da.size // 8),), (256,),
                                                             (self.h, self.da, self.a, np.int64(self.da.size // 8)))
        wgrad(self.a, self.g, self.dw2)
        wgrad(self.ln2, self.da, self.dw1)
        main.gemm(self.da, self.w1, self.dx, tb=True)  # fc1 dgrad
        be.layernorm_bwd(self.dx.reshape(self.res.shape), self.res, self.mean, self.rstd, self.gamma, self.d_res,
                         self.dgamma, self.dbeta, branch=self.branch)
        main.gemm(self.g, self.wo, self.dy, tb=True)  # attention output dgrad
        wgrad(self.y, self.g, self.dwo)
        be.attn_bwd(self.dy.reshape(self.att_y.shape), self.qkv, self.att_y, self.lse, self.dqkv)
        g3 = self.dqkv.reshape(m, 3 * d)
        main.gemm(g3, self.wcat, self.dx, tb=True)  # q/k/v dgrad
        wgrad(self.ln1, g3, self.dwqkv)
        be.layernorm_bwd(self.dx.reshape(self.res.shape), self.res, self.mean, self.rstd, self.gamma, self.d_res,
                         self.dgamma, self.dbeta, branch=self.branch)
        if side is not None:
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(stream2)
            s1.wait_event(ev)


def run(block: Block, n: int, main, side, stream2, sm, meter) -> dict:
    for _ in range(max(4, n // 4)):  # to the steady clock (and every plan made, eagerly)
        block.backward(main, side, stream2, sm)
    cp.cuda.Device().synchronize()
    with meter.measure() as r:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(n):
            block.backward(main, side, stream2, sm)
        end.record()
        end.synchronize()
    return {"ms": cp.cuda.get_elapsed_time(start, end) / n, "mj": r.joules * 1e3 / n, "watts": r.watts, "sm_mhz": r.sm_mhz}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", nargs="+", type=int, default=[32, 8])
    ap.add_argument("--blocks", type=int, default=240, help="blocks timed per variant")
    ap.add_argument("--sm-counts", nargs="+", type=int, default=[0, 120, 100, 80])
    ap.add_argument("--residual", choices=["bf16", "fp32"], default="bf16",
                    help="the residual stream's type (the engine's default bf16, or ANDREA_RESIDUAL=fp32's)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    meter = PowerMeter.open()
    if meter is None:
        sys.exit("overlap_probe: NVML (libnvidia-ml.so.1) is not available on this machine")
    cp.cuda.Stream(non_blocking=True).use()  # the main stream: not the legacy one, which waits for every other
    be = CupyBackend("bf16")
    main_lt, side_lt = Lt(), Lt()
    stream2 = cp.cuda.Stream(non_blocking=True)
    results = []
    for B in args.batches:
        block = Block(be, B, residual=args.residual)
        n = args.blocks * 32 // B
        variants = [("one stream", None, 0)] + [(f"side stream, {s or 'all'} SMs", side_lt, s) for s in args.sm_counts]
        rows = []
        for rnd in range(2):  # twice, interleaved, so drift shows
            for name, side, sm in variants:
                r = run(block, n, main_lt, side, stream2, sm, meter) | {"variant": name, "B": B, "round": rnd,
                                                                     "residual": args.residual}
                rows.append(r)
        print(f"\n## ANDREA-120M block backward, B={B}, {args.residual} residual stream ({n} blocks a variant, two rounds)")
        print("| variant | ms/block | mJ/block | W | SM MHz |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['variant']} (round {r['round'] + 1}) | {r['ms']:.3f} | {r['mj']:.0f} | {r['watts']:.0f} | {r['sm_mhz']:.0f} |")
        sys.stdout.flush()
        results += rows
        del block
        cp.get_default_memory_pool().free_all_blocks()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
