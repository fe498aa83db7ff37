"""The CUDA sources of andrea/kernels/, compiled with NVRTC through cupy.RawModule.

A compiled module depends only on its source file, head dimension and preprocessor defines (the
16-bit type: -DANDREA_FP16 for fp16, bf16 otherwise), never on a backend's state, so compiled
modules are shared by every backend object of the process, keyed by exactly those.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import cupy as cp

# the CUDA sources ship inside the package (andrea/kernels; `kernels/` at the top of a checkout
# links there), so an installed package finds them; ANDREA_KERNELS points elsewhere for development
KERNELS = Path(os.environ.get("ANDREA_KERNELS", Path(__file__).resolve().parents[2] / "kernels"))


@functools.lru_cache(maxsize=None)
def module(name: str, head_dim: int | None = None, defines: tuple = ()) -> cp.RawModule:
    """kernels/<name>.cu compiled with -DHEAD_DIM=<head_dim> (when given) and -D<d> for each define."""
    path = KERNELS / f"{name}.cu"
    if not path.exists():
        raise FileNotFoundError(f"{path}: CUDA sources not found (reinstall the package, or set ANDREA_KERNELS to the kernels/ folder of a checkout)")
    opts = ("-std=c++17", f"-I{KERNELS}", "-lineinfo")
    if head_dim is not None:
        opts += (f"-DHEAD_DIM={head_dim}",)
    opts += tuple(f"-D{d}" for d in defines)
    return cp.RawModule(code=path.read_text(), options=opts)


def kernel(name: str, function: str, head_dim: int | None = None, defines: tuple = ()):
    """The kernel `function` of kernels/<name>.cu (see module)."""
    return module(name, head_dim, defines).get_function(function)


def blocks(n: int, threads: int = 256) -> int:
    """Blocks of `threads` threads that cover n items."""
    return (n + threads - 1) // threads


LN_FUSED_NV = (1, 2, 3, 4, 6, 8, 12)  # layernorm.cu: the layernorm_bwd_fused_<NV> kernels (float4s per lane)


def ln_nv(C: int) -> int:
    """float4s a lane of the row kernels instantiated per width (layernorm_bwd_fused_<NV>,
    add_layernorm_r16_<NV>, fp8.cu's add_layernorm_fp8_<NV>, ...) for rows of C channels."""
    return next(nv for nv in LN_FUSED_NV if 128 * nv >= C)


XENT_NV = 8  # classifier.cu (compiled with -DXENT_NV=this): vectors of 8 logits a thread of softmax_xent_h16_rows holds


def xent_threads(ld: int) -> int | None:
    """Threads a block of softmax_xent_h16_rows takes for rows of ld 16-bit logits (a multiple of 32,
    at most 1024), or None where a row does not fit (softmax_xent_h16 takes those; so does the caller
    where the kernel's registers allow fewer threads than this)."""
    if ld % 8:
        return None
    threads = -(-(-(-ld // 8) // XENT_NV) // 32) * 32
    return threads if threads <= 1024 else None
