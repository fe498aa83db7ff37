"""Causal self-attention on Hopper's warp-group tensor cores (kernels/attention_wgmma.cu: wgmma.mma_async
with shared-memory matrix descriptors, FlashAttention-3's schedule with cp.async tiles), on the buffers
of attention_mma.py: one [B, T, 3, H, D] 16-bit qkv buffer with strides, y [B, T, H·D] 16-bit, lse
[B, H, T] fp32 (the log-sum-exp of each score row, as attention_mma and cuDNN save it).

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
from andrea.engine.cupy.kernels import KERNELS

ARCH = "sm_90a"
CAPABILITY = "90"  # the only compute capability an sm_90a cubin runs on
HEAD_DIMS = (16, 32, 64)  # attention_wgmma.cu: a tile row of D 16-bit values is one swizzle atom (32, 64, 128 bytes)
# kernels/attention_wgmma.cu's defaults, overridden by -D defines of the same names (dev/cuda variants)
FWD = {"FWD_WG": 2, "FWD_BN": 64, "FWD_STAGES": 3}


def fwd_config(defines: tuple = ()) -> dict:
    """The forward's warp groups per CTA, keys per tile and stages, with `defines` ("FWD_BN=128", ...) applied."""
    cfg = dict(FWD)
    for d in defines:
        name, _, value = d.partition("=")
        if name in cfg:
            cfg[name] = int(value)
    return cfg


def fwd_launch(T: int, D: int, defines: tuple = ()) -> tuple:
    """(query rows per CTA, threads per CTA, bytes of dynamic shared memory) of flash_fwd: the .cu's
    BM, NT and FWD_SMEM (1 KB to align the base to 1024 bytes, the Q tile, FWD_STAGES K and V tiles)."""
    cfg = fwd_config(defines)
    rows = 64 * cfg["FWD_WG"]
    smem = 1024 + (rows + 2 * cfg["FWD_STAGES"] * cfg["FWD_BN"]) * 2 * D
    return rows, 128 * cfg["FWD_WG"], smem


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


def flash_fwd(be, qkv, y, lse, defines: tuple = ()) -> None:
    """y = causal softmax(q·kᵀ/√D)·v per head, lse saved; qkv [B, T, 3, H, D] 16-bit (`be`: the backend,
    for its 16-bit type's defines; `defines`: a variant's, see FWD)."""
    B, T, H, D, (q, k, v), strides = _mma_args(qkv)
    if D not in HEAD_DIMS:
        raise ValueError(f"head_dim {D}: attention_wgmma takes {HEAD_DIMS}")
    defines = tuple(defines) + tuple(be.defines)
    rows, threads, smem = fwd_launch(T, D, defines)
    f = kernel("attention_wgmma", "flash_fwd", D, defines, smem)
    f(((T + rows - 1) // rows, B * H), (threads,), (q, k, v, y, lse, np.int32(H), np.int32(T), *strides,
                                                    np.float32(1.0 / math.sqrt(D))), shared_mem=smem)
