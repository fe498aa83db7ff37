"""LayerNorm on the GPU (kernels/layernorm.cu): the forward, the residual add fused with it, and the
backward, for an fp32 or a 16-bit residual stream and output. `be`: the CupyBackend whose kernels and
scratch buffers run it (fp8's LayerNorms, which write their product's 8-bit operand: Fp8.layernorm_fwd
and Fp8.layernorm_bwd in fp8.py)."""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np

from andrea.engine.cupy.kernels import blocks, ln_nv
from andrea.engine.cupy.weights import is_16bit

LN_MAXV = 12  # kernels/layernorm.cu: float4s per lane in the vectorised row kernels
LN_FEW_ROWS = 64  # up to this many rows, add_layernorm_fwd's 16-bit-branch kernel is latency-bound (decoding)
LN_ROWS = 64  # rows per partial sum of the LayerNorm parameter gradients (the two-kernel path)
LN_R16_ROWS = 2  # layernorm.cu: rows a warp of add_layernorm_r16_<NV>


def _ln_vec(C: int) -> bool:
    """The vectorised LayerNorm row kernels apply: rows of float4s that fit a warp's registers."""
    return C % 4 == 0 and C <= 4 * 32 * LN_MAXV


def _ln_fused(C: int, h16_dout: bool = False, r16: bool = False) -> str:
    """The one-pass LayerNorm backward kernel for rows of C channels (C satisfies _ln_vec), for an
    fp32 or a 16-bit output gradient, over an fp32 or (r16) a 16-bit residual stream."""
    return f"layernorm_bwd_fused_{'h16_' if h16_dout else ''}{'r16_' if r16 else ''}{ln_nv(C)}"


def ln_fused_rows(N: int) -> int:
    """Rows per block of the one-pass LayerNorm backward: 64, fewer when that would leave fewer than
    256 blocks (a block's warps take its rows one after another: small batches need more blocks in
    flight). A function of N alone, so a shape's sums always run in the same order."""
    return max(8, min(64, N // 256 // 8 * 8))


def ln_fused_smem(C: int) -> int:
    """Dynamic shared memory of the one-pass LayerNorm backward: each of its 8 warps' running sums of
    dγ and dβ ([2C] floats)."""
    return 8 * 2 * C * 4


@functools.lru_cache(maxsize=None)
def _smem_optin(device: int) -> int:
    return cp.cuda.runtime.deviceGetAttribute(97, device)  # cudaDevAttrMaxSharedMemoryPerBlockOptin


def smem_optin() -> int:
    """The most shared memory a block may ask for on the current GPU (227 KiB on an H100/H200)."""
    return _smem_optin(cp.cuda.runtime.getDevice())


def layernorm_fwd(be, x, g, b, out, mean, rstd, eps=1e-5, feeds=None) -> None:
    if out.dtype == np.uint8:  # fp8: planned as the cast operand of the product it feeds
        be.fp8.layernorm_fwd(x, None, None, g, b, out, mean, rstd, eps, feeds)
        return
    C = x.shape[-1]
    N = x.size // C
    if _ln_vec(C) and is_16bit(x):  # a 16-bit residual stream (its outputs are 16-bit too)
        if not is_16bit(out):
            raise ValueError("a LayerNorm of the 16-bit residual stream writes a 16-bit output")
        _add_layernorm_r16(be, x, None, None, g, b, out, mean, rstd, eps)
        return
    if _ln_vec(C):  # the residual-add kernel with no residual
        name = "add_layernorm_fwd_vec_h16" if is_16bit(out) else "add_layernorm_fwd_vec"
        be.kernel("layernorm", name)(
            (blocks(N, 8),), (256,), (x, np.uint64(0), np.uint64(0), g, b, out, mean, rstd, np.int32(N), np.int32(C),
                                      np.float32(eps)))
        return
    be.kernel("layernorm", "layernorm_fwd_h16" if is_16bit(out) else "layernorm_fwd")(
        (blocks(N, 8),), (256,), (x, g, b, out, mean, rstd, np.int32(N), np.int32(C), np.float32(eps)))


def add_layernorm_fwd(be, x, f, res, g, b, out, mean, rstd, eps=1e-5, feeds=None) -> None:
    """res = x + f and out = LayerNorm(res) in one kernel (fp8: out as the cast operand of the
    product it feeds)."""
    if out.dtype == np.uint8:
        if not is_16bit(f):
            raise ValueError("an fp8 LayerNorm output needs the 16-bit branch of the 16-bit modes")
        be.fp8.layernorm_fwd(x, f, res, g, b, out, mean, rstd, eps, feeds)
        return
    C = x.shape[-1]
    N = x.size // C
    vec = "_vec" if _ln_vec(C) else ""
    if is_16bit(f):  # the 16-bit modes' branch output (plan_buffer: only where the vec kernels apply)
        if not (vec and is_16bit(out)):
            raise ValueError(f"a 16-bit branch needs C % 4 == 0, C <= {4 * 32 * LN_MAXV} and a 16-bit output")
        r16 = "_r16" if is_16bit(x) else ""  # a 16-bit residual stream (x and res)
        if is_16bit(x) != is_16bit(res):
            raise ValueError("the residual stream's input and output must have one type (16-bit or fp32)")
        if N <= LN_FEW_ROWS:  # a few rows (generation's step): a block per row, one wait on memory
            be.kernel("layernorm", "add_h16_layernorm_fwd_block_h16" + r16)(
                (N,), (-(-C // 128) * 32,), (x, f, res, g, b, out, mean, rstd, np.int32(N), np.int32(C), np.float32(eps)))
            return
        if r16:
            _add_layernorm_r16(be, x, f, res, g, b, out, mean, rstd, eps)
            return
        name = "add_h16_layernorm_fwd_vec_h16"
    else:
        name = f"add_layernorm_fwd{vec}_h16" if is_16bit(out) else f"add_layernorm_fwd{vec}"
    be.kernel("layernorm", name)((blocks(N, 8),), (256,), (x, f, res, g, b, out, mean, rstd, np.int32(N), np.int32(C),
                                                           np.float32(eps)))


def _add_layernorm_r16(be, x, f, res, g, b, out, mean, rstd, eps) -> None:
    """res = x + f (f None: no add, res None) and out = LayerNorm(res) over a 16-bit residual stream,
    LN_R16_ROWS rows a warp (kernels/layernorm.cu add_layernorm_r16_<NV>)."""
    C = x.shape[-1]
    N = x.size // C
    be.kernel("layernorm", f"add_layernorm_r16_{ln_nv(C)}")(
        (blocks(N, 8 * LN_R16_ROWS),), (256,), (x, np.uint64(0) if f is None else f, np.uint64(0) if res is None else res,
                                                g, b, out, mean, rstd, np.int32(N), np.int32(C), np.float32(eps)))


def layernorm_bwd(be, dout, x, mean, rstd, g, dx, dg, db, branch=None, feeds=None) -> None:
    """dx += the input gradient; dγ and dβ += their gradients (per-block partials, then one ordered
    sum). Where the vectorised kernels apply, one pass does both (dout fp32 or 16-bit); elsewhere a
    warp-per-row kernel and a column-partials kernel. With `branch`, the updated dx is also written
    there (in the same kernel when it is 16-bit; fp8: cast for the product `feeds`)."""
    if branch is not None and branch.dtype == np.uint8:
        be.fp8.layernorm_bwd(dout, x, mean, rstd, g, dx, dg, db, branch, feeds)
        return
    C = x.shape[-1]
    N = x.size // C
    if branch is not None and branch.data.ptr == dx.data.ptr:
        branch = None  # the branch's gradient is the stream's (a 16-bit residual stream: one buffer)
    if is_16bit(dx):  # a 16-bit residual stream (x and dx): the one pass, x and dx in 16 bits
        if not (is_16bit(x) and is_16bit(dout) and branch is None and _ln_vec(C)):
            raise ValueError("a 16-bit residual gradient needs a 16-bit stream, a 16-bit output gradient and "
                             f"no separate branch copy, with C % 4 == 0 and C <= {4 * 32 * LN_MAXV}")
        layernorm_bwd_one_pass(be, be.kernel("layernorm", _ln_fused(C, True, r16=True)),
                               (dout, x, mean, rstd, g, dx), (), (), dg, db)
        return
    fused_copy = branch is not None and is_16bit(branch)
    copy = branch if fused_copy else np.uint64(0)
    # the one pass needs 8·2C floats of shared memory a block: 96 KiB at C = 1536, past what a
    # GPU before Ampere gives one (64 KiB); there the fp32 path runs the two kernels
    fused = _ln_vec(C) and ln_fused_smem(C) <= smem_optin()
    if is_16bit(dout) and not fused:
        raise ValueError(f"a 16-bit LayerNorm output gradient needs C % 4 == 0, C <= {4 * 32 * LN_MAXV} and "
                         f"{ln_fused_smem(C)} bytes of shared memory a block (this GPU: {smem_optin()})")
    if fused:  # one pass: dx and the blocks' partial sums of dγ, dβ (dout and x read once)
        layernorm_bwd_one_pass(be, be.kernel("layernorm", _ln_fused(C, is_16bit(dout))), (dout, x, mean, rstd, g, dx),
                               (copy,), (), dg, db)
    else:
        rows = LN_ROWS
        chunks = (N + rows - 1) // rows
        partial = be.scratch("ln_partial", (chunks, 2 * C), cp.float32)
        be.kernel("layernorm", "layernorm_bwd_dx")((blocks(N, 8),), (256,), (dout, x, mean, rstd, g, dx, copy,
                                                                              np.int32(N), np.int32(C)))
        be.kernel("layernorm", "layernorm_bwd_params")((blocks(C, 128), chunks), (128,),
                                                       (dout, x, mean, rstd, partial, np.int32(N), np.int32(C),
                                                        np.int32(LN_ROWS)))
        be.kernel("layernorm", "ln_partials_final")((blocks(2 * C, 32),), (32, 8),
                                                    (partial, dg, db, np.int32(chunks), np.int32(C)))
    if branch is not None and not fused_copy:
        branch[...] = dx


def layernorm_bwd_one_pass(be, kern, args, outs, tail, dg, db, extra_smem: int = 0) -> None:
    """A one-pass LayerNorm backward kernel (layernorm_bwd_fused_*: dx and the blocks' partial sums
    of dγ and dβ; dout and x read once) over blocks of ln_fused_rows rows, then the partials' ordered
    sum into dg, db. args (dout, x, mean, rstd, g, dx), outs (what the kernel writes dx's copy
    to), tail (its arguments after the row count); extra_smem: shared memory beyond the sums'."""
    C = args[1].shape[-1]
    N = args[1].size // C
    rows = ln_fused_rows(N)
    chunks = (N + rows - 1) // rows
    partial = be.scratch("ln_partial", (chunks, 2 * C), cp.float32)
    smem = ln_fused_smem(C) + extra_smem
    if kern.max_dynamic_shared_size_bytes < smem:  # past 48 KiB only by request
        kern.max_dynamic_shared_size_bytes = smem
    kern((chunks,), (256,), (*args, *outs, partial, np.int32(N), np.int32(C), np.int32(rows), *tail), shared_mem=smem)
    be.kernel("layernorm", "ln_partials_final")((blocks(2 * C, 32),), (32, 8),
                                                (partial, dg, db, np.int32(chunks), np.int32(C)))
