"""Causal self-attention on Hopper's warp-group tensor cores (kernels/attention_wgmma.cu: wgmma.mma_async
with shared-memory matrix descriptors, FlashAttention-3's schedule with cp.async tiles), forward and
backward, on the buffers of attention_mma.py: one [B, T, 3, H, D] 16-bit qkv buffer with strides, y and
dy [B, T, H·D] 16-bit, lse [B, H, T] fp32 (the log-sum-exp of each score row, as attention_mma and cuDNN
save it), dq, dk, dv written into a buffer shaped like qkv. The backward is deterministic (dQ and dK/dV
in separate kernels, no atomics); its delta = Σ dy·y per row is attention_mma.cu's flash_delta.

wgmma exists only on the architecture sm_90a (H100/H200, compute capability 9.0 exactly), which CuPy's
RawModule does not target: it appends its own -arch=sm_<cc> to the options, and it derives that from
the device's compute capability as a number. So these kernels are compiled here with NVRTC directly
(cupy.cuda.nvrtc, -arch=sm_90a: a cubin) and the cubin loaded with cupy.cuda.function.Module, with
the production loader's options otherwise (kernels.py: -std=c++17 -I<kernels> -lineinfo
-DHEAD_DIM=<D>, the backend's -D defines; CuPy's include folders and -ftz=true, as RawModule adds).

Not dispatched by attention.py yet: check it on the device first (python3 dev/cuda/attention_wgmma.py).
"""

from __future__ import annotations

import functools
import math

import cupy as cp
import numpy as np

from andrea.engine.cupy.attention_mma import _mma_args
from andrea.engine.cupy.kernels import KERNELS, blocks

ARCH = "sm_90a"
CAPABILITY = "90"  # the only compute capability an sm_90a cubin runs on
HEAD_DIMS = (16, 32, 64)  # attention_wgmma.cu: a tile row of D 16-bit values is one swizzle atom (32, 64, 128 bytes)
# kernels/attention_wgmma.cu's defaults, overridden by -D defines of the same names (dev/cuda variants):
# warp groups per CTA, keys (or, for dK/dV, queries) per streamed tile, ring stages
CONFIG = {"FWD_WG": 2, "FWD_BN": 64, "FWD_STAGES": 3, "DQ_WG": 2, "DQ_BN": 64, "DQ_STAGES": 3,
          "KV_WG": 2, "KV_BM": 64, "KV_STAGES": 3}


def config(defines: tuple = ()) -> dict:
    """CONFIG with `defines` ("FWD_BN=128", ...) applied."""
    cfg = dict(CONFIG)
    for d in defines:
        name, _, value = d.partition("=")
        if name in cfg:
            cfg[name] = int(value)
    return cfg


def launch(kernel_name: str, D: int, defines: tuple = ()) -> tuple:
    """(rows a CTA owns, threads per CTA, bytes of dynamic shared memory) of a kernel: the .cu's
    FWD_BM/DQ_BM/KV_BN, *_NT and *_SMEM (1 KB to align the base to 1024 bytes, then the tiles)."""
    c, rb = config(defines), 2 * D  # bytes per tile row
    if kernel_name == "flash_fwd":  # Q; K and V stages
        rows = 64 * c["FWD_WG"]
        return rows, 128 * c["FWD_WG"], 1024 + rows * rb + 2 * c["FWD_STAGES"] * c["FWD_BN"] * rb
    if kernel_name == "flash_bwd_dq":  # Q, dO; K and V stages
        rows = 64 * c["DQ_WG"]
        return rows, 128 * c["DQ_WG"], 1024 + 2 * rows * rb + 2 * c["DQ_STAGES"] * c["DQ_BN"] * rb
    if kernel_name == "flash_bwd_dkdv":  # K, V; Q, dO, lse and delta stages
        rows, bm, st = 64 * c["KV_WG"], c["KV_BM"], c["KV_STAGES"]
        return rows, 128 * c["KV_WG"], 1024 + 2 * rows * rb + 2 * st * bm * rb + 2 * st * bm * 4
    raise ValueError(f"attention_wgmma has no kernel {kernel_name!r}")


def takes(D: int) -> bool:
    """The head sizes the kernels are written for, on a device that runs sm_90a code."""
    return D in HEAD_DIMS and cp.cuda.Device().compute_capability == CAPABILITY


def cubin(name: str, head_dim: int, defines: tuple = ()) -> bytes:
    """kernels/<name>.cu compiled by NVRTC for sm_90a with -DHEAD_DIM=<head_dim> and -D<d> for each
    define: the cubin (no GPU needed)."""
    from cupy._core.core import assemble_cupy_compiler_options  # CuPy's include folders (CUDA's headers, CCCL)
    from cupy.cuda import nvrtc

    path = KERNELS / f"{name}.cu"
    if not path.exists():
        raise FileNotFoundError(f"{path}: CUDA sources not found (reinstall the package, or set ANDREA_KERNELS to the kernels/ folder of a checkout)")
    opts = ("-std=c++17", f"-I{KERNELS}", "-lineinfo", f"-DHEAD_DIM={head_dim}") + tuple(f"-D{d}" for d in defines)
    opts = assemble_cupy_compiler_options(opts) + ("-ftz=true", f"-arch={ARCH}")
    prog = nvrtc.createProgram(path.read_text(), path.name, (), ())
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as err:
            raise RuntimeError(f"NVRTC could not compile {path.name} for {ARCH} {defines}: {err}\n{nvrtc.getProgramLog(prog)}") from None
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


@functools.lru_cache(maxsize=None)
def module(name: str, head_dim: int, defines: tuple = (), device: int = 0) -> cp.cuda.function.Module:
    """The cubin of kernels/<name>.cu (see cubin) loaded on `device` (a module is per device)."""
    code = cubin(name, head_dim, defines)
    with cp.cuda.Device(device):
        mod = cp.cuda.function.Module()
        mod.load(code)
    return mod


@functools.lru_cache(maxsize=None)
def _function(name: str, function: str, head_dim: int, defines: tuple, device: int, smem: int):
    f = module(name, head_dim, defines, device).get_function(function)
    if smem > 48 * 1024:  # more than the default cap of dynamic shared memory: ask for it
        cp.cuda.driver.funcSetAttribute(f.ptr, cp.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
    return f


def kernel(name: str, function: str, head_dim: int, defines: tuple = (), smem: int = 0):
    """The kernel `function` of kernels/<name>.cu for the current device (see module), allowed `smem`
    bytes of dynamic shared memory."""
    return _function(name, function, head_dim, tuple(defines), cp.cuda.runtime.getDevice(), smem)


def _run(name: str, D: int, T: int, BH: int, defines: tuple, args: tuple) -> None:
    rows, threads, smem = launch(name, D, defines)
    kernel("attention_wgmma", name, D, defines, smem)(((T + rows - 1) // rows, BH), (threads,), args, shared_mem=smem)


def _heads(qkv) -> tuple:
    B, T, H, D, ptrs, strides = _mma_args(qkv)
    if D not in HEAD_DIMS:
        raise ValueError(f"head_dim {D}: attention_wgmma takes {HEAD_DIMS}")
    return B, T, H, D, ptrs, strides


def flash_fwd(be, qkv, y, lse, defines: tuple = ()) -> None:
    """y = causal softmax(q·kᵀ/√D)·v per head, lse saved; qkv [B, T, 3, H, D] 16-bit (`be`: the backend,
    for its 16-bit type's defines; `defines`: a variant's, see CONFIG)."""
    B, T, H, D, (q, k, v), strides = _heads(qkv)
    _run("flash_fwd", D, T, B * H, tuple(defines) + tuple(be.defines),
         (q, k, v, y, lse, np.int32(H), np.int32(T), *strides, np.float32(1.0 / math.sqrt(D))))


def flash_bwd(be, dy, qkv, y, lse, dqkv, defines: tuple = ()) -> None:
    """dq, dk, dv into dqkv (overwritten) from dy, recomputing the probabilities from lse; delta by
    attention_mma.cu's flash_delta."""
    B, T, H, D, (q, k, v), strides = _heads(qkv)
    dq, dk, dv = _mma_args(dqkv)[4]
    defines = tuple(defines) + tuple(be.defines)
    delta = be.scratch("flash_delta", (B, H, T), cp.float32)
    be.kernel("attention_mma", "flash_delta", D)((blocks(B * T * H, 8),), (256,), (dy, y, delta, np.int32(B), np.int32(H),
                                                                                  np.int32(T)))
    ht, scale = (np.int32(H), np.int32(T)), np.float32(1.0 / math.sqrt(D))
    _run("flash_bwd_dq", D, T, B * H, defines, (q, k, v, dy, lse, delta, dq, *ht, *strides, scale))
    _run("flash_bwd_dkdv", D, T, B * H, defines, (q, k, v, dy, lse, delta, dk, dv, *ht, *strides, scale))
