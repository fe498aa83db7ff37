"""Hopper warp-group (wgmma) flash attention (andrea/kernels/attention_wgmma.cu, sm_90a only), every
variant checked against andrea/engine/numpy_backend.attn_fwd / attn_bwd and timed beside the production
mma.sync kernels (attention_mma's flash_fwd and flash_bwd), PyTorch's scaled_dot_product_attention with
its flash and its cuDNN backends (where torch has them), and our cuDNN path
(andrea/engine/cupy/cudnn_attention.py, where the frontend is installed), at ANDREA-12M, -120M and -480M
(config/config.yaml `models:`) with B=8 and B=32; a summary table at the end puts the best wgmma
variant of each shape beside each yardstick.

    python3 dev/cuda/attention_wgmma.py                 # edge shapes (bf16, fp16), then the models (bf16)
    python3 dev/cuda/attention_wgmma.py --models-only   # the model shapes alone
    python3 dev/cuda/attention_wgmma.py --quick         # edge shapes and ANDREA-tiny B=2 (run_all --quick)
    options: --fp16-models (the models in fp16 too), --no-probe, --reps N, --jobs N, --json FILE

The kernels are built by the launcher's own loader (andrea/engine/cupy/attention_wgmma.py: NVRTC with
-arch=sm_90a, the cubin loaded by cupy.cuda.function.Module), not by common.build (CuPy's RawModule
cannot target sm_90a); every variant's cubins are compiled first, in --jobs parallel processes, into a
cache folder (ANDREA_WGMMA_CUBIN_CACHE) the rest of the run reads. The variants new since the last
device run (NEW below) then go through a probe in a child process, one launch each at small shapes:
a kernel that faults or hangs (the mbarrier and semaphore waits trap after ~2^22 polls instead of
hanging) takes only the child's CUDA context down; it gets a failed row here and the rest runs.
On Hopper the engine runs "ws pingpong persistent skip" (forward) and "wgmma 1wg overlap" (backward)
(attention_wgmma.PRODUCTION_FWD, PRODUCTION_BWD); the other versions are marked (dev). Forward (-D defines):

wgmma            the defaults: 2 consumer warp groups (128 query rows a CTA), 64-key tiles, 3 stages,
                 intra-warpgroup overlap (S_j = Q·K_jᵀ issued before P_{j-1}·V_{j-1}; the softmax of
                 S_j while that runs); registers held for 2 CTAs per SM
wgmma no overlap -DFWD_OVERLAP=0: each tile's P·V after its own softmax
wgmma bn128      -DFWD_BN=128: 128-key tiles (twice the scores in registers: 1 CTA per SM)
wgmma 3wg        -DFWD_WG=3: 192 query rows a CTA (as FlashAttention-3 at head size 64)
wgmma 1wg        -DFWD_WG=1: 64 query rows a CTA
wgmma 4 stages   -DFWD_STAGES=4: each K/V tile fetched two iterations ahead
wgmma skip       -DFWD_SKIP_RESCALE=1: a warp whose row maxima all stayed skips O's rescaling (exact)
ws ...           -DFWD_WS=1: warp-specialized, FA-3's way: a producer warp group moves Q and the K/V tiles
                 with TMA (tensor maps over the qkv buffer), mbarrier full/empty stages, setmaxnreg
                 moving registers to the consumers. ws bn64: 64-key tiles; ws: 128-key tiles (3 stages);
                 ws 2 stages; ws pingpong (-DFWD_PINGPONG=1: the consumers' products in turns, named
                 barriers); ws 3wg (192 rows, 3 consumers); ws 1wg minb2 (1 consumer, 2 CTAs an SM);
                 ... persistent (the launcher's FWD_PERSIST=1: as many CTAs as the SMs hold, each
                 looping over the tiles longest first, the next tile's loads under this one's epilogue)
Backward (flash_bwd_dq, flash_bwd_dkdv and the whole flash_bwd, flash_bwd_prep (delta) first; the
fused ones flash_bwd_prep + flash_bwd_fused (+ flash_bwd_dq_convert)):
wgmma            the defaults: dQ with 2 warp groups (128 query rows a CTA) over 64-key tiles, dK/dV with 2
                 warp groups (128 keys a CTA) over 64-query tiles, 3 stages each
wgmma 1wg        -DDQ_WG=1 -DKV_WG=1: 64 rows (keys) a CTA, more CTAs per SM
wgmma bn128      -DDQ_BN=128 -DKV_BM=128: 128-wide streamed tiles
wgmma 4 stages   -DDQ_STAGES=4 -DKV_STAGES=4
wgmma overlap    -DKV_OVERLAP=1: dK/dV's products of tile m − 1 run under tile m's softmax (also 1wg)
fused atomic     one pass, dq summed with fp32 atomics (flash_bwd(deterministic=False)): NOT
                 deterministic, so held to the tolerance only; 2 or 1 warp groups, with overlap
fused ordered    one pass, the key blocks' dq sums in a fixed order through semaphores
                 (flash_bwd(fused=True)); deterministic; 2 or 1 warp groups, with and without overlap
Every deterministic backward is run twice and must give the same bytes.
mma.sync         attention_mma.flash_fwd / flash_bwd, production today (checked as well)
torch flash, torch cudnn   PyTorch's SDPA with one backend allowed (a yardstick: its error is shown)
cudnn            our cuDNN path (a yardstick: its error is shown)
Inputs bf16 or fp16 (the fp16 build has -DANDREA_FP16): q, k, v in one [B, T, 3, H, D] buffer as the
QKV projection writes it; y [B, T, H·D]; lse [B, H, T] fp32. y and lse are allocated with a guard
band after them that must stay untouched. Edge shapes are checked whole; model shapes on the first and
last sequence and the first and last head (their inputs are the same at B=8 and B=32, so one NumPy
reference serves both). On a GPU other than compute capability 9.0 (sm_90a code runs nowhere else) each
shape gets one row that says so, and nothing is checked.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings

import common
import numpy as np

from andrea.engine import numpy_backend as nb

SCRIPT = "attention_wgmma"
REFERENCES = {"flash_fwd": nb.attn_fwd, "flash_bwd_dq": nb.attn_bwd, "flash_bwd_dkdv": nb.attn_bwd, "flash_bwd": nb.attn_bwd}
V = common.Version
H16 = ("bf16", "fp16")
SRC = "attention_wgmma.cu"
# the variants attention.py dispatches on Hopper (their defines are attention_wgmma.PRODUCTION_FWD and
# PRODUCTION_BWD: main() checks); every other version is a dev version
PRODUCTION = {"fwd": "ws pingpong persistent skip", "bwd": "wgmma 1wg overlap"}
WS = ("FWD_WS=1",)
# (name, -D defines, new: not yet run on the device, so probed first)
FWD_VARIANTS = [
    ("wgmma", (), False),
    ("wgmma no overlap", ("FWD_OVERLAP=0",), False),
    ("wgmma bn128", ("FWD_BN=128",), False),
    ("wgmma 3wg", ("FWD_WG=3",), False),
    ("wgmma 1wg", ("FWD_WG=1",), False),
    ("wgmma 4 stages", ("FWD_STAGES=4",), False),
    ("wgmma skip", ("FWD_SKIP_RESCALE=1",), True),
    ("ws bn64", WS, True),
    ("ws", WS + ("FWD_BN=128",), True),
    ("ws 2 stages", WS + ("FWD_BN=128", "FWD_STAGES=2"), True),
    ("ws pingpong", WS + ("FWD_BN=128", "FWD_PINGPONG=1"), True),
    ("ws pingpong no overlap", WS + ("FWD_BN=128", "FWD_PINGPONG=1", "FWD_OVERLAP=0"), True),
    ("ws 3wg", WS + ("FWD_WG=3", "FWD_BN=128"), True),
    ("ws 3wg pingpong", WS + ("FWD_WG=3", "FWD_BN=128", "FWD_PINGPONG=1"), True),
    ("ws 1wg minb2", WS + ("FWD_WG=1", "FWD_MINB=2"), True),
    ("ws persistent", WS + ("FWD_BN=128", "FWD_PERSIST=1"), True),
    ("ws pingpong persistent skip", WS + ("FWD_BN=128", "FWD_PINGPONG=1", "FWD_PERSIST=1", "FWD_SKIP_RESCALE=1"), True),
    ("ws 3wg pingpong persistent", WS + ("FWD_WG=3", "FWD_BN=128", "FWD_PINGPONG=1", "FWD_PERSIST=1"), True),
]
# (name, -D defines, deterministic, fused, new)
BWD_VARIANTS = [
    ("wgmma", (), True, False, False),
    ("wgmma 1wg", ("DQ_WG=1", "KV_WG=1"), True, False, False),
    ("wgmma bn128", ("DQ_BN=128", "KV_BM=128"), True, False, False),
    ("wgmma 4 stages", ("DQ_STAGES=4", "KV_STAGES=4"), True, False, False),
    ("wgmma overlap", ("KV_OVERLAP=1",), True, False, True),
    ("wgmma 1wg overlap", ("DQ_WG=1", "KV_WG=1", "KV_OVERLAP=1"), True, False, True),
    ("fused atomic", ("KV_OVERLAP=1",), False, True, True),
    ("fused atomic 1wg", ("KV_WG=1", "KV_OVERLAP=1"), False, True, True),
    ("fused ordered", ("KV_OVERLAP=1",), True, True, True),
    ("fused ordered 1wg", ("KV_WG=1", "KV_OVERLAP=1"), True, True, True),
    ("fused ordered no overlap", (), True, True, True),
    ("fused ordered 1wg no overlap", ("KV_WG=1",), True, True, True),
]
SPLIT_KERNELS = {"flash_bwd_dq": ("flash_bwd_dq",), "flash_bwd_dkdv": ("flash_bwd_dkdv",),
                 "flash_bwd": ("flash_bwd_prep", "flash_bwd_dq", "flash_bwd_dkdv")}


def fused_kernels(deterministic: bool) -> tuple:
    return ("flash_bwd_prep", "flash_bwd_fused") + (() if deterministic else ("flash_bwd_dq_convert",))


VERSIONS = [V("flash_fwd", name, ("flash_fwd",), SRC, H16, defines, production=name == PRODUCTION["fwd"])
            for name, defines, _ in FWD_VARIANTS]
for _name, _defines, _det, _fused, _ in BWD_VARIANTS:
    if _fused:
        VERSIONS.append(V("flash_bwd", _name, fused_kernels(_det), SRC, H16, _defines, production=_name == PRODUCTION["bwd"]))
    else:
        VERSIONS += [V(op, _name, kernels, SRC, H16, _defines, production=_name == PRODUCTION["bwd"])
                     for op, kernels in SPLIT_KERNELS.items()]
EDGE = [common.Shape("edge B=2 T=200 D=64", 2, 200, 192, 3, 301),  # T not a multiple of any tile
        common.Shape("edge B=2 T=129 D=32", 2, 129, 96, 3, 301),  # one row past a 128-row CTA
        common.Shape("edge B=1 T=37 D=16", 1, 37, 16, 1, 301),  # the smallest head, one partial tile
        common.Shape("edge B=1 T=1 D=64", 1, 1, 64, 1, 301),  # a single query and key
        common.Shape("edge B=4 T=1024 H=12 D=64", 4, 1024, 768, 12, 301)]  # persistent CTAs: several tiles each
MODELS = ("ANDREA-12M", "ANDREA-120M", "ANDREA-480M")
BATCHES = (8, 32)
GUARD = 4096  # elements after y and lse that the kernels must leave alone
GUARD_BITS, GUARD_LSE = 0xABCD, -7.0  # what the guard bands hold (0xABCD: a finite bf16 and fp16)
YARDSTICKS = ("mma.sync", "torch flash", "torch cudnn", "cudnn")


def guard_intact(whole, fill, what):
    tail = whole[-GUARD:].get()
    bad = int(np.count_nonzero(tail != np.asarray(fill, tail.dtype)))
    return common.Err(float(bad), 0.0 if bad == 0 else math.inf, True, f"{what}: {bad} guard elements overwritten" if bad else "")


def be_defines(prec: str) -> tuple:
    return ("ANDREA_FP16",) if prec == "fp16" else ()


# ----------------------------------------------------------------------------- building in parallel


def builds(head_dims, precisions) -> list:
    """Every (head dim, compile defines) the run loads: each variant of each direction."""
    from andrea.engine.cupy import attention_wgmma as wg

    out = []
    for D in head_dims:
        for prec in precisions:
            extra = be_defines(prec)
            out += [(D, wg.compile_defines(defines + extra, wg.FWD_KERNELS)) for _, defines, _ in FWD_VARIANTS]
            out += [(D, wg.compile_defines(defines + extra, wg.BWD_FUSED_KERNELS if fused else wg.BWD_SPLIT_KERNELS))
                    for _, defines, _, fused, _ in BWD_VARIANTS]
    return sorted(set(out))


def precompile(jobs: list, workers: int) -> None:
    """NVRTC every build in `workers` processes (spawned: no CUDA context is shared) into the cubin cache."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from andrea.engine.cupy import attention_wgmma as wg

    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(wg.cubin, "attention_wgmma", D, defines) for D, defines in jobs]
        for f in futures:
            f.result()  # a compile error surfaces here, before any GPU work
    print(f"{SCRIPT}: {len(jobs)} cubins built in {time.perf_counter() - t0:.0f} s ({workers} processes)", flush=True)


# ----------------------------------------------------------------------------- the probe of new variants

PROBE_SHAPES = [(2, 200, 3, 64), (2, 129, 3, 32), (1, 37, 1, 16), (1, 1, 1, 64), (4, 1024, 12, 64), (2, 1024, 4, 32)]


def probe_child(names: list) -> int:
    """One launch of each named variant ("fwd:<name>" / "bwd:<name>") at PROBE_SHAPES, synchronized,
    bf16; a tab-separated line per start and outcome. A CUDA error ends the process (its context is gone)."""
    import cupy as cp

    from andrea.engine.cupy import attention_wgmma as wg
    from andrea.engine.cupy.backend import CupyBackend

    be = CupyBackend("bf16")
    fwd = {f"fwd:{n}": d for n, d, _ in FWD_VARIANTS}
    bwd = {f"bwd:{n}": (d, det, fused) for n, d, det, fused, _ in BWD_VARIANTS}
    for key in names:
        print(f"PROBE-START\t{key}", flush=True)
        try:
            for B, T, H, D in PROBE_SHAPES:
                qkv = cp.random.standard_normal((B, T, 3, H, D), dtype=cp.float32).astype(be.half)
                y, lse = cp.zeros((B, T, H * D), be.half), cp.zeros((B, H, T), cp.float32)
                if key in fwd:
                    wg.flash_fwd(be, qkv, y, lse, fwd[key])
                else:
                    wg.flash_fwd(be, qkv, y, lse)
                    dy = cp.random.standard_normal((B, T, H * D), dtype=cp.float32).astype(be.half)
                    defines, det, fused = bwd[key]
                    wg.flash_bwd(be, dy, qkv, y, lse, cp.zeros_like(qkv), defines, deterministic=det, fused=fused)
                cp.cuda.Device().synchronize()
        except (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError) as err:
            print(f"PROBE-FAULT\t{key}\t{type(err).__name__}: {err}", flush=True)
            return 3
        except Exception as err:  # noqa: BLE001 - a compile or argument error: reported, the next one runs
            print(f"PROBE-ERR\t{key}\t{type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        print(f"PROBE-OK\t{key}", flush=True)
    return 0


def probe(names: list, timeout: float = 120) -> dict:
    """{variant key: why it failed} for the new variants, each run in a child process (probe_child)
    until every one has an outcome: a fault or a hang costs the child, not this process."""
    failed, left = {}, list(names)
    while left:
        cmd = [sys.executable, os.path.abspath(__file__), "--probe-child", ",".join(left)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        started, done = None, set()
        for line in out.splitlines():
            tag, _, rest = line.partition("\t")
            key, _, why = rest.partition("\t")
            if tag == "PROBE-START":
                started = key
            elif tag in ("PROBE-OK", "PROBE-ERR", "PROBE-FAULT"):
                done.add(key)
                if tag != "PROBE-OK":
                    failed[key] = f"{tag.split('-')[1].lower()} in the probe: {why}"
        if started is not None and started not in done:  # killed, or died without a word
            failed[started] = f"hung or crashed in the probe (exit {proc.returncode}): {out[-300:]!r}"
            done.add(started)
        if not done:  # nothing ran (an import error, say): no use retrying
            for key in left:
                failed[key] = f"the probe did not start: {out[-300:]!r}"
            break
        left = [k for k in left if k not in done]
    return failed


# ----------------------------------------------------------------------------- one shape


class Case:
    """The inputs of one shape and precision on the device (q, k, v, dy random; the checked sequences
    and heads as NumPy values) and the references there, shared with a smaller batch of the same model."""

    def __init__(self, cp, shape, prec, rng, sub, heads, source=None):
        from andrea.engine.cupy.backend import CupyBackend

        B, T, H, D, C = shape.B, shape.T, shape.H, shape.D, shape.C
        self.shape, self.prec, self.sub, self.heads = shape, prec, sub, heads
        self.be = be = CupyBackend(prec)
        if source is None:  # random on the device (or exact host values for small shapes)
            if B * T * C <= 1 << 20:
                qkv = common.rounded(rng.standard_normal((B, T, 3, H, D)), prec)
                dy = common.rounded(rng.standard_normal((B, T, C)), prec)
                self.qkv16 = cp.asarray(common.to_h16(qkv, prec))
                self.dy16 = cp.asarray(common.to_h16(dy, prec))
            else:
                gen = cp.random.default_rng(int(rng.integers(1 << 30)))
                self.qkv16 = gen.standard_normal((B, T, 3, H, D), dtype=cp.float32).astype(be.half).view(cp.uint16)
                self.dy16 = gen.standard_normal((B, T, C), dtype=cp.float32).astype(be.half).view(cp.uint16)
        else:  # the batch's first B − 1 sequences and its last: the checked ones the same as in `source`
            self.qkv16 = cp.concatenate([source.qkv16[:B - 1], source.qkv16[-1:]])
            self.dy16 = cp.concatenate([source.dy16[:B - 1], source.dy16[-1:]])
        self.qkv, self.dy = self.qkv16.view(be.half), self.dy16.view(be.half)
        # the checked values: [3, len(sub), len(heads), T, D] and [len(sub), T, len(heads)·D]
        q = common.from_h16(self.qkv16[sub].get(), prec)
        self.qkv_s = np.ascontiguousarray(q.transpose(2, 0, 3, 1, 4)[:, :, heads])
        self.dy_s = common.from_h16(self.dy16[sub].get(), prec).reshape(len(sub), T, H, D)[:, :, heads].reshape(len(sub), T, -1)
        self.ref = source.ref if source is not None else {}

    def pick(self, host_btc):
        """[len(sub), T, H·D] values -> the checked heads, [len(sub), T, len(heads)·D]."""
        n, T, _ = host_btc.shape
        return host_btc.reshape(n, T, self.shape.H, self.shape.D)[:, :, self.heads].reshape(n, T, -1)


def run_shape(cp, report, shape, case, reps, failed, yardsticks=True):
    from andrea.engine.cupy import attention_mma, cudnn_attention
    from andrea.engine.cupy import attention_wgmma as wg

    prec, be, sub, heads = case.prec, case.be, case.sub, case.heads
    B, T, H, D, C = shape.B, shape.T, shape.H, shape.D, shape.C
    Hc, BH, scale = len(heads), B * H, 1.0 / math.sqrt(D)
    u32, u16 = common.u("fp32"), common.u(prec)
    if D not in wg.HEAD_DIMS:
        raise ValueError(f"{shape.name}: head size {D}; attention_wgmma takes {wg.HEAD_DIMS}")
    qkv_s = case.qkv_s
    if "fwd" not in case.ref:
        y_ref, lse_ref = np.empty((len(sub), T, Hc * D)), np.empty((len(sub), Hc, T))
        nb.attn_fwd(qkv_s, y_ref, lse_ref)
        case.ref["fwd"] = (y_ref, lse_ref)
    y_ref, lse_ref = case.ref["fwd"]
    # as dev/cuda/attention_mma.py: scores are fp32 sums of exact products of 16-bit values (2·s_err for
    # the tensor cores' truncating accumulation); P as the A operand of P·v rounded to 16 bits (u16), the
    # row sum not (another u16); T-term fp32 sums; the output rounded once
    s_err = 2 * common.score_error(qkv_s[0], qkv_s[1], scale)
    c_fwd = 2 * s_err + 2 * u16 + (T + 10) * u32
    y_abs = common.attention_abs(qkv_s[0], qkv_s[1], qkv_s[2], lse_ref, scale)["y"]
    flops = 2 * BH * T * T * D  # causal: q·kᵀ and P·v over half of the T × T scores

    y_whole = cp.full(B * T * C + GUARD, GUARD_BITS, cp.uint16)  # 16-bit bits; the kernels see be.half
    lse_whole = cp.full(B * H * T + GUARD, GUARD_LSE, cp.float32)
    y16 = y_whole[:B * T * C].reshape(B, T, C)
    y, lse = y16.view(be.half), lse_whole[:B * H * T].reshape(B, H, T)

    def check():
        got = common.heads(case.pick(common.from_h16(y16[sub].get(), prec)), Hc)
        err = common.compare(got, common.heads(y_ref, Hc), rtol=u16, atol=c_fwd * y_abs + common.tiny(prec), what="y")
        err = err.worst(common.compare(lse[sub].get()[:, heads], lse_ref, rtol=u32, atol=c_fwd, what="lse"))
        return err.worst(guard_intact(y_whole, GUARD_BITS, "y")).worst(guard_intact(lse_whole, GUARD_LSE, "lse"))

    def timed(run):
        y16.fill(0)
        lse.fill(0)
        run()
        err = check()
        ms = common.bench(cp, run, reps)
        return err, ms, common.tflops(flops, ms)

    for name, defines, _ in FWD_VARIANTS:
        if f"fwd:{name}" in failed:
            row = report.add("flash_fwd", name, prec, shape, production=name == PRODUCTION["fwd"], note=failed[f"fwd:{name}"][:200])
            row.ok = False
            continue
        report.attempt("flash_fwd", name, prec, shape, lambda d=defines: timed(lambda: wg.flash_fwd(be, case.qkv, y, lse, d)),
                       name == PRODUCTION["fwd"])
    report.attempt("flash_fwd", "mma.sync", prec, shape, lambda: timed(lambda: attention_mma.flash_fwd(be, case.qkv, y, lse)),
                   production=True)

    if yardsticks and cudnn_attention._cudnn() is not None and cudnn_attention.takes(case.qkv, y, lse):
        cudnn = cudnn_attention.CudnnAttention()
        y16.fill(0)
        if cudnn.fwd(be, case.qkv, y, lse):  # a yardstick: its error is shown, not held to our tolerance
            err = check()
            ms = common.bench(cp, lambda: cudnn.fwd(be, case.qkv, y, lse), reps)
            report.add("flash_fwd", "cudnn", prec, shape, ms=ms, rate=common.tflops(flops, ms), production=False,
                       note=f"yardstick, max err {err.max_err:.2e}, err/tol {err.ratio:.3f}")
        else:
            report.add("flash_fwd", "cudnn", prec, shape, production=False, note="yardstick: cuDNN refused the shape")

    run_backward(cp, report, shape, case, reps, y, lse, s_err, failed, yardsticks)
    if yardsticks:
        torch_yardsticks(cp, report, shape, case, reps, y_ref)


def run_backward(cp, report, shape, case, reps, y, lse, s_err, failed, yardsticks=True):
    """dQ, dK/dV and the whole backward of every variant, from the default forward's y and lse (the
    reference is given the same values); the mma.sync and cuDNN backwards beside them."""
    from andrea.engine.cupy import attention_mma, cudnn_attention
    from andrea.engine.cupy import attention_wgmma as wg

    prec, be, sub, heads = case.prec, case.be, case.sub, case.heads
    B, T, H, D, C = shape.B, shape.T, shape.H, shape.D, shape.C
    Hc, BH, scale = len(heads), B * H, 1.0 / math.sqrt(D)
    u32, u16 = common.u("fp32"), common.u(prec)
    qkv_s, dy_s = case.qkv_s, case.dy_s
    wg.flash_fwd(be, case.qkv, y, lse)
    y_in = case.pick(common.from_h16(y.view(cp.uint16)[sub].get(), prec))
    lse_in = lse[sub].get()[:, heads].astype(np.float64)
    key = (y_in.tobytes(), lse_in.tobytes())
    if case.ref.get("bwd_key") != key:  # the same inputs give the same forward: once per model
        dqkv_ref = np.empty_like(qkv_s)
        nb.attn_bwd(dy_s, qkv_s, y_in, lse_in, dqkv_ref)
        delta_ref = (common.heads(dy_s, Hc) * common.heads(y_in, Hc)).sum(-1)
        terms = common.attention_abs(qkv_s[0], qkv_s[1], qkv_s[2], lse_in, scale, common.heads(dy_s, Hc), delta_ref)
        case.ref["bwd_key"], case.ref["bwd"] = key, (dqkv_ref, terms)
    dqkv_ref, terms = case.ref["bwd"]
    # as dev/cuda/attention_mma.py: P recomputed (2·s_err); dS (or P) rounded to 16 bits as an operand
    # (u16); dP and delta D-term fp32 sums; the outputs T-term fp32 sums rounded once (rtol u16). The
    # atomic and ordered sums of dq add the key blocks' fp32 parts in another order: within the T-term bound
    c_bwd = 2 * s_err + 2 * u16 + (T + 2 * D + 10) * u32
    dqkv16 = cp.zeros((B, T, 3, H, D), cp.uint16)
    dqkv = dqkv16.view(be.half)
    index = {"dq": 0, "dk": 1, "dv": 2}
    outputs = {"flash_bwd_dq": ("dq",), "flash_bwd_dkdv": ("dk", "dv"), "flash_bwd": ("dq", "dk", "dv")}
    products = {"flash_bwd_dq": 3, "flash_bwd_dkdv": 4, "flash_bwd": 5}  # causal: half of T² per product

    def check(names):
        err = common.Err()
        got_all = common.from_h16(dqkv16[sub].get(), prec)[:, :, :, heads]  # [n, T, 3, Hc, D]
        for name in names:
            got = got_all[:, :, index[name]].transpose(0, 2, 1, 3)
            err = err.worst(common.compare(got, dqkv_ref[index[name]], rtol=u16, atol=c_bwd * terms[name] + common.tiny(prec),
                                           what=name))
        return err

    def case_run(run, names, flops, deterministic=True):
        dqkv16.fill(0)
        run()
        err = check(names)
        if deterministic:  # the very same bytes a second time (compared on the device)
            first = dqkv16.copy()
            dqkv16.fill(0)
            run()
            diff = int(cp.count_nonzero(dqkv16 != first))
            err = err.worst(common.Err(float(diff), 0.0 if diff == 0 else math.inf, True,
                                       f"bytes of a second run: {diff} differ" if diff else ""))
        ms = common.bench(cp, run, reps)
        return err, ms, common.tflops(flops, ms)

    def one(kernel_name, defines):
        """One backward kernel of the two-kernel path alone, after the delta of the whole (flash_bwd
        writes it first)."""
        defines = defines + tuple(be.defines)
        rows, threads, smem = wg.launch(kernel_name, D, defines)
        f = wg.wg_kernel(kernel_name, D, defines, smem)
        flat, dflat = case.qkv.reshape(-1), dqkv.reshape(-1)
        q, k, v = flat, flat[H * D:], flat[2 * H * D:]
        delta = be.scratch("flash_delta", (B, H, T), cp.float32)
        outs = (dflat,) if kernel_name == "flash_bwd_dq" else (dflat[H * D:], dflat[2 * H * D:])
        strides = (np.int64(T * 3 * C), np.int64(3 * C), np.int64(D))
        args = (q, k, v, case.dy, lse, delta) + outs + (np.int32(H), np.int32(T)) + strides + (np.float32(scale),)
        return lambda: f(((T + rows - 1) // rows, BH), (threads,), args, shared_mem=smem)

    for name, defines, det, fused, _ in BWD_VARIANTS:
        if f"bwd:{name}" in failed:
            row = report.add("flash_bwd", name, prec, shape, production=name == PRODUCTION["bwd"], note=failed[f"bwd:{name}"][:200])
            row.ok = False
            continue
        whole = lambda d=defines, det=det, fused=fused: wg.flash_bwd(be, case.dy, case.qkv, y, lse, dqkv, d, deterministic=det,  # noqa: E731
                                                                      fused=fused)
        if fused:
            report.attempt("flash_bwd", name, prec, shape,
                           lambda run=whole, det=det: case_run(run, outputs["flash_bwd"], products["flash_bwd"] * BH * T * T * D, det),
                           name == PRODUCTION["bwd"])
            continue
        for op in SPLIT_KERNELS:
            if op == "flash_bwd":
                run = whole
            else:
                whole()  # delta, and compiled
                run = one(op, defines)
            report.attempt(op, name, prec, shape, lambda run=run, op=op: case_run(run, outputs[op], products[op] * BH * T * T * D),
                           name == PRODUCTION["bwd"])
    report.attempt("flash_bwd", "mma.sync", prec, shape,
                   lambda: case_run(lambda: attention_mma.flash_bwd(be, case.dy, case.qkv, y, lse, dqkv), outputs["flash_bwd"],
                                    products["flash_bwd"] * BH * T * T * D), production=True)

    if yardsticks and cudnn_attention._cudnn() is not None and cudnn_attention.takes(case.qkv, y, lse, case.dy, dqkv):
        cudnn = cudnn_attention.CudnnAttention()
        dqkv16.fill(0)
        if cudnn.bwd(be, case.dy, case.qkv, y, lse, dqkv):  # a yardstick: its error is shown, not held to our tolerance
            err = check(outputs["flash_bwd"])
            ms = common.bench(cp, lambda: cudnn.bwd(be, case.dy, case.qkv, y, lse, dqkv), reps)
            report.add("flash_bwd", "cudnn", prec, shape, ms=ms, rate=common.tflops(5 * BH * T * T * D, ms), production=False,
                       note=f"yardstick, max err {err.max_err:.2e}, err/tol {err.ratio:.3f}")
        else:
            report.add("flash_bwd", "cudnn", prec, shape, production=False,
                       note="yardstick not run: cuDNN refused the shape, or production runs ours here (cudnn_attention.bwd)")


def torch_yardsticks(cp, report, shape, case, reps, y_ref):
    """PyTorch's causal SDPA on the same device values (q, k, v copied contiguous, [B, H, T, D]), once
    with only its flash backend allowed and once with only cuDNN's: forward and backward times, the
    forward's max error on the checked sequences and heads. Nothing where torch or a backend is missing."""
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    B, T, H, D = case.shape.B, case.shape.T, case.shape.H, case.shape.D
    dt = torch.bfloat16 if case.prec == "bf16" else torch.float16
    t = torch.from_dlpack(case.qkv16).view(dt)  # [B, T, 3, H, D], the very device memory
    q, k, v = (t[:, :, i].transpose(1, 2).contiguous().requires_grad_(True) for i in range(3))
    dy = torch.from_dlpack(case.dy16).view(dt).view(B, T, H, D).transpose(1, 2).contiguous()
    flops = 2 * B * H * T * T * D

    def timed(fn):
        return common.torch_median_ms(torch, fn, reps)

    for label, backend in (("torch flash", SDPBackend.FLASH_ATTENTION), ("torch cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with warnings.catch_warnings(), sdpa_kernel([backend]):
                warnings.simplefilter("ignore")
                fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                out = fwd()
                got = out.detach()[list(case.sub)][:, list(case.heads)].double().cpu().numpy()  # [n, Hc, T, D]
                max_err = float(np.abs(got - common.heads(y_ref, len(case.heads))).max())
                fwd_ms = timed(fwd)
                bwd_ms = timed(lambda: torch.autograd.grad(out, (q, k, v), dy, retain_graph=True))
        except RuntimeError as err:  # the backend does not take this shape or is not built in
            report.add("flash_fwd", label, case.prec, shape, production=False, note=f"yardstick not run: {str(err)[:120]}")
            continue
        report.add("flash_fwd", label, case.prec, shape, ms=fwd_ms, rate=common.tflops(flops, fwd_ms), production=False,
                   note=f"yardstick, max err {max_err:.2e}")
        report.add("flash_bwd", label, case.prec, shape, ms=bwd_ms, rate=common.tflops(2.5 * flops, bwd_ms), production=False,
                   note="yardstick")
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------- the summary


def summary(report, shapes) -> None:
    """Per model shape (bf16): the fastest wgmma variant that passed, forward and backward, against each
    yardstick (its time, and ours over it)."""
    names = {s.name for s in shapes}
    ours = {v[0] for v in FWD_VARIANTS} | {v[0] for v in BWD_VARIANTS}
    print(f"\n{SCRIPT}: summary, bf16, ms (ours / yardstick in brackets; < 1 is faster)")
    head = ["shape", "pass", "best wgmma", "ms"] + list(YARDSTICKS)
    lines = []
    for shape in [s.name for s in shapes if s.name in names]:
        for op, label in (("flash_fwd", "fwd"), ("flash_bwd", "bwd")):
            rows = [r for r in report.rows if r.shape == shape and r.op == op and r.precision == "bf16" and r.ms is not None]
            mine = [r for r in rows if r.version in ours and r.ok]
            if not mine:
                lines.append([shape, label, "none passed", "—"] + ["—"] * len(YARDSTICKS))
                continue
            best = min(mine, key=lambda r: r.ms)
            cells = []
            for y in YARDSTICKS:
                other = next((r for r in rows if r.version == y), None)
                cells.append("—" if other is None else f"{other.ms:.4f} ({best.ms / other.ms:.2f})")
            lines.append([shape, label, best.version, f"{best.ms:.4f}"] + cells)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(fmt(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        print(fmt(line))


# ----------------------------------------------------------------------------- main


def extra_args(ap) -> None:
    ap.add_argument("--models-only", action="store_true", help="the model shapes only (no edge shapes)")
    ap.add_argument("--fp16-models", action="store_true", help="the model shapes in fp16 too (bf16 only by default)")
    ap.add_argument("--no-probe", action="store_true", help="run the new variants in this process, unprobed")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="parallel NVRTC processes (default: the CPUs)")
    ap.add_argument("--probe-child", default=None, help=argparse.SUPPRESS)  # the probe's own call of this script


def main(argv=None) -> int:
    args = common.parse_args(__doc__, argv, extra_args)
    if args.probe_child is not None:
        return probe_child([k for k in args.probe_child.split(",") if k])
    cp = common.import_cupy()
    from andrea.engine.cupy import attention_wgmma as wg

    named = {"fwd": dict((n, d) for n, d, _ in FWD_VARIANTS)[PRODUCTION["fwd"]],
             "bwd": dict((v[0], v[1]) for v in BWD_VARIANTS)[PRODUCTION["bwd"]]}
    if named != {"fwd": wg.PRODUCTION_FWD, "bwd": wg.PRODUCTION_BWD}:
        raise SystemExit(f"{SCRIPT}: PRODUCTION names {named}, the engine runs {wg.PRODUCTION_FWD}, {wg.PRODUCTION_BWD}")
    os.environ.setdefault("ANDREA_WGMMA_CUBIN_CACHE", tempfile.mkdtemp(prefix="wgmma_cubins_"))
    cfg = common._config()
    if args.quick:
        models = [common.model_shape("ANDREA-tiny", 2, cfg)]
    else:
        models = [common.model_shape(name, batch, cfg) for name in MODELS for batch in BATCHES]
    edge = [] if args.models_only else EDGE
    common.banner(cp, SCRIPT, models)
    report = common.Report(SCRIPT)
    cc = cp.cuda.Device().compute_capability
    if cc != wg.CAPABILITY:  # a row that says so (ok, nothing checked): run_all counts a script without rows as broken
        for shape in edge + models:
            report.add("flash_fwd", "wgmma", "bf16", shape, production=False,
                       note=f"skipped: compute capability {cc}, sm_90a code runs only on 9.0 (H100/H200)")
        return report.finish(args)
    t0 = time.perf_counter()
    model_precs = H16 if args.fp16_models else ("bf16",)
    jobs = builds(sorted({s.D for s in edge}), H16) + builds(sorted({s.D for s in models}), model_precs)
    precompile(sorted(set(jobs)), args.jobs)
    new = [f"fwd:{n}" for n, _, is_new in FWD_VARIANTS if is_new] + [f"bwd:{v[0]}" for v in BWD_VARIANTS if v[4]]
    failed = {} if args.no_probe else probe(new)
    print(f"{SCRIPT}: probe of {len(new)} new variants: {len(failed)} failed {sorted(failed) if failed else ''}"
          f" ({time.perf_counter() - t0:.0f} s so far)", flush=True)

    rng = np.random.default_rng(args.seed)
    for shape in edge:
        for prec in H16 if shape.T < 1024 else ("bf16",):  # (the large edge shape is there for the persistent CTAs)
            case = Case(cp, shape, prec, rng, sorted({0, shape.B - 1}), list(range(shape.H)))
            run_shape(cp, report, shape, case, min(args.reps, 5), failed, yardsticks=False)  # checked; too small to time
    for prec in model_precs:
        by_model = {}
        for shape in sorted(models, key=lambda s: -s.B):  # the largest batch first: the smaller reuses its inputs
            model = shape.name.split()[0]
            sub, heads = [0, shape.B - 1], sorted({0, shape.H - 1})
            case = Case(cp, shape, prec, rng, sub, heads, source=by_model.get(model))
            by_model.setdefault(model, case)
            run_shape(cp, report, shape, case, args.reps, failed)
            print(f"{SCRIPT}: {shape.name} {prec} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    status = report.finish(args)
    summary(report, models)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
